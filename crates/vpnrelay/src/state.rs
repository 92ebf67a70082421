//! Finding RootlessKit's child process and which layout it uses, and the lock files that make
//! one relay / one supervisor per bridge.
//!
//! Everything here is in the tenant's own directories (`$XDG_RUNTIME_DIR`, RootlessKit's
//! state directory), so it is tenant-controlled. Every file and folder is opened with
//! `O_NOFOLLOW` (a planted symbolic link is refused, never followed) and checked through the
//! open descriptor (`fstat`): owned by the user vpnrelay runs as and not writable by group or
//! others. Nothing is truncated by path: the lock file is opened without `O_TRUNC` and
//! truncated through its descriptor once it is locked. RootlessKit's child is pinned by a
//! pidfd and its owner is checked through the `/proc/<pid>` directory opened while the pidfd
//! is held (see [`Rootless::find`]).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nsfast_sys::userns::Target;

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
    #[error("PID {pid} (from {file}) is not RootlessKit's child: {why}")]
    NotRootless {
        pid: u32,
        file: PathBuf,
        why: String,
    },
    #[error("refusing {path}: {why}")]
    Untrusted { path: PathBuf, why: String },
    #[error("no stats for bridge {bridge}: {} does not exist ({why})", path.display())]
    NoStats {
        bridge: String,
        path: PathBuf,
        why: &'static str,
    },
    #[error("lock file {path}: {source}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

/// The rootless engine's namespaces, pinned: the child is held by a pidfd and its namespaces
/// are open, so a later exit or PID reuse cannot redirect the relay elsewhere.
#[derive(Debug)]
pub struct Rootless {
    pub state_dir: PathBuf,
    pub child_pid: u32,
    /// `--detach-netns`: the network namespace file, as seen in the child's mount namespace.
    pub netns_file: Option<PathBuf>,
    pidfd: OwnedFd,
    target: Target,
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

/// Largest PID the kernel hands out (`PID_MAX_LIMIT` on 64-bit).
pub const PID_MAX: u32 = 4_194_304;

/// Parses a PID file (`child_pid`, `docker.pid`): decimal digits, optionally followed by
/// whitespace (a newline); 1 to [`PID_MAX`]. The error says what was found.
pub fn parse_pid(text: &[u8]) -> Result<u32, String> {
    let end = text
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    let digits = &text[..end];
    let shown = || format!("{:?}", String::from_utf8_lossy(&text[..text.len().min(32)]));
    if digits.is_empty() || digits.len() > 7 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(format!("{} is not a PID", shown()));
    }
    let pid: u32 = std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{} is not a PID", shown()))?;
    if pid == 0 || pid > PID_MAX {
        return Err(format!("{} is not a PID (1-{PID_MAX})", shown()));
    }
    Ok(pid)
}

/// The four user IDs (real, effective, saved, filesystem) of a `/proc/<pid>/status` text.
pub fn parse_status_uids(status: &[u8]) -> Option<[u32; 4]> {
    let line = status
        .split(|&b| b == b'\n')
        .find_map(|l| l.strip_prefix(b"Uid:"))?;
    let text = std::str::from_utf8(line).ok()?;
    let mut it = text.split_ascii_whitespace().map(|s| s.parse::<u32>().ok());
    let ids = [it.next()??, it.next()??, it.next()??, it.next()??];
    it.next().is_none().then_some(ids)
}

fn me() -> u32 {
    nix::unistd::getuid().as_raw()
}

fn io_err(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// Checks what an open descriptor refers to: the expected type, owned by `me`, not writable
/// by group or others.
fn check_owned(st: &FileStat, path: &Path, dir: bool, me: u32) -> Result<(), StateError> {
    let untrusted = |why: String| StateError::Untrusted {
        path: path.to_path_buf(),
        why,
    };
    let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
    let want = if dir { SFlag::S_IFDIR } else { SFlag::S_IFREG };
    if kind != want {
        return Err(untrusted(format!(
            "not a {} (mode {:o})",
            if dir { "directory" } else { "regular file" },
            st.st_mode
        )));
    }
    if st.st_uid != me {
        return Err(untrusted(format!(
            "it belongs to uid {}, not to us (uid {me}): no permission to use another user's files; run vpnrelay as the user that runs rootless Docker",
            st.st_uid
        )));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(untrusted(format!(
            "writable by group or others (mode {:o}); chmod go-w it",
            st.st_mode & 0o7777
        )));
    }
    Ok(())
}

/// Why an open failed.
enum OpenErr {
    Missing(io::Error),
    Other(StateError),
}

/// Opens `name` (relative to `at`, or absolute) with `O_NOFOLLOW | O_CLOEXEC` plus `flags`,
/// and checks the result with [`check_owned`]. `shown` is the full path for messages.
fn open_checked(
    at: Option<BorrowedFd<'_>>,
    name: &Path,
    shown: &Path,
    flags: OFlag,
    mode: Mode,
    dir: bool,
) -> Result<OwnedFd, OpenErr> {
    let flags = flags
        | OFlag::O_NOFOLLOW
        | OFlag::O_CLOEXEC
        | if dir {
            OFlag::O_DIRECTORY
        } else {
            OFlag::empty()
        };
    // RESOLVE_NO_SYMLINKS refuses a symbolic link in any component, not only the last as
    // O_NOFOLLOW does (a parent directory swapped for a link would otherwise be followed).
    // openat2 takes a mode only with O_CREAT/O_TMPFILE; kernels before 5.6 lack it.
    let creates = flags.intersects(OFlag::O_CREAT | OFlag::O_TMPFILE);
    let how = nix::fcntl::OpenHow::new()
        .flags(flags)
        .mode(if creates { mode } else { Mode::empty() })
        .resolve(nix::fcntl::ResolveFlag::RESOLVE_NO_SYMLINKS);
    let r = match at {
        Some(d) => nix::fcntl::openat2(d, name, how),
        None => nix::fcntl::openat2(nix::fcntl::AT_FDCWD, name, how),
    };
    let r = match r {
        Err(Errno::ENOSYS) => match at {
            Some(d) => nix::fcntl::openat(d, name, flags, mode),
            None => nix::fcntl::open(name, flags, mode),
        },
        r => r,
    };
    let fd = r.map_err(|e| match e {
        Errno::ENOENT => OpenErr::Missing(io_err(e)),
        Errno::EACCES | Errno::EPERM => OpenErr::Other(StateError::NoAccess(shown.to_path_buf())),
        // O_NOFOLLOW on a symbolic link: ELOOP (ENOTDIR with O_DIRECTORY).
        Errno::ELOOP | Errno::ENOTDIR => OpenErr::Other(StateError::Untrusted {
            path: shown.to_path_buf(),
            why: "a symbolic link or not a directory: vpnrelay never follows links in its own or RootlessKit's state; remove it".into(),
        }),
        e => OpenErr::Other(StateError::Io {
            what: format!("open {}", shown.display()),
            source: io_err(e),
        }),
    })?;
    let st = nix::sys::stat::fstat(&fd).map_err(|e| {
        OpenErr::Other(StateError::Io {
            what: format!("fstat {}", shown.display()),
            source: io_err(e),
        })
    })?;
    check_owned(&st, shown, dir, me()).map_err(OpenErr::Other)?;
    Ok(fd)
}

/// Reads at most `max` bytes from `fd`.
fn read_bounded(fd: &OwnedFd, max: usize) -> io::Result<Vec<u8>> {
    let mut out = vec![0u8; max];
    let mut n = 0;
    while n < max {
        match nix::unistd::read(fd, &mut out[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(io_err(e)),
        }
    }
    out.truncate(n);
    Ok(out)
}

fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    nsfast_sys::pidfd::open(pid)
}

/// True while the process a pidfd refers to has not exited (a pidfd polls readable once it
/// has).
fn pidfd_alive(pidfd: BorrowedFd<'_>) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(pidfd, PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(0) => true,
        Ok(_) => !fds[0]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP)),
        Err(_) => false,
    }
}

/// Reads the PID in `name` under `at` (shown as `shown` in errors): opened without following
/// links, owner and mode checked, at most 64 bytes.
fn read_pid_file(at: Option<BorrowedFd<'_>>, name: &str, shown: &Path) -> Result<u32, OpenErr> {
    let fd = open_checked(
        at,
        Path::new(name),
        shown,
        OFlag::O_RDONLY | OFlag::O_NONBLOCK,
        Mode::empty(),
        false,
    )?;
    let text = read_bounded(&fd, 64).map_err(|e| {
        OpenErr::Other(StateError::Io {
            what: format!("read {}", shown.display()),
            source: e,
        })
    })?;
    parse_pid(&text).map_err(|why| {
        OpenErr::Other(StateError::NoState {
            dir: shown.parent().unwrap_or(Path::new("/")).to_path_buf(),
            why: format!("{} holds {why}", shown.display()),
        })
    })
}

/// Docker < 23 (Debian 12's 20.10) starts RootlessKit without --state-dir (it picks
/// /tmp/rootlesskitNNN): then dockerd's own PID, from $XDG_RUNTIME_DIR/docker.pid, is in the
/// same user, mount and network namespaces as RootlessKit's child. `child_pid` is the state
/// file that was missing (named in the error when docker.pid is missing too).
fn pid_from_docker(
    child_pid: &Path,
    no_state: impl Fn(String) -> StateError,
) -> Result<(u32, PathBuf), StateError> {
    let rt = runtime_dir();
    let docker_pid = rt.join("docker.pid");
    let rt_fd = match open_checked(None, &rt, &rt, OFlag::O_RDONLY, Mode::empty(), true) {
        Ok(fd) => fd,
        Err(OpenErr::Missing(e)) => {
            return Err(no_state(format!(
                "cannot read {}: {e}",
                child_pid.display()
            )))
        }
        Err(OpenErr::Other(e)) => return Err(e),
    };
    match read_pid_file(Some(rt_fd.as_fd()), "docker.pid", &docker_pid) {
        Ok(pid) => Ok((pid, docker_pid)),
        Err(OpenErr::Missing(e)) => Err(no_state(format!(
            "cannot read {}: {e}",
            child_pid.display()
        ))),
        Err(OpenErr::Other(e)) => Err(e),
    }
}

impl Rootless {
    /// Reads `child_pid` (no links followed, owner and mode checked), pins the process by
    /// pidfd, checks its owner and opens its namespaces.
    pub fn find() -> Result<Self, StateError> {
        let me = me();
        let dir = state_dir();
        let explicit = std::env::var_os("VPNRELAY_DOCKER_STATE").is_some_and(|v| !v.is_empty());
        let no_state = |why: String| StateError::NoState {
            dir: dir.clone(),
            why,
        };
        let state_fd = match open_checked(None, &dir, &dir, OFlag::O_RDONLY, Mode::empty(), true) {
            Ok(fd) => Some(fd),
            Err(OpenErr::Missing(_)) => None,
            Err(OpenErr::Other(e)) => return Err(e),
        };
        let child_pid = dir.join("child_pid");
        let from_state = match &state_fd {
            Some(fd) => match read_pid_file(Some(fd.as_fd()), "child_pid", &child_pid) {
                Ok(pid) => Some(pid),
                Err(OpenErr::Missing(_)) => None,
                Err(OpenErr::Other(e)) => return Err(e),
            },
            None => None,
        };
        let (pid, file) = match from_state {
            Some(pid) => (pid, child_pid),
            // Docker < 23 (Debian 12's 20.10) starts RootlessKit without --state-dir (it picks
            // /tmp/rootlesskitNNN): then dockerd's own PID, from $XDG_RUNTIME_DIR/docker.pid,
            // is in the same user, mount and network namespaces as RootlessKit's child.
            None if !explicit => pid_from_docker(&child_pid, no_state)?,
            None => {
                return Err(no_state(format!(
                    "cannot read {}: {}",
                    child_pid.display(),
                    io::Error::from(io::ErrorKind::NotFound)
                )))
            }
        };
        // --detach-netns: RootlessKit >= 2 bind-mounts the namespace at <state>/netns (only
        // visible in the child's mount namespace); RootlessKit 1.x never creates that file.
        let netns_file = state_fd.as_ref().and_then(|fd| {
            nix::sys::stat::fstatat(fd, "netns", nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                .ok()
                .map(|_| dir.join("netns"))
        });
        let (pidfd, target) = pin(pid, &file, netns_file.as_deref(), me)?;
        Ok(Self {
            state_dir: dir,
            child_pid: pid,
            netns_file,
            pidfd,
            target,
        })
    }

    /// The pinned namespaces, to join with [`Target::configure_command`].
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// True while the pinned RootlessKit child runs.
    pub fn alive(&self) -> bool {
        pidfd_alive(self.pidfd.as_fd())
    }
}

/// Pins `pid` and checks it is ours and in a user namespace of its own.
///
/// Why this is race-free: the pidfd is taken first and refers to one process P for good. The
/// `/proc/<pid>` directory is opened after it and everything (owner, namespaces) is read
/// through that directory descriptor. Then the pidfd is polled: if P has not exited, the PID
/// was P's during the whole sequence (a PID is only handed out again after its process has
/// exited and been reaped), so the directory — and every file read through it — was P's. A
/// `/proc/<pid>` descriptor never moves to a later process with the same PID (lookups through
/// it fail with ESRCH once P is gone), and the namespace descriptors stay P's namespaces.
/// If the PID in the file was already reused by someone else's process before pidfd_open, the
/// owner check below fails on that process; if it was reused by one of ours, joining its
/// namespaces gives us nothing we did not have (and it is refused unless it is in a user
/// namespace of its own).
fn pin(
    pid: u32,
    file: &Path,
    netns_file: Option<&Path>,
    me: u32,
) -> Result<(OwnedFd, Target), StateError> {
    let dead = || StateError::Dead {
        pid,
        file: file.to_path_buf(),
    };
    let pidfd = pidfd_open(pid).map_err(|e| match e.raw_os_error() {
        Some(libc::ESRCH) => dead(),
        _ => StateError::Io {
            what: format!("pidfd_open({pid}) (needs Linux 5.3)"),
            source: e,
        },
    })?;
    let proc_dir = nix::fcntl::open(
        Path::new(&format!("/proc/{pid}")),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|_| dead())?;
    // /proc/<pid>/ns/* are the kernel's own links to the namespaces (followed on purpose);
    // they are looked up through the pinned directory.
    let at = |name: &str, follow: bool| {
        let nofollow = if follow {
            OFlag::empty()
        } else {
            OFlag::O_NOFOLLOW
        };
        nix::fcntl::openat(
            &proc_dir,
            name,
            OFlag::O_RDONLY | OFlag::O_CLOEXEC | nofollow,
            Mode::empty(),
        )
    };
    let gone = |name: &str, e: Errno| match e {
        Errno::ESRCH | Errno::ENOENT => dead(),
        e => StateError::Io {
            what: format!("/proc/{pid}/{name}"),
            source: io_err(e),
        },
    };
    let status = at("status", false).map_err(|e| gone("status", e))?;
    let status = read_bounded(&status, 16 << 10).map_err(|_| dead())?;
    let uids = parse_status_uids(&status).ok_or_else(|| StateError::Io {
        what: format!("/proc/{pid}/status"),
        source: io::Error::new(io::ErrorKind::InvalidData, "no Uid: line"),
    })?;
    if let Some(&owner) = uids.iter().find(|&&u| u != me) {
        return Err(StateError::Permission { pid, owner, me });
    }
    let ns = |name: &str| {
        at(name, true).map_err(|e| match e {
            Errno::EACCES | Errno::EPERM => StateError::Permission {
                pid,
                owner: uids[0],
                me,
            },
            e => gone(name, e),
        })
    };
    let user = ns("ns/user")?;
    let mnt = ns("ns/mnt")?;
    let net = match netns_file {
        Some(_) => None,
        None => Some(ns("ns/net")?),
    };
    let ino = |fd: BorrowedFd<'_>| nix::sys::stat::fstat(fd).map(|s| (s.st_dev, s.st_ino));
    let ours = nix::sys::stat::stat("/proc/self/ns/user").map(|s| (s.st_dev, s.st_ino));
    if ours.is_ok() && ino(user.as_fd()).ok() == ours.ok() {
        return Err(StateError::NotRootless {
            pid,
            file: file.to_path_buf(),
            why: "it is in our own user namespace (RootlessKit's child has one of its own)".into(),
        });
    }
    if !pidfd_alive(pidfd.as_fd()) {
        return Err(dead());
    }
    let target = Target::from_fds(user, mnt, net, netns_file).map_err(|e| StateError::Io {
        what: format!("namespaces of PID {pid}"),
        source: io::Error::other(e.to_string()),
    })?;
    Ok((pidfd, target))
}

/// An exclusive `flock` held for the life of the value; the file holds the holder's PID.
#[derive(Debug)]
pub struct Lock {
    file: Flock<File>,
    path: PathBuf,
}

/// Result of trying to take a lock.
#[derive(Debug)]
pub enum TryLock {
    Taken(Lock),
    /// Somebody holds it; their PID if they wrote one.
    Busy(Option<u32>),
}

/// `$XDG_RUNTIME_DIR/vpnrelay`.
pub(crate) fn lock_dir() -> PathBuf {
    runtime_dir().join("vpnrelay")
}

/// The lock file for `what` (`relay` or `supervise`) on `bridge`.
pub(crate) fn lock_path(what: &str, bridge: &str) -> PathBuf {
    lock_dir().join(format!("{what}-{bridge}.lock"))
}

/// The relay's flow counters for `bridge` (JSON, rewritten about once a second while the
/// relay runs; see docs/vpnrelay.md).
pub(crate) fn stats_path(bridge: &str) -> PathBuf {
    lock_dir().join(format!("relay-{bridge}.stats"))
}

/// Creates (mode 0700) and opens `dir`, no link followed, owner and mode checked.
fn open_own_dir(dir: &Path) -> Result<OwnedFd, StateError> {
    let err = |source| StateError::Lock {
        path: dir.to_path_buf(),
        source,
    };
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(err)?;
    }
    match nix::unistd::mkdir(dir, Mode::S_IRWXU) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(err(io_err(e))),
    }
    match open_checked(None, dir, dir, OFlag::O_RDONLY, Mode::empty(), true) {
        Ok(fd) => Ok(fd),
        Err(OpenErr::Missing(e)) => Err(err(e)),
        Err(OpenErr::Other(e)) => Err(e),
    }
}

fn file_name(path: &Path) -> Result<&Path, StateError> {
    path.file_name()
        .map(Path::new)
        .ok_or_else(|| StateError::Untrusted {
            path: path.to_path_buf(),
            why: "no file name".into(),
        })
}

impl Lock {
    /// Takes the lock without waiting. The file is opened without following links and
    /// without truncating; it is truncated through the descriptor once it is ours.
    pub(crate) fn try_take(path: &Path) -> Result<TryLock, StateError> {
        let err = |source| StateError::Lock {
            path: path.to_path_buf(),
            source,
        };
        let dir = open_own_dir(path.parent().unwrap_or(Path::new(".")))?;
        let fd = match open_checked(
            Some(dir.as_fd()),
            file_name(path)?,
            path,
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_NONBLOCK,
            Mode::S_IRUSR | Mode::S_IWUSR,
            false,
        ) {
            Ok(fd) => fd,
            Err(OpenErr::Missing(e)) => return Err(err(e)),
            Err(OpenErr::Other(e)) => return Err(e),
        };
        let file = match Flock::lock(File::from(fd), FlockArg::LockExclusiveNonblock) {
            Ok(f) => f,
            Err((file, Errno::EWOULDBLOCK)) => {
                let mut buf = [0u8; 32];
                let n = nix::sys::uio::pread(&file, &mut buf, 0).unwrap_or(0);
                return Ok(TryLock::Busy(parse_pid(&buf[..n]).ok()));
            }
            Err((_, e)) => return Err(err(io_err(e))),
        };
        nix::unistd::ftruncate(&*file, 0).map_err(|e| err(io_err(e)))?;
        let line = format!("{}\n", std::process::id());
        nix::sys::uio::pwrite(&*file, line.as_bytes(), 0).map_err(|e| err(io_err(e)))?;
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
            &*self.file,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        );
    }
}

/// Replaces `path` (in vpnrelay's own, checked folder) with `data`: written to a fresh
/// temporary file (`O_EXCL | O_NOFOLLOW`) and renamed over it, so a reader sees the old or
/// the new content and a planted link is replaced, never written through.
pub(crate) fn replace_file(path: &Path, data: &[u8]) -> Result<(), StateError> {
    let err = |source| StateError::Io {
        what: format!("write {}", path.display()),
        source,
    };
    let dir = open_own_dir(path.parent().unwrap_or(Path::new(".")))?;
    let name = file_name(path)?;
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(name.as_os_str());
    tmp.push(format!(".{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = nix::unistd::unlinkat(&dir, &tmp, nix::unistd::UnlinkatFlags::NoRemoveDir);
    let fd = nix::fcntl::openat(
        &dir,
        &tmp,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::S_IRUSR | Mode::S_IWUSR,
    )
    .map_err(|e| err(io_err(e)))?;
    let mut off = 0;
    while off < data.len() {
        match nix::sys::uio::pwrite(&fd, &data[off..], off as i64) {
            Ok(n) => off += n,
            Err(Errno::EINTR) => continue,
            Err(e) => {
                let _ = nix::unistd::unlinkat(&dir, &tmp, nix::unistd::UnlinkatFlags::NoRemoveDir);
                return Err(err(io_err(e)));
            }
        }
    }
    drop(fd);
    nix::fcntl::renameat(&dir, &tmp, &dir, name).map_err(|e| err(io_err(e)))
}

/// One relay's status for `vpnrelay status`: its stats file and whether a relay holds its
/// lock.
#[derive(Debug, Clone)]
pub struct RelayStatus {
    pub bridge: String,
    /// The PID in `relay-<bridge>.lock`, if it holds one.
    pub pid: Option<u32>,
    /// A relay holds the lock (it runs); false: the counters are what the last one left.
    pub running: bool,
    /// The relay's counters as it wrote them (`relay-<bridge>.stats`).
    pub stats: serde_json::Value,
}

impl RelayStatus {
    /// As JSON: `bridge`, `pid`, `running` and `stats` (the file's object).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "bridge": self.bridge,
            "pid": self.pid,
            "running": self.running,
            "stats": self.stats,
        })
    }
}

/// Largest stats file read (a relay holds at most `config::MAX_FLOWS` flows).
const MAX_STATS: usize = 4 << 20;

/// Reads the relays' stats files in `dir` (`$XDG_RUNTIME_DIR/vpnrelay`): every
/// `relay-<bridge>.stats`, or only `bridge`'s. The folder and each file are opened without
/// following links and with the owner and mode checked, like the rest of vpnrelay's state.
pub fn read_status(dir: &Path, bridge: Option<&str>) -> Result<Vec<RelayStatus>, StateError> {
    let dir_fd = match open_checked(None, dir, dir, OFlag::O_RDONLY, Mode::empty(), true) {
        Ok(fd) => fd,
        Err(OpenErr::Missing(_)) if bridge.is_some() => {
            return Err(StateError::NoStats {
                bridge: bridge.unwrap_or_default().to_string(),
                path: dir.to_path_buf(),
                why: "no relay ran as this user",
            })
        }
        Err(OpenErr::Missing(_)) => return Ok(Vec::new()),
        Err(OpenErr::Other(e)) => return Err(e),
    };
    let mut bridges: Vec<String> = match bridge {
        Some(b) => vec![b.to_string()],
        None => std::fs::read_dir(format!("/proc/self/fd/{}", dir_fd.as_raw_fd()))
            .map_err(|e| StateError::Io {
                what: format!("list {}", dir.display()),
                source: e,
            })?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let n = e.file_name().into_string().ok()?;
                Some(
                    n.strip_prefix("relay-")?
                        .strip_suffix(".stats")?
                        .to_string(),
                )
            })
            .collect(),
    };
    bridges.sort();
    let mut out = Vec::new();
    for b in bridges {
        let name = format!("relay-{b}.stats");
        let shown = dir.join(&name);
        if name.contains('/') {
            return Err(StateError::Untrusted {
                path: shown,
                why: "a bridge name has no '/'".into(),
            });
        }
        let fd = match open_checked(
            Some(dir_fd.as_fd()),
            Path::new(&name),
            &shown,
            OFlag::O_RDONLY | OFlag::O_NONBLOCK,
            Mode::empty(),
            false,
        ) {
            Ok(fd) => fd,
            Err(OpenErr::Missing(_)) if bridge.is_some() => {
                return Err(StateError::NoStats {
                    bridge: b,
                    path: shown,
                    why: "no relay ran for it",
                })
            }
            Err(OpenErr::Missing(_)) => continue,
            Err(OpenErr::Other(e)) => return Err(e),
        };
        let text = read_bounded(&fd, MAX_STATS).map_err(|e| StateError::Io {
            what: format!("read {}", shown.display()),
            source: e,
        })?;
        let stats = serde_json::from_slice(&text).map_err(|e| StateError::Io {
            what: format!("parse {}", shown.display()),
            source: io::Error::new(io::ErrorKind::InvalidData, e),
        })?;
        let lock = format!("relay-{b}.lock");
        let lock_shown = dir.join(&lock);
        let pid = read_pid_file(Some(dir_fd.as_fd()), &lock, &lock_shown).ok();
        let running = lock_held(dir_fd.as_fd(), &lock, &lock_shown);
        out.push(RelayStatus {
            bridge: b,
            pid,
            running,
            stats,
        });
    }
    Ok(out)
}

/// Whether some process holds the exclusive lock `name` (a relay runs): a shared,
/// non-blocking flock on our own descriptor is refused then, and released at once otherwise.
fn lock_held(dir: BorrowedFd<'_>, name: &str, shown: &Path) -> bool {
    let Ok(fd) = open_checked(
        Some(dir),
        Path::new(name),
        shown,
        OFlag::O_RDONLY | OFlag::O_NONBLOCK,
        Mode::empty(),
        false,
    ) else {
        return false;
    };
    matches!(
        Flock::lock(File::from(fd), FlockArg::LockSharedNonblock),
        Err((_, Errno::EWOULDBLOCK))
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn pid_files() {
        assert_eq!(parse_pid(b"1234\n"), Ok(1234));
        assert_eq!(parse_pid(b"1"), Ok(1));
        for bad in [
            &b""[..],
            b"\n",
            b"0",
            b"+5",
            b"-5",
            b" 5",
            b"5 6",
            b"4194305",
            b"99999999999",
            b"12a",
            b"\xff",
        ] {
            let e = parse_pid(bad).unwrap_err();
            assert!(e.contains("not a PID"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn status_uids() {
        let s = b"Name:\tx\nUid:\t1000\t1000\t1000\t1000\nGid:\t5\t5\t5\t5\n";
        assert_eq!(parse_status_uids(s), Some([1000; 4]));
        assert_eq!(parse_status_uids(b"Uid:\t1\t2\t3\n"), None);
        assert_eq!(parse_status_uids(b"Uid:\t1\t2\t3\t4\t5\n"), None);
        assert_eq!(parse_status_uids(b"Gid:\t1\t2\t3\t4\n"), None);
        let me = std::fs::read("/proc/self/status").unwrap();
        assert_eq!(parse_status_uids(&me).unwrap()[0], super::me());
    }

    #[test]
    fn pin_refuses_our_own_namespace_and_exited_processes() {
        let me = super::me();
        let file = Path::new("/test/child_pid");
        // Our own process: same user namespace, so not RootlessKit's child.
        match pin(std::process::id(), file, None, me) {
            Err(StateError::NotRootless { why, .. }) => assert!(why.contains("own user namespace")),
            other => panic!("pinned ourselves: {other:?}"),
        }
        // A process of ours that has exited (a zombie until reaped): its pidfd polls
        // readable, so it is not running, even though /proc/<pid> still exists.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let pidfd = pidfd_open(pid).unwrap();
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        poll(
            &mut [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)],
            PollTimeout::from(10_000u16),
        )
        .unwrap();
        assert!(!pidfd_alive(pidfd.as_fd()));
        assert!(Path::new(&format!("/proc/{pid}")).exists());
        match pin(pid, file, None, me) {
            Err(StateError::Dead { pid: p, .. }) => assert_eq!(p, pid),
            other => panic!("pinned an exited process: {other:?}"),
        }
        child.wait().unwrap();
        // Another user's process: the owner check is made for every caller, root included.
        match pin(std::process::id(), file, None, me.wrapping_add(1)) {
            Err(StateError::Permission { owner, .. }) => assert_eq!(owner, me),
            other => panic!("no owner check: {other:?}"),
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vpnrelay-state-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn lock_file_symlink_is_refused_and_its_target_unchanged() {
        let d = scratch("link");
        let victim = d.join("victim");
        std::fs::write(&victim, b"precious\n").unwrap();
        let before = std::fs::metadata(&victim).unwrap();
        let locks = d.join("vpnrelay");
        std::fs::create_dir(&locks).unwrap();
        std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o700)).unwrap();
        let lock = locks.join("relay-br-x.lock");
        std::os::unix::fs::symlink(&victim, &lock).unwrap();
        let e = match Lock::try_take(&lock) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a symlinked lock file was taken"),
        };
        assert!(e.contains("symbolic link"), "{e}");
        assert!(e.contains(&lock.display().to_string()), "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious\n");
        let after = std::fs::metadata(&victim).unwrap();
        assert_eq!(
            (after.mtime(), after.mtime_nsec(), after.len()),
            (before.mtime(), before.mtime_nsec(), before.len())
        );
        // The positive control: the same call on a plain path takes the lock and writes our
        // PID; a second try sees it busy with that PID.
        let plain = locks.join("relay-br-y.lock");
        let TryLock::Taken(held) = Lock::try_take(&plain).unwrap() else {
            panic!("lock busy");
        };
        assert_eq!(
            std::fs::read_to_string(&plain).unwrap(),
            format!("{}\n", std::process::id())
        );
        match Lock::try_take(&plain).unwrap() {
            TryLock::Busy(pid) => assert_eq!(pid, Some(std::process::id())),
            TryLock::Taken(_) => panic!("taken twice"),
        }
        drop(held);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn lock_folder_link_and_loose_modes_are_refused() {
        let d = scratch("modes");
        let real = d.join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, d.join("vpnrelay")).unwrap();
        let e = Lock::try_take(&d.join("vpnrelay/relay-br-x.lock")).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_dir(&real).unwrap().count(), 0);

        let open = d.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = Lock::try_take(&open.join("x.lock")).unwrap_err();
        assert!(e.to_string().contains("writable by group or others"), "{e}");

        let ok = d.join("ok");
        std::fs::create_dir(&ok).unwrap();
        std::fs::set_permissions(&ok, std::fs::Permissions::from_mode(0o700)).unwrap();
        let f = ok.join("x.lock");
        std::fs::write(&f, b"").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = Lock::try_take(&f).unwrap_err();
        assert!(e.to_string().contains("writable by group or others"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A symbolic link in a parent component is refused too, not only in the last one.
    #[test]
    fn a_symlinked_parent_directory_is_refused() {
        let d = scratch("parent-link");
        let real = d.join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::create_dir(real.join("state")).unwrap();
        std::fs::set_permissions(real.join("state"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        std::os::unix::fs::symlink(&real, d.join("link")).unwrap();
        let via = d.join("link/state");
        let r = open_checked(None, &via, &via, OFlag::O_RDONLY, Mode::empty(), true);
        match r {
            Err(OpenErr::Other(e)) => assert!(e.to_string().contains("symbolic link"), "{e}"),
            Err(OpenErr::Missing(e)) => panic!("missing: {e}"),
            Ok(_) => panic!(
                "{} opened through a symbolic link in its parent",
                via.display()
            ),
        }
        let direct = real.join("state");
        assert!(open_checked(None, &direct, &direct, OFlag::O_RDONLY, Mode::empty(), true).is_ok());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn replace_file_replaces_a_planted_link_not_its_target() {
        let d = scratch("replace");
        let dir = d.join("vpnrelay");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let victim = d.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let target = dir.join("relay-br-x.stats");
        std::os::unix::fs::symlink(&victim, &target).unwrap();
        replace_file(&target, b"{}").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert_eq!(std::fs::read(&target).unwrap(), b"{}");
        assert!(!std::fs::symlink_metadata(&target).unwrap().is_symlink());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn status_reads_the_stats_file_and_sees_the_running_relay() {
        let d = scratch("status");
        let dir = d.join("vpnrelay");
        let stats = serde_json::json!({
            "schema_version": nsfast_sys::out::SCHEMA_VERSION,
            "bridge": "br-a", "flows_open": 2, "flows_opened": 5,
            "refused_handed_back": 1, "refused_dropped": 0, "max_flows_per_client": 8,
            "up_bytes": 1000, "down_bytes": 2000,
        });
        // Through the writers the relay uses: its stats file and its lock.
        let lock = match Lock::try_take(&dir.join("relay-br-a.lock")).unwrap() {
            TryLock::Taken(l) => l,
            TryLock::Busy(p) => panic!("busy: {p:?}"),
        };
        replace_file(&dir.join("relay-br-a.stats"), stats.to_string().as_bytes()).unwrap();
        replace_file(&dir.join("relay-br-b.stats"), b"{\"bridge\": \"br-b\"}\n").unwrap();
        let all = read_status(&dir, None).unwrap();
        assert_eq!(
            all.iter().map(|r| r.bridge.as_str()).collect::<Vec<_>>(),
            ["br-a", "br-b"]
        );
        assert!(all[0].running, "{all:?}");
        assert_eq!(all[0].pid, Some(std::process::id()));
        assert_eq!(all[0].stats, stats);
        assert!(!all[1].running, "no lock: not running");
        assert_eq!(all[0].to_json()["stats"]["max_flows_per_client"], 8);
        drop(lock);
        let one = read_status(&dir, Some("br-a")).unwrap();
        assert_eq!(one.len(), 1);
        assert!(!one[0].running, "lock released: stopped");
        let e = read_status(&dir, Some("br-none")).unwrap_err().to_string();
        assert!(e.contains("br-none"), "{e}");
        // A missing folder is no relay, not an error.
        assert!(read_status(&d.join("absent"), None).unwrap().is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn status_refuses_a_planted_link() {
        let d = scratch("status-link");
        let dir = d.join("vpnrelay");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let victim = d.join("victim");
        std::fs::write(&victim, b"{\"secret\": 1}").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("relay-br-x.stats")).unwrap();
        let e = read_status(&dir, None).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        // The folder itself planted as a link is refused too.
        let real = d.join("real");
        std::fs::rename(&dir, &real).unwrap();
        std::os::unix::fs::symlink(&real, &dir).unwrap();
        let e = read_status(&dir, None).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
