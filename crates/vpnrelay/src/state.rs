//! Finding RootlessKit's child process and which layout it uses, and the lock files that make
//! one relay / one supervisor per bridge.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Errors naming the path or process involved.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("no RootlessKit state at {dir}: {why} (is rootless Docker running for this user? set VPNRELAY_DOCKER_STATE to its state directory, e.g. $XDG_RUNTIME_DIR/dockerd-rootless)")]
    NoState { dir: PathBuf, why: String },
    #[error("no permission to read {0} (RootlessKit state of another user?): run vpnrelay as the user that runs rootless Docker")]
    NoAccess(PathBuf),
    #[error("RootlessKit child PID {pid} (from {file}) is not running")]
    Dead { pid: u32, file: PathBuf },
    #[error("no permission to join RootlessKit child PID {pid} (owned by uid {owner}, we are uid {me}): run vpnrelay as the user that runs rootless Docker")]
    Permission { pid: u32, owner: u32, me: u32 },
    #[error("lock file {path}: {source}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The rootless engine's namespaces.
#[derive(Debug, Clone)]
pub struct Rootless {
    pub state_dir: PathBuf,
    pub child_pid: u32,
    /// `--detach-netns`: the network namespace file, as seen in the child's mount namespace.
    pub netns_file: Option<PathBuf>,
}

/// `$XDG_RUNTIME_DIR`, or `/run/user/<uid>` (cron does not set it).
pub fn runtime_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(format!("/run/user/{}", nix::unistd::getuid())),
    }
}

/// `VPNRELAY_DOCKER_STATE`, or `$XDG_RUNTIME_DIR/dockerd-rootless`.
pub fn state_dir() -> PathBuf {
    match std::env::var_os("VPNRELAY_DOCKER_STATE") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => runtime_dir().join("dockerd-rootless"),
    }
}

/// The PID in a PID file (`child_pid`, `docker.pid`, a lock file): one decimal number,
/// surrounding white space allowed; 0 is not a PID.
pub fn parse_pid(text: &str) -> Option<u32> {
    text.trim().parse().ok().filter(|&p| p != 0)
}

impl Rootless {
    /// Reads `child_pid` and checks that the process runs and that we may join it.
    pub fn find() -> Result<Self, StateError> {
        let dir = state_dir();
        let mut file = dir.join("child_pid");
        // Docker < 23 (Debian 12's 20.10) starts RootlessKit without --state-dir (it picks
        // /tmp/rootlesskitNNN): then dockerd's own PID, from $XDG_RUNTIME_DIR/docker.pid, is
        // in the same user, mount and network namespaces as RootlessKit's child.
        let docker_pid = runtime_dir().join("docker.pid");
        if !file.exists()
            && std::env::var_os("VPNRELAY_DOCKER_STATE").is_none()
            && docker_pid.exists()
        {
            file = docker_pid;
        }
        let text = fs::read_to_string(&file).map_err(|e| {
            if e.kind() == io::ErrorKind::PermissionDenied {
                StateError::NoAccess(file.clone())
            } else {
                StateError::NoState {
                    dir: dir.clone(),
                    why: format!("cannot read {}: {e}", file.display()),
                }
            }
        })?;
        let pid = parse_pid(&text).ok_or_else(|| StateError::NoState {
            dir: dir.clone(),
            why: format!("{} holds {:?}, not a PID", file.display(), text.trim()),
        })?;
        use std::os::unix::fs::MetadataExt;
        let meta = fs::metadata(format!("/proc/{pid}")).map_err(|_| StateError::Dead {
            pid,
            file: file.clone(),
        })?;
        let me = nix::unistd::getuid().as_raw();
        if meta.uid() != me && me != 0 {
            return Err(StateError::Permission {
                pid,
                owner: meta.uid(),
                me,
            });
        }
        if let Err(e) = File::open(format!("/proc/{pid}/ns/user")) {
            if e.kind() == io::ErrorKind::PermissionDenied {
                return Err(StateError::Permission {
                    pid,
                    owner: meta.uid(),
                    me,
                });
            }
            return Err(StateError::Dead { pid, file });
        }
        // --detach-netns: RootlessKit >= 2 bind-mounts the namespace at <state>/netns (only
        // visible in the child's mount namespace); RootlessKit 1.x never creates that file.
        let netns = dir.join("netns");
        let netns_file = netns.exists().then_some(netns);
        Ok(Self {
            state_dir: dir,
            child_pid: pid,
            netns_file,
        })
    }
}

/// An exclusive `flock` held for the life of the value; the file holds the holder's PID.
#[derive(Debug)]
pub struct Lock {
    file: File,
    path: PathBuf,
}

/// Result of trying to take a lock.
pub enum TryLock {
    Taken(Lock),
    /// Somebody holds it; their PID if they wrote one.
    Busy(Option<u32>),
}

fn lock_dir() -> PathBuf {
    runtime_dir().join("vpnrelay")
}

/// The lock file for `what` (`relay` or `supervise`) on `bridge`.
pub fn lock_path(what: &str, bridge: &str) -> PathBuf {
    lock_dir().join(format!("{what}-{bridge}.lock"))
}

impl Lock {
    /// Takes the lock without waiting.
    pub fn try_take(path: &Path) -> Result<TryLock, StateError> {
        let err = |source| StateError::Lock {
            path: path.to_path_buf(),
            source,
        };
        if let Some(d) = path.parent() {
            fs::create_dir_all(d).map_err(err)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(err)?;
        // SAFETY: flock on a descriptor we own; no memory is involved.
        let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut s = String::new();
                let _ = file.read_to_string(&mut s);
                return Ok(TryLock::Busy(parse_pid(&s)));
            }
            return Err(err(e));
        }
        file.set_len(0).map_err(err)?;
        file.rewind().map_err(err)?;
        writeln!(file, "{}", std::process::id()).map_err(err)?;
        Ok(TryLock::Taken(Lock {
            file,
            path: path.to_path_buf(),
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keeps the lock across exec in a child (clears close-on-exec).
    pub fn inherit(&self) {
        let _ = nix::fcntl::fcntl(
            &self.file,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// fuzz/fuzz_targets/rootlesskit_state.rs asserts that a PID parsed from a state file is
    /// a PID: `0` was taken as one ("PID 0 is not running") instead of "holds \"0\", not a PID".
    #[test]
    fn pid_files_hold_one_pid() {
        assert_eq!(parse_pid("12345\n"), Some(12345));
        assert_eq!(parse_pid("  987 "), Some(987));
        assert_eq!(parse_pid("0\n"), None);
        assert_eq!(parse_pid(""), None);
        assert_eq!(parse_pid("12 34"), None);
        assert_eq!(parse_pid("-1"), None);
        assert_eq!(parse_pid("4294967296"), None);
    }
}
