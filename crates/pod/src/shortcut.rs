//! The pod shortcut: `nsfast sockmap`'s programs (`bpf/sockmap.bpf.c`, the same object) in pod
//! mode, attached for one host with no daemon.
//!
//! `enable` loads the object with `NSF_MODE_PODS`, attaches sk_msg to its SOCKHASH and sockops
//! to a cgroup (default: the cgroup2 root) by a BPF link, and pins the link and the maps under
//! the host's pin directory (`<pin dir>/shortcut/`), so they outlive the command. The maps
//! and link are built in `shortcut-new/` and renamed into place: a SIGKILLed `enable` leaves
//! either nothing or a `shortcut-new/` that the next `enable`/`disable`/`sync` removes.
//!
//! Only sockets whose network namespace is in `nsf_pods` take part: [`sync`] makes that map
//! match the host's complete pod records (netns cookie → host id, opt-out flag, counter slot),
//! called by `pod add`, `pod del` and `enable` with the host's lock held. It is idempotent,
//! so a retry after a crash repairs whatever a killed run left. `disable` unpins everything:
//! new connections take the kernel path at once, sockets already redirected keep their
//! redirect (the kernel keeps the maps alive while they hold them) until they close. The host's
//! last pod going removes the pin directory, and the shortcut with it.

use std::fs;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use aya::maps::{Array, HashMap as BpfHashMap, Map, MapData, PerCpuArray, PerCpuValues, SockHash};
use aya::programs::{links::FdLink, CgroupAttachMode, SkMsg, SockOps};
use aya::EbpfLoader;
use nsfast_bpf::sockmap_abi::{
    self as abi, Config, Counters, PodCounters, PodEntry, PodStat, Stat,
};
use nsfast_sys::cgroup::{cgroup2_mount, Cgroup};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::abi as pabi;
use crate::error::PodError;
use crate::fault::crash_point;
use crate::state::{create_dir_all_racy, ensure_bpffs, Host, HostLock, PodRecord};

/// What the shortcut bypasses, for `status` and the docs.
pub const BYPASS_NOTE: &str = "the shortcut bypasses tc and netfilter for pod <-> pod TCP on \
     this host (sends go straight into the peer socket); opt a pod out with `pod add \
     --no-shortcut` (CNI: NSFAST_SHORTCUT=false) if its traffic must meet host rules";

/// Steps of `enable` that [`crate::pod::CRASH_ENV`] can stop after: `shortcut-maps` (maps
/// pinned in `shortcut-new/`), `shortcut-attach` (the link attached and pinned there),
/// `shortcut-state` (the state file written), `shortcut-ready` (renamed into place). And of
/// `pod add` with the shortcut on: `shortcut` (the pod registered, the add not returned).
pub const ENABLE_STEPS: &[&str] = &[
    "shortcut-maps",
    "shortcut-attach",
    "shortcut-state",
    "shortcut-ready",
];

const DIR: &str = "shortcut";
const NEW_DIR: &str = "shortcut-new"; // bpffs names cannot contain a dot
const STATE_FILE: &str = "shortcut.state";
const LINK: &str = "link";
/// Maps pinned (by their names in the object).
const MAPS: &[&str] = &[
    abi::MAP_SOCKHASH,
    abi::MAP_PODS,
    abi::MAP_POD_STATS,
    abi::MAP_STATS,
    abi::MAP_CONFIG,
    abi::MAP_KEPT,
    abi::MAP_KEPT_HEAD,
];

/// What `enable` recorded (in the host's state directory; the pins are on bpffs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnabledState {
    pub cgroup: PathBuf,
    pub cgroup_id: u64,
    pub host_id: u32,
    pub enabled_unix: u64,
    /// Whether the splice guard is attached (nsfast_bpf::sockmap_readers).
    #[serde(default)]
    pub splice_guard: bool,
    /// Admission (`--keep-tcp-after`; 0: every connection joins).
    #[serde(default = "default_keep_tcp_after")]
    pub keep_tcp_after: u32,
    /// Admission's probe interval (`--probe-interval`), in nanoseconds.
    #[serde(default = "default_probe_interval_ns")]
    pub probe_interval_ns: u64,
}

fn default_keep_tcp_after() -> u32 {
    abi::DEFAULT_ADMIT_AFTER
}

fn default_probe_interval_ns() -> u64 {
    abi::DEFAULT_ADMIT_PROBE_NS
}

impl EnabledState {
    /// The admission settings the shortcut was loaded with.
    pub fn admission(&self) -> abi::Admission {
        abi::Admission {
            after: self.keep_tcp_after,
            probe_ns: self.probe_interval_ns,
        }
    }
}

/// What `enable` asks for. Admission settings: each `None` takes the default for a new
/// shortcut, and whatever an enabled one has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EnableRequest {
    pub keep_tcp_after: Option<u32>,
    pub probe_interval_ns: Option<u64>,
    /// Run without the splice guard where it cannot attach (`--allow-splice-hole`; see
    /// [`nsfast_bpf::sockmap_readers`]): else enabling fails there, and a shortcut enabled
    /// without it is refused to a request that does not accept that.
    pub allow_splice_hole: bool,
}

impl EnableRequest {
    /// What a new shortcut is loaded with.
    fn settings(&self) -> abi::Admission {
        abi::Admission::or_default(self.keep_tcp_after, self.probe_interval_ns)
    }

    /// Whether an enabled shortcut with `have` is what this asks for.
    fn matches(&self, have: abi::Admission) -> bool {
        self.keep_tcp_after.is_none_or(|a| a == have.after)
            && self.probe_interval_ns.is_none_or(|p| p == have.probe_ns)
    }
}

fn dir(host: &Host) -> PathBuf {
    host.pin_dir().join(DIR)
}

fn new_dir(host: &Host) -> PathBuf {
    host.pin_dir().join(NEW_DIR)
}

fn state_path(host: &Host) -> PathBuf {
    host.state_dir().join(STATE_FILE)
}

/// The host id that goes into pod-mode pair keys: the host namespace's cookie (never reused),
/// folded to 32 bits and never 0 (0 is a plain `nsfast sockmap` key).
pub fn host_id(host: &Host) -> Result<u32, PodError> {
    let c = host.ns.cookie()?;
    Ok(((c as u32) ^ ((c >> 32) as u32)).max(1))
}

/// Whether the shortcut is enabled on `host` (its link is pinned).
pub fn is_enabled(host: &Host) -> bool {
    dir(host).join(LINK).exists()
}

fn remove_pins(d: &Path) -> Result<(), PodError> {
    if !d.exists() {
        return Ok(());
    }
    // The link first: new connections take the kernel path from here on.
    let link = d.join(LINK);
    if link.exists() {
        fs::remove_file(&link).map_err(PodError::io(format!("unpin {}", link.display())))?;
    }
    fs::remove_dir_all(d).map_err(PodError::io(format!("remove {}", d.display())))
}

/// Removes what a killed `enable` left (`shortcut-new/`, or a `shortcut/` without its link).
fn remove_leftovers(host: &Host) -> Result<(), PodError> {
    let nd = new_dir(host);
    if nd.exists() {
        warn!(
            "host {}: removing {} (an interrupted shortcut enable)",
            host.display,
            nd.display()
        );
        remove_pins(&nd)?;
    }
    let d = dir(host);
    if d.exists() && !d.join(LINK).exists() {
        warn!(
            "host {}: removing {} (a shortcut without its link)",
            host.display,
            d.display()
        );
        remove_pins(&d)?;
    }
    Ok(())
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// How `enable` went.
#[derive(Debug, Clone, Serialize)]
pub struct Enabled {
    pub state: EnabledState,
    /// It was enabled already (on the same cgroup): nothing changed.
    pub already: bool,
}

/// Enables the shortcut on `host`, attached to `cgroup` (default: the cgroup2 root). Enabling
/// again on the same cgroup changes nothing; on another cgroup it is refused.
pub fn enable(
    host: &Host,
    cgroup: Option<&Path>,
    request: EnableRequest,
) -> Result<Enabled, PodError> {
    let root = cgroup2_mount().map_err(|e| PodError::Bpf {
        what: "find the cgroup2 mount".into(),
        source: Box::new(e),
    })?;
    let path = cgroup.map(Path::to_path_buf).unwrap_or(root);
    let cg = Cgroup::open(&path).map_err(|e| PodError::Bpf {
        what: format!(
            "invalid --cgroup {}: expected an existing cgroup2 directory",
            path.display()
        ),
        source: Box::new(e),
    })?;
    let lock = host.lock()?;
    enable_locked(host, &lock, &cg, request)
}

/// [`enable`] with the host's lock held.
pub fn enable_locked(
    host: &Host,
    lock: &HostLock,
    cg: &Cgroup,
    request: EnableRequest,
) -> Result<Enabled, PodError> {
    let cgroup_id = cg.id().map_err(|e| PodError::Bpf {
        what: format!("read the id of cgroup {}", cg.path().display()),
        source: Box::new(e),
    })?;
    remove_leftovers(host)?;
    if is_enabled(host) {
        if let Some(st) = read_state(host)? {
            if st.cgroup_id != cgroup_id {
                return Err(PodError::Io {
                    what: format!(
                        "the shortcut of host {} is already attached to cgroup {}: \
                         `nsfast pod shortcut disable` first to move it to {}",
                        host.display,
                        st.cgroup.display(),
                        cg.path().display()
                    ),
                    source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
                });
            }
            if !st.splice_guard && !request.allow_splice_hole {
                let flag = nsfast_bpf::sockmap_readers::ALLOW_SPLICE_HOLE_FLAG;
                return Err(PodError::Io {
                    what: format!(
                        "the shortcut of host {} runs without the splice guard (enabled with \
                         {flag}): ask with {flag} too, or `nsfast pod shortcut disable` it",
                        host.display
                    ),
                    source: std::io::Error::from(std::io::ErrorKind::Unsupported),
                });
            }
            if !request.matches(st.admission()) {
                return Err(PodError::Io {
                    what: format!(
                        "the shortcut of host {} is already enabled with --keep-tcp-after {} \
                         --probe-interval {:?}: `nsfast pod shortcut disable` first to change them",
                        host.display,
                        st.keep_tcp_after,
                        std::time::Duration::from_nanos(st.probe_interval_ns)
                    ),
                    source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
                });
            }
            sync(host, lock)?;
            return Ok(Enabled {
                state: st,
                already: true,
            });
        }
        // Pins without the state file (removed by hand?): start over.
        warn!(
            "host {}: the shortcut's state file is missing: enabling it again",
            host.display
        );
        remove_pins(&dir(host))?;
    }
    ensure_bpffs()?;
    create_dir_all_racy(&host.pin_dir())?;
    let nd = new_dir(host);
    fs::create_dir(&nd).map_err(PodError::io(format!("create {}", nd.display())))?;
    let settings = request.settings();
    let mut state = EnabledState {
        cgroup: cg.path().to_path_buf(),
        cgroup_id,
        host_id: host_id(host)?,
        enabled_unix: now_unix(),
        splice_guard: false,
        keep_tcp_after: settings.after,
        probe_interval_ns: settings.probe_ns,
    };
    let guard = nsfast_bpf::sockmap_readers::SpliceGuard::allowing_hole(request.allow_splice_hole);
    match build(host, lock, cg, &nd, &state, guard) {
        Ok(guard) => state.splice_guard = guard,
        Err(e) => {
            let _ = remove_pins(&nd);
            return Err(e);
        }
    }
    crash_point("shortcut-attach");
    write_state(host, &state)?;
    crash_point("shortcut-state");
    let d = dir(host);
    fs::rename(&nd, &d).map_err(PodError::io(format!(
        "rename {} to {}",
        nd.display(),
        d.display()
    )))?;
    crash_point("shortcut-ready");
    info!(
        "host {}: shortcut enabled on cgroup {} (id {cgroup_id})",
        host.display,
        cg.path().display()
    );
    Ok(Enabled {
        state,
        already: false,
    })
}

/// Loads the object in pod mode, pins its maps in `nd`, registers the host's pods, attaches
/// the reader programs (pinned as `rx-<program>`), sk_msg to the SOCKHASH and sockops to the
/// cgroup, and pins the link in `nd`. Returns whether the splice guard is attached.
fn build(
    host: &Host,
    lock: &HostLock,
    cg: &Cgroup,
    nd: &Path,
    state: &EnabledState,
    guard: nsfast_bpf::sockmap_readers::SpliceGuard,
) -> Result<bool, PodError> {
    let admission = state.admission();
    let mut loader = EbpfLoader::new();
    loader.override_global(abi::GLOBAL_QUEUE_LIMIT, &abi::DEFAULT_QUEUE_LIMIT, true);
    admission.set_globals(&mut loader);
    // The host's NetworkPolicy tables and generation, shared with its pod programs (created
    // here if no pod has made them yet): a pair checks its connection again after a change.
    crate::datapath::replace_stale_pins(
        &host.pin_dir(),
        nsfast_bpf::SOCKMAP,
        &pabi::POLICY_RULE_MAPS,
    )?;
    for m in pabi::POLICY_RULE_MAPS {
        loader.map_pin_path(m, host.pin_dir().join(m));
    }
    let mut ebpf = loader
        .load(nsfast_bpf::SOCKMAP)
        .map_err(|e| PodError::Load(Box::new(e)))?;
    {
        let mut cfg: Array<&mut MapData, Config> = Array::try_from(
            ebpf.map_mut(abi::MAP_CONFIG)
                .ok_or_else(|| missing(abi::MAP_CONFIG))?,
        )
        .map_err(PodError::map("open nsf_config"))?;
        cfg.set(
            0,
            Config::of_loader(
                state.cgroup_id,
                abi::MODE_PODS,
                state.enabled_unix,
                abi::DEFAULT_QUEUE_LIMIT,
                admission,
            ),
            0,
        )
        .map_err(PodError::map("write nsf_config"))?;
    }
    for m in MAPS {
        let map = ebpf.map(m).ok_or_else(|| missing(m))?;
        let p = nd.join(m);
        map.pin(&p).map_err(|e| PodError::Bpf {
            what: format!("pin {}", p.display()),
            source: Box::new(e),
        })?;
    }
    sync_in(host, lock, nd, state.host_id)?;
    crash_point("shortcut-maps");
    let readers =
        nsfast_bpf::sockmap_readers::attach(&mut ebpf, guard).map_err(|e| PodError::Io {
            what: e.to_string(),
            source: std::io::Error::from(std::io::ErrorKind::Unsupported),
        })?;
    for (name, link) in readers.links {
        let p = nd.join(format!("rx-{name}"));
        link.pin(&p).map_err(|e| PodError::Bpf {
            what: format!("pin {}", p.display()),
            source: Box::new(e),
        })?;
    }
    {
        // The socket-option hook, linked to the cgroup before sockops and pinned beside the
        // reader programs (removed with them).
        let prog =
            nsfast_bpf::sockmap_readers::load_sockopt(&mut ebpf).map_err(|e| PodError::Io {
                what: e,
                source: std::io::Error::from(std::io::ErrorKind::Unsupported),
            })?;
        let dir = fs::File::open(cg.path())
            .map_err(PodError::io(format!("open cgroup {}", cg.path().display())))?;
        let link = nsfast_sys::bpf::cgroup_link(
            prog.as_fd(),
            dir.as_fd(),
            nsfast_sys::bpf::BPF_CGROUP_SETSOCKOPT,
        )
        .map_err(PodError::io(format!(
            "attach {} to cgroup {}",
            abi::PROG_SETSOCKOPT,
            cg.path().display()
        )))?;
        let p = nd.join(format!("rx-{}", abi::PROG_SETSOCKOPT));
        nsfast_sys::bpf::netkit::obj_pin(link.as_fd(), &p)
            .map_err(PodError::io(format!("pin {}", p.display())))?;
    }
    let sockhash_fd = {
        let map = ebpf
            .map(abi::MAP_SOCKHASH)
            .ok_or_else(|| missing(abi::MAP_SOCKHASH))?;
        let hash: SockHash<&MapData, u64> =
            SockHash::try_from(map).map_err(PodError::map("open nsf_sockhash"))?;
        hash.fd()
            .try_clone()
            .map_err(PodError::io("dup the sockhash fd"))?
    };
    let sk_msg: &mut SkMsg = ebpf
        .program_mut(abi::PROG_SK_MSG)
        .ok_or_else(|| missing(abi::PROG_SK_MSG))?
        .try_into()
        .map_err(PodError::prog("sk_msg program type"))?;
    sk_msg.load().map_err(PodError::prog("load sk_msg"))?;
    // Attached to the map (BPF_PROG_ATTACH; the pinned map holds the program), not a link.
    let msg_link = sk_msg
        .attach(&sockhash_fd)
        .map_err(PodError::prog("attach sk_msg to nsf_sockhash"))?;
    let msg_link = sk_msg
        .take_link(msg_link)
        .map_err(PodError::prog("take the sk_msg attachment"))?;
    // Dropping aya's handle would detach the program from the map: keep it attached after
    // this process (the handle's two descriptors close when the process exits).
    std::mem::forget(msg_link);
    let sockops: &mut SockOps = ebpf
        .program_mut(abi::PROG_SOCKOPS)
        .ok_or_else(|| missing(abi::PROG_SOCKOPS))?
        .try_into()
        .map_err(PodError::prog("sockops program type"))?;
    sockops.load().map_err(PodError::prog("load sockops"))?;
    let cgdir = fs::File::open(cg.path())
        .map_err(PodError::io(format!("open cgroup {}", cg.path().display())))?;
    let id = sockops
        .attach(cgdir.as_fd(), CgroupAttachMode::Single)
        .map_err(PodError::prog(format!(
            "attach sockops to cgroup {}",
            cg.path().display()
        )))?;
    let link = sockops
        .take_link(id)
        .map_err(PodError::prog("take the sockops link"))?;
    let fd_link = FdLink::try_from(link).map_err(|e| PodError::Bpf {
        what: "the sockops attachment is not a BPF link (kernel < 5.7?)".into(),
        source: Box::new(e),
    })?;
    let p = nd.join(LINK);
    fd_link.pin(&p).map_err(|e| PodError::Bpf {
        what: format!("pin {}", p.display()),
        source: Box::new(e),
    })?;
    Ok(readers.splice_guard)
}

fn missing(what: &str) -> PodError {
    PodError::Io {
        what: format!("the sockmap object has no {what}"),
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    }
}

fn write_state(host: &Host, st: &EnabledState) -> Result<(), PodError> {
    let p = state_path(host);
    let body = serde_json::to_vec_pretty(st).map_err(|e| PodError::State {
        path: p.clone(),
        source: e,
    })?;
    // 0600, as the pod records: it names the host's cgroup and id.
    crate::state::write_private(&host.state_dir(), &p, &body)
}

fn read_state(host: &Host) -> Result<Option<EnabledState>, PodError> {
    let p = state_path(host);
    match fs::read(&p) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| PodError::State { path: p, source: e }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(PodError::Io {
            what: format!("read {}", p.display()),
            source: e,
        }),
    }
}

/// Disables the shortcut on `host`: unpins the link (new connections take the kernel path at
/// once) and the maps. Sockets already redirected keep their redirect until they close.
/// Returns whether anything was enabled.
pub fn disable(host: &Host) -> Result<bool, PodError> {
    if !host.state_dir().exists() && !host.pin_dir().exists() {
        return Ok(false);
    }
    let _lock = host.lock()?;
    let was = is_enabled(host) || new_dir(host).exists() || dir(host).exists();
    remove_pins(&dir(host))?;
    remove_pins(&new_dir(host))?;
    let p = state_path(host);
    if p.exists() {
        fs::remove_file(&p).map_err(PodError::io(format!("remove {}", p.display())))?;
    }
    if was {
        info!("host {}: shortcut disabled", host.display);
    }
    // A host with neither pods nor uplink filters keeps no state for the shortcut's sake.
    if host.records()?.is_empty() && host.uplink_tcs()?.is_empty() {
        host.gc_if_empty()?;
    }
    Ok(was)
}

/// The netns cookie of a pod's namespace (from its record, or by opening the namespace).
fn pod_cookie(r: &PodRecord) -> Option<u64> {
    r.netns_cookie.or_else(|| {
        nsfast_sys::netns::NetNs::open(&r.netns)
            .ok()
            .and_then(|ns| ns.cookie().ok())
    })
}

/// The inode of a pod's namespace if it can be opened and is the one of the record's cookie
/// (0: unknown). Kept in the `nsf_pods` entry's `netns_ino` word (which the BPF programs never
/// read) so that [`sync_in`] can tell later whether the namespace still exists.
fn pod_inode(r: &PodRecord, cookie: u64) -> u32 {
    nsfast_sys::netns::NetNs::open(&r.netns)
        .ok()
        .filter(|ns| ns.cookie().is_ok_and(|c| c == cookie))
        .and_then(|ns| u32::try_from(ns.inode()).ok())
        .unwrap_or(0)
}

/// Whether the network namespace with `cookie` and inode `ino` may still exist (so sockets of
/// it may still count into its slot): its inode is reachable ([`crate::state::live_netns`]) and
/// the namespace there has that cookie, or cannot be opened to compare. Inode 0 (unknown, an
/// entry of an older nsfast): gone.
fn netns_alive(
    cookie: u64,
    ino: u32,
    live: &std::collections::BTreeMap<u64, Vec<PathBuf>>,
) -> bool {
    if ino == 0 {
        return false;
    }
    let Some(paths) = live.get(&u64::from(ino)) else {
        return false;
    };
    let ns = paths.iter().find_map(|p| {
        let ns = nsfast_sys::netns::NetNs::open(&p.display().to_string()).ok()?;
        (ns.inode() == u64::from(ino)).then_some(ns)
    });
    match ns {
        Some(ns) => ns.cookie().map_or(true, |c| c == cookie),
        None => true,
    }
}

/// Makes `nsf_pods` match the host's complete pod records (lock held); nothing to do when
/// the shortcut is off. Cleans up what a killed `enable` left.
pub fn sync(host: &Host, lock: &HostLock) -> Result<(), PodError> {
    remove_leftovers(host)?;
    if !is_enabled(host) {
        return Ok(());
    }
    let id = match read_state(host)? {
        Some(st) => st.host_id,
        None => host_id(host)?,
    };
    sync_in(host, lock, &dir(host), id)
}

/// Whether a pod's record keeps its namespace off the shortcut: an opt-out
/// (`--no-shortcut`, CNI `NSFAST_SHORTCUT=false`), or `--host-firewall`, whose traffic must
/// meet the host's netfilter rules, which the shortcut would bypass.
pub fn keeps_tcp(r: &PodRecord) -> bool {
    r.no_shortcut || r.host_firewall
}

/// The `nsf_pods` entries the records ask for: netns cookie → (off the shortcut, netns
/// inode). One namespace can carry several attachments (one per interface or address
/// family); it is off the shortcut if any of them says so, and a disagreement is logged.
/// `locate` gives a record's cookie and inode (`None`: its namespace is gone).
fn wanted_entries(
    records: impl IntoIterator<Item = PodRecord>,
    locate: impl Fn(&PodRecord) -> Option<(u64, u32)>,
) -> std::collections::BTreeMap<u64, (bool, u32)> {
    /// Off the shortcut, inode, and each attachment's (pod name, off).
    type Acc = (bool, u32, Vec<(String, bool)>);
    let mut want: std::collections::BTreeMap<u64, Acc> = Default::default();
    for r in records {
        match locate(&r) {
            Some((c, ino)) => {
                let off = keeps_tcp(&r);
                let e = want.entry(c).or_insert((false, 0, Vec::new()));
                e.0 |= off;
                if e.1 == 0 {
                    e.1 = ino;
                }
                e.2.push((r.name.clone(), off));
            }
            None => warn!("pod {}: its namespace {} is gone", r.name, r.netns),
        }
    }
    want.into_iter()
        .map(|(c, (off, ino, who))| {
            if who.iter().any(|w| w.1 != off) {
                let on: Vec<&str> = who.iter().filter(|w| !w.1).map(|w| w.0.as_str()).collect();
                let out: Vec<&str> = who.iter().filter(|w| w.1).map(|w| w.0.as_str()).collect();
                warn!(
                    "network namespace {c:#x} is shared by pods {} (shortcut allowed) and {} \
                     (--no-shortcut or --host-firewall): the whole namespace stays off the \
                     shortcut",
                    on.join(", "),
                    out.join(", ")
                );
            }
            (c, (off, ino))
        })
        .collect()
}

fn open_pinned(d: &Path, name: &str) -> Result<Map, PodError> {
    let p = d.join(name);
    let data = MapData::from_pin(&p).map_err(PodError::map(format!("open {}", p.display())))?;
    Map::from_map_data(data).map_err(PodError::map(format!("open {}", p.display())))
}

fn sync_in(host: &Host, _lock: &HostLock, d: &Path, host_id: u32) -> Result<(), PodError> {
    let mut pods: BpfHashMap<MapData, u64, PodEntry> =
        BpfHashMap::try_from(open_pinned(d, abi::MAP_PODS)?)
            .map_err(PodError::map("open nsf_pods"))?;
    let mut stats: PerCpuArray<MapData, PodCounters> =
        PerCpuArray::try_from(open_pinned(d, abi::MAP_POD_STATS)?)
            .map_err(PodError::map("open nsf_pod_stats"))?;
    let want = wanted_entries(host.records()?.into_iter().filter(|r| !r.pending), |r| {
        let c = pod_cookie(r);
        c.map(|c| (c, pod_inode(r, c)))
    });
    let have: Vec<(u64, PodEntry)> = pods.iter().flatten().collect();
    // Slots are never reused while sockets of their old pod may live: a socket keeps the
    // slot it was given at connect (in its socket storage) until it closes, whether or not
    // its pod is still registered, and would count into the next pod given the slot. Sockets
    // hold their network namespace, so a deleted pod's entry stays, turned into an opt-out
    // (new sockets there take the kernel path, counted only into the dead pod's slot), until
    // its namespace is gone; then the entry and the slot go.
    let mut used = std::collections::BTreeSet::new();
    let mut live = None;
    for (c, e) in &have {
        if want.contains_key(c) {
            used.insert(e.slot);
            continue;
        }
        let live = live.get_or_insert_with(crate::state::live_netns);
        if netns_alive(*c, e.netns_ino, live) {
            used.insert(e.slot);
            if e.flags & abi::POD_NO_SHORTCUT == 0 {
                let retired = PodEntry {
                    flags: e.flags | abi::POD_NO_SHORTCUT,
                    ..*e
                };
                pods.insert(c, retired, 0)
                    .map_err(PodError::map("retire an nsf_pods entry"))?;
            }
        } else {
            pods.remove(c)
                .map_err(PodError::map("remove from nsf_pods"))?;
        }
    }
    let ncpu = aya::util::nr_cpus().map_err(|(_, e)| PodError::Io {
        what: "count the possible CPUs".into(),
        source: e,
    })?;
    for (c, (no_shortcut, ino)) in want {
        let flags = if no_shortcut { abi::POD_NO_SHORTCUT } else { 0 };
        if let Some((_, e)) = have.iter().find(|(k, _)| *k == c) {
            let ino = if ino == 0 { e.netns_ino } else { ino };
            if e.flags != flags || e.host_id != host_id || e.netns_ino != ino {
                let e = PodEntry {
                    flags,
                    host_id,
                    netns_ino: ino,
                    ..*e
                };
                pods.insert(c, e, 0)
                    .map_err(PodError::map("update nsf_pods"))?;
            }
            continue;
        }
        let Some(slot) = (0..abi::MAX_PODS).find(|s| !used.contains(s)) else {
            return Err(PodError::Io {
                what: format!("the shortcut holds {} pods at most", abi::MAX_PODS),
                source: std::io::Error::from(std::io::ErrorKind::OutOfMemory),
            });
        };
        used.insert(slot);
        let zero = PerCpuValues::try_from(vec![PodCounters::default(); ncpu]).map_err(|e| {
            PodError::Io {
                what: "per-CPU zeros".into(),
                source: e,
            }
        })?;
        stats
            .set(slot, zero, 0)
            .map_err(PodError::map("clear nsf_pod_stats"))?;
        pods.insert(
            c,
            PodEntry {
                host_id,
                flags,
                slot,
                netns_ino: ino,
            },
            0,
        )
        .map_err(PodError::map("insert into nsf_pods"))?;
    }
    Ok(())
}

/// A pod's shortcut counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PodShortcutStats {
    /// Whether the pod takes part (false: `--no-shortcut`).
    pub shortcut: bool,
    /// Connection ends of this pod that were paired.
    pub paired: u64,
    pub redirected_msgs: u64,
    pub redirected_bytes: u64,
    /// Sockets of this pod that fell back to the kernel path (no peer pod: a connection to the
    /// host or a remote pod; or the peer closed).
    pub fallbacks: u64,
    /// Bytes this pod's tracked sockets sent on the kernel path.
    pub passed_bytes: u64,
    /// Connection ends skipped because the pod opted out.
    pub opted_out: u64,
}

/// The shortcut of one host.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub host: String,
    pub enabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup_id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_id: Option<u32>,
    /// Admission settings (`enable --keep-tcp-after`, `--probe-interval` in nanoseconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_tcp_after: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_interval_ns: Option<u64>,
    pub bypasses: &'static str,
    /// Sockets currently in the SOCKHASH.
    pub sockets: u64,
    pub pairs: u64,
    pub pair_conflicts: u64,
    pub redirected_bytes: u64,
    pub passed_bytes: u64,
    /// Sends kept on TCP until their receiver was seen reading all of it (the gate).
    pub gated_bytes: u64,
    /// Receiving sockets seen reading with splice(2)/sendfile(2), the directions that moved to
    /// TCP for them, and the splices the guard refused (EINVAL) while shortcut bytes waited.
    pub splice_readers: u64,
    pub splice_pass: u64,
    pub splice_refused: u64,
    /// Times a direction moved to TCP because its receiver fell behind by the queue limit.
    pub queue_limit: u64,
    /// Sockets kept on TCP for a socket option or read flag the shortcut cannot honour
    /// (SO_RCVLOWAT, SO_ZEROCOPY, TCP_ULP, MSG_WAITALL, MSG_OOB).
    pub kept_tcp: u64,
    /// Directions of paired connections moved to TCP because a NetworkPolicy change denies
    /// their connection (where the pod programs then drop what the policies deny).
    pub policy_denied: u64,
    /// Connection ends kept on TCP without joining: their endpoints' recent connections gained
    /// nothing from the shortcut (admission).
    pub skipped_short: u64,
    /// The last connection ends that kept TCP, oldest first (up to 64), with the process and
    /// the reason.
    pub kept_recent: Vec<nsfast_bpf::sockmap_kept::KeptConn>,
    /// Entries in the pairing maps now (None where they could not be read).
    pub map_entries: Option<nsfast_bpf::sockmap_entries::MapEntries>,
    /// Per pod, by name.
    pub pods: std::collections::BTreeMap<String, PodShortcutStats>,
}

/// Per-pod counters of `host` (empty when the shortcut is off), by pod name.
pub fn pod_stats(
    host: &Host,
) -> Result<std::collections::BTreeMap<String, PodShortcutStats>, PodError> {
    let mut out = std::collections::BTreeMap::new();
    if !is_enabled(host) {
        return Ok(out);
    }
    let d = dir(host);
    let pods: BpfHashMap<MapData, u64, PodEntry> =
        BpfHashMap::try_from(open_pinned(&d, abi::MAP_PODS)?)
            .map_err(PodError::map("open nsf_pods"))?;
    let stats: PerCpuArray<MapData, PodCounters> =
        PerCpuArray::try_from(open_pinned(&d, abi::MAP_POD_STATS)?)
            .map_err(PodError::map("open nsf_pod_stats"))?;
    for r in host.records()?.into_iter().filter(|r| !r.pending) {
        let Some(e) = pod_cookie(&r).and_then(|c| pods.get(&c, 0).ok()) else {
            continue;
        };
        let per_cpu = stats
            .get(&e.slot, 0)
            .map_err(PodError::map("read nsf_pod_stats"))?;
        let sum = |s: PodStat| per_cpu.iter().map(|c| c.v[s as usize]).sum::<u64>();
        out.insert(
            r.name.clone(),
            PodShortcutStats {
                shortcut: e.flags & abi::POD_NO_SHORTCUT == 0,
                paired: sum(PodStat::Paired),
                redirected_msgs: sum(PodStat::RedirectMsgs),
                redirected_bytes: sum(PodStat::RedirectBytes),
                fallbacks: sum(PodStat::Fallbacks),
                passed_bytes: sum(PodStat::PassBytes),
                opted_out: sum(PodStat::OptedOut),
            },
        );
    }
    Ok(out)
}

/// The shortcut's state and counters on `host`.
pub fn status(host: &Host) -> Result<Status, PodError> {
    let mut s = Status {
        host: host.display.clone(),
        enabled: is_enabled(host),
        cgroup: None,
        cgroup_id: None,
        host_id: None,
        keep_tcp_after: None,
        probe_interval_ns: None,
        bypasses: BYPASS_NOTE,
        sockets: 0,
        pairs: 0,
        pair_conflicts: 0,
        redirected_bytes: 0,
        passed_bytes: 0,
        gated_bytes: 0,
        splice_readers: 0,
        splice_pass: 0,
        splice_refused: 0,
        queue_limit: 0,
        kept_tcp: 0,
        policy_denied: 0,
        skipped_short: 0,
        kept_recent: Vec::new(),
        map_entries: None,
        pods: Default::default(),
    };
    if !s.enabled {
        return Ok(s);
    }
    if let Some(st) = read_state(host)? {
        s.cgroup = Some(st.cgroup);
        s.cgroup_id = Some(st.cgroup_id);
        s.host_id = Some(st.host_id);
        s.keep_tcp_after = Some(st.keep_tcp_after);
        s.probe_interval_ns = Some(st.probe_interval_ns);
    }
    let d = dir(host);
    let stats: PerCpuArray<MapData, Counters> =
        PerCpuArray::try_from(open_pinned(&d, abi::MAP_STATS)?)
            .map_err(PodError::map("open nsf_stats"))?;
    let per_cpu = stats.get(&0, 0).map_err(PodError::map("read nsf_stats"))?;
    let sum = |x: Stat| per_cpu.iter().map(|c| c.v[x as usize]).sum::<u64>();
    s.pairs = sum(Stat::Paired);
    s.pair_conflicts = sum(Stat::PairConflict);
    s.redirected_bytes = sum(Stat::RedirectBytes);
    s.passed_bytes = sum(Stat::PassBytes);
    s.gated_bytes = sum(Stat::GatedBytes);
    s.splice_readers = sum(Stat::SpliceReaders);
    s.splice_pass = sum(Stat::SplicePass);
    s.splice_refused = sum(Stat::SpliceRefused);
    s.queue_limit = sum(Stat::QueueLimit);
    s.kept_tcp = sum(Stat::KeptTcp);
    s.policy_denied = sum(Stat::PolicyDenied);
    s.skipped_short = sum(Stat::SkippedShort);
    if let (Ok(e), Ok(h)) = (
        open_pinned(&d, abi::MAP_KEPT),
        open_pinned(&d, abi::MAP_KEPT_HEAD),
    ) {
        s.kept_recent = nsfast_bpf::sockmap_kept::KeptLog::new(e, h)
            .and_then(|l| l.since(0))
            .map_err(PodError::map("read nsf_kept"))?
            .events;
    }
    let hash: SockHash<MapData, u64> = SockHash::try_from(open_pinned(&d, abi::MAP_SOCKHASH)?)
        .map_err(PodError::map("open nsf_sockhash"))?;
    s.sockets = hash.keys().filter(|k| k.is_ok()).count() as u64;
    s.map_entries = MapData::from_pin(d.join(abi::MAP_SOCKHASH))
        .ok()
        .and_then(|m| m.info().ok())
        .and_then(|i| nsfast_bpf::sockmap_entries::of_sockhash(i.id()));
    s.pods = pod_stats(host)?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str, netns: &str, no_shortcut: bool, host_firewall: bool) -> PodRecord {
        let body = format!(
            r#"{{"name":"{name}","ip":"10.0.0.1","prefix":24,"gateway":"169.254.1.1",
            "datapath":"veth","host":"h","netns":"{netns}","netns_owned":true,
            "host_if":"nsf0","host_ifindex":3,"pod_if":"eth0","pod_mac":"","host_mac":"",
            "link_pins":[],"no_shortcut":{no_shortcut},"host_firewall":{host_firewall}}}"#
        );
        crate::state::parse_record(body.as_bytes()).unwrap()
    }

    /// The namespace's cookie is its name's length here; inode 7.
    fn locate(r: &PodRecord) -> Option<(u64, u32)> {
        (r.netns != "gone").then_some((r.netns.len() as u64, 7))
    }

    /// Two attachments in one namespace: an opt-out on either keeps the namespace off the
    /// shortcut, in whichever order the records come.
    #[test]
    fn an_opt_out_of_any_attachment_keeps_the_namespace_off() {
        for order in [["a", "b"], ["b", "a"]] {
            let rs = order.map(|n| record(n, "ns1", n == "a", false));
            let want = wanted_entries(rs, locate);
            assert_eq!(want.get(&3), Some(&(true, 7)), "{order:?}");
        }
        let want = wanted_entries([record("a", "ns1", false, false)], locate);
        assert_eq!(want.get(&3), Some(&(false, 7)));
    }

    /// A --host-firewall pod keeps TCP: its traffic must meet the host's netfilter rules.
    #[test]
    fn host_firewall_pods_never_take_the_shortcut() {
        let r = record("f", "ns22", false, true);
        assert!(keeps_tcp(&r));
        let want = wanted_entries([r, record("g", "ns333", false, false)], locate);
        assert_eq!(want.get(&4), Some(&(true, 7)));
        assert_eq!(want.get(&5), Some(&(false, 7)));
        let want = wanted_entries([record("x", "gone", false, false)], locate);
        assert!(want.is_empty());
    }
}
