//! Find running shortcut instances (and ones still draining after their loader exited) from
//! the kernel's own lists of programs and maps: no pins, no state files.

use std::borrow::Borrow;
use std::path::{Path, PathBuf};

use aya::maps::{Array, MapData, PerCpuArray, SockHash};
use nsfast_bpf::sockmap_entries::open_map;
use serde::Serialize;

use crate::abi::{self, Config, Counters, Stat};
use crate::error::SockmapError;

/// Counters summed over CPUs, plus the sockets currently in the map.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Sockets currently in the SOCKHASH.
    pub sockets: u64,
    pub sockets_added: u64,
    pub sockets_add_failed: u64,
    /// Connections whose two ends were paired.
    pub pairs: u64,
    /// Ambiguous pair keys (two connections with the same key): neither was paired.
    pub pair_conflicts: u64,
    pub redirected_msgs: u64,
    pub redirected_bytes: u64,
    pub passed_msgs: u64,
    pub passed_bytes: u64,
    /// Directions that sent on the kernel path before pairing completed (stay on it).
    pub tainted: u64,
    /// Redirects that found the peer gone and fell back to the kernel path.
    pub redirect_failed: u64,
    /// Connections skipped by the port filter.
    pub skipped_port: u64,
    /// Tracked sockets that closed and owned map entries (the first end of each pair, or one
    /// left unpaired; the claiming end owns none and takes no close callback).
    pub closed: u64,
    /// Receiving sockets seen reading with splice(2) or sendfile(2).
    pub splice_readers: u64,
    /// Directions moved to TCP because their receiver reads with splice(2)/sendfile(2).
    pub splice_pass: u64,
    /// splice(2)/sendfile(2) calls refused with EINVAL because shortcut bytes were unread.
    pub splice_refused: u64,
    /// Directions moved to TCP because their receiver fell behind by the queue limit.
    pub queue_limit: u64,
    /// Directions kept on TCP because the receiver's read counters were missing.
    pub rx_missing: u64,
    /// Sends kept on TCP until their receiver was seen reading (recvmsg) all of it.
    pub gated_msgs: u64,
    pub gated_bytes: u64,
    /// Sockets kept on TCP for a socket option or read flag the shortcut cannot honour
    /// (SO_RCVLOWAT, SO_ZEROCOPY, TCP_ULP, MSG_WAITALL, MSG_OOB).
    pub kept_tcp: u64,
    /// Connection ends kept on TCP without joining: their endpoints' recent connections gained
    /// nothing from the shortcut (admission, `--keep-tcp-after`).
    pub skipped_short: u64,
}

/// Reads the counters and counts the sockets in the map.
pub(crate) fn read_stats<S, H>(
    stats: PerCpuArray<S, Counters>,
    hash: SockHash<H, u64>,
) -> Result<Stats, SockmapError>
where
    S: Borrow<MapData>,
    H: Borrow<MapData>,
{
    let per_cpu = stats
        .get(&0, 0)
        .map_err(SockmapError::map("read nsf_stats"))?;
    let get = |s: Stat| -> Result<u64, SockmapError> {
        Ok(per_cpu.iter().map(|c| c.v[s as usize]).sum())
    };
    Ok(Stats {
        sockets: hash.keys().filter(|k| k.is_ok()).count() as u64,
        sockets_added: get(Stat::SockAdded)?,
        sockets_add_failed: get(Stat::SockAddFailed)?,
        pairs: get(Stat::Paired)?,
        pair_conflicts: get(Stat::PairConflict)?,
        redirected_msgs: get(Stat::RedirectMsgs)?,
        redirected_bytes: get(Stat::RedirectBytes)?,
        passed_msgs: get(Stat::PassMsgs)?,
        passed_bytes: get(Stat::PassBytes)?,
        tainted: get(Stat::Tainted)?,
        redirect_failed: get(Stat::RedirectFailed)?,
        skipped_port: get(Stat::SkippedPort)?,
        closed: get(Stat::Closed)?,
        splice_readers: get(Stat::SpliceReaders)?,
        splice_pass: get(Stat::SplicePass)?,
        splice_refused: get(Stat::SpliceRefused)?,
        queue_limit: get(Stat::QueueLimit)?,
        rx_missing: get(Stat::RxMissing)?,
        gated_msgs: get(Stat::GatedMsgs)?,
        gated_bytes: get(Stat::GatedBytes)?,
        kept_tcp: get(Stat::KeptTcp)?,
        skipped_short: get(Stat::SkippedShort)?,
    })
}

/// The settings an instance was loaded with (`sockmap run` options; a pod shortcut has the
/// default queue limit and `pod shortcut enable`'s admission).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Settings {
    /// `--queue-limit`: bytes a receiver may leave unread before its sender moves to TCP.
    pub queue_limit: u64,
    /// `--keep-tcp-after`: short connections in a row after which new ones keep TCP (0:
    /// every connection joins).
    pub keep_tcp_after: u32,
    /// `--probe-interval` in nanoseconds.
    pub probe_interval_ns: u64,
}

impl From<&Config> for Settings {
    fn from(c: &Config) -> Self {
        Settings {
            queue_limit: c.queue_limit,
            keep_tcp_after: c.admit_after,
            probe_interval_ns: c.admit_probe_ns,
        }
    }
}

/// One shortcut instance found in the kernel.
#[derive(Debug, Clone, Serialize)]
pub struct Instance {
    pub sk_msg_prog_id: u32,
    pub sockops_prog_id: Option<u32>,
    pub cgroup_id: u64,
    pub cgroup_path: Option<PathBuf>,
    pub loader_pid: u32,
    pub loader_alive: bool,
    /// Whether the sockops program is still attached to the cgroup. An instance that is not
    /// attached any more is draining: its sockets keep the shortcut until they close.
    pub attached: bool,
    pub started_unix: u64,
    /// A pod shortcut (`nsfast pod shortcut`, pinned, no loader process) rather than a
    /// `sockmap run` instance.
    pub pod_mode: bool,
    /// What the instance was loaded with (None if its nsf_config could not be read).
    pub settings: Option<Settings>,
    pub stats: Stats,
    /// The last connection ends that kept TCP, oldest first (up to 64).
    pub kept_recent: Vec<nsfast_bpf::sockmap_kept::KeptConn>,
    /// Entries in the pairing maps now (None where the sockops program is gone).
    pub map_entries: Option<nsfast_bpf::sockmap_entries::MapEntries>,
}

/// The kept-TCP log among the maps of program `prog` (empty when it has none).
fn kept_of(prog: &aya::programs::ProgramInfo) -> Vec<nsfast_bpf::sockmap_kept::KeptConn> {
    let Ok(Some(ids)) = prog.map_ids() else {
        return Vec::new();
    };
    let (mut events, mut head) = (None, None);
    for id in ids {
        match open_map(id) {
            Some((n, m)) if n == abi::MAP_KEPT => events = Some(m),
            Some((n, m)) if n == abi::MAP_KEPT_HEAD => head = Some(m),
            _ => {}
        }
    }
    let (Some(e), Some(h)) = (events, head) else {
        return Vec::new();
    };
    nsfast_bpf::sockmap_kept::KeptLog::new(e, h)
        .and_then(|l| l.since(0))
        .map(|b| b.events)
        .unwrap_or_default()
}

/// All instances of the shortcut currently loaded in the kernel.
pub fn instances() -> Result<Vec<Instance>, SockmapError> {
    // A program that went away between the kernel's list and its open is skipped; a refusal
    // (EPERM without CAP_SYS_ADMIN/CAP_BPF) is an error, never an empty answer.
    let mut progs = Vec::new();
    for p in aya::programs::loaded_programs() {
        match p {
            Ok(p) => progs.push(p),
            Err(e) if nsfast_sys::report::is_permission_error(&e) => {
                return Err(SockmapError::Program {
                    what: "listing the loaded BPF programs",
                    source: Box::new(e),
                })
            }
            Err(_) => {}
        }
    }
    let mut out = Vec::new();
    for p in progs
        .iter()
        .filter(|p| p.name_as_str() == Some(abi::PROG_SK_MSG))
    {
        let Ok(Some(map_ids)) = p.map_ids() else {
            continue;
        };
        let mut stats_map = None;
        let mut hash_map = None;
        let mut read_config = None;
        let mut hash_id = None;
        for id in &map_ids {
            let Some((name, map)) = open_map(*id) else {
                continue;
            };
            match name.as_str() {
                abi::MAP_STATS => stats_map = PerCpuArray::<MapData, Counters>::try_from(map).ok(),
                abi::MAP_SOCKHASH => {
                    hash_id = Some(*id);
                    hash_map = SockHash::<MapData, u64>::try_from(map).ok();
                }
                abi::MAP_CONFIG => {
                    read_config = Array::<MapData, Config>::try_from(map)
                        .ok()
                        .and_then(|a| a.get(&0, 0).ok());
                }
                _ => {}
            }
        }
        let (Some(s), Some(h)) = (stats_map, hash_map) else {
            continue;
        };
        let config = read_config.unwrap_or_default();
        let stats = read_stats(s, h)?;
        // The sockops program of the same instance uses the same sockhash.
        let sockops = hash_id.and_then(|h| {
            progs
                .iter()
                .find(|q| nsfast_bpf::sockmap_entries::is_sockops_of(q, h))
        });
        let sockops_prog_id = sockops.map(|q| q.id());
        let kept_recent = sockops.map(kept_of).unwrap_or_default();
        let map_entries = sockops.and_then(nsfast_bpf::sockmap_entries::of_program);
        let cgroup_path = find_cgroup_by_id(config.cgroup_id);
        let attached = match (&cgroup_path, sockops_prog_id) {
            (Some(path), Some(id)) => std::fs::File::open(path)
                .ok()
                .and_then(|f| {
                    nsfast_sys::bpf::prog_query(
                        std::os::fd::AsFd::as_fd(&f),
                        nsfast_sys::bpf::BPF_CGROUP_SOCK_OPS,
                    )
                    .ok()
                })
                .is_some_and(|ids| ids.contains(&id)),
            _ => false,
        };
        out.push(Instance {
            sk_msg_prog_id: p.id(),
            sockops_prog_id,
            cgroup_id: config.cgroup_id,
            cgroup_path,
            loader_pid: config.loader_pid,
            loader_alive: config.loader_pid != 0
                && Path::new(&format!("/proc/{}", config.loader_pid)).exists(),
            attached,
            started_unix: config.started_unix,
            pod_mode: config.port_mode & abi::MODE_PODS != 0,
            settings: read_config.as_ref().map(Settings::from),
            stats,
            kept_recent,
            map_entries,
        });
    }
    Ok(out)
}

/// Finds the cgroup2 directory whose inode is `id` (searching a few levels deep).
pub(crate) fn find_cgroup_by_id(id: u64) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let root = nsfast_sys::cgroup::cgroup2_mount().ok()?;
    let mut stack = vec![(root, 0u32)];
    while let Some((dir, depth)) = stack.pop() {
        if std::fs::metadata(&dir).ok()?.ino() == id {
            return Some(dir);
        }
        if depth >= 6 {
            continue;
        }
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push((e.path(), depth + 1));
                }
            }
        }
    }
    None
}
