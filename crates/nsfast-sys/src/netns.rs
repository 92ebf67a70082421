//! Network namespaces: create named ones (bind-mounted at /run/netns/NAME, so `ip netns`
//! sees them), open existing ones, enter one on the current thread, run a closure or a
//! command inside one, and delete them. Netlink handles bound to a namespace are built on top
//! of this module, in [`crate::net`] ([`NetNs::netlink`]); this module knows nothing of them.

use std::ffi::CString;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};

/// Where named namespaces live, as with iproute2.
pub const NETNS_RUN_DIR: &str = "/run/netns";

/// Network namespace errors; each names the namespace.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The name cannot be used as a file name under /run/netns.
    #[error("invalid network namespace name {0:?}: use 1-64 characters from [A-Za-z0-9_.-]")]
    BadName(String),
    /// A namespace with that name already exists.
    #[error("network namespace {0:?} already exists ({NETNS_RUN_DIR}/{0})")]
    Exists(String),
    /// No namespace with that name or path.
    #[error("network namespace {0:?} not found: expected a name under {NETNS_RUN_DIR} or a path such as /proc/PID/ns/net")]
    NotFound(String),
    /// A system call failed.
    #[error("{op} for network namespace {name:?}")]
    Sys {
        op: &'static str,
        name: String,
        #[source]
        source: io::Error,
    },
    /// The path exists but is not a network namespace (not an nsfs file, or a namespace of
    /// another type).
    #[error("{path:?} is not a network namespace ({why}): expected a name under {NETNS_RUN_DIR} or a path such as /proc/PID/ns/net")]
    NotNetns { path: String, why: String },
    /// The worker thread panicked.
    #[error("thread running inside network namespace {0:?} panicked")]
    Panicked(String),
}

/// `statfs` magic of nsfs, the file system of namespace files (`/proc/PID/ns/*`, bind mounts).
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// Refuses a file that is not a network namespace: it must live on nsfs and report
/// `CLONE_NEWNET` to `NS_GET_NSTYPE` (Linux 4.11+).
fn check_netns_file(file: &File, path: &str) -> Result<(), NetnsError> {
    let not = |why: String| NetnsError::NotNetns {
        path: path.to_string(),
        why,
    };
    let st = nix::sys::statfs::fstatfs(file).map_err(|e| not(format!("fstatfs: {e}")))?;
    let magic = st.filesystem_type().0 as i64;
    if magic != NSFS_MAGIC {
        return Err(not(format!("file system magic {magic:#x}, not nsfs")));
    }
    // SAFETY: NS_GET_NSTYPE takes no argument and only reads the namespace of the open fd,
    // which stays open for the duration of the call.
    let t = unsafe { libc::ioctl(file.as_raw_fd(), libc::NS_GET_NSTYPE) };
    if t < 0 {
        return Err(not(format!(
            "NS_GET_NSTYPE: {}",
            io::Error::last_os_error()
        )));
    }
    if t != libc::CLONE_NEWNET {
        return Err(not(format!("a namespace of type {t:#x}, not CLONE_NEWNET")));
    }
    Ok(())
}

/// Opens a namespace file without ever blocking on what the path names: `O_PATH` first (which
/// opens nothing, so a FIFO or a device planted where a namespace was expected cannot stall
/// the caller), `fstatfs` of that handle for nsfs, and only then a real open of the same inode
/// through `/proc/self/fd`. `Err(None)`: the path does not open at all.
fn open_nsfs(path: &Path) -> Result<File, Option<NetnsError>> {
    use std::os::unix::fs::OpenOptionsExt;
    let shown = path.display().to_string();
    let handle = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)
        .map_err(|_| None)?;
    let st = nix::sys::statfs::fstatfs(&handle).map_err(|e| {
        Some(NetnsError::NotNetns {
            path: shown.clone(),
            why: format!("fstatfs: {e}"),
        })
    })?;
    let magic = st.filesystem_type().0 as i64;
    if magic != NSFS_MAGIC {
        return Err(Some(NetnsError::NotNetns {
            path: shown,
            why: format!("file system magic {magic:#x}, not nsfs"),
        }));
    }
    File::open(format!("/proc/self/fd/{}", handle.as_raw_fd())).map_err(|e| {
        Some(NetnsError::NotNetns {
            path: shown,
            why: format!("reopen: {e}"),
        })
    })
}

/// Why mounts this process makes (namespace bind mounts under /run/netns, a bpffs at
/// /sys/fs/bpf) would not be seen outside it, or `None` when nothing says so. Two signs:
/// - its mount namespace is not its parent's: it was started in a fresh one (`ip netns exec`
///   and `unshare -m` unshare, then exec the command);
/// - /run/netns's own mount receives mounts but does not send them (`master:` without
///   `shared:`, as `ip netns exec` leaves every mount after `mount --make-rslave /`), which
///   also holds for the command's children.
///
/// `NSFAST_ALLOW_PRIVATE_MOUNT_NS=1` skips the check (e.g. a container that shares /run/netns
/// and /sys/fs/bpf with the host through its own arrangement).
pub fn private_mount_namespace() -> Option<String> {
    if std::env::var_os("NSFAST_ALLOW_PRIVATE_MOUNT_NS").is_some_and(|v| v == "1") {
        return None;
    }
    let ours = fs::read_link("/proc/self/ns/mnt").ok()?;
    let ppid = nix::unistd::getppid().as_raw();
    if ppid > 0 {
        if let Ok(parent) = fs::read_link(format!("/proc/{ppid}/ns/mnt")) {
            if parent != ours {
                return Some(format!(
                    "it runs in mount namespace {}, not its parent's ({})",
                    ours.display(),
                    parent.display()
                ));
            }
        }
    }
    // Only /run/netns's own mount (iproute2 makes one): what "/" does varies by setup.
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let own: String = info
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(NETNS_RUN_DIR))
        .map(|l| format!("{l}\n"))
        .collect();
    let tags = propagation_of(&own, Path::new(NETNS_RUN_DIR))?;
    let slave = tags.iter().any(|t| t.starts_with("master:"));
    let shared = tags.iter().any(|t| t.starts_with("shared:"));
    (slave && !shared).then(|| {
        format!(
            "the mount holding {NETNS_RUN_DIR} only receives mounts ({}): mounts made here do not reach the host's mount namespace",
            tags.join(" ")
        )
    })
}

/// The propagation tags (`shared:N`, `master:N`, ...) of the mount in `mountinfo` (the text of
/// /proc/PID/mountinfo) that holds `path`: the last listed mount whose mount point is `path`
/// or one of its ancestors, the longest such.
pub fn propagation_of(mountinfo: &str, path: &Path) -> Option<Vec<String>> {
    let mut best: Option<(usize, Vec<String>)> = None;
    for line in mountinfo.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let Some(sep) = f.iter().position(|x| *x == "-") else {
            continue;
        };
        if f.len() < 6 || sep < 6 {
            continue;
        }
        let point = Path::new(f[4]);
        if !path.starts_with(point) {
            continue;
        }
        let depth = point.components().count();
        if best.as_ref().is_none_or(|(d, _)| depth >= *d) {
            best = Some((depth, f[6..sep].iter().map(|t| t.to_string()).collect()));
        }
    }
    best.map(|(_, t)| t)
}

/// The netns cookie of the namespace the calling thread is in (`SO_NETNS_COOKIE`, Linux
/// 5.7+): a 64-bit number the kernel never hands out twice within a boot, unlike the
/// namespace's inode number.
pub fn current_cookie() -> io::Result<u64> {
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: plain socket(2); the returned descriptor is checked and owned at once.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: the option value points at a u64 of the length passed; the kernel writes at
    // most `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("getsockopt(SO_NETNS_COOKIE) (needs Linux >= 5.7): {e}"),
        ));
    }
    Ok(cookie)
}

/// Sets the loopback device of the calling thread's namespace up, as `ip link set lo up`
/// does, with `SIOCGIFFLAGS`/`SIOCSIFFLAGS` on a datagram socket (no netlink needed).
fn loopback_up() -> io::Result<()> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    // SAFETY: `ifreq` is plain old data (a name and a union of integers); all zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(b"lo") {
        *d = *s as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the NUL-terminated name and writes `ifru_flags` of the
    // `ifreq` passed, which lives across the call; the socket is open.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just filled `ifru_flags`, the union member read and written here.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: SIOCSIFFLAGS only reads the `ifreq` passed, which lives across the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as _, &req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn sys<'a>(op: &'static str, name: &'a str) -> impl FnOnce(nix::Error) -> NetnsError + 'a {
    move |e| NetnsError::Sys {
        op,
        name: name.to_string(),
        source: e.into(),
    }
}

/// A handle to a network namespace. When `owned`, dropping it deletes the namespace's
/// bind mount (the namespace itself dies with its last user).
#[derive(Debug)]
pub struct NetNs {
    name: String,
    path: PathBuf,
    file: File,
    owned: bool,
}

pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

impl NetNs {
    /// Creates a new named network namespace at /run/netns/NAME with loopback up.
    /// The returned handle owns it: dropping it deletes it.
    pub fn create(name: &str) -> Result<Self, NetnsError> {
        if !valid_name(name) {
            return Err(NetnsError::BadName(name.into()));
        }
        let dir = Path::new(NETNS_RUN_DIR);
        fs::create_dir_all(dir).map_err(|e| NetnsError::Sys {
            op: "mkdir /run/netns",
            name: name.into(),
            source: e,
        })?;
        share_run_dir(dir).map_err(sys("make /run/netns a shared mount", name))?;
        let path = dir.join(name);
        match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(NetnsError::Exists(name.into()))
            }
            Err(e) => {
                return Err(NetnsError::Sys {
                    op: "create mount point",
                    name: name.into(),
                    source: e,
                })
            }
        }
        // unshare() on a short-lived thread so the caller's thread keeps its namespace.
        let p = path.clone();
        let n = name.to_string();
        let res = std::thread::spawn(move || -> Result<(), NetnsError> {
            unshare(CloneFlags::CLONE_NEWNET).map_err(sys("unshare(CLONE_NEWNET)", &n))?;
            loopback_up().map_err(|e| NetnsError::Sys {
                op: "set lo up",
                name: n.clone(),
                source: e,
            })?;
            mount(
                Some("/proc/thread-self/ns/net"),
                &p,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(sys("bind mount", &n))
        })
        .join()
        .map_err(|_| NetnsError::Panicked(name.into()))?;
        if let Err(e) = res {
            let _ = fs::remove_file(&path);
            return Err(e);
        }
        let file = File::open(&path).map_err(|e| NetnsError::Sys {
            op: "open",
            name: name.into(),
            source: e,
        })?;
        Ok(Self {
            name: name.into(),
            path,
            file,
            owned: true,
        })
    }

    /// Opens an existing namespace by name (under /run/netns) or by path. Not owned.
    pub fn open(name_or_path: &str) -> Result<Self, NetnsError> {
        let path = if name_or_path.contains('/') {
            PathBuf::from(name_or_path)
        } else {
            Path::new(NETNS_RUN_DIR).join(name_or_path)
        };
        let file = open_nsfs(&path).map_err(|e| match e {
            None => NetnsError::NotFound(name_or_path.into()),
            Some(e) => e,
        })?;
        check_netns_file(&file, &path.display().to_string())?;
        Ok(Self {
            name: name_or_path.into(),
            path,
            file,
            owned: false,
        })
    }

    /// The namespace of the calling thread. Not owned.
    pub fn current() -> Result<Self, NetnsError> {
        Self::open("/proc/thread-self/ns/net")
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The namespace's inode number, which identifies it.
    pub fn inode(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        self.file.metadata().map(|m| m.ino()).unwrap_or(0)
    }

    /// The namespace's netns cookie (see [`current_cookie`]), read from a socket made inside
    /// it. Unlike the inode, never reused within a boot: state about a namespace is keyed by it.
    pub fn cookie(&self) -> Result<u64, NetnsError> {
        self.run(current_cookie)?.map_err(|e| NetnsError::Sys {
            op: "read the netns cookie",
            name: self.name.clone(),
            source: e,
        })
    }

    /// Moves the calling thread into this namespace until the guard is dropped.
    pub fn enter(&self) -> Result<NetnsGuard, NetnsError> {
        let prev = File::open("/proc/thread-self/ns/net").map_err(|e| NetnsError::Sys {
            op: "open current netns",
            name: self.name.clone(),
            source: e,
        })?;
        setns(self.file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(sys("setns", &self.name))?;
        Ok(NetnsGuard { prev })
    }

    /// Runs `f` on a new thread inside this namespace and returns its result.
    pub fn run<F, R>(&self, f: F) -> Result<R, NetnsError>
    where
        F: FnOnce() -> R + Send,
        R: Send,
    {
        std::thread::scope(|s| {
            s.spawn(|| -> Result<R, NetnsError> {
                setns(self.file.as_fd(), CloneFlags::CLONE_NEWNET)
                    .map_err(sys("setns", &self.name))?;
                Ok(f())
            })
            .join()
            .map_err(|_| NetnsError::Panicked(self.name.clone()))?
        })
    }

    /// Spawns a long-lived thread inside this namespace.
    pub fn spawn<F, R>(&self, f: F) -> Result<std::thread::JoinHandle<R>, NetnsError>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let file = self.file.try_clone().map_err(|e| NetnsError::Sys {
            op: "dup",
            name: self.name.clone(),
            source: e,
        })?;
        let (tx, rx) = std::sync::mpsc::channel();
        let name = self.name.clone();
        let h = std::thread::spawn(move || {
            let r = setns(file.as_fd(), CloneFlags::CLONE_NEWNET);
            let ok = r.is_ok();
            let _ = tx.send(r);
            assert!(ok, "setns into {name} failed");
            f()
        });
        rx.recv()
            .map_err(|_| NetnsError::Panicked(self.name.clone()))?
            .map_err(sys("setns", &self.name))?;
        Ok(h)
    }

    /// Makes `cmd` start inside this namespace (and optionally inside a cgroup whose
    /// `cgroup.procs` path is given). Both are applied in the child before exec.
    pub fn configure_command(&self, cmd: &mut Command, cgroup_procs: Option<&Path>) {
        configure_command(cmd, Some(self), cgroup_procs);
    }

    /// Keeps the namespace after this handle is dropped.
    pub fn persist(mut self) -> Self {
        self.owned = false;
        self
    }

    /// Deletes the namespace's bind mount and file (like `ip netns del`).
    pub fn delete(mut self) -> Result<(), NetnsError> {
        self.owned = false;
        delete_named(&self.name)
    }
}

impl AsFd for NetNs {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if self.owned {
            if let Err(e) = delete_named(&self.name) {
                tracing::warn!("cleanup of network namespace {}: {e}", self.name);
            }
        }
    }
}

/// Makes `dir` its own mount with shared propagation, as iproute2 does before its first
/// `ip netns add`: the namespace bind mounts made in it then reach every mount namespace that
/// holds a copy of it, and a later `ip netns add` finds the mount already there. Without it,
/// that `ip netns add` binds the directory onto itself and the namespaces mounted before sit
/// under the new mount, where `delete_named` cannot unmount them (the unlink fails with
/// EBUSY and the namespace lives on).
fn share_run_dir(dir: &Path) -> nix::Result<()> {
    let shared = || {
        mount(
            None::<&str>,
            dir,
            None::<&str>,
            MsFlags::MS_SHARED | MsFlags::MS_REC,
            None::<&str>,
        )
    };
    match shared() {
        // EINVAL: `dir` is not a mount point yet.
        Err(nix::Error::EINVAL) => {
            mount(
                Some(dir),
                dir,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None::<&str>,
            )?;
            shared()
        }
        r => r,
    }
}

/// Deletes /run/netns/NAME (unmount, then unlink). Missing is not an error.
pub fn delete_named(name: &str) -> Result<(), NetnsError> {
    let path = Path::new(NETNS_RUN_DIR).join(name);
    if !path.exists() {
        return Ok(());
    }
    match umount2(&path, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => {}
        Err(e) => return Err(sys("umount", name)(e)),
    }
    match fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(NetnsError::Sys {
            op: "unlink",
            name: name.into(),
            source: e,
        }),
    }
}

/// Names under /run/netns.
pub fn list_named() -> Vec<String> {
    fs::read_dir(NETNS_RUN_DIR)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Restores the thread's previous namespace when dropped.
#[derive(Debug)]
pub struct NetnsGuard {
    prev: File,
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if let Err(e) = setns(self.prev.as_fd(), CloneFlags::CLONE_NEWNET) {
            // Continuing in the wrong namespace would be worse than stopping.
            panic!("cannot restore the thread's network namespace: {e}");
        }
    }
}

/// Makes `cmd` start inside `ns` (if given) and inside the cgroup whose `cgroup.procs` path is
/// given (if given). Applied in the forked child before exec.
pub fn configure_command(cmd: &mut Command, ns: Option<&NetNs>, cgroup_procs: Option<&Path>) {
    let ns_fd = ns.map(|n| n.file.as_raw_fd());
    let procs = cgroup_procs
        .map(|p| CString::new(p.as_os_str().as_encoded_bytes()).expect("path without NUL"));
    // SAFETY: the closure runs in the child between fork and exec and only makes
    // async-signal-safe system calls (setns, open, write, close) on values prepared before
    // the fork; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(procs) = &procs {
                crate::cgroup::join_cgroup_raw(procs)?;
            }
            if let Some(fd) = ns_fd {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_names() {
        assert!(valid_name("nsft-123-a"));
        assert!(!valid_name(""));
        assert!(!valid_name("a/b"));
        assert!(!valid_name(".."));
        assert!(!valid_name(&"x".repeat(65)));
    }

    /// `NetNs::open` refuses what is not a network namespace, naming the path: a regular
    /// file, a directory, another namespace type.
    #[test]
    fn propagation_is_read_from_the_mount_holding_the_path() {
        let host = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
                    45 27 254:0 /run/netns /run/netns rw,relatime shared:1 - ext4 /dev/vda rw\n";
        let exec = "48 47 254:0 / / rw,relatime master:7 - ext4 /dev/vda rw\n\
                    70 48 254:0 /run/netns /run/netns rw,relatime master:1 - ext4 /dev/vda rw\n";
        let p = Path::new("/run/netns");
        assert_eq!(propagation_of(host, p).unwrap(), vec!["shared:1"]);
        assert_eq!(propagation_of(exec, p).unwrap(), vec!["master:1"]);
        let root_only = "27 1 254:0 / / rw,relatime shared:3 - ext4 /dev/vda rw\n";
        assert_eq!(propagation_of(root_only, p).unwrap(), vec!["shared:3"]);
        assert!(propagation_of("garbage\n", p).is_none());
        // /run/netnsX does not hold /run/netns.
        let other = "27 1 254:0 / / rw - ext4 /dev/vda rw\n\
                     9 27 0:1 / /run/netnsX rw master:2 - tmpfs t rw\n";
        assert!(propagation_of(other, p).unwrap().is_empty());
    }

    #[test]
    fn open_never_blocks_on_a_fifo_or_a_device() {
        let dir = std::env::temp_dir().join(format!("nsfast-netns-fifo-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("net");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        {
            let p = fifo.display().to_string();
            let (tx, rx) = std::sync::mpsc::channel();
            let q = p.clone();
            std::thread::spawn(move || {
                let _ = tx.send(NetNs::open(&q).map(|_| ()).map_err(|e| e.to_string()));
            });
            let r = rx
                .recv_timeout(std::time::Duration::from_secs(5))
                .unwrap_or_else(|_| panic!("NetNs::open({p}) still blocked after 5 s"));
            let e = r.expect_err(&p);
            assert!(e.contains("not a network namespace"), "{p}: {e}");
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn open_refuses_files_that_are_not_network_namespaces() {
        // A regular file (/etc/passwd where there is one: the VM guests have none), a
        // directory, and a namespace of another type.
        let mut paths = vec!["/proc/self/status", "/proc", "/proc/self/ns/mnt"];
        if Path::new("/etc/passwd").exists() {
            paths.push("/etc/passwd");
        }
        for p in paths {
            let e = NetNs::open(p).expect_err(p).to_string();
            assert!(
                e.contains(&format!("{p:?}")) && e.contains("not a network namespace"),
                "{e}"
            );
        }
        let ns = NetNs::open("/proc/self/ns/net").expect("own netns");
        assert!(ns.inode() > 0);
    }

    /// A namespace made by `create` has its loopback up: a TCP connection to 127.0.0.1 inside
    /// it is accepted (with lo down, connect fails with ENETUNREACH).
    #[test]
    fn created_namespaces_have_loopback_up() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let ns = NetNs::create(&format!("nsft{}x0-lo", std::process::id())).unwrap();
        ns.run(|| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        })
        .unwrap();
    }

    /// In a mount namespace of its own whose /run/netns is a plain directory: after `create`,
    /// /run/netns is a shared mount, and an `ip netns add` made next does not hide the first
    /// namespace's mount (its delete would fail with EBUSY and leak the namespace).
    #[test]
    fn create_shares_run_netns_so_ip_netns_add_does_not_hide_it() {
        // iproute2's `ip netns` (busybox's `ip`, as in the VM guests, has none).
        let ip_netns = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !nix::unistd::geteuid().is_root() || !ip_netns {
            eprintln!("skipped: needs root and iproute2's `ip netns`");
            return;
        }
        let tag = format!("nsft{}x0-sh", std::process::id());
        std::thread::spawn(move || {
            // This thread only: a mount namespace with nothing propagating back, and a fresh
            // tmpfs at /run so /run/netns starts as a plain directory.
            unshare(CloneFlags::CLONE_NEWNS).unwrap();
            mount(
                None::<&str>,
                "/",
                None::<&str>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&str>,
            )
            .unwrap();
            mount(
                Some("tmpfs"),
                "/run",
                Some("tmpfs"),
                MsFlags::empty(),
                Some("mode=0755"),
            )
            .unwrap();
            let a = NetNs::create(&format!("{tag}-a")).unwrap();
            let info = fs::read_to_string("/proc/thread-self/mountinfo").unwrap();
            let own: Vec<&str> = info
                .lines()
                .filter(|l| l.split(' ').nth(4) == Some(NETNS_RUN_DIR))
                .collect();
            assert!(
                own.iter().any(|l| l.contains(" shared:")),
                "/run/netns is not a shared mount of its own: {own:?}"
            );
            let b = format!("{tag}-b");
            let st = Command::new("ip")
                .args(["netns", "add", &b])
                .status()
                .unwrap();
            assert!(st.success(), "ip netns add {b}");
            let r = a.delete();
            let _ = Command::new("ip").args(["netns", "del", &b]).status();
            r.expect("delete the namespace made before `ip netns add`");
            assert!(!Path::new(NETNS_RUN_DIR).join(format!("{tag}-a")).exists());
        })
        .join()
        .expect("the test thread");
    }

    /// The cookie identifies the namespace: the same through two paths, different for another.
    #[test]
    fn cookies_identify_namespaces() {
        let a = NetNs::current().unwrap().cookie().unwrap();
        assert_eq!(
            a,
            NetNs::open("/proc/self/ns/net").unwrap().cookie().unwrap()
        );
        assert_eq!(a, current_cookie().unwrap());
        if nix::unistd::geteuid().is_root() {
            let name = format!("nsft{}x0-ck", std::process::id());
            let other = NetNs::create(&name).unwrap();
            assert_ne!(other.cookie().unwrap(), a);
        }
    }
}
