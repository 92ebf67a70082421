//! Where a host's pods are remembered between invocations.
//!
//! Two places per host network namespace, both keyed by the namespace's netns cookie and
//! inode (`cookie-<cookie>-ino-<inode>`), so the same host reached by name (`--host NS`) or as
//! the current namespace (the CNI plugin) shares one state. The cookie (`SO_NETNS_COOKIE`) is
//! what identifies the namespace: the kernel reuses inode numbers at once, never cookies, so a
//! new namespace that got a dead one's inode never sees the dead one's pods. The inode is in
//! the key only to find out cheaply whether the namespace still exists.
//! - bpffs `<bpffs>/nsfast-pod/<key>/`: the pinned endpoint and counter maps and one pinned
//!   BPF link per attachment (`link-<ifname>`, `uplink-<ifname>`). Pins keep the programs
//!   attached after `nsfast pod add` exits; removing a pin detaches its program.
//! - `/run/nsfast/pod/<key>/`: one JSON record per pod (what `del`/`list`/CNI `CHECK` need:
//!   names, devices, netns ownership, and the priority/handle of classic-tc filters, which
//!   cannot be pinned), `uplinks/<ifname>.json` for an uplink's tc filter, and a lock file
//!   serialising concurrent changes.
//!
//! A pod record is written (fsync'd, atomic rename) *before* `add` changes anything, marked
//! `pending` and naming what will be made; it is completed after. A pending record seen with
//! the host's lock held belongs to an `add` that died (every `add` holds the lock until it
//! completes or undoes its record): the next `add`, `del` or CNI `GC` of that pod undoes it.
//!
//! State written before the cookie key (`netns-<inode>`) is adopted by the namespace that has
//! that inode only if its records' devices are there (same name, ifindex and MAC); otherwise it
//! is stale (see [`orphaned_keys`]).
//!
//! Both live on memory file systems: like the namespaces and links they describe, they do not
//! survive a reboot. When a host's last pod goes, both directories are removed.

use std::fs::{self, File};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use nsfast_sys::net::Netlink;
use nsfast_sys::netns::{NetNs, NetnsError};
use serde::{Deserialize, Serialize};

use crate::error::PodError;

/// Root of the per-host state directories.
pub const STATE_ROOT: &str = "/run/nsfast/pod";
/// Root of the per-host policy directories (the policy module writes them; a host's removal here
/// takes its directory too).
pub const POLICY_ROOT: &str = "/run/nsfast/policy";
/// Directory under the bpffs mount.
pub const PIN_SUBDIR: &str = "nsfast-pod";

/// The bpffs mount used for pins: `$NSFAST_BPFFS` or /sys/fs/bpf.
pub fn bpffs_root() -> PathBuf {
    std::env::var_os("NSFAST_BPFFS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/sys/fs/bpf"))
}

const BPF_FS_MAGIC: i64 = 0xcafe4a11;

/// Makes sure the bpffs root is a bpffs mount, mounting one there if it is not (as systemd
/// and Cilium do at boot).
pub fn ensure_bpffs() -> Result<PathBuf, PodError> {
    let root = bpffs_root();
    // Concurrent callers (threads or processes) serialise on a lock of the directory itself,
    // so bpffs is mounted once, not stacked (a second mount would hide the first one's pins).
    let dir = File::open(&root).map_err(PodError::io(format!("open {}", root.display())))?;
    let _lock =
        nsfast_sys::lockfile::lock_exclusive(dir, &root, nsfast_sys::lockfile::timeout_from_env())
            .map_err(|e| PodError::Io {
                what: format!("lock the bpffs mount point: {e}"),
                source: std::io::Error::from(e.kind()),
            })?;
    let st = nix::sys::statfs::statfs(&root).map_err(|e| PodError::Io {
        what: format!("statfs {}", root.display()),
        source: e.into(),
    })?;
    if st.filesystem_type().0 as i64 != BPF_FS_MAGIC {
        tracing::info!("mounting bpffs at {} (it was not mounted)", root.display());
        nix::mount::mount(
            Some("bpf"),
            &root,
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            Some("mode=0700"),
        )
        .map_err(|e| PodError::Io {
            what: format!("mount bpffs at {}", root.display()),
            source: e.into(),
        })?;
    }
    Ok(root)
}

/// A host network namespace and its state paths.
#[derive(Debug)]
pub struct Host {
    pub ns: NetNs,
    /// `--host` name, or "current" for the caller's namespace.
    pub display: String,
    pub key: String,
    /// The host namespace's netlink handle, opened on first use (see [`Host::netlink`]).
    nl: std::sync::OnceLock<Netlink>,
}

impl Host {
    /// `Some(name)`: the named namespace under /run/netns (or a path to a namespace);
    /// `None`: the caller's namespace. Anything that is not a network namespace is refused.
    pub fn open(name: Option<&str>) -> Result<Self, PodError> {
        let (ns, display) = match name {
            Some(n) => (
                NetNs::open(n).map_err(|e| match e {
                    NetnsError::NotFound(_) => PodError::NoHost(n.to_string()),
                    e => PodError::Netns(e),
                })?,
                n.to_string(),
            ),
            None => (NetNs::current()?, "current".to_string()),
        };
        let key = host_key(ns.cookie()?, ns.inode());
        let host = Self {
            ns,
            display,
            key,
            nl: std::sync::OnceLock::new(),
        };
        host.adopt_legacy_state();
        Ok(host)
    }

    /// State under the inode-only key (`netns-<inode>`, which builds that predate the cookie
    /// key write): moved to this host's key if its records describe devices this namespace
    /// has (a live host, upgraded); left for [`orphaned_keys`] otherwise (a dead namespace
    /// whose inode this one got). Best effort: failing leaves it where it is, stale.
    /// The host namespace's netlink handle: opened on first use and reused for the rest of
    /// this `Host`'s life, so one operation (one `Host`) opens one connection to the host.
    pub fn netlink(&self) -> Result<&Netlink, PodError> {
        if let Some(n) = self.nl.get() {
            return Ok(n);
        }
        let n = self.ns.netlink()?;
        Ok(self.nl.get_or_init(|| n))
    }

    fn adopt_legacy_state(&self) {
        let legacy = legacy_key(self.ns.inode());
        let old_state = Path::new(STATE_ROOT).join(&legacy);
        if !old_state.exists() {
            return;
        }
        let path = old_state.join(".lock");
        let Ok(f) = nsfast_sys::lockfile::open_private(&path) else {
            return;
        };
        let timeout = nsfast_sys::lockfile::timeout_from_env();
        let Ok(_lock) = nsfast_sys::lockfile::lock_exclusive(f, &path, timeout) else {
            return;
        };
        let Ok(nl) = self.netlink() else {
            return;
        };
        if !legacy_state_belongs(nl, &old_state) {
            return;
        }
        if let Err(e) = self.migrate_from(&legacy) {
            tracing::warn!("adopt pod state {legacy} for host {}: {e}", self.display);
        } else {
            tracing::info!(
                "pod state {legacy} adopted as {} (host {})",
                self.key,
                self.display
            );
        }
    }

    fn migrate_from(&self, legacy: &str) -> Result<(), PodError> {
        let (old_state, old_pins) = (
            Path::new(STATE_ROOT).join(legacy),
            bpffs_root().join(PIN_SUBDIR).join(legacy),
        );
        if self.state_dir().exists() || self.pin_dir().exists() {
            return Err(PodError::Io {
                what: format!("{} already has state", self.key),
                source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
            });
        }
        if old_pins.exists() {
            fs::rename(&old_pins, self.pin_dir())
                .map_err(PodError::io(format!("rename {}", old_pins.display())))?;
        }
        fs::rename(&old_state, self.state_dir())
            .map_err(PodError::io(format!("rename {}", old_state.display())))?;
        for mut r in self.records()? {
            for p in &mut r.link_pins {
                if let Ok(rest) = p.strip_prefix(&old_pins) {
                    *p = self.pin_dir().join(rest);
                }
            }
            self.write_record(&r)?;
        }
        Ok(())
    }

    pub fn state_dir(&self) -> PathBuf {
        Path::new(STATE_ROOT).join(&self.key)
    }

    pub fn pin_dir(&self) -> PathBuf {
        bpffs_root().join(PIN_SUBDIR).join(&self.key)
    }

    /// Where the cls_bpf filters on uplinks are remembered (TCX uplinks are pins instead).
    pub fn uplink_dir(&self) -> PathBuf {
        self.state_dir().join("uplinks")
    }

    /// The tc filter on uplink `ifname`, if the wire program is attached there with tc.
    pub fn uplink_tc(&self, ifname: &str) -> Result<Option<TcFilter>, PodError> {
        let p = self.uplink_dir().join(format!("{ifname}.json"));
        let body = match fs::read(&p) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(PodError::io(format!("read {}", p.display()))(e)),
        };
        serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| PodError::State { path: p, source: e })
    }

    /// Every uplink tc filter of this host, sorted by device.
    pub fn uplink_tcs(&self) -> Result<Vec<TcFilter>, PodError> {
        let mut v = Vec::new();
        let Ok(rd) = fs::read_dir(self.uplink_dir()) else {
            return Ok(v);
        };
        for e in rd.flatten() {
            let name = e.file_name();
            if let Some(dev) = name.to_str().and_then(|n| n.strip_suffix(".json")) {
                if let Some(f) = self.uplink_tc(dev)? {
                    v.push(f);
                }
            }
        }
        v.sort_by(|a, b| a.ifname.cmp(&b.ifname));
        Ok(v)
    }

    /// Remembers an uplink's tc filter (written as soon as it is attached).
    pub fn write_uplink_tc(&self, f: &TcFilter) -> Result<(), PodError> {
        let dir = self.uplink_dir();
        create_dir_all_racy(&dir)?;
        let p = dir.join(format!("{}.json", f.ifname));
        let body = serde_json::to_vec_pretty(f).map_err(|e| PodError::State {
            path: p.clone(),
            source: e,
        })?;
        write_private(&dir, &p, &body)
    }

    /// Forgets an uplink's tc filter.
    pub fn remove_uplink_tc(&self, ifname: &str) -> Result<(), PodError> {
        let p = self.uplink_dir().join(format!("{ifname}.json"));
        match fs::remove_file(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(PodError::io(format!("remove {}", p.display()))(e)),
        }
    }

    pub fn record_path(&self, pod: &str) -> PathBuf {
        self.state_dir().join(format!("{pod}.json"))
    }

    /// Takes the host's lock (created with the state directory) until the guard drops.
    /// A lock whose directory was removed meanwhile (the host's last pod went) is retaken.
    /// The wait is bounded ([`nsfast_sys::lockfile::timeout_from_env`]) and a termination
    /// signal ends it; either error names the process holding the lock.
    ///
    /// Every change to a host's pods takes this lock, so this is also where a caller in a
    /// private mount namespace is refused (see
    /// [`nsfast_sys::netns::private_mount_namespace`]), before anything is made.
    pub fn lock(&self) -> Result<HostLock, PodError> {
        use nsfast_sys::lockfile;
        use std::os::unix::fs::MetadataExt;
        if let Some(why) = nsfast_sys::netns::private_mount_namespace() {
            return Err(PodError::PrivateMountNs(why));
        }
        let dir = self.state_dir();
        let path = dir.join(".lock");
        let timeout = lockfile::timeout_from_env();
        for _ in 0..50 {
            create_dir_all_racy(&dir)?;
            let f = match lockfile::open_private(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(PodError::io(format!("open {}", path.display()))(e)),
            };
            let lock = lockfile::lock_exclusive(f, &path, timeout).map_err(|e| PodError::Io {
                what: format!("lock the host's pod state: {e}"),
                source: std::io::Error::from(e.kind()),
            })?;
            let held = lock.metadata().map(|m| m.ino()).ok();
            let now = fs::metadata(&path).map(|m| m.ino()).ok();
            if held.is_some() && held == now {
                remove_stale_temps(&dir);
                return Ok(HostLock { _lock: lock });
            }
        }
        Err(PodError::Io {
            what: format!("lock {}: it keeps disappearing", path.display()),
            source: std::io::Error::from(std::io::ErrorKind::WouldBlock),
        })
    }

    /// Every pod record of this host, sorted by name.
    pub fn records(&self) -> Result<Vec<PodRecord>, PodError> {
        let mut out = Vec::new();
        let Ok(rd) = fs::read_dir(self.state_dir()) else {
            return Ok(out);
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "json") {
                out.push(read_record(&p)?);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    pub fn record(&self, pod: &str) -> Result<Option<PodRecord>, PodError> {
        let p = self.record_path(pod);
        if !p.exists() {
            return Ok(None);
        }
        read_record(&p).map(Some)
    }

    /// Writes `r` so that a crash leaves either the old or the new record, never a torn one
    /// (see `write_private`).
    pub fn write_record(&self, r: &PodRecord) -> Result<(), PodError> {
        let dir = self.state_dir();
        create_dir_all_racy(&dir)?;
        let p = self.record_path(&r.name);
        let body = serde_json::to_vec_pretty(r).map_err(|e| PodError::State {
            path: p.clone(),
            source: e,
        })?;
        write_private(&dir, &p, &body)
    }

    pub fn remove_record(&self, pod: &str) -> Result<(), PodError> {
        match fs::remove_file(self.record_path(pod)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(PodError::io("remove pod record")(e)),
        }
    }

    /// Removes the host's pins and state directory if no pod is left. Called with the lock
    /// held; the lock file goes with the directory.
    pub fn gc_if_empty(&self) -> Result<bool, PodError> {
        if !self.records()?.is_empty() {
            return Ok(false);
        }
        let pins = self.pin_dir();
        if pins.exists() {
            fs::remove_dir_all(&pins)
                .map_err(PodError::io(format!("remove {}", pins.display())))?;
        }
        let parent = bpffs_root().join(PIN_SUBDIR);
        let _ = fs::remove_dir(&parent); // only if empty
        let dir = self.state_dir();
        fs::remove_dir_all(&dir).map_err(PodError::io(format!("remove {}", dir.display())))?;
        let _ = fs::remove_dir(STATE_ROOT);
        let _ = fs::remove_dir("/run/nsfast");
        Ok(true)
    }
}

/// The state key of the namespace with netns cookie `cookie` and inode `inode`.
pub fn host_key(cookie: u64, inode: u64) -> String {
    format!("cookie-{cookie}-ino-{inode}")
}

/// The key nsfast used before the cookie: the inode alone (reused by the kernel).
pub fn legacy_key(inode: u64) -> String {
    format!("netns-{inode}")
}

/// A state key: the namespace's cookie (`None` for a legacy key) and inode.
pub fn parse_key(key: &str) -> Option<(Option<u64>, u64)> {
    if let Some(rest) = key.strip_prefix("cookie-") {
        let (c, i) = rest.split_once("-ino-")?;
        return Some((Some(c.parse().ok()?), i.parse().ok()?));
    }
    let i = key.strip_prefix("netns-")?.parse().ok()?;
    Some((None, i))
}

/// Whether the legacy state directory `dir` describes the namespace of `nl`: it has pod
/// records and each one's host device exists there with the recorded ifindex and MAC.
fn legacy_state_belongs(nl: &Netlink, dir: &Path) -> bool {
    let mut any = false;
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let Ok(r) = read_record(&p) else {
            return false;
        };
        let idx = nl.link_index(&r.host_if).ok();
        let mac = nl.link_mac(&r.host_if).ok();
        let mac = mac.map(|m| {
            m.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":")
        });
        if idx != Some(r.host_ifindex) || mac.as_deref() != Some(r.host_mac.as_str()) {
            return false;
        }
        any = true;
    }
    any
}

/// Every network namespace that can still be reached, by inode, with paths that reach it:
/// named ones (/run/netns), any process's or thread's (`/proc/*/task/*/ns/net`), any open
/// namespace fd (`/proc/*/fd/*`), and nsfs bind mounts in any mount namespace (e.g. a
/// container runtime's), found through each process's mountinfo and root.
pub fn live_netns() -> std::collections::BTreeMap<u64, Vec<PathBuf>> {
    use std::os::unix::fs::MetadataExt;
    let mut live: std::collections::BTreeMap<u64, Vec<PathBuf>> = Default::default();
    let mut add = |i: u64, p: PathBuf| live.entry(i).or_default().push(p);
    let mut mnt_seen = std::collections::BTreeSet::new();
    let parse = |p: &Path| -> Option<u64> {
        let t = fs::read_link(p).ok()?;
        let t = t.to_str()?;
        t.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
    };
    if let Ok(rd) = fs::read_dir("/run/netns") {
        for e in rd.flatten() {
            if let Ok(m) = fs::metadata(e.path()) {
                add(m.ino(), e.path());
            }
        }
    }
    for proc_ in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pd = proc_.path();
        if !proc_
            .file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        for t in fs::read_dir(pd.join("task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let p = t.path().join("ns/net");
            if let Some(i) = parse(&p) {
                add(i, p);
            }
        }
        for f in fs::read_dir(pd.join("fd")).into_iter().flatten().flatten() {
            if let Some(i) = parse(&f.path()) {
                add(i, f.path());
            }
        }
        // nsfs bind mounts, once per mount namespace, seen through this process's root.
        let Some(mnt) = fs::read_link(pd.join("ns/mnt")).ok() else {
            continue;
        };
        if !mnt_seen.insert(mnt) {
            continue;
        }
        let Ok(mi) = fs::read_to_string(pd.join("mountinfo")) else {
            continue;
        };
        for line in mi.lines() {
            let Some((pre, post)) = line.split_once(" - ") else {
                continue;
            };
            if post.split_whitespace().next() != Some("nsfs") {
                continue;
            }
            // The mount's root field names the namespace: `net:[<inode>]`.
            let mut f = pre.split_whitespace();
            let root = f.nth(3).unwrap_or("");
            let point = f.next().unwrap_or("");
            if let Some(i) = root
                .strip_prefix("net:[")
                .and_then(|r| r.strip_suffix(']'))
                .and_then(|r| r.parse().ok())
            {
                add(i, pd.join("root").join(point.trim_start_matches('/')));
            }
        }
    }
    live
}

/// Inodes of every network namespace that can still be reached ([`live_netns`]).
pub fn live_netns_inodes() -> std::collections::BTreeSet<u64> {
    live_netns().into_keys().collect()
}

/// Whether the namespace state `key` describes is gone, given the live namespaces: its inode
/// is not in use, or is in use by a namespace with another cookie (the kernel reused the
/// inode), or (legacy key) the namespace with that inode lacks the recorded devices. A live
/// namespace that cannot be opened to compare counts as alive (its state is kept).
fn key_is_stale(key: &str, live: &std::collections::BTreeMap<u64, Vec<PathBuf>>) -> bool {
    let Some((cookie, ino)) = parse_key(key) else {
        return false;
    };
    let Some(paths) = live.get(&ino) else {
        return true;
    };
    let ns = paths.iter().find_map(|p| {
        let ns = NetNs::open(&p.display().to_string()).ok()?;
        (ns.inode() == ino).then_some(ns)
    });
    let Some(ns) = ns else {
        return false;
    };
    match cookie {
        Some(c) => ns.cookie().is_ok_and(|now| now != c),
        None => match ns.netlink() {
            Ok(nl) => !legacy_state_belongs(&nl, &Path::new(STATE_ROOT).join(key)),
            Err(_) => true,
        },
    }
}

/// Host keys with pod state (pins or records) whose network namespace no longer exists
/// anywhere (`key_is_stale`): what is left when a host namespace was deleted without its
/// pods (a killed run, or a namespace deleted by hand), even if a new namespace got its inode.
pub fn orphaned_keys() -> Vec<String> {
    orphaned_keys_where(|_| true)
}

/// [`orphaned_keys`] restricted to keys with inode `inode`: stale state of dead namespaces
/// whose inode a live one now has.
pub fn orphaned_keys_of_inode(inode: u64) -> Vec<String> {
    orphaned_keys_where(|k| parse_key(k).is_some_and(|(_, i)| i == inode))
}

fn orphaned_keys_where(want: impl Fn(&str) -> bool) -> Vec<String> {
    let mut cands = std::collections::BTreeSet::new();
    for dir in [
        PathBuf::from(STATE_ROOT),
        bpffs_root().join(PIN_SUBDIR),
        PathBuf::from(POLICY_ROOT),
    ] {
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if parse_key(&name).is_some() && want(&name) {
                cands.insert(name);
            }
        }
    }
    if cands.is_empty() {
        return Vec::new();
    }
    let live = live_netns();
    cands
        .into_iter()
        .filter(|k| key_is_stale(k, &live))
        .collect()
}

/// Removes the pins, records and policies of host `key` (from [`orphaned_keys`]). Its namespace is gone,
/// and with it every device and tc filter the records describe; dropping the pins frees the
/// maps and the detached links. Returns what was removed.
pub fn remove_orphan(key: &str) -> Result<Vec<PathBuf>, PodError> {
    let mut gone = Vec::new();
    let state = Path::new(STATE_ROOT).join(key);
    // Serialise with anything that took this (then dead) host's lock.
    let path = state.join(".lock");
    let _lock = match nsfast_sys::lockfile::open_private(&path) {
        Ok(f) => Some(
            nsfast_sys::lockfile::lock_exclusive(
                f,
                &path,
                nsfast_sys::lockfile::timeout_from_env(),
            )
            .map_err(|e| PodError::Io {
                what: format!("lock the pod state of dead host {key}: {e}"),
                source: std::io::Error::from(e.kind()),
            })?,
        ),
        Err(_) => None,
    };
    for dir in [
        bpffs_root().join(PIN_SUBDIR).join(key),
        state.clone(),
        Path::new(POLICY_ROOT).join(key),
    ] {
        if dir.exists() {
            fs::remove_dir_all(&dir).map_err(PodError::io(format!("remove {}", dir.display())))?;
            gone.push(dir);
        }
    }
    let _ = fs::remove_dir(bpffs_root().join(PIN_SUBDIR));
    let _ = fs::remove_dir(STATE_ROOT);
    let _ = fs::remove_dir(POLICY_ROOT);
    let _ = fs::remove_dir("/run/nsfast");
    Ok(gone)
}

/// Whether `p` is one of the roots of pod state (policies included) or inside one (kept 0700).
fn private_root(p: &Path) -> bool {
    p.starts_with(STATE_ROOT)
        || p.starts_with(POLICY_ROOT)
        || p.starts_with(bpffs_root().join(PIN_SUBDIR))
}

/// `create_dir_all` that tolerates a parent being removed concurrently (by another host's
/// cleanup of the shared, then empty, parent directory). Every directory it makes is `0700`,
/// and `dir` and its ancestors up to the pod-state roots are made `0700` if they were not:
/// records name pods' addresses and namespaces, and no other user may open the lock inside.
pub fn create_dir_all_racy(dir: &Path) -> Result<(), PodError> {
    let mut last = None;
    for _ in 0..20 {
        match make_private_dir(dir) {
            Ok(()) => return Ok(()),
            // A step found something missing, or std's recursive create reported its mkdir's
            // EEXIST, and `dir` is gone now: another host's (or the last pod's) cleanup
            // removed it or a parent in between. Make it anew.
            Err((_, e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::AlreadyExists
                ) && fs::symlink_metadata(dir).is_err() =>
            {
                last = Some(e)
            }
            Err((what, e)) => return Err(PodError::io(what)(e)),
        }
    }
    Err(PodError::io(format!("create {}", dir.display()))(
        last.unwrap_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound)),
    ))
}

/// One try of [`create_dir_all_racy`]; an error names the step that failed.
fn make_private_dir(dir: &Path) -> Result<(), (String, std::io::Error)> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    fn at<'a>(
        what: &'a str,
        p: &'a Path,
    ) -> impl FnOnce(std::io::Error) -> (String, std::io::Error) + 'a {
        move |e| (format!("{what} {}", p.display()), e)
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(at("create", dir))?;
    let m = fs::symlink_metadata(dir).map_err(at("stat", dir))?;
    if !m.is_dir() {
        return Err(at("create", dir)(std::io::Error::from(
            std::io::ErrorKind::NotADirectory,
        )));
    }
    if m.permissions().mode() & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(at("chmod 0700", dir))?;
    }
    // The roots nsfast owns above it, however they were made (an older version, an admin's
    // `mkdir -p`): 0700 too, so no directory of pod state lists to others.
    for a in dir.ancestors().skip(1) {
        if !private_root(a) {
            continue;
        }
        let m = fs::symlink_metadata(a).map_err(at("stat", a))?;
        if m.is_dir() && m.permissions().mode() & 0o077 != 0 {
            fs::set_permissions(a, fs::Permissions::from_mode(0o700))
                .map_err(at("chmod 0700", a))?;
        }
    }
    Ok(())
}

/// Removes the temporary files ([`write_private`]'s `*.tmp`) in a host's state directory
/// and its uplink directory. Called with the host's lock held: every writer holds it, so a
/// temporary file seen then is what a killed writer left.
fn remove_stale_temps(dir: &Path) {
    for d in [dir.to_path_buf(), dir.join("uplinks")] {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "tmp") && e.file_type().is_ok_and(|t| t.is_file())
            {
                match fs::remove_file(&p) {
                    Ok(()) => tracing::info!("removed {}, left by a killed write", p.display()),
                    Err(e) => tracing::warn!("stale {}: {e}", p.display()),
                }
            }
        }
    }
}

/// Writes `body` to `p` (in directory `dir`) so that a crash leaves the old or the new file,
/// never a torn one: a `0600` temporary file (never through a symbolic link), fsync'd,
/// renamed over `p`, and the directory fsync'd.
pub(crate) fn write_private(dir: &Path, p: &Path, body: &[u8]) -> Result<(), PodError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut name = p.as_os_str().to_owned();
    name.push(".tmp");
    let tmp = PathBuf::from(name);
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(PodError::io(format!("create {}", tmp.display())))?;
    f.write_all(body)
        .and_then(|()| f.sync_all())
        .map_err(PodError::io(format!("write {}", tmp.display())))?;
    drop(f);
    fs::rename(&tmp, p).map_err(PodError::io(format!("write {}", p.display())))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(PodError::io(format!("fsync {}", dir.display())))
}

/// Largest pod record read (records are a few hundred bytes; a bigger file is not ours).
pub const MAX_RECORD: u64 = 1 << 20;

/// Parses a pod record as stored (the entry point for fuzzing the state reader).
pub fn parse_record(body: &[u8]) -> Result<PodRecord, serde_json::Error> {
    let mut r: PodRecord = serde_json::from_slice(body)?;
    // Records written before `attach` existed: netkit pods were netkit, veth pods TCX.
    if r.datapath != Datapath::Veth {
        r.attach = AttachMethod::Netkit;
    }
    Ok(r)
}

fn read_record(p: &Path) -> Result<PodRecord, PodError> {
    use std::io::Read;
    let mut body = Vec::new();
    File::open(p)
        .and_then(|f| f.take(MAX_RECORD + 1).read_to_end(&mut body))
        .map_err(PodError::io(format!("read {}", p.display())))?;
    if body.len() as u64 > MAX_RECORD {
        return Err(PodError::Io {
            what: format!(
                "pod record {} is larger than {MAX_RECORD} bytes",
                p.display()
            ),
            source: std::io::Error::from(std::io::ErrorKind::InvalidData),
        });
    }
    parse_record(&body).map_err(|e| PodError::State {
        path: p.to_path_buf(),
        source: e,
    })
}

/// Held while a host's pods change.
#[derive(Debug)]
pub struct HostLock {
    _lock: nix::fcntl::Flock<File>,
}

/// The device pair behind a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Datapath {
    /// veth pair, TCX program on the host end.
    Veth,
    /// netkit pair in L3 mode, programs on the primary.
    NetkitL3,
    /// netkit pair in L2 mode.
    NetkitL2,
}

/// How a pod's (or uplink's) programs are attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum AttachMethod {
    /// TCX ingress links (Linux 6.6+), pinned in bpffs.
    #[default]
    Tcx,
    /// Classic tc: a cls_bpf direct-action filter on the clsact ingress hook, made over
    /// netlink; not a BPF link, so remembered as a [`TcFilter`] in the state instead of a pin.
    Tc,
    /// netkit links (`BPF_NETKIT_PEER` / `BPF_NETKIT_PRIMARY`), pinned in bpffs.
    Netkit,
}

impl AttachMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            AttachMethod::Tcx => "tcx",
            AttachMethod::Tc => "tc",
            AttachMethod::Netkit => "netkit",
        }
    }
}

/// A cls_bpf filter nsfast attached (classic tc), with what removing exactly it needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcFilter {
    /// Device in the host namespace.
    pub ifname: String,
    /// Its index when attached: a device of the same name made later is left alone.
    pub ifindex: u32,
    /// Filter priority the kernel assigned.
    pub priority: u16,
    /// Filter handle the kernel assigned.
    pub handle: u32,
    /// The program's name, as the filter reports it.
    pub program: String,
    /// Whether nsfast added the device's clsact qdisc (then it is removed with the filter,
    /// unless other filters were added to it since).
    pub qdisc_added: bool,
    /// On the clsact egress hook (what the device sends); ingress otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub egress: bool,
}

impl Datapath {
    pub fn as_str(self) -> &'static str {
        match self {
            Datapath::Veth => "veth",
            Datapath::NetkitL3 => "netkit-l3",
            Datapath::NetkitL2 => "netkit-l2",
        }
    }
}

/// What `pod add` made, as remembered for `del`, `list` and CNI `CHECK`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRecord {
    pub name: String,
    pub ip: Ipv4Addr,
    pub prefix: u8,
    pub gateway: Ipv4Addr,
    /// The pod's IPv6 address (dual-stack or IPv6-only pods; then `ip` is 0.0.0.0 for an
    /// IPv6-only pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip6: Option<Ipv6Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix6: Option<u8>,
    /// The pod's IPv6 gateway (fe80::1), with `ip6`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway6: Option<Ipv6Addr>,
    pub datapath: Datapath,
    /// `--host` name or "current".
    pub host: String,
    /// The pod's namespace: a name under /run/netns or a path (CNI_NETNS).
    pub netns: String,
    /// Whether `pod add` created the namespace (then `del` deletes it).
    pub netns_owned: bool,
    pub host_if: String,
    pub host_ifindex: u32,
    pub pod_if: String,
    pub pod_mac: String,
    pub host_mac: String,
    /// How the programs are attached: `tcx`, `tc` (veth) or `netkit`.
    #[serde(default)]
    pub attach: AttachMethod,
    /// Pins of the BPF links attached for this pod (TCX, netkit).
    pub link_pins: Vec<PathBuf>,
    /// cls_bpf filters attached for this pod (classic tc).
    #[serde(default)]
    pub tc_filters: Vec<TcFilter>,
    /// CNI attachment, if made by nsfast-cni: (container id, network name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni: Option<CniAttachment>,
    /// The pod's traffic goes through the host stack (netfilter) instead of being redirected.
    #[serde(default)]
    pub host_firewall: bool,
    /// An intent, not a pod: `add` wrote this before changing anything and had not finished.
    /// It names what `add` makes (`host_if` and its pair, `link_pins`, the endpoint of `ip`
    /// unless unspecified, the namespace if `netns_owned`, the IPAM lease if `cni`); the
    /// next `add`/`del`/GC of the pod undoes whatever of it exists.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
    /// `--no-shortcut`: the pod's sockets never take the pod shortcut (crate::shortcut).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_shortcut: bool,
    /// The pod namespace's netns cookie (the shortcut's key for the pod), once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns_cookie: Option<u64>,
    /// What NetworkPolicies see of the pod: its Kubernetes namespace, name, labels and named
    /// ports (`pod add --namespace/--label/--named-port`, or the CNI runtime's).
    #[serde(flatten)]
    pub identity: PodIdentity,
}

/// A pod's identity as NetworkPolicies select it. It comes from whoever adds the pod (the
/// operator's `pod add` flags, the container runtime through CNI), never from the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodIdentity {
    /// The Kubernetes namespace (not the network namespace, which is `netns`).
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// The Kubernetes pod name (CNI `K8S_POD_NAME`), when it differs from `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k8s_name: Option<String>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// Named ports (container ports' names), which policies may name instead of numbers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub named_ports: Vec<nsfast_policy::NamedPort>,
}

impl Default for PodIdentity {
    fn default() -> Self {
        Self {
            namespace: default_namespace(),
            k8s_name: None,
            labels: Default::default(),
            named_ports: Vec::new(),
        }
    }
}

fn default_namespace() -> String {
    nsfast_policy::parse::DEFAULT_NAMESPACE.to_string()
}

impl PodRecord {
    /// The record as the CLI's `--json` shows it (`pod add`, `pod list`, `pod del`): the stored
    /// fields plus `ips` (every address with its prefix, IPv4 first, as in `pod list`'s IP
    /// column). An IPv6-only pod has no `ip`, `prefix` or `gateway` (the stored record keeps
    /// `0.0.0.0` there, which is no address of the pod).
    pub fn output_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).expect("a pod record serialises");
        if let Some(o) = v.as_object_mut() {
            if self.ip.is_unspecified() {
                for k in ["ip", "prefix", "gateway"] {
                    o.remove(k);
                }
            }
            o.insert("ips".into(), serde_json::json!(self.cidrs()));
        }
        v
    }

    /// The pod's addresses, IPv4 first: what its endpoint entries are keyed by (none for a CNI
    /// intent written before IPAM answered).
    pub fn addrs(&self) -> Vec<IpAddr> {
        let mut v = Vec::new();
        if !self.ip.is_unspecified() {
            v.push(IpAddr::V4(self.ip));
        }
        if let Some(a) = self.ip6 {
            v.push(IpAddr::V6(a));
        }
        v
    }

    /// The addresses with their prefixes, as `pod list` shows them (`10.0.0.5/24`,
    /// `fd00::5/64`).
    pub fn cidrs(&self) -> Vec<String> {
        let mut v = Vec::new();
        if !self.ip.is_unspecified() {
            v.push(format!("{}/{}", self.ip, self.prefix));
        }
        if let Some(a) = self.ip6 {
            v.push(format!("{a}/{}", self.prefix6.unwrap_or(128)));
        }
        v
    }
}

/// `serialize_with` for a record in command output: [`PodRecord::output_json`].
pub fn ser_record<S: serde::Serializer>(r: &PodRecord, s: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&r.output_json(), s)
}

/// `serialize_with` for records in command output: [`PodRecord::output_json`] each.
pub fn ser_records<S: serde::Serializer>(rs: &[PodRecord], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(rs.iter().map(PodRecord::output_json))
}

/// The CNI identity of a pod made by `nsfast-cni`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniAttachment {
    pub container_id: String,
    pub network: String,
    pub ifname: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host's last DEL removes its state directory under the lock while an ADD makes it
    /// before taking the lock: whichever step of the make the removal falls between, the
    /// make succeeds and the directory exists afterwards (the removal happens once a round,
    /// as a DEL's does).
    #[test]
    fn making_the_state_directory_survives_a_concurrent_removal() {
        let root = std::env::temp_dir().join(format!("nsfast-racy-mkdir-{}", std::process::id()));
        let dir = root.join("host");
        for round in 0..10000 {
            fs::create_dir_all(&dir).unwrap();
            let go = std::sync::Arc::new(std::sync::Barrier::new(2));
            let (d, g) = (dir.clone(), go.clone());
            let remover = std::thread::spawn(move || {
                g.wait();
                let _ = fs::remove_dir(&d);
            });
            go.wait();
            let made = create_dir_all_racy(&dir);
            remover.join().unwrap();
            if let Err(e) = made {
                fs::remove_dir_all(&root).ok();
                panic!("round {round}: {e}");
            }
            // The removal came after the make, or before it and the make redid it.
            fs::remove_dir_all(&dir).ok();
        }
        fs::remove_dir_all(&root).unwrap();
    }

    /// A record written before `attach`/`tc_filters` existed still reads, with the method its
    /// datapath implies.
    #[test]
    fn old_records_read_with_their_attach_method() {
        let dir = std::env::temp_dir().join(format!("nsfast-pod-state-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let body = |dp: &str| {
            format!(
                r#"{{"name":"p","ip":"10.0.0.1","prefix":24,"gateway":"169.254.1.1",
                "datapath":"{dp}","host":"h","netns":"p","netns_owned":true,
                "host_if":"nsf0","host_ifindex":3,"pod_if":"eth0","pod_mac":"","host_mac":"",
                "link_pins":[]}}"#
            )
        };
        for (dp, want) in [
            ("veth", AttachMethod::Tcx),
            ("netkit-l3", AttachMethod::Netkit),
        ] {
            let p = dir.join(format!("{dp}.json"));
            fs::write(&p, body(dp)).unwrap();
            let r = read_record(&p).unwrap();
            assert_eq!(r.attach, want, "{dp}");
            assert!(r.tc_filters.is_empty());
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn keys_round_trip_and_legacy_keys_parse() {
        assert_eq!(host_key(4096, 4026532000), "cookie-4096-ino-4026532000");
        assert_eq!(
            parse_key(&host_key(4096, 4026532000)),
            Some((Some(4096), 4026532000))
        );
        assert_eq!(parse_key(&legacy_key(77)), Some((None, 77)));
        for bad in [
            "",
            "netns-",
            "netns-x",
            "cookie-1",
            "cookie-a-ino-1",
            "cookie-1-ino-",
        ] {
            assert_eq!(parse_key(bad), None, "{bad}");
        }
    }

    /// A record without `pending` (every record before intents existed) is complete; a pending
    /// one round-trips, and a complete one is written without the field.
    #[test]
    fn pending_defaults_to_complete_and_round_trips() {
        let body = br#"{"name":"p","ip":"10.0.0.1","prefix":24,"gateway":"169.254.1.1",
            "datapath":"veth","host":"h","netns":"p","netns_owned":true,"host_if":"nsf0",
            "host_ifindex":3,"pod_if":"eth0","pod_mac":"","host_mac":"","link_pins":[]}"#;
        let mut r = parse_record(body).unwrap();
        assert!(!r.pending);
        assert!(!serde_json::to_string(&r).unwrap().contains("pending"));
        r.pending = true;
        let j = serde_json::to_vec(&r).unwrap();
        assert!(parse_record(&j).unwrap().pending);
        assert!(parse_record(b"{").is_err());
    }

    /// State of an inode no namespace has is stale; a key that is not ours never is.
    #[test]
    fn keys_of_unused_inodes_are_stale() {
        let live = std::collections::BTreeMap::new();
        assert!(key_is_stale(&host_key(1, 12345), &live));
        assert!(key_is_stale(&legacy_key(12345), &live));
        assert!(!key_is_stale("something-else", &live));
    }

    #[test]
    fn tc_filter_round_trips() {
        let f = TcFilter {
            ifname: "wire0".into(),
            ifindex: 7,
            priority: 49152,
            handle: 1,
            program: "nsf_pod_from_wire".into(),
            qdisc_added: true,
            egress: false,
        };
        let j = serde_json::to_string(&f).unwrap();
        assert_eq!(serde_json::from_str::<TcFilter>(&j).unwrap(), f);
    }
}
