//! The one "remove what a dead run left" cleanup, for every throwaway name of [`crate::name`]
//! whose owning process is gone: bench runs' namespaces, cgroups and pod state, and rootless
//! worlds' processes, namespaces and folders. Live runs' objects are left alone.

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

/// Namespaces and cgroups left by bench runs whose process is gone (`nsfb-<pid>-...`,
/// [`crate::name::run_prefix`]).
pub fn bench_leftovers() -> (Vec<String>, Vec<PathBuf>) {
    let dead = |name: &str| -> bool {
        crate::name::dead_owner(name).is_some_and(|p| p.starts_with(crate::name::BENCH))
    };
    let ns: Vec<String> = nsfast_sys::netns::list_named()
        .into_iter()
        .filter(|n| dead(n))
        .collect();
    let cgs = nsfast_sys::cgroup::cgroup2_mount()
        .ok()
        .and_then(|m| fs::read_dir(m).ok())
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_str().is_some_and(dead))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    (ns, cgs)
}

/// The one "remove what a dead run left" cleanup (`nsfast bench --cleanup`): removes what
/// [`bench_leftovers`] finds, and the `nsfast pod` state of killed runs' pod
/// topologies (`bpf`, `netkit`): pods of a stale host namespace are deleted through
/// `nsfast pod` (their tc filters, pins and records with them) before the namespaces go, and
/// pod state whose host namespace is already gone is removed after. Returns what was removed.
pub fn dead_runs() -> Vec<String> {
    let mut done = Vec::new();
    let (ns, _) = bench_leftovers();
    for n in &ns {
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
    let (ns, cgs) = bench_leftovers();
    for n in ns {
        match nsfast_sys::netns::delete_named(&n) {
            Ok(()) => done.push(format!("network namespace {n}")),
            Err(e) => tracing::warn!("{e}"),
        }
    }
    for c in cgs {
        match remove_cgroup_tree(&c) {
            Ok(()) => done.push(format!("cgroup {}", c.display())),
            Err(e) => tracing::warn!("remove cgroup {}: {e}", c.display()),
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
