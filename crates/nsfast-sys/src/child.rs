//! Helpers for `pre_exec` closures of child processes nsfast starts.

use std::io;

/// Makes the calling process receive SIGKILL when its parent thread exits, so a child outlives
/// no crashed or SIGKILLed parent. Async-signal-safe (one `prctl`), for `pre_exec`.
pub fn die_with_parent_raw() -> io::Result<()> {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number and touches no memory of ours.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
