//! What `pod add` is asked for: the mode and attach requests, addresses, names, the
//! [`AddOptions`], and how they resolve against the running kernel.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use nsfast_sys::net;

use super::*;
use crate::error::PodError;
use crate::state::{AttachMethod, CniAttachment, Datapath, Host};

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
pub(super) fn valid_ifname(name: &str) -> bool {
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
    /// `--namespace`, `--label`, `--named-port`: what NetworkPolicies select the pod by.
    pub identity: crate::state::PodIdentity,
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
            identity: Default::default(),
        }
    }
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
