//! `pod add / del / list`: the pod's namespace, its device pair, addresses and routes, the
//! BPF attachments and the endpoint entry, each undone if a later step fails.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::str::FromStr;

use nsfast_sys::net::{self, NetkitMode, Netlink};
use nsfast_sys::netns::{self, NetNs};
use serde::Serialize;
use tracing::{info, warn};

use crate::abi::{self, Endpoint};
use crate::datapath;
use crate::error::PodError;
use crate::state::{AttachMethod, CniAttachment, Datapath, Host, HostLock, PodRecord, TcFilter};

/// The link-local gateway every pod routes through (answered by the BPF ARP responder on
/// veth and netkit L2; netkit L3 needs no ARP).
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// The pods' IPv6 gateway (link-local, answered by the BPF NDP responder on veth and netkit
/// L2; netkit L3 needs no NDP).
pub const GATEWAY6: Ipv6Addr = abi::GATEWAY6;
/// Default name of the pod's device.
pub const POD_IF: &str = "eth0";

/// `--mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeRequest {
    /// veth pair + TCX programs.
    Veth,
    /// netkit L3 (the default netkit mode).
    Netkit,
    /// netkit L2 (ARP answered by the peer program).
    NetkitL2,
    /// netkit if the kernel has it, else veth.
    Auto,
}

impl FromStr for ModeRequest {
    type Err = PodError;
    fn from_str(s: &str) -> Result<Self, PodError> {
        match s {
            "veth" => Ok(Self::Veth),
            "netkit" | "netkit-l3" => Ok(Self::Netkit),
            "netkit-l2" => Ok(Self::NetkitL2),
            "auto" => Ok(Self::Auto),
            _ => Err(PodError::BadMode(s.into())),
        }
    }
}

/// How to attach the veth and uplink programs (`NSFAST_POD_ATTACH`, or [`AddOptions::attach`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttachRequest {
    /// TCX where the kernel has it (6.6+), else classic tc; `NSFAST_POD_ATTACH` overrides.
    #[default]
    Auto,
    /// TCX links only (an error on kernels without TCX).
    Tcx,
    /// Classic tc (clsact + cls_bpf direct-action over netlink), also where TCX exists.
    Tc,
}

/// The environment variable that forces the attach method (`auto`, `tcx`, `tc`).
pub const ATTACH_ENV: &str = "NSFAST_POD_ATTACH";

impl FromStr for AttachRequest {
    type Err = PodError;
    fn from_str(s: &str) -> Result<Self, PodError> {
        match s {
            "auto" | "" => Ok(Self::Auto),
            "tcx" => Ok(Self::Tcx),
            "tc" => Ok(Self::Tc),
            _ => Err(PodError::BadAttach(s.into())),
        }
    }
}

/// TCX support, probed once per process (a read-only query in a throwaway namespace).
pub fn tcx_support() -> &'static nsfast_sys::probe::Feature {
    static TCX: std::sync::OnceLock<nsfast_sys::probe::Feature> = std::sync::OnceLock::new();
    TCX.get_or_init(nsfast_sys::probe::tcx)
}

/// Resolves the attach method for veth and uplink programs: `req`, else `NSFAST_POD_ATTACH`,
/// else TCX if the kernel has it, else tc. Returns the method and why it was chosen.
pub fn resolve_attach(req: AttachRequest) -> Result<(AttachMethod, String), PodError> {
    let req = match req {
        AttachRequest::Auto => match std::env::var(ATTACH_ENV) {
            Ok(v) => v.parse().map_err(|_| PodError::BadAttachEnv(v))?,
            Err(_) => AttachRequest::Auto,
        },
        r => r,
    };
    let tcx = tcx_support();
    let kver = nsfast_sys::kernel::release();
    match req {
        AttachRequest::Tc => Ok((AttachMethod::Tc, "tc (requested)".into())),
        AttachRequest::Tcx if !tcx.available => Err(PodError::NoTcx {
            kernel: kver,
            reason: tcx.reason.clone(),
        }),
        AttachRequest::Tcx => Ok((AttachMethod::Tcx, "TCX (requested)".into())),
        AttachRequest::Auto if tcx.available => Ok((AttachMethod::Tcx, "TCX".into())),
        AttachRequest::Auto => Ok((
            AttachMethod::Tc,
            format!("tc (kernel {kver} lacks TCX, Linux >= 6.6: clsact + cls_bpf direct-action)"),
        )),
    }
}

/// An IPv4 address with prefix (`10.244.1.5/24`; a bare address is /32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodIp {
    pub ip: Ipv4Addr,
    pub prefix: u8,
}

impl FromStr for PodIp {
    type Err = PodError;
    fn from_str(s: &str) -> Result<Self, PodError> {
        let bad = || PodError::BadIp(s.into());
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, p.parse::<u8>().map_err(|_| bad())?),
            None => (s, 32),
        };
        let ip: Ipv4Addr = a.parse().map_err(|_| bad())?;
        if !(8..=32).contains(&p) || ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() {
            return Err(bad());
        }
        Ok(Self { ip, prefix: p })
    }
}

/// An IPv6 address with prefix (`fd00:10:244::5/64`; a bare address is /128). Link-local
/// addresses are refused (fe80::1 is the gateway, and the datapath drops link-local sources).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodIp6 {
    pub ip: Ipv6Addr,
    pub prefix: u8,
}

impl FromStr for PodIp6 {
    type Err = PodError;
    fn from_str(s: &str) -> Result<Self, PodError> {
        let bad = || PodError::BadIp(s.into());
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, p.parse::<u8>().map_err(|_| bad())?),
            None => (s, 128),
        };
        let ip: Ipv6Addr = a.parse().map_err(|_| bad())?;
        let seg0 = ip.segments()[0];
        if !(16..=128).contains(&p)
            || ip.is_unspecified()
            || ip.is_loopback()
            || ip.is_multicast()
            || (seg0 & 0xffc0) == 0xfe80
            || ip.to_ipv4_mapped().is_some()
        {
            return Err(bad());
        }
        Ok(Self { ip, prefix: p })
    }
}

/// A pod's addresses (`--ip`, repeatable or comma-separated): one IPv4 and/or one IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PodAddrs {
    pub v4: Option<PodIp>,
    pub v6: Option<PodIp6>,
}

impl PodAddrs {
    /// Parses `--ip` values; each may hold several addresses separated by commas. Refuses an
    /// empty list, an empty item and a second address of a family, naming the value.
    pub fn parse<S: AsRef<str>>(values: &[S]) -> Result<Self, PodError> {
        let all = values
            .iter()
            .map(|v| v.as_ref())
            .collect::<Vec<_>>()
            .join(",");
        let mut out = Self::default();
        for item in all.split(',').map(str::trim) {
            if item.is_empty() {
                return Err(PodError::BadIpList {
                    value: all.clone(),
                    reason: "an empty address".into(),
                });
            }
            let twice = |fam: &str, first: String| PodError::BadIpList {
                value: all.clone(),
                reason: format!("a second {fam} address {item:?} (the first is {first})"),
            };
            if item.contains(':') {
                let a: PodIp6 = item.parse()?;
                if let Some(f) = out.v6 {
                    return Err(twice("IPv6", format!("{}/{}", f.ip, f.prefix)));
                }
                out.v6 = Some(a);
            } else {
                let a: PodIp = item.parse()?;
                if let Some(f) = out.v4 {
                    return Err(twice("IPv4", format!("{}/{}", f.ip, f.prefix)));
                }
                out.v4 = Some(a);
            }
        }
        Ok(out)
    }
}

/// Validates a pod name: 1-40 of [a-z0-9-], starting with a letter or digit.
pub fn valid_pod_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 40
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// The one interface-name rule, [`nsfast_sys::args::ifname`].
fn valid_ifname(name: &str) -> bool {
    nsfast_sys::args::ifname::check("--ifname", name).is_ok()
}

/// FNV-1a, for short stable device names.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

/// The host-side device name of pod `name` on `host`: `nsf` + 8 hex digits.
pub fn host_ifname(host: &Host, name: &str) -> String {
    format!("nsf{:08x}", fnv(&format!("{}/{name}", host.key)) as u32)
}

/// What to make.
#[derive(Debug, Clone)]
pub struct AddOptions {
    pub name: String,
    /// The IPv4 address; unspecified (0.0.0.0) for an IPv6-only pod.
    pub ip: PodIp,
    /// The IPv6 address of a dual-stack or IPv6-only pod.
    pub ip6: Option<PodIp6>,
    pub mode: ModeRequest,
    /// `--host NS`; `None`: the caller's namespace.
    pub host: Option<String>,
    /// Uplinks to attach the wire program to (once per host).
    pub uplinks: Vec<String>,
    /// How veth and uplink programs are attached.
    pub attach: AttachRequest,
    /// An existing namespace (name or path) to put the pod in; `None`: create one named after
    /// the pod.
    pub netns: Option<String>,
    /// The pod's device name.
    pub pod_if: String,
    pub cni: Option<CniAttachment>,
    /// `--host-firewall`: the pod's traffic (to and from it) goes through the host stack and
    /// its netfilter instead of being redirected (the source check still applies).
    pub host_firewall: bool,
    /// `--no-shortcut`: the pod's TCP never takes the pod shortcut (crate::shortcut).
    pub no_shortcut: bool,
}

impl AddOptions {
    /// Options for a pod with the addresses `a` (IPv4 and/or IPv6).
    pub fn with_addrs(name: &str, a: PodAddrs) -> Self {
        let mut o = Self::new(
            name,
            a.v4.unwrap_or(PodIp {
                ip: Ipv4Addr::UNSPECIFIED,
                prefix: 32,
            }),
        );
        o.ip6 = a.v6;
        o
    }

    /// The pod's addresses, IPv4 first (none for a CNI intent before IPAM).
    pub fn addrs(&self) -> Vec<IpAddr> {
        let mut v = Vec::new();
        if !self.ip.ip.is_unspecified() {
            v.push(IpAddr::V4(self.ip.ip));
        }
        if let Some(a) = self.ip6 {
            v.push(IpAddr::V6(a.ip));
        }
        v
    }

    pub fn new(name: &str, ip: PodIp) -> Self {
        Self {
            name: name.into(),
            ip,
            ip6: None,
            mode: ModeRequest::Veth,
            host: None,
            uplinks: Vec::new(),
            attach: AttachRequest::Auto,
            netns: None,
            pod_if: POD_IF.into(),
            cni: None,
            host_firewall: false,
            no_shortcut: false,
        }
    }
}

/// Result of `add`.
#[derive(Debug, Clone, Serialize)]
pub struct Added {
    #[serde(serialize_with = "crate::state::ser_record")]
    pub record: PodRecord,
    /// How the mode was chosen, e.g. "auto: kernel lacks netkit, using veth + TCX".
    pub mode_note: String,
    /// How the veth and uplink programs are attached (`tcx` or `tc`; netkit pods use netkit
    /// links, see the record's `attach`).
    pub attach: AttachMethod,
}

/// Resolves `--mode` and the attach method against the running kernel without changing
/// anything: the device pair, how veth/uplink programs attach, and a note saying why.
pub fn resolve_mode(
    m: ModeRequest,
    attach: AttachRequest,
) -> Result<(Datapath, AttachMethod, String), PodError> {
    let kver = nsfast_sys::kernel::release();
    let has = || net::probe_netkit().unwrap_or(false);
    let (dp, note) = match m {
        ModeRequest::Veth => (Datapath::Veth, "veth (requested)".to_string()),
        ModeRequest::Netkit | ModeRequest::NetkitL2 => {
            if !has() {
                return Err(PodError::NoNetkit(kver));
            }
            if m == ModeRequest::Netkit {
                (Datapath::NetkitL3, "netkit L3 (requested)".into())
            } else {
                (Datapath::NetkitL2, "netkit L2 (requested)".into())
            }
        }
        ModeRequest::Auto => {
            if has() {
                (
                    Datapath::NetkitL3,
                    format!("auto: kernel {kver} has netkit, using netkit L3"),
                )
            } else {
                (
                    Datapath::Veth,
                    format!("auto: kernel {kver} lacks netkit, using veth"),
                )
            }
        }
    };
    let (method, why) = resolve_attach(attach)?;
    let note = if dp == Datapath::Veth {
        format!("{note} + {why}")
    } else {
        format!("{note}; uplinks: {why}")
    };
    Ok((dp, method, note))
}

/// The link-local address `add` gives a pod with IPv6 address `ip6` (fe80::/64 with an
/// interface id hashed from `ip6`, the universal/local bit clear): known from the record
/// alone, so a killed `add` is undone without asking the pod. It has an endpoint entry like
/// the pod's own address, so the datapath answers (and source-checks) the neighbour
/// solicitations the pod's kernel sends from it; nothing else may use it.
pub fn pod_link_local(ip6: Ipv6Addr) -> Ipv6Addr {
    // FNV-1a, 64 bits.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in ip6.octets() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let iid = h & !(0x02u64 << 56);
    let mut o = [0u8; 16];
    o[0] = 0xfe;
    o[1] = 0x80;
    o[8..].copy_from_slice(&iid.to_be_bytes());
    Ipv6Addr::from(o)
}

/// The keys of a pod's endpoint entries: its addresses and, with IPv6, its link-local one
/// ([`pod_link_local`]).
pub fn endpoint_keys(addrs: &[IpAddr]) -> Vec<IpAddr> {
    let mut v = addrs.to_vec();
    for a in addrs {
        if let IpAddr::V6(a6) = a {
            v.push(IpAddr::V6(pod_link_local(*a6)));
        }
    }
    v
}

/// Undo steps of a half-made pod, run in reverse on failure.
#[derive(Default)]
struct Undo {
    host_link: Option<String>,
    pins: Vec<PathBuf>,
    tc: Vec<TcFilter>,
    endpoints: Vec<(IpAddr, u32)>,
}

impl Undo {
    fn run(self, host: &Host) {
        for (ip, idx) in self.endpoints {
            let _ = datapath::endpoint_remove(host, ip, idx);
        }
        for p in self.pins.iter().rev() {
            let _ = datapath::unpin(p);
        }
        for f in self.tc.iter().rev() {
            let _ = datapath::detach_tc(host, f);
        }
        if let (Some(l), Ok(nl)) = (self.host_link, host.netlink()) {
            let _ = nl.delete_link(&l);
        }
    }
}

pub use crate::fault::{crash_point, CRASH_ENV};

/// The steps of an `add` (CNI ADD and `nsfast pod add`) that [`CRASH_ENV`] can stop after:
/// - `intent` (CNI): the intent record is written, nothing else;
/// - `ipam` (CNI): the IPAM plugin leased the address, the intent does not name it yet;
/// - `planned`: the intent names the address;
/// - `netns` (`pod add` without a namespace): the pod's namespace is made;
/// - `devices`: the device pair exists;
/// - `addresses`: addresses and routes are set;
/// - `attach`: the programs are attached and pinned;
/// - `endpoint`: the endpoint map has the pod;
/// - `record`: the record is complete (CNI: the result is not printed yet).
pub const ADD_STEPS: &[&str] = &[
    "intent",
    "ipam",
    "planned",
    "netns",
    "devices",
    "addresses",
    "attach",
    "endpoint",
    "record",
];

/// A checked `add`: the host and how the pod will be made, before anything changes.
#[derive(Debug)]
pub struct Plan {
    pub host: Host,
    pub datapath: Datapath,
    pub attach: AttachMethod,
    pub mode_note: String,
}

/// Checks `opts` against the system without changing anything: names, the host, uplinks,
/// the mode and attach method.
pub fn plan(opts: &AddOptions) -> Result<Plan, PodError> {
    if !valid_pod_name(&opts.name) {
        return Err(PodError::BadName(opts.name.clone()));
    }
    if !valid_ifname(&opts.pod_if) {
        return Err(PodError::BadIfName(opts.pod_if.clone()));
    }
    for u in &opts.uplinks {
        if !valid_ifname(u) {
            return Err(PodError::BadIfName(u.clone()));
        }
    }
    let host = Host::open(opts.host.as_deref())?;
    for u in &opts.uplinks {
        if !host.netlink()?.link_exists(u)? {
            return Err(PodError::NoUplink {
                dev: u.clone(),
                host: host.display.clone(),
            });
        }
    }
    let (datapath, attach, mode_note) = resolve_mode(opts.mode, opts.attach)?;
    Ok(Plan {
        host,
        datapath,
        attach,
        mode_note,
    })
}

/// Makes a pod. Input is checked before anything changes; on error everything made is
/// removed again. A pending record of the same name (an `add` that was killed) is undone
/// first.
pub fn add(opts: &AddOptions) -> Result<Added, PodError> {
    let plan = plan(opts)?;
    info!("pod {}: {}", opts.name, plan.mode_note);
    let lock = plan.host.lock()?;
    if let Some(r) = plan.host.record(&opts.name)? {
        if r.pending {
            warn!(
                "pod {}: undoing an add that did not finish (pending record)",
                r.name
            );
            undo_pending(&plan.host, &r)?;
            plan.host.remove_record(&r.name)?;
        }
    }
    // Repairs the shortcut's pod map after a killed add/del (e.g. a pod whose add died after
    // its record was complete): a retry of the add leaves the pod known either way.
    if let Err(e) = crate::shortcut::sync(&plan.host, &lock) {
        warn!(
            "host {}: shortcut pod map not repaired: {e}",
            plan.host.display
        );
    }
    add_locked(&plan, &lock, opts)
}

/// The intent record of `opts` on `host` (pending, nothing made yet): what `add` will make.
pub fn intent(host: &Host, opts: &AddOptions, dp: Datapath, attach: AttachMethod) -> PodRecord {
    let host_if = host_ifname(host, &opts.name);
    let link_pins = match dp {
        Datapath::Veth if attach == AttachMethod::Tc => Vec::new(),
        Datapath::Veth => vec![datapath::link_pin(host, &host_if)],
        Datapath::NetkitL3 | Datapath::NetkitL2 => vec![
            datapath::netkit_pin(host, &host_if, "peer"),
            datapath::netkit_pin(host, &host_if, "primary"),
        ],
    };
    PodRecord {
        name: opts.name.clone(),
        ip: opts.ip.ip,
        prefix: opts.ip.prefix,
        gateway: GATEWAY,
        ip6: opts.ip6.map(|a| a.ip),
        prefix6: opts.ip6.map(|a| a.prefix),
        gateway6: opts.ip6.map(|_| GATEWAY6),
        datapath: dp,
        host: host.display.clone(),
        netns: opts.netns.clone().unwrap_or_else(|| opts.name.clone()),
        netns_owned: opts.netns.is_none(),
        host_if,
        host_ifindex: 0,
        pod_if: opts.pod_if.clone(),
        pod_mac: String::new(),
        host_mac: String::new(),
        attach: if dp == Datapath::Veth {
            attach
        } else {
            AttachMethod::Netkit
        },
        link_pins,
        tc_filters: Vec::new(),
        cni: opts.cni.clone(),
        host_firewall: opts.host_firewall,
        pending: true,
        no_shortcut: opts.no_shortcut,
        netns_cookie: None,
    }
}

/// [`add`] with the host's lock held (from [`Plan::host`]). A pending record of the same name
/// is taken to be the caller's own intent (the CNI plugin writes one before asking IPAM) and
/// is overwritten. On error what was made is undone; the intent record is removed, except for
/// CNI pods, whose caller still has to release the IPAM lease and then calls [`forget`].
pub fn add_locked(plan: &Plan, _lock: &HostLock, opts: &AddOptions) -> Result<Added, PodError> {
    let host = &plan.host;
    let (dp, attach) = (plan.datapath, plan.attach);
    // A failed add leaves the shortcut as it found it (`pod add` never enables it; the CNI
    // plugin, which may, passes what it found to [`forget_failed_add`] itself).
    let shortcut_was_on = crate::shortcut::is_enabled(host);
    let precheck = || -> Result<(), PodError> {
        if host.record(&opts.name)?.is_some_and(|r| !r.pending) {
            return Err(PodError::Exists {
                name: opts.name.clone(),
                host: host.display.clone(),
            });
        }
        // Pending records are intents of adds that died: they block nothing.
        let want = opts.addrs();
        if opts.ip.ip.is_unspecified() && opts.ip6.is_none() {
            return Err(PodError::BadIpList {
                value: String::new(),
                reason: "no address".into(),
            });
        }
        for other in host.records()? {
            if other.pending || other.name == opts.name {
                continue;
            }
            if let Some(ip) = other.addrs().into_iter().find(|a| want.contains(a)) {
                return Err(PodError::IpInUse {
                    ip,
                    other: other.name,
                    host: host.display.clone(),
                });
            }
        }
        if opts.netns.is_none() && netns::list_named().contains(&opts.name) {
            return Err(PodError::Netns(netns::NetnsError::Exists(
                opts.name.clone(),
            )));
        }
        Ok(())
    };
    if let Err(e) = precheck() {
        if opts.cni.is_none() {
            let _ = gc_after_failed_add(host, shortcut_was_on);
        }
        return Err(e);
    }
    let mut record = intent(host, opts, dp, attach);
    host.write_record(&record)?;
    crash_point("planned");

    let fail = |e: PodError, undo: Undo, pod_ns: Option<NetNs>| -> PodError {
        warn!("pod {}: add failed, undoing: {e}", opts.name);
        undo.run(host);
        drop(pod_ns); // deletes a namespace made here
        if opts.cni.is_none() {
            let _ = forget_failed_add(host, &opts.name, shortcut_was_on);
        }
        e
    };
    // The pod's namespace: made here (deleted again on error by the owned handle) or given.
    let pod_ns = match &opts.netns {
        None => match NetNs::create(&opts.name) {
            Ok(ns) => ns,
            Err(e) => return Err(fail(e.into(), Undo::default(), None)),
        },
        Some(p) => match NetNs::open(p) {
            Ok(ns) => ns,
            Err(e) => return Err(fail(e.into(), Undo::default(), None)),
        },
    };
    if opts.netns.is_none() {
        crash_point("netns");
    }
    let mut undo = Undo::default();
    match build(host, &pod_ns, opts, dp, attach, &mut undo) {
        Ok(mut built) => {
            built.netns = record.netns.clone();
            built.netns_owned = record.netns_owned;
            built.pending = false;
            built.netns_cookie = pod_ns.cookie().ok();
            record = built;
            if let Err(e) = host.write_record(&record) {
                return Err(fail(e, undo, Some(pod_ns)));
            }
            crash_point("record");
            // The shortcut (if on) learns the pod; a failure leaves the pod on the kernel
            // path, and the next add/del/enable of the host retries.
            if crate::shortcut::is_enabled(host) {
                if let Err(e) = crate::shortcut::sync(host, _lock) {
                    warn!("pod {}: the shortcut did not learn it: {e}", opts.name);
                }
                crash_point("shortcut");
            }
            if record.netns_owned {
                let _ = pod_ns.persist();
            }
            Ok(Added {
                record,
                mode_note: plan.mode_note.clone(),
                attach,
            })
        }
        Err(e) => Err(fail(e, undo, Some(pod_ns))),
    }
}

/// Undoes whatever exists of the pending record `r` (an `add` that died): its endpoint entry
/// (unless a complete pod of the host owns that address now), its pins, its device pair (and
/// with it the pod's addresses and routes), and the namespace if `add` was making it. The
/// record itself stays: the caller removes it ([`forget`]) once everything else (the CNI
/// plugin: the IPAM lease) is released. Lock held.
pub fn undo_pending(host: &Host, r: &PodRecord) -> Result<(), PodError> {
    for ip in endpoint_keys(&r.addrs()) {
        if let Some(ep) = datapath::endpoint_get(host, ip)? {
            let owned_by_other = host.records()?.iter().any(|o| {
                !o.pending
                    && o.name != r.name
                    && endpoint_keys(&o.addrs()).contains(&ip)
                    && o.host_ifindex == ep.ifindex
            });
            if !owned_by_other {
                datapath::endpoint_remove(host, ip, ep.ifindex)?;
            }
        }
    }
    remove_attachments(host, r)
}

/// Removes the record of pod `name` and, if it was the host's last, the host's state. Lock
/// held.
pub fn forget(host: &Host, name: &str) -> Result<(), PodError> {
    host.remove_record(name)?;
    gc_host(host).map(|_| ())
}

/// [`forget`] for an `add` that failed: the record goes; the host's state too if the add
/// left no pod, unless the shortcut was on before the add (`shortcut_was_on`) — it stays
/// enabled, as the add found it. Lock held.
pub fn forget_failed_add(host: &Host, name: &str, shortcut_was_on: bool) -> Result<(), PodError> {
    host.remove_record(name)?;
    gc_after_failed_add(host, shortcut_was_on).map(|_| ())
}

fn gc_after_failed_add(host: &Host, shortcut_was_on: bool) -> Result<bool, PodError> {
    if shortcut_was_on && crate::shortcut::is_enabled(host) {
        return Ok(false);
    }
    gc_host(host)
}

fn mac_str(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Makes the pod's devices, addresses, routes, programs and endpoint entry (the steps
/// `devices`, `addresses`, `attach`, `endpoint` of [`ADD_STEPS`], in that order), noting in
/// `undo` what to remove if a later step fails. One netlink connection per namespace: the
/// host's (through `host`) and the pod's.
fn build(
    host: &Host,
    pod_ns: &NetNs,
    opts: &AddOptions,
    dp: Datapath,
    attach: AttachMethod,
    undo: &mut Undo,
) -> Result<PodRecord, PodError> {
    let host_if = host_ifname(host, &opts.name);
    let hnl = host.netlink()?;
    let pnl = pod_ns.netlink()?;
    make_devices(host, &pnl, opts, dp, &host_if, undo)?;
    crash_point("devices");
    let host_ifindex = hnl.link_index(&host_if)?;
    let host_mac = hnl.link_mac(&host_if)?;
    let pod_mac = pnl.link_mac(&opts.pod_if)?;
    set_addresses(host, pod_ns, &pnl, opts, dp, &host_if)?;
    crash_point("addresses");
    attach_programs(host, opts, dp, attach, &host_if, host_ifindex, undo)?;
    crash_point("attach");
    insert_endpoint(host, opts, dp, host_ifindex, pod_mac, host_mac, undo)?;
    crash_point("endpoint");
    // The intent record with what only building could tell: index, MACs, what was attached.
    Ok(PodRecord {
        host_ifindex,
        pod_mac: mac_str(pod_mac),
        host_mac: mac_str(host_mac),
        link_pins: undo.pins.clone(),
        tc_filters: undo.tc.clone(),
        pending: false,
        ..intent(host, opts, dp, attach)
    })
}

/// The device pair: `host_if` in the host, `opts.pod_if` in the pod (made under a temporary
/// name, so the pod's name may exist in the host). Refuses a `host_if` that exists already.
fn make_devices(
    host: &Host,
    pnl: &Netlink,
    opts: &AddOptions,
    dp: Datapath,
    host_if: &str,
    undo: &mut Undo,
) -> Result<(), PodError> {
    let hnl = host.netlink()?;
    let tmp_if = format!("nsp{}", &host_if[3..]);
    if hnl.link_exists(host_if)? {
        return Err(PodError::Io {
            what: format!("device {host_if} already exists in host {}", host.display),
            source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
        });
    }
    undo.host_link = Some(host_if.to_string());
    match dp {
        Datapath::Veth => hnl.create_veth_into(host_if, &tmp_if, pnl, &opts.pod_if)?,
        Datapath::NetkitL3 | Datapath::NetkitL2 => {
            let mode = if dp == Datapath::NetkitL3 {
                NetkitMode::L3
            } else {
                NetkitMode::L2
            };
            hnl.create_netkit(host_if, &tmp_if, pnl, &opts.pod_if, mode)?
        }
    }
    Ok(())
}

/// The pod's address and its routes (everything via the host), and in the host a /32 route
/// to the pod (for the stack's own traffic) and forwarding, which bpf_fib_lookup requires.
fn set_addresses(
    host: &Host,
    pod_ns: &NetNs,
    pnl: &Netlink,
    opts: &AddOptions,
    dp: Datapath,
    host_if: &str,
) -> Result<(), PodError> {
    let hnl = host.netlink()?;
    if !opts.ip.ip.is_unspecified() {
        let any = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        pnl.add_address(&opts.pod_if, IpAddr::V4(opts.ip.ip), opts.ip.prefix)?;
        if dp == Datapath::NetkitL3 {
            pnl.add_route(any, 0, None, Some(&opts.pod_if))?;
        } else {
            pnl.add_link_route(GATEWAY, 32, &opts.pod_if)?;
            pnl.add_route(any, 0, Some(IpAddr::V4(GATEWAY)), None)?;
        }
        hnl.add_route(IpAddr::V4(opts.ip.ip), 32, None, Some(host_if))?;
        net::set_sysctl(Some(&host.ns), "net.ipv4.ip_forward", "1")?;
    }
    if let Some(a) = opts.ip6 {
        set_addresses6(host, pod_ns, pnl, opts, a, dp, host_if)?;
    }
    Ok(())
}

/// The IPv6 half of [`set_addresses`]: the pod's address, usable at once (no duplicate
/// address detection: the address is the pod's by the endpoint table, and the datapath drops
/// the DAD probes, sent from `::`), its default route via fe80::1 on its device (netkit L3:
/// out of the device), and in the host a /128 route to the pod and IPv6 forwarding on the
/// host-side device, which bpf_fib_lookup requires (on every device for host-firewall pods).
fn set_addresses6(
    host: &Host,
    pod_ns: &NetNs,
    pnl: &Netlink,
    opts: &AddOptions,
    a: PodIp6,
    dp: Datapath,
    host_if: &str,
) -> Result<(), PodError> {
    let hnl = host.netlink()?;
    let pod_ns = Some(pod_ns);
    let conf = |dev: &str, key: &str| format!("net/ipv6/conf/{dev}/{key}");
    // No kernel-made link-local address (its own interface id): the pod gets the one the
    // datapath knows ([`pod_link_local`]). Disabling IPv6 once drops any address the kernel
    // made already (the device may be up).
    set_proc(pod_ns, &conf(&opts.pod_if, "addr_gen_mode"), "1")?;
    set_proc(pod_ns, &conf(&opts.pod_if, "disable_ipv6"), "1")?;
    set_proc(pod_ns, &conf(&opts.pod_if, "disable_ipv6"), "0")?;
    set_proc(pod_ns, &conf(&opts.pod_if, "accept_dad"), "0")?;
    set_proc(pod_ns, &conf(&opts.pod_if, "accept_ra"), "0")?;
    pnl.add_address(&opts.pod_if, IpAddr::V6(pod_link_local(a.ip)), 64)?;
    pnl.add_address(&opts.pod_if, IpAddr::V6(a.ip), a.prefix)?;
    let any = IpAddr::V6(Ipv6Addr::UNSPECIFIED);
    if dp == Datapath::NetkitL3 {
        pnl.add_route(any, 0, None, Some(&opts.pod_if))?;
    } else {
        pnl.add_route(any, 0, Some(IpAddr::V6(GATEWAY6)), Some(&opts.pod_if))?;
    }
    set_proc(Some(&host.ns), &conf(host_if, "disable_ipv6"), "0")?;
    hnl.add_route(IpAddr::V6(a.ip), 128, None, Some(host_if))?;
    // bpf_fib_lookup (AF_INET6) asks the ingress device, the host-side device, whether it
    // forwards; the host's own interfaces keep their setting (a host that learns its IPv6
    // route from router advertisements would stop accepting them with forwarding on). The
    // host-firewall path is the stack's forwarding, which needs it for every device.
    set_proc(Some(&host.ns), &conf(host_if, "forwarding"), "1")?;
    if opts.host_firewall {
        set_proc(Some(&host.ns), "net/ipv6/conf/all/forwarding", "1")?;
    }
    Ok(())
}

/// Writes `/proc/sys/<path>` in `ns` (device names may hold dots, so not a dotted key).
fn set_proc(ns: Option<&NetNs>, path: &str, value: &str) -> Result<(), PodError> {
    let full = format!("/proc/sys/{path}");
    let work = || std::fs::write(&full, value);
    let r = match ns {
        Some(ns) => ns.run(work).map_err(PodError::from)?,
        None => work(),
    };
    r.map_err(PodError::io(format!("write {full}")))
}

/// The pod's programs on its device pair (TCX link, tc filter or netkit links, noted in
/// `undo`) and the wire program on each uplink that has none yet.
fn attach_programs(
    host: &Host,
    opts: &AddOptions,
    dp: Datapath,
    attach: AttachMethod,
    host_if: &str,
    host_ifindex: u32,
    undo: &mut Undo,
) -> Result<(), PodError> {
    datapath::prepare_pins(host)?;
    match dp {
        Datapath::Veth if attach == AttachMethod::Tc => {
            let f = datapath::attach_tc(host, abi::PROG_FROM_CONTAINER, host_if)?;
            undo.tc.push(f);
        }
        Datapath::Veth => {
            let pin = datapath::link_pin(host, host_if);
            datapath::attach_tcx(host, abi::PROG_FROM_CONTAINER, host_if, &pin)?;
            undo.pins.push(pin);
        }
        Datapath::NetkitL3 | Datapath::NetkitL2 => {
            datapath::attach_netkit(
                host,
                host_if,
                host_ifindex,
                dp == Datapath::NetkitL3,
                &mut undo.pins,
            )?;
        }
    }
    attach_uplinks(host, &opts.uplinks, attach)
}

/// The wire program on each of `uplinks` that has none yet. Shared by the host's pods:
/// removed with the host's last pod (gc_host), not undone by a failed `add`; a tc filter is
/// remembered at once so that removal finds it.
fn attach_uplinks(host: &Host, uplinks: &[String], attach: AttachMethod) -> Result<(), PodError> {
    for u in uplinks {
        let pin = datapath::uplink_pin(host, u);
        if pin.exists() || host.uplink_tc(u)?.is_some() {
            continue;
        }
        if attach == AttachMethod::Tc {
            let f = datapath::attach_tc(host, abi::PROG_FROM_WIRE, u)?;
            if let Err(e) = host.write_uplink_tc(&f) {
                let _ = datapath::detach_tc(host, &f);
                return Err(e);
            }
            info!(
                "uplink {u}: wire program attached (tc clsact ingress, prio {} handle {:#x})",
                f.priority, f.handle
            );
        } else {
            datapath::attach_tcx(host, abi::PROG_FROM_WIRE, u, &pin)?;
            info!("uplink {u}: wire program attached (tcx ingress)");
        }
    }
    Ok(())
}

/// The pod's entry in the host's endpoint map (noted in `undo`).
fn insert_endpoint(
    host: &Host,
    opts: &AddOptions,
    dp: Datapath,
    host_ifindex: u32,
    pod_mac: [u8; 6],
    host_mac: [u8; 6],
    undo: &mut Undo,
) -> Result<(), PodError> {
    let mut flags = 0;
    if dp != Datapath::Veth {
        flags |= abi::EP_NETKIT;
    }
    if dp == Datapath::NetkitL3 {
        flags |= abi::EP_L3;
    }
    if opts.host_firewall {
        flags |= abi::EP_HOST_FW;
    }
    let ep = Endpoint {
        ifindex: host_ifindex,
        flags,
        pod_mac,
        host_mac,
    };
    for ip in endpoint_keys(&opts.addrs()) {
        datapath::endpoint_insert(host, ip, ep)?;
        undo.endpoints.push((ip, host_ifindex));
    }
    Ok(())
}

/// Deletes pod `name` on `host`: endpoint, programs, devices, routes, the namespace if `add`
/// made it, the record; with the host's last pod also its maps, uplink programs and state
/// directories. A pending record (an `add` that died) is undone. `Ok(None)` if there was no
/// such pod (nothing changed).
pub fn del(name: &str, host: Option<&str>) -> Result<Option<PodRecord>, PodError> {
    if !valid_pod_name(name) {
        return Err(PodError::BadName(name.into()));
    }
    let host = Host::open(host)?;
    if !host.state_dir().exists() {
        return Ok(None);
    }
    let lock = host.lock()?;
    let r = del_locked(&host, &lock, name)?;
    gc_host(&host)?;
    Ok(r)
}

/// Deletes pod `name` (complete or pending) with the host's lock held; leaves the host's
/// state for [`gc_host`].
pub fn del_locked(
    host: &Host,
    _lock: &HostLock,
    name: &str,
) -> Result<Option<PodRecord>, PodError> {
    let Some(r) = host.record(name)? else {
        return Ok(None);
    };
    remove(host, &r)?;
    if let Err(e) = crate::shortcut::sync(host, _lock) {
        warn!("pod {name}: the shortcut did not forget it: {e}");
    }
    Ok(Some(r))
}

/// Deletes every pod of `host` and the host's maps, uplink programs and state directories
/// (including pins an interrupted run left without a record), and the stale state of dead
/// namespaces that had this namespace's inode (their devices are gone with them: only their
/// pins and records are removed, nothing in this namespace).
pub fn del_all(host: Option<&str>) -> Result<Vec<PodRecord>, PodError> {
    let host = Host::open(host)?;
    remove_stale_of(&host)?;
    if !host.state_dir().exists() && !host.pin_dir().exists() {
        return Ok(Vec::new());
    }
    remove_where(&host, |_| false)
}

/// Removes the stale state of dead namespaces that had `host`'s inode (see
/// [`crate::state::orphaned_keys_of_inode`]): their pins and records only, nothing in `host`.
/// Returns the directories removed.
pub fn remove_stale_of(host: &Host) -> Result<Vec<PathBuf>, PodError> {
    let mut gone = Vec::new();
    for k in crate::state::orphaned_keys_of_inode(host.ns.inode()) {
        for d in crate::state::remove_orphan(&k)? {
            info!("removed stale pod state {}", d.display());
            gone.push(d);
        }
    }
    Ok(gone)
}

/// With no pod left on `host`: detaches the uplinks' tc filters (TCX uplinks go with their
/// pins), then removes the host's pins and state directories. Lock held.
pub fn gc_host(host: &Host) -> Result<bool, PodError> {
    if !host.records()?.is_empty() {
        return Ok(false);
    }
    for f in host.uplink_tcs()? {
        datapath::detach_tc(host, &f)?;
        host.remove_uplink_tc(&f.ifname)?;
    }
    host.gc_if_empty()
}

/// Removes the pod state of host namespaces that no longer exist (see
/// [`crate::state::orphaned_keys`]). Returns the directories removed.
pub fn remove_orphaned_state() -> Result<Vec<PathBuf>, PodError> {
    let mut gone = Vec::new();
    for k in crate::state::orphaned_keys() {
        gone.extend(crate::state::remove_orphan(&k)?);
    }
    Ok(gone)
}

/// Tears down what `r` describes (lock held); a pending record through [`undo_pending`].
fn remove(host: &Host, r: &PodRecord) -> Result<(), PodError> {
    if r.pending {
        undo_pending(host, r)?;
        return host.remove_record(&r.name);
    }
    for ip in endpoint_keys(&r.addrs()) {
        datapath::endpoint_remove(host, ip, r.host_ifindex)?;
    }
    remove_attachments(host, r)?;
    host.remove_record(&r.name)
}

/// What a pod holds beyond its endpoint entry and record, complete or pending alike: link
/// pins, tc filters, the device pair (with it the pod's addresses and routes) and the
/// namespace if nsfast made it. Lock held.
fn remove_attachments(host: &Host, r: &PodRecord) -> Result<(), PodError> {
    for p in &r.link_pins {
        datapath::unpin(p)?;
    }
    for f in &r.tc_filters {
        datapath::detach_tc(host, f)?;
    }
    host.netlink()?.delete_link(&r.host_if)?;
    if r.netns_owned {
        netns::delete_named(&r.netns)?;
    }
    Ok(())
}

/// `pod list` output for one host.
#[derive(Debug, Clone, Serialize)]
pub struct Listing {
    pub host: String,
    #[serde(serialize_with = "crate::state::ser_records")]
    pub pods: Vec<PodRecord>,
    pub uplinks: Vec<datapath::Uplink>,
    /// Datapath counters of the host (all its pods), by name.
    pub counters: std::collections::BTreeMap<String, u64>,
    /// Whether the pod shortcut is on for this host, and its per-pod counters (by pod name).
    pub shortcut_enabled: bool,
    pub shortcut: std::collections::BTreeMap<String, crate::shortcut::PodShortcutStats>,
}

/// Lists the pods of `host` with the host's datapath counters.
pub fn list(host: Option<&str>) -> Result<Listing, PodError> {
    let host = Host::open(host)?;
    let pods = host.records()?;
    let counters = abi::COUNTERS
        .iter()
        .map(|s| s.to_string())
        .zip(datapath::counters(&host)?)
        .collect();
    Ok(Listing {
        host: host.display.clone(),
        uplinks: datapath::uplinks(&host),
        pods,
        counters,
        shortcut_enabled: crate::shortcut::is_enabled(&host),
        shortcut: crate::shortcut::pod_stats(&host).unwrap_or_else(|e| {
            warn!("host {}: shortcut counters unreadable: {e}", host.display);
            Default::default()
        }),
    })
}

/// Problems found by [`check`].
pub fn check(host: &Host, r: &PodRecord) -> Vec<String> {
    let mut bad = Vec::new();
    match host
        .netlink()
        .map_err(|e| e.to_string())
        .and_then(|nl| nl.link_index(&r.host_if).map_err(|e| e.to_string()))
    {
        Ok(i) if i == r.host_ifindex => {}
        Ok(i) => bad.push(format!(
            "host device {} has ifindex {i}, expected {}",
            r.host_if, r.host_ifindex
        )),
        Err(e) => bad.push(format!("host device {}: {e}", r.host_if)),
    }
    for p in &r.link_pins {
        if !p.exists() {
            bad.push(format!("BPF link pin {} missing", p.display()));
        }
    }
    for f in &r.tc_filters {
        match datapath::tc_present(host, f) {
            Ok(true) => {}
            Ok(false) => bad.push(format!(
                "tc filter {} prio {} handle {:#x} missing from {} ingress",
                f.program, f.priority, f.handle, f.ifname
            )),
            Err(e) => bad.push(format!("query tc filters of {}: {e}", f.ifname)),
        }
    }
    if r.datapath == Datapath::Veth && r.attach == AttachMethod::Tcx {
        match datapath::tcx_ingress_programs(host, &r.host_if) {
            Ok(v)
                if v.iter()
                    .any(|n| n == abi::kernel_name(abi::PROG_FROM_CONTAINER)) => {}
            Ok(v) => bad.push(format!(
                "{} has tcx ingress programs {v:?}, expected {}",
                r.host_if,
                abi::PROG_FROM_CONTAINER
            )),
            Err(e) => bad.push(format!("query {}: {e}", r.host_if)),
        }
    }
    for ip in r.addrs() {
        match datapath::endpoint_get(host, ip) {
            Ok(Some(ep)) if ep.ifindex == r.host_ifindex => {}
            Ok(_) => bad.push(format!("endpoint {ip} missing from the BPF map")),
            Err(e) => bad.push(format!("endpoint map: {e}")),
        }
    }
    match NetNs::open(&r.netns) {
        Ok(ns) => match ns.netlink() {
            Ok(nl) => {
                if !r.ip.is_unspecified() {
                    match nl.link_ipv4_addresses(&r.pod_if) {
                        Ok(a) if a.contains(&(r.ip, r.prefix)) => {}
                        Ok(a) => bad.push(format!(
                            "pod device {} has addresses {a:?}, expected {}/{}",
                            r.pod_if, r.ip, r.prefix
                        )),
                        Err(e) => bad.push(format!("pod device {}: {e}", r.pod_if)),
                    }
                }
                if let (Some(ip6), Some(p6)) = (r.ip6, r.prefix6) {
                    match nl.link_ipv6_addresses(&r.pod_if) {
                        Ok(a) if a.contains(&(ip6, p6)) => {}
                        Ok(a) => bad.push(format!(
                            "pod device {} has IPv6 addresses {a:?}, expected {ip6}/{p6}",
                            r.pod_if
                        )),
                        Err(e) => bad.push(format!("pod device {}: {e}", r.pod_if)),
                    }
                }
            }
            Err(e) => bad.push(format!("pod device {}: {e}", r.pod_if)),
        },
        Err(e) => bad.push(format!("pod namespace {}: {e}", r.netns)),
    }
    bad
}

/// Deletes every pod on `host` whose record fails `keep` (used by CNI GC). Returns the names.
pub fn remove_where(
    host: &Host,
    keep: impl Fn(&PodRecord) -> bool,
) -> Result<Vec<PodRecord>, PodError> {
    let _lock = host.lock()?;
    let mut gone = Vec::new();
    for r in host.records()? {
        if !keep(&r) {
            remove(host, &r)?;
            gone.push(r);
        }
    }
    gc_host(host)?;
    Ok(gone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ips() {
        assert_eq!(
            "10.244.1.5/24".parse::<PodIp>().unwrap(),
            PodIp {
                ip: Ipv4Addr::new(10, 244, 1, 5),
                prefix: 24
            }
        );
        assert_eq!("10.0.0.1".parse::<PodIp>().unwrap().prefix, 32);
        for bad in [
            "",
            "10.0.0.1/33",
            "10.0.0.1/4",
            "x/24",
            "0.0.0.0/24",
            "::1/64",
            "127.0.0.1",
        ] {
            let e = bad.parse::<PodIp>().unwrap_err().to_string();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn parses_dual_stack_ip_lists() {
        let a = PodAddrs::parse(&["10.244.1.5/24,fd00:10::5/64"]).unwrap();
        assert_eq!(a.v4.unwrap().ip, Ipv4Addr::new(10, 244, 1, 5));
        assert_eq!(a.v6.unwrap().prefix, 64);
        assert_eq!(
            a,
            PodAddrs::parse(&["fd00:10::5/64", "10.244.1.5/24"]).unwrap()
        );
        let six = PodAddrs::parse(&["fd00::7"]).unwrap();
        assert!(six.v4.is_none() && six.v6.unwrap().prefix == 128);
        for (bad, needle) in [
            (
                vec!["10.0.0.1/24", "10.0.0.2/24"],
                "a second IPv4 address \"10.0.0.2/24\"",
            ),
            (
                vec!["fd00::1/64,fd00::2/64"],
                "a second IPv6 address \"fd00::2/64\"",
            ),
            (vec!["10.0.0.1/24,"], "an empty address"),
            (vec![""], "an empty address"),
            (vec!["fe80::1/64"], "\"fe80::1/64\""),
            (vec!["ff02::1"], "\"ff02::1\""),
            (vec!["::"], "\"::\""),
            (vec!["::ffff:10.0.0.1"], "\"::ffff:10.0.0.1\""),
            (vec!["fd00::1/8"], "\"fd00::1/8\""),
            (vec!["fd00::1/129"], "\"fd00::1/129\""),
        ] {
            let e = PodAddrs::parse(&bad).unwrap_err().to_string();
            assert!(e.contains(needle), "{bad:?}: {e}");
        }
    }

    #[test]
    fn validates_names() {
        assert!(valid_pod_name("web-1"));
        assert!(!valid_pod_name("Web"));
        assert!(!valid_pod_name("-a"));
        assert!(!valid_pod_name(""));
        assert!(!valid_pod_name(&"a".repeat(41)));
        assert!(valid_ifname("eth0"));
        assert!(!valid_ifname("a/b"));
        assert!(!valid_ifname("sixteen-chars-xx"));
    }

    #[test]
    fn pod_link_local_is_a_stable_link_local_address_per_pod_address() {
        let a: Ipv6Addr = "fd00:10:244::5".parse().unwrap();
        let b: Ipv6Addr = "fd00:10:245::5".parse().unwrap();
        let la = pod_link_local(a);
        assert_eq!(la.segments()[..4], [0xfe80, 0, 0, 0], "{la}");
        assert_eq!(la.octets()[8] & 0x02, 0, "universal/local bit clear: {la}");
        assert_eq!(la, pod_link_local(a), "deterministic");
        assert_ne!(la, pod_link_local(b), "same interface id in another /64");
        assert_ne!(
            la,
            Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1),
            "not the gateway"
        );
        let keys = endpoint_keys(&[IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5)), IpAddr::V6(a)]);
        assert_eq!(keys.len(), 3);
        assert_eq!(keys[2], IpAddr::V6(la));
    }

    #[test]
    fn parses_attach_methods() {
        assert_eq!("tc".parse::<AttachRequest>().unwrap(), AttachRequest::Tc);
        assert_eq!("tcx".parse::<AttachRequest>().unwrap(), AttachRequest::Tcx);
        assert_eq!(
            "auto".parse::<AttachRequest>().unwrap(),
            AttachRequest::Auto
        );
        let e = "xdp".parse::<AttachRequest>().unwrap_err().to_string();
        assert!(e.contains("\"xdp\"") && e.contains("tcx"), "{e}");
    }

    #[test]
    fn parses_modes() {
        assert_eq!("auto".parse::<ModeRequest>().unwrap(), ModeRequest::Auto);
        assert_eq!(
            "netkit".parse::<ModeRequest>().unwrap(),
            ModeRequest::Netkit
        );
        let e = "tap".parse::<ModeRequest>().unwrap_err().to_string();
        assert!(e.contains("\"tap\"") && e.contains("veth"), "{e}");
    }
}
