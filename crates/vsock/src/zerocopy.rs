//! `MSG_ZEROCOPY` on the relay's AF_VSOCK sends (Linux 6.7+, `--zerocopy`): data read from the
//! other leg into a buffer of a small pool is sent with `send(MSG_ZEROCOPY)`, so the kernel
//! takes the buffer's pages instead of copying them into a new skb; the buffer goes back to the
//! pool only after the kernel's completion for it arrived on the socket's error queue.
//!
//! - Every successful zero-copy send call takes the next number of the socket's 32-bit
//!   counter (it wraps); a completion covers the calls `lo..=hi`, in any order, possibly
//!   coalesced, possibly with `SO_EE_CODE_ZEROCOPY_COPIED` (the kernel copied after all, e.g.
//!   a send larger than the peer's credit). Sends are non-blocking (`MSG_DONTWAIT`), so one
//!   call makes at most one enqueue and one counter number (a blocking send of more than the
//!   peer's credit loops inside the kernel and would take several). A completion for a number
//!   never sent, or one already completed, ends the connection's zero-copy use with an error
//!   (the kernel alone writes the error queue; this only guards against a misunderstanding).
//! - At most [`MAX_IN_FLIGHT`] buffers of [`CHUNK`] bytes wait for completions; with all of
//!   them out the pump waits for POLLERR (completions), which is the backpressure.
//! - At the end (EOF, or an error) the pump waits for the outstanding completions: they come
//!   when the peer has read the data, or when the peer's socket is closed and its queue freed.
//!   If they do not come within [`DRAIN_LIMIT`] of no progress, the buffers are abandoned
//!   (leaked on purpose and counted: the peer might still read them, so their memory is never
//!   reused). Freeing them would be memory-safe (the kernel holds its own page references) but
//!   could change bytes not yet delivered.

use std::collections::VecDeque;
use std::io;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{getsockopt, sockopt};
use nsfast_sys::kernel::KernelVersion;
use nsfast_sys::zerocopy as zc;
use serde::Serialize;

use crate::conn::Conn;
use crate::idle::{self, Activity};

/// Bytes per zero-copy send: one vsock packet (VIRTIO_VSOCK_MAX_PKT_BUF_SIZE), so a send fits
/// the peer's credit more often (the kernel copies a send that does not fit whole).
pub const CHUNK: usize = 64 << 10;
/// Most buffers waiting for their completion.
pub const MAX_IN_FLIGHT: usize = 16;
/// How long the end of a connection waits for outstanding completions without progress.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(5);

/// `--zerocopy`: MSG_ZEROCOPY on the relay's AF_VSOCK sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ZeroCopy {
    /// Where it measured faster (see [`decide`]), else copies; an old kernel falls back
    /// quietly (the reason logged once).
    #[default]
    Auto,
    /// On every AF_VSOCK send leg, or an error (Linux 6.7+).
    On,
    /// Never.
    Off,
}

impl std::str::FromStr for ZeroCopy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(ZeroCopy::Auto),
            "on" => Ok(ZeroCopy::On),
            "off" => Ok(ZeroCopy::Off),
            _ => Err(format!("invalid zerocopy mode {s:?}: use auto, on or off")),
        }
    }
}

/// The first kernel with MSG_ZEROCOPY for AF_VSOCK.
pub const MIN_KERNEL: (u32, u32) = (6, 7);

/// Whether `mode` on kernel `kv` uses zero-copy sends: `Ok(true)` / `Ok(false)` with the reason
/// to log (once), `Err` for `on` where it cannot work.
///
/// `auto` is off: measured in the 7.2 guest over vsock loopback (docs/vsock.md, "Zero-copy
/// sends"), zero-copy sends were not faster than the copy path there.
pub fn decide(mode: ZeroCopy, kv: KernelVersion) -> Result<(bool, Option<String>), String> {
    let new_enough = kv.at_least(MIN_KERNEL.0, MIN_KERNEL.1);
    match mode {
        ZeroCopy::Off => Ok((false, None)),
        ZeroCopy::On if new_enough => Ok((true, None)),
        ZeroCopy::On => Err(format!(
            "--zerocopy on needs Linux {}.{} or later for MSG_ZEROCOPY on AF_VSOCK (this kernel is {kv})",
            MIN_KERNEL.0, MIN_KERNEL.1
        )),
        ZeroCopy::Auto if !new_enough => Ok((
            false,
            Some(format!(
                "kernel {kv} < {}.{}: no MSG_ZEROCOPY for AF_VSOCK, copying",
                MIN_KERNEL.0, MIN_KERNEL.1
            )),
        )),
        ZeroCopy::Auto => Ok((
            false,
            Some(
                "zero-copy vsock sends were not faster than copies where measured (--zerocopy on \
                 forces them)"
                    .into(),
            ),
        )),
    }
}

/// What the zero-copy sends of one direction did.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct ZcStats {
    /// Zero-copy send calls.
    pub sends: u64,
    /// Send calls the kernel's completions covered.
    pub completions: u64,
    /// Of those, the ones the kernel copied after all (SO_EE_CODE_ZEROCOPY_COPIED).
    pub copied: u64,
    /// Buffers given up at the end without a completion (leaked, never reused).
    pub abandoned: u64,
}

impl ZcStats {
    pub fn add(&mut self, o: &ZcStats) {
        self.sends += o.sends;
        self.completions += o.completions;
        self.copied += o.copied;
        self.abandoned += o.abandoned;
    }
}

/// A completion that does not fit what was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("zero-copy completion {lo}..={hi} does not match the sends in flight ({first}..{next})")]
pub struct Unexpected {
    pub lo: u32,
    pub hi: u32,
    pub first: u32,
    pub next: u32,
}

/// The socket's zero-copy counter, as far as this side knows it: numbers `done..next` are in
/// flight (wrapping u32 arithmetic; fewer than 2^31 in flight), `early` the ranges completed
/// out of order above `done`.
#[derive(Debug, Default)]
pub struct Tracker {
    next: u32,
    done: u32,
    early: Vec<(u32, u32)>,
    pub stats: ZcStats,
}

impl Tracker {
    /// Counts one successful zero-copy send call; returns its number.
    pub fn sent(&mut self) -> u32 {
        let n = self.next;
        self.next = self.next.wrapping_add(1);
        self.stats.sends += 1;
        n
    }

    /// Send calls not yet completed.
    pub fn outstanding(&self) -> u32 {
        self.next.wrapping_sub(self.done)
    }

    /// Whether send call `n` (a number [`Tracker::sent`] returned) is complete: every number
    /// up to `n` is (buffers are recycled in order).
    pub fn is_done(&self, n: u32) -> bool {
        // n is done iff it lies before `done` (in serial-number order: less than 2^31 behind).
        (self.done.wrapping_sub(n) as i32) > 0
    }

    /// Applies a completion of calls `lo..=hi`.
    pub fn complete(&mut self, lo: u32, hi: u32, copied: bool) -> Result<(), Unexpected> {
        let window = self.outstanding();
        let (rl, rh) = (lo.wrapping_sub(self.done), hi.wrapping_sub(self.done));
        let overlaps = self.early.iter().any(|&(a, b)| {
            let (ra, rb) = (a.wrapping_sub(self.done), b.wrapping_sub(self.done));
            rl <= rb && ra <= rh
        });
        if rl > rh || rh >= window || overlaps {
            return Err(Unexpected {
                lo,
                hi,
                first: self.done,
                next: self.next,
            });
        }
        let n = u64::from(rh - rl) + 1;
        self.stats.completions += n;
        if copied {
            self.stats.copied += n;
        }
        self.early.push((lo, hi));
        // Advance over every range that now starts at `done`.
        while let Some(i) = self.early.iter().position(|&(a, _)| a == self.done) {
            let (_, b) = self.early.swap_remove(i);
            self.done = b.wrapping_add(1);
        }
        Ok(())
    }
}

/// The zero-copy sender of one direction: a pool of buffers, the ones in flight with the
/// number of their last send call.
struct Sender<'a> {
    fd: BorrowedFd<'a>,
    free: Vec<Vec<u8>>,
    flight: VecDeque<(u32, Vec<u8>)>,
    allocated: usize,
    t: Tracker,
    scratch: Vec<zc::Completion>,
    /// The last [`Sender::reap`] read a completion.
    reaped_any: bool,
}

/// poll() on one descriptor; returns revents (empty on timeout).
fn poll_one(fd: BorrowedFd<'_>, events: PollFlags, timeout: Duration) -> io::Result<PollFlags> {
    let mut p = [PollFd::new(fd, events)];
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    match poll(
        &mut p,
        PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
    ) {
        Ok(0) => Ok(PollFlags::empty()),
        Ok(_) => Ok(p[0].revents().unwrap_or(PollFlags::empty())),
        Err(Errno::EINTR) => Ok(PollFlags::empty()),
        Err(e) => Err(e.into()),
    }
}

impl<'a> Sender<'a> {
    fn new(fd: BorrowedFd<'a>) -> Self {
        Self {
            fd,
            free: Vec::new(),
            flight: VecDeque::new(),
            allocated: 0,
            t: Tracker::default(),
            scratch: Vec::new(),
            reaped_any: false,
        }
    }

    /// Reads the error queue and recycles the buffers whose sends are complete; whether a
    /// buffer was freed.
    fn reap(&mut self) -> io::Result<bool> {
        self.scratch.clear();
        zc::read_completions(self.fd, &mut self.scratch)?;
        self.reaped_any = !self.scratch.is_empty();
        for c in &self.scratch {
            self.t
                .complete(c.lo, c.hi, c.copied)
                .map_err(|e| io::Error::other(e.to_string()))?;
        }
        let mut freed = false;
        while let Some((last, _)) = self.flight.front() {
            if !self.t.is_done(*last) {
                break;
            }
            if let Some((_, b)) = self.flight.pop_front() {
                self.free.push(b);
                freed = true;
            }
        }
        Ok(freed)
    }

    /// A free buffer: recycled, new while fewer than MAX_IN_FLIGHT exist, or after waiting for
    /// completions (POLLERR).
    fn buffer(&mut self, act: Option<&Activity>, tick: Duration) -> io::Result<Vec<u8>> {
        loop {
            if let Some(b) = self.free.pop() {
                return Ok(b);
            }
            if self.allocated < MAX_IN_FLIGHT {
                self.allocated += 1;
                return Ok(vec![0u8; CHUNK]);
            }
            if self.reap()? {
                continue;
            }
            let ev = poll_one(self.fd, PollFlags::empty(), tick)?;
            if ev.is_empty() {
                if let Some(a) = act {
                    a.check()?;
                }
            } else if ev.contains(PollFlags::POLLERR) {
                if !self.reap()? && !self.reaped_any {
                    // POLLERR without a completion: the socket's own error (a reset).
                    self.socket_error()?;
                }
            } else if ev.contains(PollFlags::POLLHUP) {
                return Err(io::Error::from(io::ErrorKind::BrokenPipe));
            }
        }
    }

    /// Sends all of `buf[..n]` (several calls when the peer's credit is short), then puts the
    /// buffer in flight.
    fn send(
        &mut self,
        buf: Vec<u8>,
        n: usize,
        act: Option<&Activity>,
        tick: Duration,
    ) -> io::Result<()> {
        let mut off = 0;
        let mut last = None;
        let r = loop {
            if off == n {
                break Ok(());
            }
            match zc::send(self.fd, &buf[off..n]) {
                Ok(0) => {
                    break Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "send wrote nothing",
                    ))
                }
                Ok(m) => {
                    off += m;
                    last = Some(self.t.sent());
                    if let Some(a) = act {
                        a.touch();
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // No credit: wait for room (POLLOUT) or completions (POLLERR).
                    let ev = match poll_one(self.fd, PollFlags::POLLOUT, tick) {
                        Ok(ev) => ev,
                        Err(e) => break Err(e),
                    };
                    if ev.contains(PollFlags::POLLERR) {
                        let r = self.reap().and_then(|_| {
                            if self.reaped_any {
                                Ok(())
                            } else {
                                self.socket_error()
                            }
                        });
                        if let Err(e) = r {
                            break Err(e);
                        }
                    } else if ev.is_empty() {
                        if let Some(Err(e)) = act.map(|a| a.check()) {
                            break Err(e);
                        }
                    }
                }
                Err(e) => break Err(e),
            }
        };
        match last {
            // Part of it went out: the buffer waits for its completion, even after an error.
            Some(l) => self.flight.push_back((l, buf)),
            None => self.free.push(buf),
        }
        r
    }

    /// Takes the socket's pending error (SO_ERROR, which clears it), as an Err; Ok if none.
    fn socket_error(&self) -> io::Result<()> {
        match getsockopt(&self.fd, sockopt::SocketError) {
            Ok(0) => Ok(()),
            Ok(e) => Err(io::Error::from_raw_os_error(e)),
            Err(e) => Err(e.into()),
        }
    }

    /// Waits for the outstanding completions (bounded: [`DRAIN_LIMIT`] without progress), then
    /// abandons what is left.
    fn drain(&mut self) {
        let mut progress = Instant::now();
        while !self.flight.is_empty() {
            match self.reap() {
                Ok(true) => {
                    progress = Instant::now();
                    continue;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!("zero-copy completions: {e}");
                    break;
                }
            }
            if progress.elapsed() >= DRAIN_LIMIT {
                break;
            }
            let left = DRAIN_LIMIT.saturating_sub(progress.elapsed());
            match poll_one(
                self.fd,
                PollFlags::empty(),
                left.min(Duration::from_millis(100)),
            ) {
                Err(_) => break,
                Ok(ev) if ev.contains(PollFlags::POLLERR) => {
                    // A completion (read next turn) or the socket's error: take the error, so
                    // poll does not report it again.
                    let _ = self.reap();
                    if !self.reaped_any {
                        let _ = self.socket_error();
                    }
                }
                // A peer that has gone makes poll return at once: completions come when its
                // socket is freed; look again in a moment instead of spinning.
                Ok(ev) if ev.contains(PollFlags::POLLHUP) => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Ok(_) => {}
            }
        }
        if !self.flight.is_empty() {
            let n = self.flight.len();
            tracing::warn!(
                "{n} zero-copy buffer(s) without a completion after {}: abandoned (not reused)",
                nsfast_sys::args::duration::format(DRAIN_LIMIT)
            );
            self.t.stats.abandoned += n as u64;
            for (_, b) in self.flight.drain(..) {
                // Never reused: the peer may still read these pages.
                std::mem::forget(b);
            }
        }
    }
}

/// Copies `src` → `dst` (an AF_VSOCK socket) until EOF, sending with MSG_ZEROCOPY, then
/// half-closes `dst` and waits for the outstanding completions. Returns the bytes moved and the
/// zero-copy counts (in `stats`, also on error).
pub(crate) fn pump(
    src: &Conn,
    dst: &Conn,
    total: &mut u64,
    stats: &mut ZcStats,
    act: Option<&Activity>,
    tick: Duration,
) -> io::Result<()> {
    zc::enable(dst.writer())
        .map_err(|e| io::Error::new(e.kind(), format!("SO_ZEROCOPY on {}: {e}", dst.label)))?;
    let mut s = Sender::new(dst.writer());
    let r = (|| -> io::Result<()> {
        loop {
            let mut buf = s.buffer(act, tick)?;
            let n = match idle::read(src.reader(), &mut buf, act) {
                Ok(n) => n,
                Err(e) => {
                    s.free.push(buf);
                    return Err(e);
                }
            };
            if n == 0 {
                s.free.push(buf);
                return dst.shutdown_write();
            }
            if let Some(a) = act {
                a.touch();
            }
            s.send(buf, n, act, tick)?;
            *total += n as u64;
            s.reap()?;
        }
    })();
    if r.is_err() {
        // The connection is over: let the peer know now (the relay aborts both legs next
        // anyway), so that a peer which closed with our data unread is reset and frees it.
        dst.abort();
    }
    s.drain();
    *stats = s.t.stats;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(t: &mut Tracker, n: u32) -> Vec<u32> {
        (0..n).map(|_| t.sent()).collect()
    }

    #[test]
    fn in_order_and_coalesced_completions_free_in_order() {
        let mut t = Tracker::default();
        let ids = sent(&mut t, 4);
        assert_eq!(ids, [0, 1, 2, 3]);
        assert!(!t.is_done(0));
        t.complete(0, 1, false).unwrap();
        assert!(t.is_done(0) && t.is_done(1) && !t.is_done(2));
        t.complete(2, 3, true).unwrap();
        assert!(t.is_done(3));
        assert_eq!(t.outstanding(), 0);
        assert_eq!(
            t.stats,
            ZcStats {
                sends: 4,
                completions: 4,
                copied: 2,
                abandoned: 0
            }
        );
    }

    #[test]
    fn out_of_order_ranges_wait_for_the_gap() {
        let mut t = Tracker::default();
        sent(&mut t, 6);
        t.complete(3, 4, false).unwrap();
        assert!(
            !t.is_done(0) && !t.is_done(3),
            "3..=4 early: nothing free yet"
        );
        t.complete(1, 2, false).unwrap();
        assert!(!t.is_done(1));
        t.complete(0, 0, false).unwrap();
        assert!(t.is_done(4) && !t.is_done(5));
        assert_eq!(t.outstanding(), 1);
        t.complete(5, 5, false).unwrap();
        assert_eq!(t.outstanding(), 0);
    }

    #[test]
    fn the_32_bit_counter_wraps() {
        let mut t = Tracker {
            next: u32::MAX - 1,
            done: u32::MAX - 1,
            ..Tracker::default()
        };
        let ids = sent(&mut t, 4);
        assert_eq!(ids, [u32::MAX - 1, u32::MAX, 0, 1]);
        t.complete(u32::MAX, 0, false).unwrap();
        assert!(!t.is_done(u32::MAX));
        t.complete(u32::MAX - 1, u32::MAX - 1, false).unwrap();
        assert!(t.is_done(u32::MAX - 1) && t.is_done(u32::MAX) && t.is_done(0));
        assert!(!t.is_done(1));
        t.complete(1, 1, true).unwrap();
        assert_eq!(t.outstanding(), 0);
        assert_eq!(t.stats.completions, 4);
        assert_eq!(t.stats.copied, 1);
    }

    #[test]
    fn completions_for_numbers_never_sent_or_twice_are_refused() {
        let mut t = Tracker::default();
        sent(&mut t, 3);
        assert!(t.complete(0, 3, false).is_err(), "3 was never sent");
        assert!(t.complete(2, 1, false).is_err(), "reversed range");
        t.complete(1, 1, false).unwrap();
        assert!(t.complete(1, 2, false).is_err(), "1 already complete");
        t.complete(0, 0, false).unwrap();
        assert!(t.complete(0, 0, false).is_err(), "0 already complete");
        assert!(t.complete(7, 9, false).is_err());
        t.complete(2, 2, false).unwrap();
        assert_eq!(t.outstanding(), 0);
        assert_eq!(t.stats.completions, 3);
    }

    #[test]
    fn numbers_not_yet_sent_are_not_done() {
        let mut t = Tracker::default();
        sent(&mut t, 2);
        t.complete(0, 1, false).unwrap();
        assert!(!t.is_done(2) && !t.is_done(3), "not handed out yet");
    }

    #[test]
    fn on_refuses_old_kernels_and_auto_falls_back_with_a_reason() {
        let old = KernelVersion::new(6, 1, 0);
        let new = KernelVersion::new(7, 2, 0);
        let e = decide(ZeroCopy::On, old).unwrap_err();
        assert!(e.contains("6.7") && e.contains("6.1.0"), "{e}");
        assert_eq!(
            decide(ZeroCopy::On, KernelVersion::new(6, 7, 0)),
            Ok((true, None))
        );
        let (use_it, why) = decide(ZeroCopy::Auto, old).unwrap();
        assert!(!use_it && why.unwrap().contains("6.1.0"));
        assert_eq!(decide(ZeroCopy::Off, new), Ok((false, None)));
        assert_eq!(decide(ZeroCopy::Off, old), Ok((false, None)));
        assert!(decide(ZeroCopy::Auto, new).unwrap().1.is_some());
        assert_eq!("on".parse::<ZeroCopy>(), Ok(ZeroCopy::On));
        assert!("yes"
            .parse::<ZeroCopy>()
            .unwrap_err()
            .contains("auto, on or off"));
    }
}
