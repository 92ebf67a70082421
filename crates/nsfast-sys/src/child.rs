//! Helpers for `pre_exec` closures of child processes nsfast starts.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::sys::signal::Signal;

/// Makes `cmd`'s process die with the thread that starts it and, when `cpu` is given, start
/// pinned to that CPU. Applied in the child before exec (after any earlier `pre_exec` hooks,
/// such as [`crate::netns::configure_command`]'s).
pub fn configure(cmd: &mut Command, cpu: Option<usize>) {
    // SAFETY: the closure runs between fork and exec and only makes the prctl and
    // sched_setaffinity system calls on values captured by copy; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            die_with_parent_raw(Signal::SIGKILL)?;
            if let Some(cpu) = cpu {
                crate::sched::set_affinity_raw(cpu)?;
            }
            Ok(())
        });
    }
}

/// Makes `cmd`'s process receive `sig` when the thread that spawned it dies
/// (`PR_SET_PDEATHSIG`), so a supervised child never outlives a killed supervisor.
pub fn die_with_parent(cmd: &mut Command, sig: Signal) {
    // SAFETY: the closure runs in the child between fork and exec and only calls prctl
    // (die_with_parent_raw), which is async-signal-safe; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || die_with_parent_raw(sig));
    }
}

/// Makes the calling process receive `sig` when its parent thread exits, so a child outlives
/// no crashed or SIGKILLed parent. Async-signal-safe (one `prctl`), for `pre_exec`.
pub fn die_with_parent_raw(sig: Signal) -> io::Result<()> {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number and touches no memory of ours.
    crate::syscall::cvt(unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            sig as libc::c_int as libc::c_ulong,
            0,
            0,
            0,
        )
    })
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    // The child reads its parent-death signal back (PR_GET_PDEATHSIG) in a later pre_exec
    // hook and exits with it as its status.
    #[test]
    fn the_child_gets_the_signal_asked_for() {
        for sig in [Signal::SIGKILL, Signal::SIGTERM] {
            let mut cmd = Command::new("true");
            die_with_parent(&mut cmd, sig);
            // SAFETY: the closure runs between fork and exec, calls prctl(PR_GET_PDEATHSIG)
            // into a local and _exit, both async-signal-safe; it allocates nothing.
            unsafe {
                cmd.pre_exec(|| {
                    let mut got: libc::c_int = 0;
                    libc::prctl(libc::PR_GET_PDEATHSIG, &mut got as *mut libc::c_int);
                    libc::_exit(got);
                });
            }
            let st = cmd.status().unwrap();
            assert_eq!(st.code(), Some(sig as i32));
        }
    }
}
