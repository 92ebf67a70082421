//! rtnetlink helpers with a synchronous face: each call opens a netlink socket inside the
//! requested namespace (on a helper thread), does its work on a current-thread tokio runtime
//! and returns. Cheap enough for setup paths; nothing here is on a data path.

use std::future::Future;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd};

use futures::TryStreamExt;
use rtnetlink::{Handle, LinkUnspec, LinkVeth, RouteMessageBuilder};

use crate::netns::{NetNs, NetnsError};

/// rtnetlink errors; each names the object involved.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("netlink: {what}")]
    Netlink {
        what: String,
        #[source]
        source: rtnetlink::Error,
    },
    #[error("no link named {0:?} in this namespace")]
    NoSuchLink(String),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("netlink runtime: {0}")]
    Io(#[from] std::io::Error),
}

fn nl(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetError {
    let what = what.into();
    move |source| NetError::Netlink { what, source }
}

/// Runs `f` with an rtnetlink handle bound to `ns` (or the caller's namespace).
pub fn with_handle<F, Fut, R>(ns: Option<&NetNs>, f: F) -> Result<R, NetError>
where
    F: FnOnce(Handle) -> Fut + Send,
    Fut: Future<Output = Result<R, NetError>>,
    R: Send,
{
    let work = move || -> Result<R, NetError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        rt.block_on(async move {
            let (conn, handle, _) = rtnetlink::new_connection()?;
            let task = tokio::spawn(conn);
            let r = f(handle).await;
            task.abort();
            r
        })
    };
    match ns {
        Some(ns) => ns.run(work)?,
        None => std::thread::scope(|s| s.spawn(work).join()).unwrap_or_else(|_| {
            Err(NetError::Io(std::io::Error::other(
                "netlink thread panicked",
            )))
        }),
    }
}

async fn index_of(handle: &Handle, name: &str) -> Result<u32, NetError> {
    let mut links = handle.link().get().match_name(name.to_string()).execute();
    match links.try_next().await {
        Ok(Some(msg)) => Ok(msg.header.index),
        Ok(None) => Err(NetError::NoSuchLink(name.into())),
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => {
            Err(NetError::NoSuchLink(name.into()))
        }
        Err(e) => Err(nl(format!("get link {name}"))(e)),
    }
}

/// The ifindex of `name` in `ns`.
pub fn link_index(ns: Option<&NetNs>, name: &str) -> Result<u32, NetError> {
    with_handle(ns, |h| async move { index_of(&h, name).await })
}

/// Sets link `name` up.
pub fn link_up(ns: Option<&NetNs>, name: &str) -> Result<(), NetError> {
    with_handle(ns, |h| async move {
        let idx = index_of(&h, name).await?;
        h.link()
            .set(LinkUnspec::new_with_index(idx).up().build())
            .execute()
            .await
            .map_err(nl(format!("set {name} up")))
    })
}

/// Creates a veth pair `name_a` (in `ns_a`) <-> `name_b` (in `ns_b`), both up.
pub fn create_veth(ns_a: &NetNs, name_a: &str, ns_b: &NetNs, name_b: &str) -> Result<(), NetError> {
    create_pair_into(
        Some(ns_a),
        LinkVeth::new(name_a, name_b).build(),
        name_a,
        name_b,
        ns_b,
        name_b,
    )
}

/// Adds the pair described by `msg` in `host` (ends `host_name` and `tmp_name`), moves
/// `tmp_name` into `pod`, renames it `pod_name` there and sets both ends up. On error the pair
/// is deleted again. Shared by veth and netkit pairs.
fn create_pair_into(
    host: Option<&NetNs>,
    msg: rtnetlink::packet_route::link::LinkMessage,
    host_name: &str,
    tmp_name: &str,
    pod: &NetNs,
    pod_name: &str,
) -> Result<(), NetError> {
    let fd_pod = pod.as_fd().as_raw_fd();
    let r = with_handle(host, |h| async move {
        h.link()
            .add(msg)
            .execute()
            .await
            .map_err(nl(format!("add {host_name}/{tmp_name}")))?;
        let idx_b = index_of(&h, tmp_name).await?;
        h.link()
            .set(
                LinkUnspec::new_with_index(idx_b)
                    .setns_by_fd(fd_pod)
                    .build(),
            )
            .execute()
            .await
            .map_err(nl(format!("move {tmp_name} to its namespace")))?;
        let idx_a = index_of(&h, host_name).await?;
        h.link()
            .set(LinkUnspec::new_with_index(idx_a).up().build())
            .execute()
            .await
            .map_err(nl(format!("set {host_name} up")))
    })
    .and_then(|()| {
        if tmp_name != pod_name {
            rename_link(Some(pod), tmp_name, pod_name)?;
        }
        link_up(Some(pod), pod_name)
    });
    if r.is_err() {
        let _ = delete_link(host, host_name);
    }
    r
}

/// Deletes link `name` (and, for a veth, its peer). Missing is not an error.
pub fn delete_link(ns: Option<&NetNs>, name: &str) -> Result<(), NetError> {
    with_handle(ns, |h| async move {
        match index_of(&h, name).await {
            Ok(idx) => h
                .link()
                .del(idx)
                .execute()
                .await
                .map_err(nl(format!("delete {name}"))),
            Err(NetError::NoSuchLink(_)) => Ok(()),
            Err(e) => Err(e),
        }
    })
}

/// Adds `addr/prefix` to link `name`.
pub fn add_address(
    ns: Option<&NetNs>,
    name: &str,
    addr: IpAddr,
    prefix: u8,
) -> Result<(), NetError> {
    with_handle(ns, |h| async move {
        let idx = index_of(&h, name).await?;
        h.address()
            .add(idx, addr, prefix)
            .execute()
            .await
            .map_err(nl(format!("add {addr}/{prefix} to {name}")))
    })
}

/// Adds a route to `dst/prefix`, via `gateway` and/or out of `dev`.
pub fn add_route(
    ns: Option<&NetNs>,
    dst: IpAddr,
    prefix: u8,
    gateway: Option<IpAddr>,
    dev: Option<&str>,
) -> Result<(), NetError> {
    with_handle(ns, |h| async move {
        let oif = match dev {
            Some(d) => Some(index_of(&h, d).await?),
            None => None,
        };
        let msg = match dst {
            IpAddr::V4(d) => {
                let mut b =
                    RouteMessageBuilder::<std::net::Ipv4Addr>::new().destination_prefix(d, prefix);
                if let Some(IpAddr::V4(g)) = gateway {
                    b = b.gateway(g);
                }
                if let Some(i) = oif {
                    b = b.output_interface(i);
                }
                b.build()
            }
            IpAddr::V6(d) => {
                let mut b =
                    RouteMessageBuilder::<std::net::Ipv6Addr>::new().destination_prefix(d, prefix);
                if let Some(IpAddr::V6(g)) = gateway {
                    b = b.gateway(g);
                }
                if let Some(i) = oif {
                    b = b.output_interface(i);
                }
                b.build()
            }
        };
        h.route()
            .add(msg)
            .execute()
            .await
            .map_err(nl(format!("add route {dst}/{prefix}")))
    })
}

/// Writes a sysctl (`net.ipv4.ip_forward` style key) inside `ns`.
pub fn set_sysctl(ns: Option<&NetNs>, key: &str, value: &str) -> Result<(), NetError> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    let work = || std::fs::write(&path, value);
    match ns {
        Some(ns) => ns.run(work)??,
        None => work()?,
    }
    Ok(())
}

async fn mac_of(handle: &Handle, name: &str) -> Result<[u8; 6], NetError> {
    use netlink_packet_route::link::LinkAttribute;
    let mut links = handle.link().get().match_name(name.to_string()).execute();
    let msg = match links.try_next().await {
        Ok(Some(msg)) => msg,
        Ok(None) => return Err(NetError::NoSuchLink(name.into())),
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => {
            return Err(NetError::NoSuchLink(name.into()))
        }
        Err(e) => return Err(nl(format!("get link {name}"))(e)),
    };
    for a in msg.attributes {
        if let LinkAttribute::Address(a) = a {
            if a.len() == 6 {
                let mut m = [0u8; 6];
                m.copy_from_slice(&a);
                return Ok(m);
            }
        }
    }
    // L3 devices (netkit L3, tun) have no MAC.
    Ok([0u8; 6])
}

/// The MAC address of link `name` in `ns` (all zero for a device without one).
pub fn link_mac(ns: Option<&NetNs>, name: &str) -> Result<[u8; 6], NetError> {
    with_handle(ns, |h| async move { mac_of(&h, name).await })
}

/// Whether link `name` exists in `ns`.
pub fn link_exists(ns: Option<&NetNs>, name: &str) -> Result<bool, NetError> {
    match link_index(ns, name) {
        Ok(_) => Ok(true),
        Err(NetError::NoSuchLink(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Renames link `old` to `new` in `ns` (the link must be down).
pub fn rename_link(ns: Option<&NetNs>, old: &str, new: &str) -> Result<(), NetError> {
    with_handle(ns, |h| async move {
        let idx = index_of(&h, old).await?;
        h.link()
            .set(
                LinkUnspec::new_with_index(idx)
                    .name(new.to_string())
                    .build(),
            )
            .execute()
            .await
            .map_err(nl(format!("rename {old} to {new}")))
    })
}

/// Adds a permanent neighbour entry `ip -> mac` on link `dev` (replacing an existing one).
pub fn add_neighbour(
    ns: Option<&NetNs>,
    dev: &str,
    ip: IpAddr,
    mac: [u8; 6],
) -> Result<(), NetError> {
    with_handle(ns, |h| async move {
        let idx = index_of(&h, dev).await?;
        h.neighbours()
            .add(idx, ip)
            .link_layer_address(&mac)
            .replace()
            .execute()
            .await
            .map_err(nl(format!("add neighbour {ip} on {dev}")))
    })
}

/// The IPv4 addresses (with prefix length) on link `name` in `ns`.
pub fn link_ipv4_addresses(
    ns: Option<&NetNs>,
    name: &str,
) -> Result<Vec<(std::net::Ipv4Addr, u8)>, NetError> {
    use netlink_packet_route::address::AddressAttribute;
    with_handle(ns, |h| async move {
        let idx = index_of(&h, name).await?;
        let mut out = Vec::new();
        let mut addrs = h.address().get().set_link_index_filter(idx).execute();
        while let Some(msg) = addrs
            .try_next()
            .await
            .map_err(nl(format!("list addresses of {name}")))?
        {
            for a in &msg.attributes {
                if let AddressAttribute::Address(IpAddr::V4(v4)) = a {
                    out.push((*v4, msg.header.prefix_len));
                }
            }
        }
        Ok(out)
    })
}

/// Netkit device mode (`IFLA_NETKIT_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetkitMode {
    /// Ethernet headers, ARP (`NETKIT_L2`).
    L2,
    /// IP only, no ARP (`NETKIT_L3`).
    L3,
}

/// Creates a netkit pair: `primary` stays in `host` with policy forward, `peer` is moved into
/// `pod` and renamed `pod_name`, with policy blackhole (drop until a program is attached to `BPF_NETKIT_PEER`), as
/// Cilium does. Both ends are set up. Fails with `EOPNOTSUPP` on kernels without netkit.
pub fn create_netkit(
    host: Option<&NetNs>,
    primary: &str,
    peer: &str,
    pod: &NetNs,
    pod_name: &str,
    mode: NetkitMode,
) -> Result<(), NetError> {
    use rtnetlink::packet_route::link::{NetkitMode as M, NetkitPolicy};
    let m = match mode {
        NetkitMode::L2 => M::L2,
        NetkitMode::L3 => M::L3,
    };
    create_pair_into(
        host,
        rtnetlink::LinkNetkit::new(primary, peer, m)
            .policy(NetkitPolicy::Pass)
            .peer_policy(NetkitPolicy::Drop)
            .build(),
        primary,
        peer,
        pod,
        pod_name,
    )
}

/// Whether the running kernel can create netkit devices. The probe runs in a private,
/// unnamed network namespace made on a short-lived thread, so nothing visible changes.
pub fn probe_netkit() -> Result<bool, NetError> {
    match netkit_trial() {
        Ok(()) => Ok(true),
        Err(NetError::Netlink {
            source: rtnetlink::Error::NetlinkError(e),
            ..
        }) if e.raw_code() == -libc::EOPNOTSUPP || e.raw_code() == -libc::EINVAL => Ok(false),
        Err(e) => Err(e),
    }
}

/// Creates an L3 netkit pair in a private throwaway network namespace that dies with its
/// thread; returns the kernel's answer as is.
pub fn netkit_trial() -> Result<(), NetError> {
    std::thread::scope(|s| {
        s.spawn(|| -> Result<(), NetError> {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| NetError::Io(std::io::Error::from(e)))?;
            // Threads spawned from here (with_handle's) inherit the throwaway namespace.
            with_handle(None, |h| async move {
                h.link()
                    .add(
                        rtnetlink::LinkNetkit::new(
                            "nsfprobe0",
                            "nsfprobe1",
                            rtnetlink::packet_route::link::NetkitMode::L3,
                        )
                        .build(),
                    )
                    .execute()
                    .await
                    .map_err(nl("add netkit nsfprobe0/nsfprobe1"))
            })
        })
        .join()
    })
    .unwrap_or_else(|_| Err(NetError::Io(std::io::Error::other("probe thread panicked"))))
}

/// Adds a link-scope route (`ip route add DST/PREFIX dev DEV scope link`) for an on-link
/// gateway that is outside the device's own subnets.
pub fn add_link_route(
    ns: Option<&NetNs>,
    dst: std::net::Ipv4Addr,
    prefix: u8,
    dev: &str,
) -> Result<(), NetError> {
    use netlink_packet_route::route::RouteScope;
    with_handle(ns, |h| async move {
        let idx = index_of(&h, dev).await?;
        let msg = RouteMessageBuilder::<std::net::Ipv4Addr>::new()
            .destination_prefix(dst, prefix)
            .output_interface(idx)
            .scope(RouteScope::Link)
            .build();
        h.route()
            .add(msg)
            .execute()
            .await
            .map_err(nl(format!("add route {dst}/{prefix} dev {dev}")))
    })
}

/// Creates a veth pair whose `host_name` end stays in `host` and whose other end ends up in
/// `pod` named `pod_name` (it is created under the temporary name `tmp_name`, so `pod_name`
/// may exist in `host`, e.g. `eth0`). Both ends are up. On error nothing is left.
pub fn create_veth_into(
    host: Option<&NetNs>,
    host_name: &str,
    tmp_name: &str,
    pod: &NetNs,
    pod_name: &str,
) -> Result<(), NetError> {
    create_pair_into(
        host,
        LinkVeth::new(host_name, tmp_name).build(),
        host_name,
        tmp_name,
        pod,
        pod_name,
    )
}

/// One `ip rule` steering protocol traffic that enters on a link to a routing table:
/// `iif <iif> ipproto <proto> dport <start>-<end> lookup <table> priority <priority>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRule {
    pub iif: String,
    pub ip_proto: u8,
    pub dport: (u16, u16),
    pub table: u32,
    pub priority: u32,
    /// Only packets from this address (`from A/32`) and source port (`sport P`), when set.
    pub from: Option<std::net::SocketAddrV4>,
}

fn rule_matches(msg: &netlink_packet_route::rule::RuleMessage, r: &PortRule) -> bool {
    use netlink_packet_route::rule::RuleAttribute as A;
    let mut table = u32::from(msg.header.table);
    let mut prio = 0;
    let mut iif = None;
    for a in &msg.attributes {
        match a {
            A::Table(t) => table = *t,
            A::Priority(p) => prio = *p,
            A::Iifname(n) => iif = Some(n.as_str()),
            _ => {}
        }
    }
    table == r.table && prio == r.priority && iif == Some(r.iif.as_str())
}

/// The rule's `from A/32 sport P`, if it has both.
fn rule_from(msg: &netlink_packet_route::rule::RuleMessage) -> Option<std::net::SocketAddrV4> {
    use netlink_packet_route::rule::RuleAttribute as A;
    let mut src = None;
    let mut sport = None;
    for a in &msg.attributes {
        match a {
            A::Source(std::net::IpAddr::V4(ip)) if msg.header.src_len == 32 => src = Some(*ip),
            A::SourcePortRange(r) if r.start == r.end => sport = Some(r.start),
            _ => {}
        }
    }
    Some(std::net::SocketAddrV4::new(src?, sport?))
}

/// Adds an IPv4 `PortRule` (an existing identical rule is an error from the kernel: EEXIST,
/// which is reported as success).
pub fn add_port_rule(ns: Option<&NetNs>, r: &PortRule) -> Result<(), NetError> {
    use netlink_packet_route::rule::{RuleAttribute, RulePortRange};
    let r = r.clone();
    with_handle(ns, |h| async move {
        let mut req = h
            .rule()
            .add()
            .v4()
            .input_interface(r.iif.clone())
            .table_id(r.table)
            .priority(r.priority)
            // Without an explicit action the kernel treats the rule as FR_ACT_UNSPEC and
            // fails every lookup through it (EINVAL): packets are dropped, not routed.
            .action(netlink_packet_route::rule::RuleAction::ToTable);
        let attrs = &mut req.message_mut().attributes;
        attrs.push(RuleAttribute::IpProtocol(
            netlink_packet_route::IpProtocol::from(r.ip_proto),
        ));
        attrs.push(RuleAttribute::DestinationPortRange(RulePortRange {
            start: r.dport.0,
            end: r.dport.1,
        }));
        if let Some(from) = r.from {
            req.message_mut().header.src_len = 32;
            let attrs = &mut req.message_mut().attributes;
            attrs.push(RuleAttribute::Source((*from.ip()).into()));
            attrs.push(RuleAttribute::SourcePortRange(RulePortRange {
                start: from.port(),
                end: from.port(),
            }));
        }
        match req.execute().await {
            Ok(()) => Ok(()),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::EEXIST => Ok(()),
            Err(e) => Err(nl(format!(
                "add rule iif {} dport {}-{} table {}",
                r.iif, r.dport.0, r.dport.1, r.table
            ))(e)),
        }
    })
}

/// The IPv4 rules with this iif, table and priority (whatever their ports).
async fn port_rules(
    h: &Handle,
    iif: &str,
    table: u32,
    priority: u32,
) -> Result<Vec<netlink_packet_route::rule::RuleMessage>, NetError> {
    let probe = PortRule {
        iif: iif.to_string(),
        ip_proto: 0,
        dport: (0, 0),
        table,
        priority,
        from: None,
    };
    let mut found = Vec::new();
    let mut rules = h.rule().get(rtnetlink::IpVersion::V4).execute();
    while let Some(msg) = rules.try_next().await.map_err(nl("list rules"))? {
        if rule_matches(&msg, &probe) {
            found.push(msg);
        }
    }
    Ok(found)
}

/// Deletes every IPv4 rule with this iif, table and priority (whatever its ports).
/// Returns how many were deleted.
pub fn delete_port_rules(
    ns: Option<&NetNs>,
    iif: &str,
    table: u32,
    priority: u32,
) -> Result<usize, NetError> {
    with_handle(ns, |h| async move {
        let found = port_rules(&h, iif, table, priority).await?;
        let n = found.len();
        for msg in found {
            match h.rule().del(msg).execute().await {
                Ok(()) => {}
                Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENOENT => {}
                Err(e) => return Err(nl(format!("delete rule iif {iif} table {table}"))(e)),
            }
        }
        Ok(n)
    })
}

/// Deletes the IPv4 rules with this iif, table and priority whose `from A/32 sport P` is
/// `from` (rules added with [`PortRule::from`]). Returns how many were deleted.
pub fn delete_port_rules_from(
    ns: Option<&NetNs>,
    iif: &str,
    table: u32,
    priority: u32,
    from: std::net::SocketAddrV4,
) -> Result<usize, NetError> {
    with_handle(ns, |h| async move {
        let found = port_rules(&h, iif, table, priority).await?;
        let mut n = 0;
        for msg in found.into_iter().filter(|m| rule_from(m) == Some(from)) {
            match h.rule().del(msg).execute().await {
                Ok(()) => n += 1,
                Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENOENT => {}
                Err(e) => return Err(nl(format!("delete rule iif {iif} from {from}"))(e)),
            }
        }
        Ok(n)
    })
}

/// Counts IPv4 rules with this iif, table and priority.
pub fn count_port_rules(
    ns: Option<&NetNs>,
    iif: &str,
    table: u32,
    priority: u32,
) -> Result<usize, NetError> {
    with_handle(ns, |h| async move {
        Ok(port_rules(&h, iif, table, priority).await?.len())
    })
}

fn local_default_route(table: u32, lo: u32) -> netlink_packet_route::route::RouteMessage {
    use netlink_packet_route::route::{RouteScope, RouteType};
    RouteMessageBuilder::<std::net::Ipv4Addr>::new()
        .destination_prefix(std::net::Ipv4Addr::UNSPECIFIED, 0)
        .kind(RouteType::Local)
        .scope(RouteScope::Host)
        .table_id(table)
        .output_interface(lo)
        .build()
}

/// `ip route replace local 0.0.0.0/0 dev lo table <table>`: everything that looks the table
/// up is delivered to local sockets.
pub fn add_local_default_route(ns: Option<&NetNs>, table: u32) -> Result<(), NetError> {
    with_handle(ns, |h| async move {
        let lo = index_of(&h, "lo").await?;
        h.route()
            .add(local_default_route(table, lo))
            .replace()
            .execute()
            .await
            .map_err(nl(format!("add local default route to table {table}")))
    })
}

/// Removes the route added by [`add_local_default_route`]. Missing is not an error.
pub fn delete_local_default_route(ns: Option<&NetNs>, table: u32) -> Result<(), NetError> {
    with_handle(ns, |h| async move {
        let lo = index_of(&h, "lo").await?;
        match h
            .route()
            .del(local_default_route(table, lo))
            .execute()
            .await
        {
            Ok(()) => Ok(()),
            Err(rtnetlink::Error::NetlinkError(e))
                if e.raw_code() == -libc::ESRCH || e.raw_code() == -libc::ENOENT =>
            {
                Ok(())
            }
            Err(e) => Err(nl(format!("delete local default route from table {table}"))(e)),
        }
    })
}

/// Counts IPv4 rules (any selector) that look up `table`.
pub fn count_any_rules_to_table(ns: Option<&NetNs>, table: u32) -> Result<usize, NetError> {
    use netlink_packet_route::rule::RuleAttribute as A;
    with_handle(ns, |h| async move {
        let mut n = 0;
        let mut rules = h.rule().get(rtnetlink::IpVersion::V4).execute();
        while let Some(msg) = rules.try_next().await.map_err(nl("list rules"))? {
            let mut t = u32::from(msg.header.table);
            for a in &msg.attributes {
                if let A::Table(x) = a {
                    t = *x;
                }
            }
            if t == table {
                n += 1;
            }
        }
        Ok(n)
    })
}

// ---- tc (clsact qdisc, cls_bpf filters) -------------------------------------------------
//
// Attaching a cls_bpf filter needs the program's fd and is done by aya (`SchedClassifier` with
// `TcAttachOptions::Netlink`); finding, checking and removing filters and the clsact qdisc are
// plain rtnetlink and live here.

/// `TC_H_MAJ(TC_H_CLSACT)`: the clsact qdisc's handle `ffff:0`.
const CLSACT_HANDLE: u32 = 0xffff_0000;
/// `TC_H_CLSACT` (= `TC_H_INGRESS`), the parent of the clsact qdisc.
const TC_H_CLSACT: u32 = 0xffff_fff1;
/// Parent of clsact's ingress hook (`ffff:fff2`) and egress hook (`ffff:fff3`).
const CLSACT_INGRESS: u32 = 0xffff_fff2;
const CLSACT_EGRESS: u32 = 0xffff_fff3;
/// `ETH_P_ALL` in network byte order, the protocol aya's cls_bpf filters are made with.
const ETH_P_ALL_BE: u32 = (libc::ETH_P_ALL as u16).to_be() as u32;

/// One filter on a device's clsact ingress or egress hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcFilterInfo {
    /// Filter priority (`tc filter ... prio`).
    pub priority: u16,
    /// Filter handle (`major:minor` as a u32).
    pub handle: u32,
    /// Classifier kind, e.g. `bpf`.
    pub kind: String,
    /// cls_bpf: the name the program was attached under.
    pub bpf_name: Option<String>,
    /// cls_bpf: the attached program's id.
    pub bpf_id: Option<u32>,
}

fn tc_parent(ingress: bool) -> u32 {
    if ingress {
        CLSACT_INGRESS
    } else {
        CLSACT_EGRESS
    }
}

fn is_code(e: &rtnetlink::Error, codes: &[i32]) -> bool {
    matches!(e, rtnetlink::Error::NetlinkError(m) if codes.iter().any(|c| m.raw_code() == -c))
}

async fn filters_of(
    h: &Handle,
    ifname: &str,
    idx: u32,
    ingress: bool,
) -> Result<Vec<TcFilterInfo>, NetError> {
    use netlink_packet_route::tc::{TcAttribute, TcFilterBpfOption, TcOption};
    let mut req = h.traffic_filter(idx as i32).get();
    req = if ingress { req.ingress() } else { req.egress() };
    let mut s = req.execute();
    let mut out = Vec::new();
    loop {
        let msg = match s.try_next().await {
            Ok(Some(m)) => m,
            Ok(None) => break,
            // No clsact qdisc on the device: no hook, no filters.
            Err(e) if is_code(&e, &[libc::EINVAL, libc::ENOENT]) => break,
            Err(e) => return Err(nl(format!("list tc filters of {ifname}"))(e)),
        };
        if msg.header.index != idx as i32 {
            continue;
        }
        let mut f = TcFilterInfo {
            priority: (msg.header.info >> 16) as u16,
            handle: msg.header.handle.into(),
            kind: String::new(),
            bpf_name: None,
            bpf_id: None,
        };
        let mut has_options = false;
        for a in &msg.attributes {
            match a {
                TcAttribute::Kind(k) => f.kind = k.clone(),
                TcAttribute::Options(opts) => {
                    has_options = true;
                    for o in opts {
                        match o {
                            TcOption::Bpf(TcFilterBpfOption::ProgName(n)) => {
                                f.bpf_name = Some(n.clone())
                            }
                            TcOption::Bpf(TcFilterBpfOption::ProgId(i)) => f.bpf_id = Some(*i),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        // A dump also lists each classifier instance (prio/protocol) on its own, without a
        // handle or options: not a filter.
        if has_options || f.handle != 0 {
            out.push(f);
        }
    }
    Ok(out)
}

/// The filters on `ifname`'s clsact ingress (`ingress`) or egress hook in `ns` (none without a
/// clsact qdisc).
pub fn tc_filters(
    ns: Option<&NetNs>,
    ifname: &str,
    ingress: bool,
) -> Result<Vec<TcFilterInfo>, NetError> {
    with_handle(ns, |h| async move {
        let idx = index_of(&h, ifname).await?;
        filters_of(&h, ifname, idx, ingress).await
    })
}

/// Whether `ifname` in `ns` has a clsact qdisc.
pub fn has_clsact(ns: Option<&NetNs>, ifname: &str) -> Result<bool, NetError> {
    use netlink_packet_route::tc::TcAttribute;
    with_handle(ns, |h| async move {
        let idx = index_of(&h, ifname).await?;
        let mut s = h.qdisc().get().index(idx as i32).execute();
        while let Some(m) = s
            .try_next()
            .await
            .map_err(nl(format!("list qdiscs of {ifname}")))?
        {
            let kind_is_clsact = m
                .attributes
                .iter()
                .any(|a| matches!(a, TcAttribute::Kind(k) if k == "clsact"));
            if m.header.index == idx as i32 && kind_is_clsact {
                return Ok(true);
            }
        }
        Ok(false)
    })
}

async fn tc_request(
    h: &Handle,
    msg: netlink_packet_route::RouteNetlinkMessage,
) -> Result<(), rtnetlink::Error> {
    use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_REQUEST};
    let mut req = NetlinkMessage::from(msg);
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK;
    let mut h = h.clone();
    let mut resp = h.request(req)?;
    while let Some(m) = futures::StreamExt::next(&mut resp).await {
        if let NetlinkPayload::Error(e) = m.payload {
            if e.code.is_some() {
                return Err(rtnetlink::Error::NetlinkError(e));
            }
        }
    }
    Ok(())
}

/// `ifname`'s index in the handle's namespace, or `None` when the device is gone or, with
/// `ifindex`, when a device of that name now has another index (not the one we attached to).
async fn current_index(
    h: &Handle,
    ifname: &str,
    ifindex: Option<u32>,
) -> Result<Option<u32>, NetError> {
    match index_of(h, ifname).await {
        Ok(i) if ifindex.is_some_and(|want| want != i) => Ok(None),
        Ok(i) => Ok(Some(i)),
        Err(NetError::NoSuchLink(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Sends a tc delete request: `Ok(true)` when deleted, `Ok(false)` when the object (or its
/// device) was already gone.
async fn tc_delete(
    h: &Handle,
    msg: netlink_packet_route::RouteNetlinkMessage,
    what: impl FnOnce() -> String,
) -> Result<bool, NetError> {
    match tc_request(h, msg).await {
        Ok(()) => Ok(true),
        Err(e) if is_code(&e, &[libc::ENOENT, libc::EINVAL, libc::ENODEV]) => Ok(false),
        Err(e) => Err(nl(what())(e)),
    }
}

/// Deletes the filter `priority`/`handle` from `ifname`'s clsact ingress (or egress) hook in
/// `ns`, if it is still there and, when `ifindex` is given, the device still has that index
/// (a device of the same name made later is not touched). Returns whether it was deleted.
pub fn tc_filter_delete(
    ns: Option<&NetNs>,
    ifname: &str,
    ifindex: Option<u32>,
    ingress: bool,
    priority: u16,
    handle: u32,
) -> Result<bool, NetError> {
    use netlink_packet_route::tc::TcMessage;
    with_handle(ns, |h| async move {
        let Some(idx) = current_index(&h, ifname, ifindex).await? else {
            return Ok(false);
        };
        let mut m = TcMessage::with_index(idx as i32);
        m.header.parent = tc_parent(ingress).into();
        m.header.handle = handle.into();
        m.header.info = (u32::from(priority) << 16) | ETH_P_ALL_BE;
        let msg = netlink_packet_route::RouteNetlinkMessage::DelTrafficFilter(m);
        tc_delete(&h, msg, || {
            format!("delete tc filter prio {priority} handle {handle:#x} of {ifname}")
        })
        .await
    })
}

/// Deletes `ifname`'s clsact qdisc in `ns` (and with it every filter on both hooks), if the
/// device (with index `ifindex`, when given) and the qdisc exist. Returns whether it was deleted.
pub fn delete_clsact(
    ns: Option<&NetNs>,
    ifname: &str,
    ifindex: Option<u32>,
) -> Result<bool, NetError> {
    use netlink_packet_route::tc::{TcAttribute, TcMessage};
    with_handle(ns, |h| async move {
        let Some(idx) = current_index(&h, ifname, ifindex).await? else {
            return Ok(false);
        };
        let mut m = TcMessage::with_index(idx as i32);
        m.header.parent = TC_H_CLSACT.into();
        m.header.handle = CLSACT_HANDLE.into();
        m.attributes.push(TcAttribute::Kind("clsact".into()));
        let msg = netlink_packet_route::RouteNetlinkMessage::DelQueueDiscipline(m);
        tc_delete(&h, msg, || format!("delete clsact qdisc of {ifname}")).await
    })
}
