//! cgroup v2: find the mount, create and remove cgroups, move processes, read ids and CPU use.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// cgroup errors; each names the path involved.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// No cgroup2 file system is mounted.
    #[error("no cgroup2 mount found in /proc/self/mountinfo: mount one with `mount -t cgroup2 none /sys/fs/cgroup/unified` or boot with unified cgroups")]
    NoCgroup2Mount,
    /// The path does not exist.
    #[error("cgroup path {0} does not exist")]
    Missing(PathBuf),
    /// The path exists but is not on a cgroup2 file system.
    #[error("{0} is not a cgroup2 directory (expected a directory under a cgroup2 mount such as {1})")]
    NotCgroup2(PathBuf, PathBuf),
    /// An I/O error on a cgroup file.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> CgroupError + 'a {
    move |source| CgroupError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// The mount point of the cgroup2 hierarchy, from `/proc/self/mountinfo`.
pub fn cgroup2_mount() -> Result<PathBuf, CgroupError> {
    let text = fs::read_to_string("/proc/self/mountinfo")
        .map_err(io_err("read", Path::new("/proc/self/mountinfo")))?;
    find_cgroup2_in_mountinfo(&text).ok_or(CgroupError::NoCgroup2Mount)
}

/// Finds the first cgroup2 mount point in mountinfo text (exposed for tests).
pub fn find_cgroup2_in_mountinfo(text: &str) -> Option<PathBuf> {
    for line in text.lines() {
        // "36 35 0:31 / /sys/fs/cgroup/unified rw,... shared:9 - cgroup2 cgroup2 rw"
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fstype = right.split_whitespace().next().unwrap_or("");
        if fstype != "cgroup2" {
            continue;
        }
        let mount_point = left.split_whitespace().nth(4)?;
        return Some(PathBuf::from(unescape_mountinfo(mount_point)));
    }
    None
}

fn unescape_mountinfo(s: &str) -> String {
    // mountinfo escapes space, tab, newline and backslash as \ooo octal.
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A cgroup v2 directory.
#[derive(Debug, Clone)]
pub struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    /// Opens an existing cgroup, checking it is a directory on a cgroup2 file system.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, CgroupError> {
        let path = path.as_ref().to_path_buf();
        if !path.exists() {
            return Err(CgroupError::Missing(path));
        }
        let st = nix::sys::statfs::statfs(&path).map_err(|e| CgroupError::Io {
            op: "statfs",
            path: path.clone(),
            source: e.into(),
        })?;
        if st.filesystem_type().0 as i64 != CGROUP2_SUPER_MAGIC || !path.is_dir() {
            let mount = cgroup2_mount().unwrap_or_else(|_| PathBuf::from("/sys/fs/cgroup"));
            return Err(CgroupError::NotCgroup2(path, mount));
        }
        Ok(Self { path })
    }

    /// Opens `name` under the cgroup2 mount, creating it if needed.
    pub fn create_under_root(name: &str) -> Result<Self, CgroupError> {
        let root = cgroup2_mount()?;
        Self::create(root.join(name))
    }

    /// Creates (or opens, when it exists) the cgroup at `path`.
    pub fn create(path: impl AsRef<Path>) -> Result<Self, CgroupError> {
        let path = path.as_ref();
        match fs::create_dir(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err("mkdir", path)(e)),
        }
        Self::open(path)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The cgroup id the kernel uses (the directory's inode number on cgroup2).
    pub fn id(&self) -> Result<u64, CgroupError> {
        fs::metadata(&self.path)
            .map(|m| m.ino())
            .map_err(io_err("stat", &self.path))
    }

    /// Moves process `pid` into this cgroup.
    pub fn add_pid(&self, pid: u32) -> Result<(), CgroupError> {
        let f = self.path.join("cgroup.procs");
        fs::write(&f, pid.to_string()).map_err(io_err("write", &f))
    }

    /// The processes currently in this cgroup.
    pub fn pids(&self) -> Result<Vec<u32>, CgroupError> {
        let f = self.path.join("cgroup.procs");
        let text = fs::read_to_string(&f).map_err(io_err("read", &f))?;
        Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// CPU time consumed by the cgroup so far (`usage_usec` from cpu.stat), when available.
    pub fn cpu_usage_usec(&self) -> Option<u64> {
        let text = fs::read_to_string(self.path.join("cpu.stat")).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("usage_usec "))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Removes the (empty) cgroup directory.
    pub fn remove(&self) -> Result<(), CgroupError> {
        match fs::remove_dir(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("rmdir", &self.path)(e)),
        }
    }
}

/// Writes `pid` into `<cgroup>/cgroup.procs` using only async-signal-safe calls, for use in
/// `pre_exec` closures. `procs_path` must be a NUL-terminated path to a cgroup.procs file.
pub fn join_cgroup_raw(procs_path: &std::ffi::CStr) -> io::Result<()> {
    let pid = std::process::id();
    let mut buf = [0u8; 16];
    let mut n = pid;
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // SAFETY: procs_path is a valid NUL-terminated string; open/write/close are async-signal
    // safe and get valid buffers whose lengths match.
    unsafe {
        let fd = libc::open(procs_path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let w = libc::write(fd, buf[i..].as_ptr().cast(), buf.len() - i);
        let err = io::Error::last_os_error();
        libc::close(fd);
        if w < 0 {
            return Err(err);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_cgroup2_in_hybrid_and_unified_layouts() {
        let hybrid = "25 20 0:22 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755\n\
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate\n\
27 25 0:24 / /sys/fs/cgroup/cpu rw shared:11 - cgroup cgroup rw,cpu\n";
        assert_eq!(
            find_cgroup2_in_mountinfo(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let unified = "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";
        assert_eq!(
            find_cgroup2_in_mountinfo(unified),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(
            find_cgroup2_in_mountinfo("1 0 0:1 / / rw - ext4 /dev/vda rw\n"),
            None
        );
        let escaped = "30 25 0:26 / /mnt/my\\040cg rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            find_cgroup2_in_mountinfo(escaped),
            Some(PathBuf::from("/mnt/my cg"))
        );
    }

    #[test]
    fn rejects_paths_that_are_not_cgroups() {
        match Cgroup::open("/tmp") {
            Err(CgroupError::NotCgroup2(p, _)) => assert_eq!(p, PathBuf::from("/tmp")),
            other => panic!("expected NotCgroup2, got {other:?}"),
        }
        assert!(matches!(
            Cgroup::open("/nonexistent/cg"),
            Err(CgroupError::Missing(_))
        ));
    }
}
