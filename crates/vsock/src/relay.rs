//! Moving bytes both ways between two connections, with half-close: when one side's data ends,
//! the other side gets shutdown(SHUT_WR) (not a full close), so it can still answer.
//! Between two sockets the bytes move with splice(2) through a pipe, without copies through
//! user space; anything splice refuses falls back to read/write with a large buffer.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{fcntl, splice, FcntlArg, OFlag, SpliceFFlags};
use nix::unistd::{pipe2, read, write};
use serde::Serialize;
use tracing::{debug, info, warn};

use crate::addr::Address;
use crate::conn::{self, Conn, ConnError, Listener, SockOpts};

/// Relay options.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Serve every connection of a listening first address (each in its own thread).
    pub fork: bool,
    /// With `fork`: at most this many connections at once (the next waits).
    pub max_children: usize,
    /// Most bytes moved per call (pipe size and largest splice request, or copy buffer).
    pub buffer: usize,
    /// Socket-level options.
    pub sock: SockOpts,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            fork: false,
            max_children: 64,
            buffer: 256 << 10,
            sock: SockOpts::default(),
        }
    }
}

/// What one relayed connection moved.
#[derive(Debug, Clone, Serialize)]
pub struct ConnStats {
    pub id: u64,
    pub a: String,
    pub b: String,
    pub bytes_a_to_b: u64,
    pub bytes_b_to_a: u64,
    pub millis: u64,
    pub spliced: bool,
    pub error: Option<String>,
}

/// Relay errors.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Conn(#[from] ConnError),
    #[error("--fork needs a listening first address (got {0})")]
    ForkNeedsListener(String),
    #[error("with --fork the second address must connect, not listen (got {0})")]
    ForkSecondListens(String),
    #[error("--max-children must be at least 1")]
    ZeroChildren,
    #[error("accept on {addr}")]
    Accept {
        addr: String,
        #[source]
        source: io::Error,
    },
}

/// A pipe for splice, as large as `size` allows (best effort: capped by fs.pipe-max-size for
/// unprivileged users; the default 64 KiB pipe still works).
fn pipe(size: usize) -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = pipe2(OFlag::O_CLOEXEC)?;
    let _ = fcntl(
        &w,
        FcntlArg::F_SETPIPE_SZ(size.min(i32::MAX as usize) as i32),
    );
    Ok((r, w))
}

/// Copies src → dst until EOF, then half-closes dst. Returns (bytes, spliced).
///
/// Between two sockets the bytes go socket → pipe → socket with splice(2) in this one thread.
/// (Not a reader and a writer thread sharing the pipe: splice from a socket holds the pipe's
/// mutex while it waits for data, so the writer could not forward a request already in the
/// pipe — request/response traffic stalled; see docs/vsock.md.) A source that refuses splice
/// (EINVAL/ENOSYS before any byte) is copied with read/write instead.
pub fn pump(src: &Conn, dst: &Conn, buffer: usize) -> io::Result<(u64, bool)> {
    let mut total = 0u64;
    let mut spliced = false;
    if src.is_socket() && dst.is_socket() {
        match splice_loop(src.reader(), dst.writer(), buffer, &mut total) {
            Ok(()) => spliced = true,
            Err(e)
                if total == 0
                    && matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) =>
            {
                debug!(
                    "splice not supported between {} and {}: {e}; copying",
                    src.label, dst.label
                );
                copy_loop(src.reader(), dst.writer(), buffer, &mut total)?;
            }
            Err(e) => return Err(e),
        }
    } else {
        copy_loop(src.reader(), dst.writer(), buffer, &mut total)?;
    }
    dst.shutdown_write()?;
    Ok((total, spliced))
}

fn splice_loop(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    buffer: usize,
    total: &mut u64,
) -> io::Result<()> {
    let (pr, pw) = pipe(buffer)?;
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_MORE;
    let mut chunk = SPLICE_MIN.min(buffer);
    loop {
        let n = match splice(src, None, &pw, None, chunk, flags) {
            Ok(n) => n,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            return Ok(());
        }
        chunk = next_chunk(chunk, n, buffer);
        let mut left = n;
        while left > 0 {
            match splice(&pr, None, dst, None, left, flags) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "splice wrote nothing",
                    ))
                }
                Ok(m) => left -= m,
                Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        *total += n as u64;
    }
}

/// The smallest splice request: one page.
const SPLICE_MIN: usize = 4096;

/// The next splice request size: double it when the last one came back full (bulk data is
/// waiting), halve it when it came back less than a quarter full (small messages), within
/// [one page, `buffer`]. A socket without its own splice_read (AF_VSOCK among them) is read
/// through copy_splice_read, which allocates pages for the whole request before it reads:
/// asking for 256 KiB to move a 1-byte request cost 64 page allocations per message.
fn next_chunk(chunk: usize, got: usize, buffer: usize) -> usize {
    let min = SPLICE_MIN.min(buffer);
    if got >= chunk {
        (chunk * 2).min(buffer)
    } else if got < chunk / 4 {
        (chunk / 2).max(min)
    } else {
        chunk
    }
}

fn copy_loop(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    buffer: usize,
    total: &mut u64,
) -> io::Result<()> {
    let mut buf = vec![0u8; buffer];
    loop {
        let n = match read(src, &mut buf) {
            Ok(n) => n,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            return Ok(());
        }
        let mut off = 0;
        while off < n {
            match write(dst, &buf[off..n]) {
                Ok(m) => off += m,
                Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        *total += n as u64;
    }
}

/// Relays between `a` and `b` until both directions have ended.
pub fn relay(id: u64, a: Conn, b: Conn, buffer: usize) -> ConnStats {
    let start = Instant::now();
    let (r_ab, r_ba) = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let r = pump(&a, &b, buffer);
            if r.is_err() {
                a.abort();
                b.abort();
            }
            r
        });
        let r_ba = pump(&b, &a, buffer);
        if r_ba.is_err() {
            a.abort();
            b.abort();
        }
        let r_ab = h
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("relay thread panicked")));
        (r_ab, r_ba)
    });
    let error = match (&r_ab, &r_ba) {
        (Err(e), _) => Some(format!("{} -> {}: {e}", a.label, b.label)),
        (_, Err(e)) => Some(format!("{} -> {}: {e}", b.label, a.label)),
        _ => None,
    };
    let (ab, s1) = r_ab.unwrap_or((0, false));
    let (ba, s2) = r_ba.unwrap_or((0, false));
    ConnStats {
        id,
        a: a.label.clone(),
        b: b.label.clone(),
        bytes_a_to_b: ab,
        bytes_b_to_a: ba,
        millis: start.elapsed().as_millis() as u64,
        spliced: s1 || s2,
        error,
    }
}

/// Opens the second address for one connection of the first.
fn open_second(b: &Address, opts: &Options) -> Result<Conn, RelayError> {
    if b.is_listen() {
        let l = Listener::open(b, opts.sock)?;
        return l.accept().map_err(|source| RelayError::Accept {
            addr: b.to_string(),
            source,
        });
    }
    Ok(conn::connect(b, opts.sock)?)
}

/// Runs a relay between addresses `a` and `b`; `report` is called for every finished
/// connection. Without `fork` it serves one connection and returns.
pub fn run(
    a: &Address,
    b: &Address,
    opts: &Options,
    report: &(dyn Fn(&ConnStats) + Sync),
) -> Result<(), RelayError> {
    if opts.fork {
        if !a.is_listen() {
            return Err(RelayError::ForkNeedsListener(a.to_string()));
        }
        if b.is_listen() {
            return Err(RelayError::ForkSecondListens(b.to_string()));
        }
        if opts.max_children == 0 {
            return Err(RelayError::ZeroChildren);
        }
    }
    if !a.is_listen() {
        let ca = conn::connect(a, opts.sock)?;
        let cb = open_second(b, opts)?;
        report(&relay(1, ca, cb, opts.buffer));
        return Ok(());
    }
    let listener = Listener::open(a, opts.sock)?;
    info!("listening on {a}, relaying to {b}");
    if !opts.fork {
        let ca = listener.accept().map_err(|source| RelayError::Accept {
            addr: a.to_string(),
            source,
        })?;
        let cb = open_second(b, opts)?;
        report(&relay(1, ca, cb, opts.buffer));
        return Ok(());
    }
    let slots = Arc::new((Mutex::new(0usize), Condvar::new()));
    std::thread::scope(|s| -> Result<(), RelayError> {
        let mut id = 0u64;
        loop {
            {
                let (lock, cv) = &*slots;
                let mut n = lock.lock().unwrap_or_else(|e| e.into_inner());
                while *n >= opts.max_children {
                    n = cv
                        .wait_timeout(n, Duration::from_secs(1))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                *n += 1;
            }
            let ca = match listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    release(&slots);
                    continue;
                }
                Err(source) => {
                    release(&slots);
                    return Err(RelayError::Accept {
                        addr: a.to_string(),
                        source,
                    });
                }
            };
            id += 1;
            let slots = slots.clone();
            s.spawn(move || {
                match conn::connect(b, opts.sock) {
                    Ok(cb) => report(&relay(id, ca, cb, opts.buffer)),
                    // A failing peer (refused connection, bad hybrid handshake) ends this
                    // connection only, never the relay.
                    Err(e) => {
                        warn!("connection {id} from {}: {e}", ca.label);
                        report(&ConnStats {
                            id,
                            a: ca.label.clone(),
                            b: b.to_string(),
                            bytes_a_to_b: 0,
                            bytes_b_to_a: 0,
                            millis: 0,
                            spliced: false,
                            error: Some(error_chain(&e)),
                        });
                    }
                }
                release(&slots);
            });
        }
    })
}

fn release(slots: &Arc<(Mutex<usize>, Condvar)>) {
    let (lock, cv) = &**slots;
    let mut n = lock.lock().unwrap_or_else(|e| e.into_inner());
    *n = n.saturating_sub(1);
    cv.notify_one();
}

/// An error with its causes, `a: b: c`.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod chunk_tests {
    use super::*;

    #[test]
    fn splice_requests_grow_with_bulk_and_shrink_with_small_messages() {
        let buf = 256 << 10;
        let mut c = SPLICE_MIN;
        for _ in 0..10 {
            c = next_chunk(c, c, buf);
        }
        assert_eq!(c, buf, "full reads grow the request up to the buffer");
        for _ in 0..10 {
            c = next_chunk(c, 1, buf);
        }
        assert_eq!(c, SPLICE_MIN, "1-byte messages shrink it to one page");
        assert_eq!(
            next_chunk(64 << 10, 20 << 10, buf),
            64 << 10,
            "steady in between"
        );
        assert_eq!(next_chunk(4096, 4096, 1024), 1024, "never above the buffer");
        assert_eq!(
            next_chunk(1024, 1, 1024),
            1024,
            "nor below it when it is under a page"
        );
    }
}
