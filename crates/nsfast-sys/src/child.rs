//! Helpers for `pre_exec` closures of child processes nsfast starts.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Makes `cmd`'s process die with the thread that starts it and, when `cpu` is given, start
/// pinned to that CPU. Applied in the child before exec (after any earlier `pre_exec` hooks,
/// such as [`crate::netns::configure_command`]'s).
pub fn configure(cmd: &mut Command, cpu: Option<usize>) {
    // SAFETY: the closure runs between fork and exec and only makes the prctl and
    // sched_setaffinity system calls on values captured by copy; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            die_with_parent_raw()?;
            if let Some(cpu) = cpu {
                crate::sched::set_affinity_raw(cpu)?;
            }
            Ok(())
        });
    }
}

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
