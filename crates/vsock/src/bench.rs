//! iperf-vsock-like throughput test: the client sends N bytes and half-closes, the server
//! counts them and answers with the count (8 bytes, little endian), so both ends agree on
//! what arrived. Works on every stream address (vsock, TCP, UNIX, hybrid).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Instant;

use serde::Serialize;

use crate::addr::Address;
use crate::conn::{self, Conn, ConnError, Listener, SockOpts};

/// Result of one client run.
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    pub address: String,
    pub bytes: u64,
    pub buffer: usize,
    pub seconds: f64,
    pub gbit_per_s: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Conn(#[from] ConnError),
    #[error("benchmark I/O on {0}")]
    Io(String, #[source] io::Error),
    #[error("the server counted {got} bytes, the client sent {sent}")]
    Mismatch { sent: u64, got: u64 },
}

fn write_all(fd: BorrowedFd<'_>, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: buf is readable for buf.len() bytes and fd is a live descriptor.
        let n = unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

fn read_some(fd: i32, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: buf is writable for buf.len() bytes and fd is a live descriptor.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn borrowed(fd: i32) -> BorrowedFd<'static> {
    // SAFETY: the descriptor belongs to a Conn that outlives every use made of it here.
    unsafe { BorrowedFd::borrow_raw(fd) }
}

/// Serves one connection: counts bytes until EOF, answers with the count.
pub fn serve_one(c: &Conn, buffer: usize) -> io::Result<u64> {
    let mut buf = vec![0u8; buffer];
    let mut total = 0u64;
    loop {
        let n = read_some(c.read_fd(), &mut buf)?;
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    write_all(borrowed(c.write_fd()), &total.to_le_bytes())?;
    c.shutdown_write()?;
    Ok(total)
}

/// Runs the server on `addr`: one connection when `once`, else forever.
pub fn server(
    addr: &Address,
    buffer: usize,
    sock: SockOpts,
    once: bool,
    report: &dyn Fn(u64),
) -> Result<(), BenchError> {
    let l = Listener::open(addr, sock)?;
    loop {
        let c = l
            .accept()
            .map_err(|e| BenchError::Io(addr.to_string(), e))?;
        match serve_one(&c, buffer) {
            Ok(n) => report(n),
            Err(e) if once => return Err(BenchError::Io(addr.to_string(), e)),
            Err(_) => {}
        }
        if once {
            return Ok(());
        }
    }
}

/// Sends `bytes` to the server at `addr` and checks the server's count.
pub fn client(
    addr: &Address,
    bytes: u64,
    buffer: usize,
    sock: SockOpts,
) -> Result<BenchResult, BenchError> {
    let c = conn::connect(addr, sock)?;
    let io = |e| BenchError::Io(addr.to_string(), e);
    let buf = vec![0x5au8; buffer];
    let start = Instant::now();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buffer as u64) as usize;
        write_all(borrowed(c.write_fd()), &buf[..n]).map_err(io)?;
        left -= n as u64;
    }
    c.shutdown_write().map_err(io)?;
    let mut reply = [0u8; 8];
    let mut got = 0;
    while got < 8 {
        let n = read_some(c.read_fd(), &mut reply[got..]).map_err(io)?;
        if n == 0 {
            return Err(io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "server closed before answering",
            )));
        }
        got += n;
    }
    let seconds = start.elapsed().as_secs_f64();
    let counted = u64::from_le_bytes(reply);
    if counted != bytes {
        return Err(BenchError::Mismatch {
            sent: bytes,
            got: counted,
        });
    }
    Ok(BenchResult {
        address: addr.to_string(),
        bytes,
        buffer,
        seconds,
        gbit_per_s: bytes as f64 * 8.0 / seconds / 1e9,
    })
}
