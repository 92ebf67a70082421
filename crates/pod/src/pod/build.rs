//! The steps of `add` that change the system: devices, addresses and routes, programs and
//! the endpoint entry, each noted in an [`Undo`] that removes it again if a later step fails;
//! and the record they make ([`intent`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use nsfast_sys::net::{self, NetkitMode, Netlink};
use nsfast_sys::netns::NetNs;
use tracing::info;

use super::*;
use crate::abi::{self, Endpoint};
use crate::datapath;
use crate::error::PodError;
use crate::state::{AttachMethod, Datapath, Host, HostLock, PodRecord, TcFilter};

/// Undo steps of a half-made pod, run in reverse on failure.
#[derive(Default)]
pub(super) struct Undo {
    host_link: Option<String>,
    pins: Vec<PathBuf>,
    tc: Vec<TcFilter>,
    endpoints: Vec<(IpAddr, u32)>,
}

impl Undo {
    pub(super) fn run(self, host: &Host) {
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

/// The intent record of `opts` on `host` (pending, nothing made yet): what `add` will make.
pub fn intent(host: &Host, opts: &AddOptions, dp: Datapath, attach: AttachMethod) -> PodRecord {
    let host_if = host_ifname(host, &opts.name);
    let link_pins = match dp {
        Datapath::Veth if attach == AttachMethod::Tc => Vec::new(),
        Datapath::Veth => vec![
            datapath::link_pin(host, &host_if),
            datapath::egress_link_pin(host, &host_if),
        ],
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
        identity: opts.identity.clone(),
    }
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
pub(super) fn build(
    host: &Host,
    lock: &HostLock,
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
    // The host's NetworkPolicies count the pod (its pending record names its address and
    // identity) before its endpoint exists. Until then the programs drop what it sends (the
    // source-address check needs the endpoint) and do not deliver to it, so it never sends
    // or receives through them unpoliced; a pod whose policies cannot be written is not made.
    crate::policy::sync(host, lock)?;
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
        // Ingress: what the pod sends; egress: what the host stack sends into it.
        Datapath::Veth if attach == AttachMethod::Tc => {
            let f = datapath::attach_tc(host, abi::PROG_FROM_CONTAINER, host_if)?;
            let qdisc_added = f.qdisc_added;
            undo.tc.push(f);
            let mut f = datapath::attach_tc_at(host, abi::PROG_TO_CONTAINER, host_if, true)?;
            // The qdisc goes with whichever filter is removed last.
            f.qdisc_added |= qdisc_added;
            undo.tc.push(f);
        }
        Datapath::Veth => {
            let pin = datapath::link_pin(host, host_if);
            datapath::attach_tcx(host, abi::PROG_FROM_CONTAINER, host_if, &pin)?;
            undo.pins.push(pin);
            let pin = datapath::egress_link_pin(host, host_if);
            datapath::attach_tcx_at(host, abi::PROG_TO_CONTAINER, host_if, &pin, true)?;
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
