//! Starting processes inside a topology's namespace and cgroup, pinned to a CPU, and waiting
//! for them while watching for SIGINT/SIGTERM. A [`ChildGuard`] kills (by PID) and reaps its
//! process on every exit path.

use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nsfast_sys::netns::NetNs;

use crate::BenchError;

/// How to start a worker: the program and the arguments before the spec
/// (for the nsfast binary: its own path and `bench-worker`).
#[derive(Debug, Clone)]
pub struct Launcher {
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl Launcher {
    /// The running executable re-executed as `EXE bench-worker`.
    pub fn current_exe() -> std::io::Result<Self> {
        Ok(Self {
            program: std::env::current_exe()?,
            args: vec!["bench-worker".into()],
        })
    }
}

/// A child process that is killed and reaped when dropped.
#[derive(Debug)]
pub struct ChildGuard {
    pub child: Child,
    pub what: String,
    stdout: Option<BufReader<ChildStdout>>,
}

/// Builds a command that starts inside `ns` and `cgroup`, pinned to `cpu`, and is killed if
/// the thread that started it dies (so a SIGKILLed run leaves no worker or sockperf behind).
pub fn command_in(
    program: &Path,
    args: &[String],
    ns: &NetNs,
    cgroup: &Path,
    cpu: Option<usize>,
) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    nsfast_sys::netns::configure_command(&mut cmd, Some(ns), Some(&cgroup.join("cgroup.procs")));
    nsfast_sys::child::configure(&mut cmd, cpu);
    cmd
}

impl ChildGuard {
    pub fn spawn(mut cmd: Command, what: impl Into<String>) -> Result<Self, BenchError> {
        let what = what.into();
        let mut child = cmd.spawn().map_err(|e| BenchError::Spawn {
            what: what.clone(),
            source: e,
        })?;
        let stdout = child.stdout.take().map(BufReader::new);
        Ok(Self {
            child,
            what,
            stdout,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stdout(&mut self) -> &mut BufReader<ChildStdout> {
        self.stdout.as_mut().expect("stdout is piped")
    }

    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.child.stdin.take()
    }

    /// Everything the child wrote on stderr (after it exited), trimmed.
    pub fn stderr_text(&mut self) -> String {
        let mut s = String::new();
        if let Some(e) = self.child.stderr.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s.trim().to_string()
    }

    /// Waits for the child to exit within `limit`, returning early with
    /// [`BenchError::Interrupted`] if SIGINT/SIGTERM arrives (the child is then killed).
    pub fn wait(&mut self, limit: Duration) -> Result<ExitStatus, BenchError> {
        let end = Instant::now() + limit;
        loop {
            match self.child.try_wait() {
                Ok(Some(st)) => return Ok(st),
                Ok(None) => {}
                Err(e) => {
                    return Err(BenchError::Spawn {
                        what: self.what.clone(),
                        source: e,
                    })
                }
            }
            check_interrupt()?;
            if Instant::now() >= end {
                self.kill();
                return Err(BenchError::Timeout {
                    what: self.what.clone(),
                    secs: limit.as_secs_f64(),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills the child (by its PID) and reaps it.
    pub fn kill(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Returns [`BenchError::Interrupted`] if a termination signal is pending (the caller
/// blocked them with `nsfast_sys::signals::block_termination`).
pub fn check_interrupt() -> Result<(), BenchError> {
    match nsfast_sys::signals::pending_termination() {
        Some(sig) => Err(BenchError::Interrupted(sig.as_str().to_string())),
        None => Ok(()),
    }
}

/// Sleeps for `d`, waking early with an error on SIGINT/SIGTERM.
pub fn sleep_interruptible(d: Duration) -> Result<(), BenchError> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        check_interrupt()?;
        std::thread::sleep((end - Instant::now()).min(Duration::from_millis(20)));
    }
    Ok(())
}
