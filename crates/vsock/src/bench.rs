//! iperf-vsock-like throughput test: the client sends N bytes and half-closes, the server
//! counts them and answers with the count (8 bytes, little endian), so both ends agree on
//! what arrived. Works on every stream address (vsock, TCP, UNIX, hybrid).

use std::io;
use std::os::fd::BorrowedFd;
use std::time::Instant;

use nix::errno::Errno;
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
    /// CPU time the whole machine was busy during the run (all CPUs, from `/proc/stat`:
    /// user + nice + system + irq + softirq), so on an otherwise idle guest it is what the
    /// client, the server, any relay between them and the kernel's workers spent.
    pub cpu_busy_s: Option<f64>,
    /// `cpu_busy_s` per GB (10^9 bytes) moved.
    pub cpu_s_per_gb: Option<f64>,
}

/// Busy CPU seconds of the whole machine so far (`None` when `/proc/stat` cannot be read).
fn busy_seconds() -> Option<f64> {
    let cpus = nsfast_sys::procstat::per_cpu_times().ok()?;
    let ticks: u64 = cpus
        .iter()
        .flatten()
        .map(|t| t.user + t.nice + t.system + t.irq + t.softirq)
        .sum();
    Some(ticks as f64 / nsfast_sys::procstat::user_hz() as f64)
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
        match nix::unistd::write(fd, buf) {
            Ok(n) => buf = &buf[n..],
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn read_some(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match nix::unistd::read(fd, buf) {
            Ok(n) => return Ok(n),
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Serves one connection: counts bytes until EOF, answers with the count.
pub(crate) fn serve_one(c: &Conn, buffer: usize) -> io::Result<u64> {
    let mut buf = vec![0u8; buffer];
    let mut total = 0u64;
    loop {
        let n = read_some(c.reader(), &mut buf)?;
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    write_all(c.writer(), &total.to_le_bytes())?;
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
    tracing::info!("listening on {addr}");
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
    let busy0 = busy_seconds();
    let start = Instant::now();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buffer as u64) as usize;
        write_all(c.writer(), &buf[..n]).map_err(io)?;
        left -= n as u64;
    }
    c.shutdown_write().map_err(io)?;
    let mut reply = [0u8; 8];
    let mut got = 0;
    while got < 8 {
        let n = read_some(c.reader(), &mut reply[got..]).map_err(io)?;
        if n == 0 {
            return Err(io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "server closed before answering",
            )));
        }
        got += n;
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu_busy_s = busy0.zip(busy_seconds()).map(|(a, b)| (b - a).max(0.0));
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
        cpu_busy_s,
        cpu_s_per_gb: cpu_busy_s.map(|c| c / (bytes as f64 / 1e9)),
    })
}
