//! Exclusive `flock(2)` locks on private lock files, with a bounded wait.
//!
//! A lock another process holds is waited for at most a deadline, and a termination signal
//! (SIGINT, SIGTERM, SIGHUP) ends the wait at once, blocked or not: nothing has changed yet
//! while a caller waits for its lock, so giving up is always safe. Either way the error names
//! the process that holds the lock (from `/proc/locks`), so an operator can see who stalls.
//!
//! Lock files are created `0600` with `O_NOFOLLOW`: only root (the owner) can open them, so
//! no other user can take the lock and stall every change.

use std::fs::File;
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

/// How long a lock is waited for unless `NSFAST_LOCK_TIMEOUT_SECS` says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// The wait bound: `$NSFAST_LOCK_TIMEOUT_SECS` (whole seconds, 1-86400) or [`DEFAULT_TIMEOUT`].
pub fn timeout_from_env() -> Duration {
    std::env::var("NSFAST_LOCK_TIMEOUT_SECS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| (1..=86_400).contains(s))
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_TIMEOUT)
}

/// Why a lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is held by {holder}; gave up after {} s (set NSFAST_LOCK_TIMEOUT_SECS to wait longer)", path.display(), waited.as_secs())]
    TimedOut {
        path: PathBuf,
        holder: Holder,
        waited: Duration,
    },
    #[error("{signal} received while waiting for {} (held by {holder}); nothing was changed", path.display())]
    Interrupted {
        path: PathBuf,
        holder: Holder,
        signal: nix::sys::signal::Signal,
    },
}

impl LockError {
    /// The `io::ErrorKind` a caller that speaks `io::Error` reports.
    pub fn kind(&self) -> io::ErrorKind {
        match self {
            LockError::Io { source, .. } => source.kind(),
            LockError::TimedOut { .. } => io::ErrorKind::TimedOut,
            LockError::Interrupted { .. } => io::ErrorKind::Interrupted,
        }
    }
}

/// The process that holds a lock, as `/proc/locks` tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// `None` when no holder was found (it let go meanwhile, or lives in a PID namespace
    /// this process cannot see).
    pub pid: Option<i32>,
    pub comm: Option<String>,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.pid, &self.comm) {
            (Some(p), Some(c)) => write!(f, "pid {p} ({c})"),
            (Some(p), None) => write!(f, "pid {p}"),
            _ => write!(f, "a process this one cannot see"),
        }
    }
}

/// Opens (creating it `0600` if needed) the lock file at `path` without following a symbolic
/// link, and makes an existing one `0600`.
pub fn open_private(path: &Path) -> io::Result<File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ));
    }
    if meta.mode() & 0o077 != 0 {
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(f)
}

/// Takes an exclusive lock on `file` (opened from `path`), waiting at most `timeout`.
/// A termination signal ends the wait: it is taken from the pending set when the caller
/// blocked the termination signals, and is otherwise delivered as usual.
pub fn lock_exclusive(
    file: File,
    path: &Path,
    timeout: Duration,
) -> Result<Flock<File>, LockError> {
    let start = Instant::now();
    let ino = file.metadata().ok().map(|m| (m.dev(), m.ino()));
    let mut file = file;
    let mut pause = Duration::from_millis(2);
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(l),
            Err((f, nix::errno::Errno::EWOULDBLOCK)) => file = f,
            Err((_, nix::errno::Errno::EINTR)) => {
                return Err(LockError::Io {
                    path: path.into(),
                    source: io::Error::from(io::ErrorKind::Interrupted),
                })
            }
            Err((_, e)) => {
                return Err(LockError::Io {
                    path: path.into(),
                    source: e.into(),
                })
            }
        }
        let holder = || {
            ino.map(|(d, i)| holder_of(d, i)).unwrap_or(Holder {
                pid: None,
                comm: None,
            })
        };
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(LockError::TimedOut {
                path: path.into(),
                holder: holder(),
                waited,
            });
        }
        if waited >= Duration::from_secs(1) && pause < Duration::from_millis(50) {
            tracing::info!("waiting for {} (held by {})", path.display(), holder());
            pause = Duration::from_millis(50);
        }
        let nap = pause.min(timeout - waited);
        if let Some(signal) = wait_signal(nap) {
            return Err(LockError::Interrupted {
                path: path.into(),
                holder: holder(),
                signal,
            });
        }
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Sleeps `d`, or less if a blocked termination signal arrives (then returns it).
fn wait_signal(d: Duration) -> Option<nix::sys::signal::Signal> {
    let mut cur = nix::sys::signal::SigSet::empty();
    let blocked = nix::sys::signal::pthread_sigmask(
        nix::sys::signal::SigmaskHow::SIG_BLOCK,
        None,
        Some(&mut cur),
    )
    .is_ok()
        && crate::signals::termination_set()
            .iter()
            .all(|s| cur.contains(s));
    if blocked {
        crate::signals::wait_termination_timeout(d)
    } else {
        std::thread::sleep(d);
        None
    }
}

/// The holder of the `flock` lock on inode `ino` of device `dev`, from `/proc/locks`.
pub fn holder_of(dev: u64, ino: u64) -> Holder {
    let text = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    let pid = parse_proc_locks(&text, dev, ino);
    let comm = pid.and_then(|p| {
        std::fs::read_to_string(format!("/proc/{p}/comm"))
            .ok()
            .map(|c| c.trim_end().to_string())
    });
    Holder { pid, comm }
}

/// The PID of the granted `FLOCK` on (`dev`, `ino`) in `/proc/locks` text. Lines look like
/// `3: FLOCK  ADVISORY  WRITE 1234 00:1a:5678 0 EOF` (major and minor in hex); waiters'
/// lines have `->` after the number and are skipped.
pub fn parse_proc_locks(text: &str, dev: u64, ino: u64) -> Option<i32> {
    let major = nix::sys::stat::major(dev);
    let minor = nix::sys::stat::minor(dev);
    text.lines().find_map(|line| {
        let mut w = line.split_whitespace();
        w.next()?; // "N:"
        let kind = w.next()?;
        if kind != "FLOCK" {
            return None;
        }
        let _advisory = w.next()?;
        let _rw = w.next()?;
        let pid: i32 = w.next()?.parse().ok()?;
        let mut id = w.next()?.split(':');
        let maj = u64::from_str_radix(id.next()?, 16).ok()?;
        let min = u64::from_str_radix(id.next()?, 16).ok()?;
        let i: u64 = id.next()?.parse().ok()?;
        (maj == major && min == minor && i == ino && pid > 0).then_some(pid)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_locks_names_the_granted_holder_not_a_waiter() {
        let dev = nix::sys::stat::makedev(0, 0x1a);
        let text = "1: POSIX  ADVISORY  WRITE 99 00:1a:5678 0 EOF\n\
                    2: FLOCK  ADVISORY  WRITE 1234 00:1a:5678 0 EOF\n\
                    2: -> FLOCK  ADVISORY  WRITE 4321 00:1a:5678 0 EOF\n\
                    3: FLOCK  ADVISORY  WRITE 77 00:1b:5678 0 EOF\n";
        assert_eq!(parse_proc_locks(text, dev, 5678), Some(1234));
        assert_eq!(parse_proc_locks(text, dev, 5679), None);
        assert_eq!(
            parse_proc_locks(text, nix::sys::stat::makedev(0, 0x1b), 5678),
            Some(77)
        );
        assert_eq!(parse_proc_locks("garbage\n\n1:\n", dev, 5678), None);
    }

    #[test]
    fn lock_files_are_private_and_symlinks_refused() {
        let dir = std::env::temp_dir().join(format!("nsfast-lockfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.lock");
        std::fs::write(&p, b"").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let f = open_private(&p).unwrap();
        assert_eq!(f.metadata().unwrap().mode() & 0o777, 0o600);
        let q = dir.join("b.lock");
        open_private(&q).unwrap();
        assert_eq!(std::fs::metadata(&q).unwrap().mode() & 0o777, 0o600);
        let l = dir.join("link.lock");
        std::os::unix::fs::symlink(&p, &l).unwrap();
        assert!(
            open_private(&l).is_err(),
            "a symbolic link is never followed"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A fresh directory `nsfast-<tag>-<pid>` in the temp dir, its `held.lock`, and that
    /// lock taken (by an open file description of its own).
    fn held_lock(tag: &str) -> (PathBuf, PathBuf, Flock<File>) {
        let dir = std::env::temp_dir().join(format!("nsfast-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("held.lock");
        let held = lock_exclusive(open_private(&p).unwrap(), &p, Duration::from_secs(1)).unwrap();
        (dir, p, held)
    }

    /// A lock held by another open file description: the wait ends at the deadline and the
    /// error names this process (the holder).
    #[test]
    fn a_held_lock_times_out_naming_its_holder() {
        let (dir, p, held) = held_lock("lockwait");
        let t = Instant::now();
        let e = lock_exclusive(open_private(&p).unwrap(), &p, Duration::from_millis(300))
            .expect_err("held elsewhere");
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        match &e {
            LockError::TimedOut { holder, .. } => {
                assert_eq!(holder.pid, Some(std::process::id() as i32), "{e}")
            }
            other => panic!("expected a time-out, got {other}"),
        }
        assert!(e.to_string().contains("NSFAST_LOCK_TIMEOUT_SECS"), "{e}");
        drop(held);
        lock_exclusive(open_private(&p).unwrap(), &p, Duration::from_millis(300)).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// With the termination signals blocked (as `pod add` and nsfast-cni block them), a
    /// SIGTERM ends the wait for a held lock at once.
    #[test]
    fn sigterm_ends_the_wait() {
        let (dir, p, held) = held_lock("locksig");
        let q = p.clone();
        let r = std::thread::spawn(move || {
            crate::signals::block_termination().unwrap();
            // raise(3) is thread-directed: only this thread (which blocks it) sees it.
            nix::sys::signal::raise(nix::sys::signal::Signal::SIGTERM).unwrap();
            let t = Instant::now();
            let e = lock_exclusive(open_private(&q).unwrap(), &q, Duration::from_secs(30))
                .expect_err("held elsewhere");
            (t.elapsed(), e)
        })
        .join()
        .unwrap();
        assert!(r.0 < Duration::from_secs(5), "{:?}", r.0);
        assert!(
            matches!(
                r.1,
                LockError::Interrupted {
                    signal: nix::sys::signal::Signal::SIGTERM,
                    ..
                }
            ),
            "{}",
            r.1
        );
        drop(held);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
