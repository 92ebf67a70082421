//! Synchronous signal handling: block SIGINT/SIGTERM (and SIGHUP) early in `main`, before any
//! thread starts, then wait for one where it suits the program.

use nix::sys::signal::{SigSet, SigmaskHow, Signal};

/// The termination signals nsfast's long-running commands react to.
pub fn termination_set() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGHUP);
    set
}

/// Blocks the termination signals in the calling thread (and in threads it spawns later).
pub fn block_termination() -> nix::Result<()> {
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&termination_set()), None)
}

/// Waits until a termination signal arrives (they must be blocked first).
pub fn wait_termination() -> nix::Result<Signal> {
    termination_set().wait()
}

/// [`wait_termination_timeout`] for a daemon (a relay, the bridge, `sockmap run`, vpnrelay):
/// SIGHUP (a terminal's hang-up, `systemctl reload`) is logged and changes nothing, and only
/// SIGINT or SIGTERM is returned. A daemon's options are fixed at start, so there is nothing
/// to re-read, and stopping would exit 0, which `Restart=on-failure` does not restart: the
/// service would be gone for good.
pub fn wait_stop_timeout(timeout: std::time::Duration) -> Option<Signal> {
    match wait_termination_timeout(timeout) {
        Some(Signal::SIGHUP) => {
            tracing::info!("received SIGHUP: nothing to reload, still running (SIGTERM stops)");
            None
        }
        other => other,
    }
}

/// [`wait_stop_timeout`] without a bound: waits for SIGINT or SIGTERM.
pub fn wait_stop() -> Signal {
    loop {
        if let Some(s) = wait_stop_timeout(std::time::Duration::from_secs(3600)) {
            return s;
        }
    }
}

/// [`wait_stop_timeout`] without waiting: a pending SIGINT or SIGTERM.
pub fn pending_stop() -> Option<Signal> {
    wait_stop_timeout(std::time::Duration::ZERO)
}

/// Returns a termination signal if one is pending, without waiting.
pub fn pending_termination() -> Option<Signal> {
    wait_termination_timeout(std::time::Duration::ZERO)
}

/// Waits up to `timeout` for a termination signal (they must be blocked first).
pub fn wait_termination_timeout(timeout: std::time::Duration) -> Option<Signal> {
    let set = termination_set();
    let ts = nix::sys::time::TimeSpec::from_duration(timeout);
    loop {
        let mut info = std::mem::MaybeUninit::<libc::siginfo_t>::uninit();
        // SAFETY: `set` is a valid sigset_t, `info` is writable storage for one siginfo_t and
        // `ts` is a valid timespec; sigtimedwait does not retain any of the pointers.
        let r = unsafe { libc::sigtimedwait(set.as_ref(), info.as_mut_ptr(), ts.as_ref()) };
        if r > 0 {
            return Signal::try_from(r).ok();
        }
        if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        return None;
    }
}

pub use crate::child::die_with_parent;
