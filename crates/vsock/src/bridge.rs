//! The sibling bridge: a host-side relay that lets VMs in one group reach each other over vsock.
//!
//! A guest cannot reach a sibling VM by itself: vsock only connects a guest with its host. The
//! bridge runs on the host, accepts what the guests of a group send to the host, decides which
//! sibling the connection is for, connects to that sibling on the same port and relays both
//! ways (the relay's splice loop with half-close, [`crate::relay::relay`]).
//!
//! Members are reached in one of two ways:
//!
//! - **AF_VSOCK** (the default; a host with vhost-vsock). The bridge listens on every port of the
//!   list at `VMADDR_CID_ANY`. The source of an accepted connection is the peer's CID; the
//!   accepted socket's local CID (getsockname) is the CID the guest dialled: `2`
//!   (`VMADDR_CID_HOST`) when it dialled the host, or the sibling's CID for a
//!   `VMADDR_FLAG_TO_HOST` dial, on hosts that deliver those (a listener at `VMADDR_CID_ANY`
//!   matches any destination). vhost-vsock does not: since Linux 5.5 it drops guest packets
//!   whose destination is not CID 2, so there every connection is a host dial.
//! - **Hybrid vsock** (Firecracker, Cloud Hypervisor, vhost-device-vsock `--uds-path PATH`).
//!   A guest's connection to the host's port P arrives as a UNIX connection to `PATH_P`, where
//!   the bridge listens; the bridge reaches the guest with `CONNECT P` on `PATH`. Such a guest
//!   can only dial the host.
//!
//! Routing ([`Config::route`]): a guest that dials a sibling's CID reaches it when the two share
//! a group; a guest that dials the host reaches the one other member of its groups (with more
//! than one candidate the bridge refuses: use one bridge per pair). Anything else is denied:
//! the connection is closed and reported.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nsfast_sys::vsock::{VsockAddr, VsockListener, VsockStream, VMADDR_CID_ANY, VMADDR_CID_HOST};
use serde::Serialize;
use tracing::warn;

use crate::addr::UNIX_PATH_MAX;
use crate::conn::{self, Conn, SockOpts};
use crate::hybrid;
use crate::relay::{self, error_chain};
use crate::unixsock::{BindError, BoundSocket};

/// Lowest CID a guest can have (0 hypervisor, 1 local, 2 host).
pub const MIN_GUEST_CID: u32 = 3;
/// Highest usable port and CID (`u32::MAX` is `VMADDR_PORT_ANY` / `VMADDR_CID_ANY`).
pub const MAX_VALUE: u32 = u32::MAX - 1;
/// At most this many ports in `--ports` (each is a listener per member transport).
pub const MAX_PORTS: usize = 1024;

/// A bad `--ports`, `--group` or `--vm` value: names the flag, the value and what is valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {value:?} in {flag}: {reason}")]
pub struct ArgError {
    pub flag: &'static str,
    pub what: &'static str,
    pub value: String,
    pub reason: String,
}

fn arg_err(
    flag: &'static str,
    what: &'static str,
    value: &str,
    reason: impl Into<String>,
) -> ArgError {
    ArgError {
        flag,
        what,
        value: value.into(),
        reason: reason.into(),
    }
}

fn guest_cid(flag: &'static str, s: &str) -> Result<u32, ArgError> {
    let why = format!("guest CIDs are {MIN_GUEST_CID}-{MAX_VALUE}");
    let v: u64 = s
        .trim()
        .parse()
        .map_err(|_| arg_err(flag, "CID", s, format!("not a number ({why})")))?;
    if v < u64::from(MIN_GUEST_CID) || v > u64::from(MAX_VALUE) {
        return Err(arg_err(flag, "CID", s, format!("out of range ({why})")));
    }
    Ok(v as u32)
}

/// Parses one `--group CID,CID[,...]`: guest CIDs (3-4294967294), none twice. A group of one
/// CID is allowed: that VM is known to the bridge but reaches nobody (every connection from it
/// is denied and reported).
pub fn parse_group(s: &str) -> Result<Vec<u32>, ArgError> {
    let mut g = Vec::new();
    for c in s.split(',') {
        let cid = guest_cid("--group", c)?;
        if g.contains(&cid) {
            return Err(arg_err(
                "--group",
                "group",
                s,
                format!("CID {cid} is listed twice"),
            ));
        }
        g.push(cid);
    }
    Ok(g)
}

/// How the bridge reaches a member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// AF_VSOCK on the host (vhost-vsock).
    Vsock,
    /// Hybrid vsock through the VMM's UNIX socket at this path.
    Hybrid(PathBuf),
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Vsock => write!(f, "vsock"),
            Transport::Hybrid(p) => write!(f, "hybrid:{}", p.display()),
        }
    }
}

/// Parses one `--vm CID=vsock` or `--vm CID=hybrid:PATH`.
pub fn parse_vm(s: &str) -> Result<(u32, Transport), ArgError> {
    let forms = "expected CID=vsock or CID=hybrid:PATH";
    let Some((c, t)) = s.split_once('=') else {
        return Err(arg_err("--vm", "member", s, forms));
    };
    let cid = guest_cid("--vm", c)?;
    let t = if t == "vsock" {
        Transport::Vsock
    } else if let Some(p) = t.strip_prefix("hybrid:") {
        if p.is_empty() {
            return Err(arg_err("--vm", "member", s, "empty hybrid path"));
        }
        if p.contains('\0') {
            return Err(arg_err("--vm", "member", s, "path contains a NUL byte"));
        }
        if p.len() > UNIX_PATH_MAX {
            return Err(arg_err(
                "--vm",
                "member",
                s,
                format!(
                    "path is {} bytes long: UNIX socket paths are at most {UNIX_PATH_MAX}",
                    p.len()
                ),
            ));
        }
        Transport::Hybrid(PathBuf::from(p))
    } else {
        return Err(arg_err("--vm", "member", s, forms));
    };
    Ok((cid, t))
}

/// Why a connection was not bridged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Deny {
    #[error("{src} is in no group")]
    NotMember { src: u32 },
    #[error("{src} dialled the host, but no group of {src} has another member")]
    Alone { src: u32 },
    #[error("{src} dialled the host, but its groups have {} other members ({}): a host dial needs exactly one partner per bridge (run one bridge per pair on its own ports), or a dial to the sibling's CID with VMADDR_FLAG_TO_HOST where the host delivers those (vhost-vsock drops them)", .candidates.len(), list(.candidates))]
    Ambiguous { src: u32, candidates: Vec<u32> },
    #[error("{src} dialled {dst}, and the two share no group")]
    NoSharedGroup { src: u32, dst: u32 },
    #[error("{src} dialled its own CID")]
    SelfDial { src: u32 },
}

fn list(c: &[u32]) -> String {
    c.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// A validated bridge configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    groups: Vec<Vec<u32>>,
    members: BTreeMap<u32, Transport>,
    ports: Vec<u32>,
}

/// A configuration that does not hold together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("no --group given: give at least one, e.g. --group 3,4")]
    NoGroup,
    #[error("no --ports given: give at least one port, e.g. --ports 5000")]
    NoPorts,
    #[error("--vm {cid}={transport}: CID {cid} is in no --group")]
    VmNotInGroup { cid: u32, transport: Transport },
    #[error("--vm given twice for CID {0}")]
    VmTwice(u32),
    #[error("--vm {a} and --vm {b} use the same hybrid path {}", .path.display())]
    SamePath { a: u32, b: u32, path: PathBuf },
    #[error("--vm {cid}=hybrid:{}: the listening path {}_{port} is longer than {UNIX_PATH_MAX} bytes", .path.display(), .path.display())]
    PathTooLong { cid: u32, path: PathBuf, port: u32 },
}

impl Config {
    /// Builds a configuration: every CID of a group is a member, reached over AF_VSOCK unless
    /// `vms` says `hybrid:PATH`.
    pub fn new(
        groups: Vec<Vec<u32>>,
        vms: Vec<(u32, Transport)>,
        ports: Vec<u32>,
    ) -> Result<Self, ConfigError> {
        if groups.is_empty() {
            return Err(ConfigError::NoGroup);
        }
        if ports.is_empty() {
            return Err(ConfigError::NoPorts);
        }
        let mut members: BTreeMap<u32, Transport> = groups
            .iter()
            .flatten()
            .map(|&c| (c, Transport::Vsock))
            .collect();
        let mut seen = BTreeSet::new();
        let mut paths: BTreeMap<PathBuf, u32> = BTreeMap::new();
        let max_port_len = ports.iter().max().map_or(1, |p| p.to_string().len());
        for (cid, t) in vms {
            if !seen.insert(cid) {
                return Err(ConfigError::VmTwice(cid));
            }
            let Some(slot) = members.get_mut(&cid) else {
                return Err(ConfigError::VmNotInGroup { cid, transport: t });
            };
            if let Transport::Hybrid(p) = &t {
                if let Some(&a) = paths.get(p) {
                    return Err(ConfigError::SamePath {
                        a,
                        b: cid,
                        path: p.clone(),
                    });
                }
                paths.insert(p.clone(), cid);
                if p.as_os_str().len() + 1 + max_port_len > UNIX_PATH_MAX {
                    return Err(ConfigError::PathTooLong {
                        cid,
                        path: p.clone(),
                        port: ports.iter().copied().max().unwrap_or(0),
                    });
                }
            }
            *slot = t;
        }
        Ok(Self {
            groups,
            members,
            ports,
        })
    }

    pub fn groups(&self) -> &[Vec<u32>] {
        &self.groups
    }

    pub fn ports(&self) -> &[u32] {
        &self.ports
    }

    /// Members and how each is reached.
    pub fn members(&self) -> &BTreeMap<u32, Transport> {
        &self.members
    }

    /// Whether any member is reached over AF_VSOCK (then the bridge opens vsock listeners).
    pub fn uses_vsock(&self) -> bool {
        self.members.values().any(|t| *t == Transport::Vsock)
    }

    /// The other members of `src`'s groups, sorted.
    fn partners(&self, src: u32) -> Vec<u32> {
        let set: BTreeSet<u32> = self
            .groups
            .iter()
            .filter(|g| g.contains(&src))
            .flatten()
            .copied()
            .filter(|&c| c != src)
            .collect();
        set.into_iter().collect()
    }

    /// Where a connection from guest `src` that dialled CID `dialled` goes: the target CID,
    /// or why it is denied. A pure function of the configuration.
    pub fn route(&self, src: u32, dialled: u32) -> Result<u32, Deny> {
        if !self.members.contains_key(&src) {
            return Err(Deny::NotMember { src });
        }
        if dialled == VMADDR_CID_HOST {
            let p = self.partners(src);
            return match p.as_slice() {
                [] => Err(Deny::Alone { src }),
                [one] => Ok(*one),
                _ => Err(Deny::Ambiguous { src, candidates: p }),
            };
        }
        if dialled == src {
            return Err(Deny::SelfDial { src });
        }
        if self
            .groups
            .iter()
            .any(|g| g.contains(&src) && g.contains(&dialled))
        {
            Ok(dialled)
        } else {
            Err(Deny::NoSharedGroup { src, dst: dialled })
        }
    }
}

/// Bridge options.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// At most this many bridged connections at once; more are refused (closed and reported).
    pub max_conns: usize,
    /// At most this many at once within one group (a connection counts in every group that
    /// holds both its ends), so one group cannot take the slots of the others.
    pub max_conns_per_group: usize,
    /// At most this many at once from one source CID, so one guest cannot take its group's.
    pub max_conns_per_cid: usize,
    /// A bridged connection that moved no byte either way for this long is closed (zero: never).
    pub idle_timeout: Duration,
    /// Bytes moved per call (splice pipe size or copy buffer).
    pub buffer: usize,
    pub sock: SockOpts,
    /// Limit for a hybrid target: its VMM's socket and the `OK` reply (AF_VSOCK targets use the
    /// kernel's vsock connect timeout).
    pub connect_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            max_conns: 256,
            max_conns_per_group: 64,
            max_conns_per_cid: 32,
            idle_timeout: Duration::from_secs(3600),
            buffer: 256 << 10,
            sock: SockOpts::default(),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// What happened to one connection; printed as a log line, or a JSON object with `--json`.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Event {
    /// A connection was accepted and its target connected; bytes flow from now on.
    Open {
        id: u64,
        src: u32,
        dst: u32,
        port: u32,
        dialled: u32,
    },
    /// A connection was refused by the routing rules (or the connection limit) and closed.
    Deny {
        src: u32,
        dialled: u32,
        port: u32,
        reason: String,
    },
    /// The target could not be reached; the source connection was closed.
    Fail {
        id: u64,
        src: u32,
        dst: u32,
        port: u32,
        error: String,
    },
    /// A bridged connection ended.
    Close {
        id: u64,
        src: u32,
        dst: u32,
        port: u32,
        bytes_src_to_dst: u64,
        bytes_dst_to_src: u64,
        millis: u64,
        spliced: bool,
        error: Option<String>,
    },
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::Open {
                id,
                src,
                dst,
                port,
                dialled,
            } => write!(
                f,
                "bridge {src}:{port} -> {dst}:{port} (conn {id}, dialled {dialled})"
            ),
            Event::Deny {
                src,
                dialled,
                port,
                reason,
            } => write!(f, "denied {src}:{port} -> {dialled}:{port}: {reason}"),
            Event::Fail {
                id,
                src,
                dst,
                port,
                error,
            } => write!(
                f,
                "failed {src}:{port} -> {dst}:{port} (conn {id}): {error}"
            ),
            Event::Close {
                id,
                src,
                dst,
                port,
                bytes_src_to_dst,
                bytes_dst_to_src,
                millis,
                spliced,
                error,
            } => {
                write!(
                    f,
                    "closed {src}:{port} -> {dst}:{port} (conn {id}): {bytes_src_to_dst} bytes ->, {bytes_dst_to_src} bytes <-, {millis} ms{}",
                    if *spliced { ", spliced" } else { "" }
                )?;
                if let Some(e) = error {
                    write!(f, ", error: {e}")?;
                }
                Ok(())
            }
        }
    }
}

/// Errors setting the bridge up.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error("listen on hybrid path {} (member {cid})", .path.display())]
    HybridListen {
        cid: u32,
        path: PathBuf,
        #[source]
        source: BindError,
    },
    #[error("listen on vsock port {port} (CID any)")]
    VsockListen {
        port: u32,
        #[source]
        source: io::Error,
    },
    #[error("--max-conns must be at least 1")]
    ZeroConns,
    #[error("--max-conns-per-group must be at least 1")]
    ZeroPerGroup,
    #[error("--max-conns-per-cid must be at least 1")]
    ZeroPerCid,
}

enum Source {
    /// AF_VSOCK listener at CID_ANY:port.
    Vsock { l: VsockListener, port: u32 },
    /// A hybrid member's `PATH_port`.
    Hybrid { l: BoundSocket, cid: u32, port: u32 },
}

/// Open connections, counted against the limits.
#[derive(Default)]
struct Counts {
    total: usize,
    per_cid: BTreeMap<u32, usize>,
    /// Indexed like `Config::groups`.
    per_group: Vec<usize>,
}

/// One admitted connection's place in [`Counts`], given back when dropped (on every way its
/// thread ends, a panic in the report callback included).
struct Slot {
    bridge: Arc<Bridge>,
    src: u32,
    groups: Vec<usize>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.bridge.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_cid.get_mut(&self.src) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.per_cid.remove(&self.src);
            }
        }
        for &g in &self.groups {
            c.per_group[g] = c.per_group[g].saturating_sub(1);
        }
    }
}

/// An open bridge: every listener bound. [`Bridge::serve`] runs it.
pub struct Bridge {
    cfg: Config,
    opts: Options,
    sources: Vec<Source>,
    next_id: AtomicU64,
    counts: Mutex<Counts>,
}

/// The listening path for guest-initiated connections to `port` on a hybrid member.
pub fn hybrid_listen_path(path: &Path, port: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!("_{port}"));
    PathBuf::from(s)
}

impl Bridge {
    /// Binds every listener: per port, one AF_VSOCK listener at CID_ANY when any member is
    /// reached over vsock, and one UNIX listener `PATH_port` per hybrid member. Nothing is
    /// bound when any of them fails (the ones already bound are closed and their files removed).
    pub fn open(cfg: Config, opts: Options) -> Result<Self, BridgeError> {
        if opts.max_conns == 0 {
            return Err(BridgeError::ZeroConns);
        }
        if opts.max_conns_per_group == 0 {
            return Err(BridgeError::ZeroPerGroup);
        }
        if opts.max_conns_per_cid == 0 {
            return Err(BridgeError::ZeroPerCid);
        }
        let counts = Counts {
            per_group: vec![0; cfg.groups.len()],
            ..Counts::default()
        };
        let mut b = Self {
            cfg,
            opts,
            sources: Vec::new(),
            next_id: AtomicU64::new(0),
            counts: Mutex::new(counts),
        };
        let hybrids: Vec<(u32, PathBuf)> = b
            .cfg
            .members
            .iter()
            .filter_map(|(&c, t)| match t {
                Transport::Hybrid(p) => Some((c, p.clone())),
                Transport::Vsock => None,
            })
            .collect();
        for &port in &b.cfg.ports {
            if b.cfg.uses_vsock() {
                let l = VsockListener::bind_with(
                    VsockAddr {
                        cid: VMADDR_CID_ANY,
                        port,
                    },
                    opts.sock.vsock_buffer,
                )
                .map_err(|source| BridgeError::VsockListen { port, source })?;
                b.sources.push(Source::Vsock { l, port });
            }
            for (cid, p) in &hybrids {
                let path = hybrid_listen_path(p, port);
                let l = BoundSocket::bind(&path).map_err(|source| BridgeError::HybridListen {
                    cid: *cid,
                    path: path.clone(),
                    source,
                })?;
                b.sources.push(Source::Hybrid { l, cid: *cid, port });
            }
        }
        Ok(b)
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// What is listening, one line each (for the startup log).
    pub fn listening(&self) -> Vec<String> {
        self.sources
            .iter()
            .map(|s| match s {
                Source::Vsock { port, .. } => format!("vsock CID any, port {port}"),
                Source::Hybrid { l, cid, .. } => {
                    format!("{} (member {cid})", l.path.display())
                }
            })
            .collect()
    }

    /// Removes the hybrid listening files, those still ours (on shutdown; also done on drop).
    pub fn remove_sockets(&self) {
        for s in &self.sources {
            if let Source::Hybrid { l, .. } = s {
                l.remove();
            }
        }
    }

    /// Admits a connection from `src` to `dst` under the limits, or says which one it hits.
    fn admit(self: &Arc<Self>, src: u32, dst: u32) -> Result<Slot, String> {
        let groups: Vec<usize> = (0..self.cfg.groups.len())
            .filter(|&i| self.cfg.groups[i].contains(&src) && self.cfg.groups[i].contains(&dst))
            .collect();
        let o = &self.opts;
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let from_src = c.per_cid.get(&src).copied().unwrap_or(0);
        if from_src >= o.max_conns_per_cid {
            return Err(format!(
                "{src} has {from_src} connections open (--max-conns-per-cid {})",
                o.max_conns_per_cid
            ));
        }
        if let Some(&g) = groups
            .iter()
            .find(|&&g| c.per_group[g] >= o.max_conns_per_group)
        {
            return Err(format!(
                "group {} has {} connections open (--max-conns-per-group {})",
                list(&self.cfg.groups[g]),
                c.per_group[g],
                o.max_conns_per_group
            ));
        }
        if c.total >= o.max_conns {
            return Err(format!("{} connections are open (--max-conns)", c.total));
        }
        c.total += 1;
        *c.per_cid.entry(src).or_default() += 1;
        for &g in &groups {
            c.per_group[g] += 1;
        }
        Ok(Slot {
            bridge: self.clone(),
            src,
            groups,
        })
    }

    /// Serves forever: one accept thread per listener, one thread per bridged connection.
    /// `report` gets every event. Returns only if a thread cannot be started.
    pub fn serve(self: &Arc<Self>, report: Arc<dyn Fn(&Event) + Send + Sync>) -> io::Result<()> {
        let mut handles = Vec::new();
        for i in 0..self.sources.len() {
            let b = self.clone();
            let report = report.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("accept-{i}"))
                    .spawn(move || b.accept_loop(i, report))?,
            );
        }
        for h in handles {
            let _ = h.join();
        }
        Ok(())
    }

    fn accept_loop(self: Arc<Self>, i: usize, report: Arc<dyn Fn(&Event) + Send + Sync>) {
        loop {
            let accepted = match &self.sources[i] {
                Source::Vsock { l, port } => l.accept().and_then(|(s, peer)| {
                    // The local CID is what the guest dialled (host or a sibling).
                    let local = s.local_addr()?;
                    Ok((OwnedFd::from(s), peer.cid, local.cid, *port))
                }),
                Source::Hybrid { l, cid, port } => l
                    .listener
                    .accept()
                    .map(|(s, _)| (OwnedFd::from(s), *cid, VMADDR_CID_HOST, *port)),
            };
            match accepted {
                Ok((fd, src, dialled, port)) => self.handle(fd, src, dialled, port, &report),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // EMFILE and the like: keep serving, without spinning.
                    warn!("accept on {}: {e}", self.listening()[i]);
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    fn handle(
        self: &Arc<Self>,
        fd: OwnedFd,
        src: u32,
        dialled: u32,
        port: u32,
        report: &Arc<dyn Fn(&Event) + Send + Sync>,
    ) {
        let deny = |reason: String| {
            report(&Event::Deny {
                src,
                dialled,
                port,
                reason,
            })
        };
        let dst = match self.cfg.route(src, dialled) {
            Ok(d) => d,
            Err(d) => return deny(d.to_string()),
        };
        let slot = match self.admit(src, dst) {
            Ok(s) => s,
            Err(why) => return deny(why),
        };
        let id = self.next_id.fetch_add(1, Ordering::SeqCst) + 1;
        let b = self.clone();
        let r = report.clone();
        // The slot moves into the thread (or is dropped with the closure if none starts).
        let spawned = std::thread::Builder::new()
            .name(format!("conn-{id}"))
            .spawn(move || b.bridge_one(slot, id, fd, src, dst, dialled, port, &*r));
        if let Err(e) = spawned {
            report(&Event::Fail {
                id,
                src,
                dst,
                port,
                error: format!("cannot start a thread: {e}"),
            });
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn bridge_one(
        &self,
        slot: Slot,
        id: u64,
        fd: OwnedFd,
        src: u32,
        dst: u32,
        dialled: u32,
        port: u32,
        report: &(dyn Fn(&Event) + Send + Sync),
    ) {
        // The slot is given back before the guest can see its connection end, so a guest that
        // reconnects at once after an EOF is never refused for the connection it just lost
        // (where the relay's own half-close comes first, at worst for an instant).
        let target = match self.connect_target(dst, port) {
            Ok(t) => t,
            Err(e) => {
                drop(slot);
                report(&Event::Fail {
                    id,
                    src,
                    dst,
                    port,
                    error: error_chain(&e),
                });
                // Closes the guest's connection.
                drop(fd);
                return;
            }
        };
        report(&Event::Open {
            id,
            src,
            dst,
            port,
            dialled,
        });
        let a = Conn::from_socket(fd, format!("{src}:{port}"));
        let b = Conn::from_socket(target, format!("{dst}:{port}"));
        let idle = Some(self.opts.idle_timeout).filter(|d| !d.is_zero());
        let s = relay::relay_with(id, a, b, self.opts.buffer, idle);
        drop(slot);
        report(&Event::Close {
            id,
            src,
            dst,
            port,
            bytes_src_to_dst: s.bytes_a_to_b,
            bytes_dst_to_src: s.bytes_b_to_a,
            millis: s.millis,
            spliced: s.spliced,
            error: s.error,
        });
    }

    /// Connects to member `dst` on `port`.
    fn connect_target(&self, dst: u32, port: u32) -> Result<OwnedFd, TargetError> {
        match &self.cfg.members[&dst] {
            Transport::Vsock => VsockStream::connect_with(
                VsockAddr { cid: dst, port },
                false,
                self.opts.sock.vsock_buffer,
            )
            .map(OwnedFd::from)
            .map_err(TargetError::Vsock),
            Transport::Hybrid(path) => {
                match conn::hybrid_connect(path, port, Some(self.opts.connect_timeout)) {
                    Ok(s) => Ok(s.into()),
                    Err(hybrid::HybridError::Connect(source)) => Err(TargetError::HybridIo {
                        path: path.clone(),
                        source,
                    }),
                    Err(source) => Err(TargetError::Hybrid {
                        path: path.clone(),
                        source,
                    }),
                }
            }
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.remove_sockets();
    }
}

/// Why a target could not be reached.
#[derive(Debug, thiserror::Error)]
enum TargetError {
    #[error("vsock connect")]
    Vsock(#[source] io::Error),
    #[error("connect to hybrid socket {}", .path.display())]
    HybridIo {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("hybrid handshake on {}", .path.display())]
    Hybrid {
        path: PathBuf,
        #[source]
        source: hybrid::HybridError,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg(groups: &[&[u32]], vms: &[(u32, &str)]) -> Config {
        Config::new(
            groups.iter().map(|g| g.to_vec()).collect(),
            vms.iter()
                .map(|(c, p)| (*c, Transport::Hybrid(PathBuf::from(p))))
                .collect(),
            vec![5000],
        )
        .unwrap()
    }

    #[test]
    fn groups_and_vms_parse() {
        assert_eq!(parse_group("3,4,10").unwrap(), vec![3, 4, 10]);
        assert_eq!(parse_group("3").unwrap(), vec![3]);
        assert_eq!(
            parse_group("3,2").unwrap_err().to_string(),
            "invalid CID \"2\" in --group: out of range (guest CIDs are 3-4294967294)"
        );
        assert!(parse_group("3,3")
            .unwrap_err()
            .to_string()
            .contains("CID 3 is listed twice"));
        assert!(parse_group("3,x").is_err());
        assert!(parse_group("4294967295").is_err());
        assert_eq!(parse_vm("3=vsock").unwrap(), (3, Transport::Vsock));
        assert_eq!(
            parse_vm("4=hybrid:/run/fc/v.sock").unwrap(),
            (4, Transport::Hybrid("/run/fc/v.sock".into()))
        );
        assert_eq!(
            parse_vm("4=tcp:1").unwrap_err().to_string(),
            "invalid member \"4=tcp:1\" in --vm: expected CID=vsock or CID=hybrid:PATH"
        );
        assert!(parse_vm("4=hybrid:").is_err());
        assert!(parse_vm("1=vsock").is_err());
        assert!(parse_vm(&format!("4=hybrid:/{}", "a".repeat(200))).is_err());
    }

    #[test]
    fn config_checks_members() {
        let g = || vec![vec![3, 4]];
        assert_eq!(
            Config::new(vec![], vec![], vec![1]).unwrap_err(),
            ConfigError::NoGroup
        );
        assert_eq!(
            Config::new(g(), vec![], vec![]).unwrap_err(),
            ConfigError::NoPorts
        );
        let e = Config::new(g(), vec![(5, Transport::Vsock)], vec![1]).unwrap_err();
        assert_eq!(e.to_string(), "--vm 5=vsock: CID 5 is in no --group");
        let e = Config::new(
            g(),
            vec![(3, Transport::Vsock), (3, Transport::Vsock)],
            vec![1],
        )
        .unwrap_err();
        assert_eq!(e, ConfigError::VmTwice(3));
        let p = || Transport::Hybrid("/tmp/x".into());
        assert!(matches!(
            Config::new(g(), vec![(3, p()), (4, p())], vec![1]).unwrap_err(),
            ConfigError::SamePath { a: 3, b: 4, .. }
        ));
        let long = Transport::Hybrid(PathBuf::from(format!("/{}", "a".repeat(100))));
        assert!(matches!(
            Config::new(g(), vec![(3, long)], vec![4000000000]).unwrap_err(),
            ConfigError::PathTooLong { cid: 3, .. }
        ));
        let c = Config::new(g(), vec![(4, p())], vec![1]).unwrap();
        assert_eq!(c.members()[&3], Transport::Vsock);
        assert_eq!(c.members()[&4], p());
        assert!(c.uses_vsock());
        let c = Config::new(
            g(),
            vec![(3, Transport::Hybrid("/a".into())), (4, p())],
            vec![1],
        )
        .unwrap();
        assert!(!c.uses_vsock());
    }

    #[test]
    fn routing_within_and_across_groups() {
        let c = cfg(&[&[3, 4], &[5, 6, 7], &[8]], &[]);
        // Dialling the host: the one other member.
        assert_eq!(c.route(3, 2), Ok(4));
        assert_eq!(c.route(4, 2), Ok(3));
        // Sibling by CID (VMADDR_FLAG_TO_HOST), same group.
        assert_eq!(c.route(3, 4), Ok(4));
        assert_eq!(c.route(6, 7), Ok(7));
        // Across groups.
        assert_eq!(c.route(3, 5), Err(Deny::NoSharedGroup { src: 3, dst: 5 }));
        assert_eq!(c.route(5, 3), Err(Deny::NoSharedGroup { src: 5, dst: 3 }));
        // Not a member at all, as source or target.
        assert_eq!(c.route(9, 2), Err(Deny::NotMember { src: 9 }));
        assert_eq!(c.route(9, 3), Err(Deny::NotMember { src: 9 }));
        assert_eq!(c.route(3, 9), Err(Deny::NoSharedGroup { src: 3, dst: 9 }));
        // Reserved CIDs dialled with to-host.
        assert_eq!(c.route(3, 0), Err(Deny::NoSharedGroup { src: 3, dst: 0 }));
        assert_eq!(c.route(3, 1), Err(Deny::NoSharedGroup { src: 3, dst: 1 }));
        // Host dial in a group of three: ambiguous, and the message says what to do.
        let e = c.route(5, 2).unwrap_err();
        assert_eq!(
            e,
            Deny::Ambiguous {
                src: 5,
                candidates: vec![6, 7]
            }
        );
        assert!(e.to_string().contains("VMADDR_FLAG_TO_HOST"), "{e}");
        // A group of one reaches nobody.
        assert_eq!(c.route(8, 2), Err(Deny::Alone { src: 8 }));
        assert_eq!(c.route(3, 3), Err(Deny::SelfDial { src: 3 }));
    }

    #[test]
    fn routing_over_several_groups() {
        // 4 is in two groups: it reaches both, the host dial is ambiguous for it only.
        let c = cfg(&[&[3, 4], &[4, 5]], &[]);
        assert_eq!(c.route(3, 2), Ok(4));
        assert_eq!(c.route(5, 2), Ok(4));
        assert!(matches!(c.route(4, 2), Err(Deny::Ambiguous { .. })));
        assert_eq!(c.route(4, 5), Ok(5));
        assert_eq!(c.route(3, 5), Err(Deny::NoSharedGroup { src: 3, dst: 5 }));
        // The same pair in two groups is one partner, not two.
        let c = cfg(&[&[3, 4], &[4, 3]], &[]);
        assert_eq!(c.route(3, 2), Ok(4));
    }

    #[test]
    fn listen_path_appends_the_port() {
        assert_eq!(
            hybrid_listen_path(Path::new("/run/vm/v.sock"), 5000),
            PathBuf::from("/run/vm/v.sock_5000")
        );
    }

    #[test]
    fn event_lines() {
        let e = Event::Open {
            id: 1,
            src: 3,
            dst: 4,
            port: 5000,
            dialled: 2,
        };
        assert_eq!(e.to_string(), "bridge 3:5000 -> 4:5000 (conn 1, dialled 2)");
        let d = Event::Deny {
            src: 3,
            dialled: 5,
            port: 5000,
            reason: Deny::NoSharedGroup { src: 3, dst: 5 }.to_string(),
        };
        assert_eq!(
            d.to_string(),
            "denied 3:5000 -> 5:5000: 3 dialled 5, and the two share no group"
        );
    }

    proptest! {
        #[test]
        fn group_and_vm_parsers_never_panic(s in "\\PC{0,40}") {
            if let Ok(g) = parse_group(&s) {
                prop_assert!(g.iter().all(|c| (MIN_GUEST_CID..=MAX_VALUE).contains(c)));
            }
            if let Ok((c, _)) = parse_vm(&s) {
                prop_assert!(c >= MIN_GUEST_CID);
            }
        }

        // Routing invariants over random groups: a route is never to the source, always to a
        // member sharing a group with it, and a sibling dial succeeds exactly when the two
        // share a group.
        #[test]
        fn routing_invariants(
            groups in proptest::collection::vec(proptest::collection::btree_set(3u32..10, 1..4), 1..4),
            src in 2u32..11,
            dialled in 0u32..11,
        ) {
            let groups: Vec<Vec<u32>> = groups.into_iter().map(|g| g.into_iter().collect()).collect();
            let c = Config::new(groups.clone(), vec![], vec![1]).unwrap();
            let share = |a: u32, b: u32| groups.iter().any(|g| g.contains(&a) && g.contains(&b));
            match c.route(src, dialled) {
                Ok(dst) => {
                    prop_assert_ne!(dst, src);
                    prop_assert!(share(src, dst));
                    if dialled != VMADDR_CID_HOST {
                        prop_assert_eq!(dst, dialled);
                    }
                }
                Err(_) => {
                    if dialled != VMADDR_CID_HOST && dialled != src {
                        prop_assert!(!share(src, dialled));
                    }
                }
            }
        }
    }
}
