//! Removing what a killed run left: worlds whose builder is gone, and their processes.

use super::*;

/// The world prefix (`nsfv<pid>x<n>`) at the start of `name` if the process that built that
/// world is gone, e.g. after a SIGKILLed test or `nsfast bench` run.
fn dead_world_prefix(name: &str) -> Option<String> {
    crate::name::dead_owner(name).filter(|p| p.starts_with(crate::name::WORLD))
}

/// Removes what worlds of dead processes left: their tenant processes (RootlessKit,
/// slirp4netns, dockerd, relays: everything whose `XDG_RUNTIME_DIR` is the world's runtime
/// folder or that lives in the world's host namespace), the `-host`/`-srv` namespaces and the
/// runtime folder. Worlds of running processes are left alone. Returns what was removed.
pub fn cleanup_stale() -> Vec<String> {
    let mut prefixes = BTreeSet::new();
    let named = nsfast_sys::netns::list_named();
    for n in &named {
        if let Some(p) = dead_world_prefix(n) {
            prefixes.insert(p);
        }
    }
    let tmp = std::env::temp_dir();
    for e in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
        if let Some(name) = e.file_name().to_str() {
            if name.ends_with("-xdg") {
                if let Some(p) = dead_world_prefix(name) {
                    prefixes.insert(p);
                }
            }
        }
    }
    let mut done = Vec::new();
    for p in prefixes {
        let runtime_dir = tmp.join(format!("{p}-xdg"));
        let env_marker = format!("XDG_RUNTIME_DIR={}", runtime_dir.display());
        let host_ino = NetNs::open(&format!("{p}-host")).ok().map(|ns| ns.inode());
        let killed = kill_world_processes(&env_marker, host_ino);
        if killed > 0 {
            done.push(format!("{killed} process(es) of vpnrelay world {p}"));
        }
        for suffix in ["host", "srv"] {
            let name = format!("{p}-{suffix}");
            if named.contains(&name) {
                match nsfast_sys::netns::delete_named(&name) {
                    Ok(()) => done.push(format!("network namespace {name}")),
                    Err(e) => tracing::warn!("{e}"),
                }
            }
        }
        if runtime_dir.exists() {
            match std::fs::remove_dir_all(&runtime_dir) {
                Ok(()) => done.push(format!("folder {}", runtime_dir.display())),
                Err(e) => tracing::warn!("remove {}: {e}", runtime_dir.display()),
            }
        }
    }
    done
}

/// Ends the processes [`world_processes`] finds (SIGTERM, then SIGKILL) and returns how many
/// there were. A process caught in `execve` shows an empty environment for a moment (the kernel
/// sets it up after the parent of a `vfork`-style spawn already runs again), so one empty scan
/// is not the end: the scan is repeated after a pause and only two empty scans in a row are.
fn kill_world_processes(env_marker: &str, host_ino: Option<u64>) -> usize {
    let mut signalled = BTreeSet::new();
    let mut empty_scans = 0;
    for _ in 0..8 {
        let pids = world_processes(env_marker, host_ino);
        if pids.is_empty() {
            empty_scans += 1;
            if empty_scans == 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        empty_scans = 0;
        for pid in &pids {
            // A process seen in an earlier round had its SIGTERM: now SIGKILL.
            let sig = if signalled.insert(*pid) {
                nix::sys::signal::Signal::SIGTERM
            } else {
                nix::sys::signal::Signal::SIGKILL
            };
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid as i32), sig);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    signalled.len()
}

/// PIDs (not this process) whose environment carries `env_marker` or whose network namespace
/// has inode `host_ino`.
fn world_processes(env_marker: &str, host_ino: Option<u64>) -> BTreeSet<u32> {
    let mut out = BTreeSet::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        let in_host = host_ino.is_some()
            && std::fs::metadata(format!("/proc/{pid}/ns/net"))
                .map(|m| m.ino())
                .ok()
                == host_ino;
        let env_hit = std::fs::read(format!("/proc/{pid}/environ"))
            .map(|env| env.split(|b| *b == 0).any(|kv| kv == env_marker.as_bytes()))
            .unwrap_or(false);
        if in_host || env_hit {
            out.insert(pid);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{dead_world_prefix, kill_world_processes};
    use std::time::Duration;

    /// A process of a dead world that is still in `execve` when the cleanup scans `/proc` (its
    /// environment not yet readable) is ended all the same. One scan found nothing in ~97 % of
    /// such spawns here (and a process it misses, e.g. a `sleep 600`, stays for its whole
    /// 600 s).
    #[test]
    fn a_world_process_caught_in_execve_is_ended() {
        let dir = format!("/tmp/nsfv-exec-race-{}-xdg", std::process::id());
        let marker = format!("XDG_RUNTIME_DIR={dir}");
        for _ in 0..5 {
            let mut c = std::process::Command::new("sleep")
                .arg("600")
                .env("XDG_RUNTIME_DIR", &dir)
                .spawn()
                .unwrap();
            let killed = kill_world_processes(&marker, None);
            let status = crate::wait_or_kill(&mut c, Duration::from_secs(5));
            assert!(
                status.is_some_and(|s| !s.success()),
                "a process spawned just before the scan was left running ({killed} ended)"
            );
            assert_eq!(killed, 1);
        }
    }

    #[test]
    fn world_prefixes_of_dead_processes_only() {
        let dead = (3_000_000..4_000_000u32)
            .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
            .unwrap();
        assert_eq!(
            dead_world_prefix(&format!("nsfv{dead}x3-host")),
            Some(format!("nsfv{dead}x3"))
        );
        assert_eq!(
            dead_world_prefix(&format!("nsfv{dead}x12-xdg")),
            Some(format!("nsfv{dead}x12"))
        );
        let me = std::process::id();
        assert_eq!(dead_world_prefix(&format!("nsfv{me}x0-host")), None);
        for bad in [
            "nsfvx1-host",
            "nsfv12-host",
            "nsfvabcx1-host",
            "nsfb-1-host",
            "nsfv1x-srv",
        ] {
            assert_eq!(dead_world_prefix(bad), None, "{bad}");
        }
    }
}
