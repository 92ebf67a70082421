//! iperf-vsock-like throughput test: the client sends N bytes and half-closes, the server
//! counts them and answers with the count (8 bytes, little endian), so both ends agree on
//! what arrived. Works on every stream address (vsock, TCP, UNIX, hybrid).

use std::io;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

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

/// iperf3-style interval lines: `[  0.00-1.00 s]  1.23 GBytes  10.5 Gbit/s`, one per
/// `period`, then the partial last one. Fed the time since the start and the bytes so far,
/// so it runs on any clock (a fake one in the tests).
#[derive(Debug, Clone)]
pub struct Intervals {
    period: Duration,
    /// Where the current interval began: time and bytes.
    from: Duration,
    from_bytes: u64,
}

impl Intervals {
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            from: Duration::ZERO,
            from_bytes: 0,
        }
    }

    /// The line of the interval that ended by `elapsed`, if one did (a late call closes the
    /// interval at `elapsed`: its line covers what really moved in that time).
    pub fn tick(&mut self, elapsed: Duration, total: u64) -> Option<String> {
        if elapsed < self.from + self.period {
            return None;
        }
        Some(self.close(elapsed, total))
    }

    /// The partial last interval's line (none when nothing is left to report).
    pub fn finish(&mut self, elapsed: Duration, total: u64) -> Option<String> {
        (elapsed > self.from && (total > self.from_bytes || self.from.is_zero()))
            .then(|| self.close(elapsed, total))
    }

    fn close(&mut self, elapsed: Duration, total: u64) -> String {
        let line = interval_line(self.from, elapsed, total - self.from_bytes);
        self.from = elapsed;
        self.from_bytes = total;
        line
    }
}

/// `[  0.00-1.00 s]  1.23 GBytes  10.5 Gbit/s`: bytes in binary units (as iperf3's
/// "GBytes"), the rate in decimal bits per second.
pub fn interval_line(from: Duration, to: Duration, bytes: u64) -> String {
    let b = bytes as f64;
    let (amount, unit) = if b >= (1u64 << 30) as f64 {
        (b / (1u64 << 30) as f64, "GBytes")
    } else if b >= (1u64 << 20) as f64 {
        (b / (1u64 << 20) as f64, "MBytes")
    } else if b >= 1024.0 {
        (b / 1024.0, "KBytes")
    } else {
        (b, "Bytes")
    };
    let secs = (to - from).as_secs_f64();
    let bits = if secs > 0.0 { b * 8.0 / secs } else { 0.0 };
    let (rate, runit) = if bits >= 1e9 {
        (bits / 1e9, "Gbit/s")
    } else if bits >= 1e6 {
        (bits / 1e6, "Mbit/s")
    } else if bits >= 1e3 {
        (bits / 1e3, "Kbit/s")
    } else {
        (bits, "bit/s")
    };
    format!(
        "[{:6.2}-{:.2} s]  {} {unit}  {rate:.1} {runit}",
        from.as_secs_f64(),
        to.as_secs_f64(),
        if amount >= 100.0 {
            format!("{amount:.0}")
        } else {
            format!("{amount:.2}")
        }
    )
}

/// Sends `bytes` to the server at `addr` and checks the server's count.
pub fn client(
    addr: &Address,
    bytes: u64,
    buffer: usize,
    sock: SockOpts,
) -> Result<BenchResult, BenchError> {
    client_with_intervals(addr, bytes, buffer, sock, &mut |_| {})
}

/// [`client`], calling `on_interval` with an iperf3-style line once per second while it runs
/// and with the partial last interval at the end ([`Intervals`]).
pub fn client_with_intervals(
    addr: &Address,
    bytes: u64,
    buffer: usize,
    sock: SockOpts,
    on_interval: &mut dyn FnMut(&str),
) -> Result<BenchResult, BenchError> {
    let c = conn::connect(addr, sock)?;
    let io = |e| BenchError::Io(addr.to_string(), e);
    let buf = vec![0x5au8; buffer];
    let busy0 = busy_seconds();
    let start = Instant::now();
    let mut intervals = Intervals::new(Duration::from_secs(1));
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buffer as u64) as usize;
        write_all(c.writer(), &buf[..n]).map_err(io)?;
        left -= n as u64;
        if let Some(line) = intervals.tick(start.elapsed(), bytes - left) {
            on_interval(&line);
        }
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
    let elapsed = start.elapsed();
    let seconds = elapsed.as_secs_f64();
    if let Some(line) = intervals.finish(elapsed, bytes) {
        on_interval(&line);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn one_line_per_second_then_the_partial_last_one() {
        const G: u64 = 1 << 30;
        let mut iv = Intervals::new(Duration::from_secs(1));
        let mut lines = Vec::new();
        // A fake clock and byte counter: writes every 250 ms, 0.25 GiB each.
        for i in 1..=10u64 {
            lines.extend(iv.tick(ms(250 * i), i * G / 4));
        }
        lines.extend(iv.finish(ms(2600), 10 * G / 4));
        assert_eq!(
            lines,
            [
                "[  0.00-1.00 s]  1.00 GBytes  8.6 Gbit/s",
                "[  1.00-2.00 s]  1.00 GBytes  8.6 Gbit/s",
                "[  2.00-2.60 s]  512 MBytes  7.2 Gbit/s",
            ]
        );
    }

    #[test]
    fn a_late_tick_covers_the_real_time_and_nothing_is_repeated() {
        let mut iv = Intervals::new(Duration::from_secs(1));
        assert_eq!(iv.tick(ms(999), 1000), None);
        // The writer was stuck for 2.5 s: one line over the whole stretch.
        assert_eq!(
            iv.tick(ms(2500), 2000).as_deref(),
            Some("[  0.00-2.50 s]  1.95 KBytes  6.4 Kbit/s")
        );
        // Nothing moved since: no empty last line.
        assert_eq!(iv.finish(ms(2600), 2000), None);
        // A run shorter than the period still gets its one line.
        let mut short = Intervals::new(Duration::from_secs(1));
        assert_eq!(
            short.finish(ms(100), 300 << 20).as_deref(),
            Some("[  0.00-0.10 s]  300 MBytes  25.2 Gbit/s")
        );
    }
}
