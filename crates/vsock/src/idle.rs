//! The relay's idle timeout: when a connection last moved a byte, and what a timed-out read
//! or write means (shared by the copy/splice loop in `relay` and the zero-copy sender).

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;

/// When a relayed connection last moved a byte, either way, for the idle timeout.
pub(crate) struct Activity {
    pub(crate) start: Instant,
    pub(crate) last_ms: AtomicU64,
    pub(crate) idle: Duration,
}

impl Activity {
    pub(crate) fn touch(&self) {
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Called when a read or write timed out (SO_RCVTIMEO / SO_SNDTIMEO, a fraction of the
    /// idle timeout): an error once nothing moved either way for the whole idle timeout.
    pub(crate) fn check(&self) -> io::Result<()> {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        if self.start.elapsed().saturating_sub(last) >= self.idle {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "idle for {} (--idle-timeout): closed",
                    nsfast_sys::args::duration::format(self.idle)
                ),
            ));
        }
        Ok(())
    }
}

/// An EAGAIN from a socket read or write: only the idle timeout's SO_RCVTIMEO / SO_SNDTIMEO
/// produce it on these blocking sockets.
pub(crate) fn timed_out(e: Errno, act: Option<&Activity>) -> io::Result<()> {
    match act {
        Some(a) if e == Errno::EAGAIN => a.check(),
        _ => Err(e.into()),
    }
}

/// One read(2), retried on EINTR and on the idle timeout's EAGAIN until nothing moved for the
/// whole idle timeout (then that error): the read of the copy loop and of the zero-copy sender.
pub(crate) fn read(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    act: Option<&Activity>,
) -> io::Result<usize> {
    loop {
        match nix::unistd::read(fd, buf) {
            Ok(n) => return Ok(n),
            Err(Errno::EINTR) => {}
            Err(e) => timed_out(e, act)?,
        }
    }
}
