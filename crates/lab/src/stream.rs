//! A fast deterministic byte stream (xorshift64*), so peers can send large volumes whose
//! SHA-256 the other side checks, and a bidirectional checked transfer over any stream.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use sha2::{Digest, Sha256};

pub struct ByteStream {
    state: u64,
}

impl ByteStream {
    pub fn new(seed: u64) -> Self {
        Self {
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        }
    }

    /// Fills `buf` with the next bytes of the stream.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let v = self.next_u64().to_le_bytes();
            rest.copy_from_slice(&v[..rest.len()]);
        }
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// The SHA-256, in hex, of the first `bytes` of stream `seed` (what a peer sending that
/// stream sends).
pub fn sha256_of(seed: u64, bytes: u64) -> String {
    let (mut s, mut h, mut left) = (ByteStream::new(seed), Sha256::new(), bytes);
    let mut buf = vec![0u8; 1 << 16];
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        s.fill(&mut buf[..n]);
        h.update(&buf[..n]);
        left -= n as u64;
    }
    format!("{:x}", h.finalize())
}

/// A stream that can be split into a writer and a reader and half-closed.
pub trait Duplex: Read + Write + Send + Sized + 'static {
    fn dup(&self) -> Self;
    fn shut_wr(&self);
    fn read_timeout(&self, d: Duration);
}

/// TCP and UNIX streams have the same `try_clone`/`shutdown`/`set_read_timeout`.
macro_rules! duplex_for {
    ($($t:ty),*) => {$(
        impl Duplex for $t {
            fn dup(&self) -> Self {
                self.try_clone().unwrap()
            }
            fn shut_wr(&self) {
                self.shutdown(std::net::Shutdown::Write).unwrap();
            }
            fn read_timeout(&self, d: Duration) {
                self.set_read_timeout(Some(d)).unwrap();
            }
        }
    )*};
}
duplex_for!(TcpStream, UnixStream);

/// What one end of a [`bidir`] transfer sent and received.
#[derive(Debug, PartialEq, Eq)]
pub struct Bidir {
    pub sent_sha: String,
    pub recv_sha: String,
    pub received: u64,
}

/// Sends `bytes` of stream `seed` then half-closes, while reading until EOF (60 s without
/// data fails the read).
pub fn bidir<S: Duplex>(s: S, bytes: u64, seed: u64) -> Bidir {
    let mut w = s.dup();
    let sender = std::thread::spawn(move || {
        let mut st = ByteStream::new(seed);
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            st.fill(&mut buf[..n]);
            h.update(&buf[..n]);
            w.write_all(&buf[..n]).unwrap();
            left -= n as u64;
        }
        w.shut_wr();
        format!("{:x}", h.finalize())
    });
    let r = s;
    r.read_timeout(Duration::from_secs(60));
    let (received, recv_sha) = read_to_end_hashed(r);
    Bidir {
        sent_sha: sender.join().unwrap(),
        recv_sha,
        received,
    }
}

/// Reads `r` to EOF (a read error fails): how many bytes, and their SHA-256 in hex.
pub fn read_to_end_hashed(mut r: impl Read) -> (u64, String) {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut received = 0;
    loop {
        let n = r.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        received += n as u64;
        h.update(&buf[..n]);
    }
    (received, format!("{:x}", h.finalize()))
}

/// Checks that two ends of a [`bidir`] transfer each got all of what the other sent.
pub fn check_pair(a: &Bidir, b: &Bidir, bytes: u64) {
    assert_eq!(a.received, bytes);
    assert_eq!(b.received, bytes);
    assert_eq!(a.recv_sha, b.sent_sha, "bytes differ in one direction");
    assert_eq!(
        b.recv_sha, a.sent_sha,
        "bytes differ in the other direction"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_seed_dependent() {
        let (mut a, mut b, mut c) = (ByteStream::new(1), ByteStream::new(1), ByteStream::new(2));
        let (mut x, mut y, mut z) = ([0u8; 37], [0u8; 37], [0u8; 37]);
        a.fill(&mut x);
        b.fill(&mut y);
        c.fill(&mut z);
        assert_eq!(x, y);
        assert_ne!(x, z);
    }
}
