//! The one "remove what a dead run left" cleanup, for every throwaway name of [`crate::name`]
//! whose owning process is gone: bench runs' and killed tests' namespaces, cgroups, temporary
//! folders, pod state and BIRD processes ([`crate::bird`]), and rootless worlds' processes,
//! namespaces and folders. Live runs' objects are left alone.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Removes a cgroup directory, retrying briefly while exiting processes leave it.
pub fn remove_cgroup_retry(path: &Path) -> io::Result<()> {
    for _ in 0..50 {
        match fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            Err(e) => return Err(e),
        }
    }
    fs::remove_dir(path)
}

/// Removes a cgroup and its child cgroups, deepest first.
pub fn remove_cgroup_tree(path: &Path) -> io::Result<()> {
    if !path.exists() {
        return Ok(());
    }
    if let Ok(rd) = fs::read_dir(path) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_cgroup_tree(&e.path())?;
            }
        }
    }
    remove_cgroup_retry(path)
}

/// What dead bench runs and killed tests left (names of [`crate::name`] whose owner id is
/// `nsfb…` or `nsft…` and whose process is gone): named network namespaces, cgroups at the
/// cgroup2 root, and folders in the temporary directory (real folders owned by this user only,
/// never a link). Rootless worlds (`nsfv…`) are [`crate::rootless::cleanup_stale`]'s.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Leftovers {
    pub namespaces: Vec<String>,
    pub cgroups: Vec<PathBuf>,
    pub dirs: Vec<PathBuf>,
}

/// Whether `name` belongs to a dead bench run or a dead test.
fn dead(name: &str) -> bool {
    use crate::name::{dead_owner, BENCH, TEST};
    dead_owner(name).is_some_and(|p| p.starts_with(BENCH) || p.starts_with(TEST))
}

/// Entries of `dir` with a dead owner's name that are real directories (`own`: owned by this
/// process's effective user).
fn dead_dirs(dir: &Path, own: bool) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let euid = nix::unistd::Uid::effective().as_raw();
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(dead))
        .filter(|e| {
            e.path()
                .symlink_metadata()
                .is_ok_and(|m| m.is_dir() && (!own || m.uid() == euid))
        })
        .map(|e| e.path())
        .collect()
}

/// Finds what [`Leftovers`] describes.
pub fn leftovers() -> Leftovers {
    Leftovers {
        namespaces: nsfast_sys::netns::list_named()
            .into_iter()
            .filter(|n| dead(n))
            .collect(),
        cgroups: nsfast_sys::cgroup::cgroup2_mount()
            .map(|m| dead_dirs(&m, false))
            .unwrap_or_default(),
        dirs: dead_dirs(&std::env::temp_dir(), true),
    }
}

/// The one "remove what a dead run left" cleanup (`nsfast bench --cleanup`): removes what
/// [`leftovers`] finds, and the `nsfast pod` state of killed runs' pod
/// topologies (`bpf`, `netkit`): pods of a stale host namespace are deleted through
/// `nsfast pod` (their tc filters, pins and records with them) before the namespaces go, and
/// pod state whose host namespace is already gone is removed after. Returns what was removed.
pub fn dead_runs() -> Vec<String> {
    let mut done = Vec::new();
    for n in &leftovers().namespaces {
        let Ok(host) = nsfast_pod::Host::open(Some(n)) else {
            continue;
        };
        if !host.state_dir().exists() && !host.pin_dir().exists() {
            continue;
        }
        drop(host);
        match nsfast_pod::pod::del_all(Some(n)) {
            Ok(pods) => done.push(format!(
                "nsfast pod state of host namespace {n} ({} pod(s))",
                pods.len()
            )),
            Err(e) => tracing::warn!("pods of stale host namespace {n}: {e}"),
        }
    }
    // Pod namespaces went with their pods: list again.
    let left = leftovers();
    for n in left.namespaces {
        match nsfast_sys::netns::delete_named(&n) {
            Ok(()) => done.push(format!("network namespace {n}")),
            Err(e) => tracing::warn!("{e}"),
        }
    }
    for c in left.cgroups {
        match remove_cgroup_tree(&c) {
            Ok(()) => done.push(format!("cgroup {}", c.display())),
            Err(e) => tracing::warn!("remove cgroup {}: {e}", c.display()),
        }
    }
    // BIRD processes of killed `bird` worlds (their configurations are in these folders).
    done.extend(crate::bird::kill_stale(&left.dirs));
    for d in left.dirs {
        match fs::remove_dir_all(&d) {
            Ok(()) => done.push(format!("folder {}", d.display())),
            Err(e) => tracing::warn!("remove {}: {e}", d.display()),
        }
    }
    match nsfast_pod::pod::remove_orphaned_state() {
        Ok(dirs) => done.extend(
            dirs.iter()
                .map(|d| format!("nsfast pod state of a deleted namespace: {}", d.display())),
        ),
        Err(e) => tracing::warn!("orphaned pod state: {e}"),
    }
    // The slirp4netns / vpnrelay topologies build vpnrelay's test world (nsfv<pid>x<n>-*):
    // its tenant processes, namespaces and runtime folder.
    done.extend(crate::rootless::cleanup_stale());
    done
}
