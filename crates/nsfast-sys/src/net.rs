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
    #[error("netlink: {what}: {source}")]
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
    let fd_b = ns_b.as_fd().as_raw_fd();
    with_handle(Some(ns_a), |h| async move {
        h.link()
            .add(LinkVeth::new(name_a, name_b).build())
            .execute()
            .await
            .map_err(nl(format!("add veth {name_a}/{name_b}")))?;
        let idx_b = index_of(&h, name_b).await?;
        h.link()
            .set(LinkUnspec::new_with_index(idx_b).setns_by_fd(fd_b).build())
            .execute()
            .await
            .map_err(nl(format!("move {name_b} to its namespace")))?;
        let idx_a = index_of(&h, name_a).await?;
        h.link()
            .set(LinkUnspec::new_with_index(idx_a).up().build())
            .execute()
            .await
            .map_err(nl(format!("set {name_a} up")))
    })?;
    link_up(Some(ns_b), name_b)
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
pub fn add_address(ns: Option<&NetNs>, name: &str, addr: IpAddr, prefix: u8) -> Result<(), NetError> {
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
                let mut b = RouteMessageBuilder::<std::net::Ipv4Addr>::new().destination_prefix(d, prefix);
                if let Some(IpAddr::V4(g)) = gateway {
                    b = b.gateway(g);
                }
                if let Some(i) = oif {
                    b = b.output_interface(i);
                }
                b.build()
            }
            IpAddr::V6(d) => {
                let mut b = RouteMessageBuilder::<std::net::Ipv6Addr>::new().destination_prefix(d, prefix);
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

/// One `ip rule` steering protocol traffic that enters on a link to a routing table:
/// `iif <iif> ipproto <proto> dport <start>-<end> lookup <table> priority <priority>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRule {
    pub iif: String,
    pub ip_proto: u8,
    pub dport: (u16, u16),
    pub table: u32,
    pub priority: u32,
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

/// Deletes every IPv4 rule with this iif, table and priority (whatever its ports).
/// Returns how many were deleted.
pub fn delete_port_rules(
    ns: Option<&NetNs>,
    iif: &str,
    table: u32,
    priority: u32,
) -> Result<usize, NetError> {
    let probe = PortRule {
        iif: iif.to_string(),
        ip_proto: 0,
        dport: (0, 0),
        table,
        priority,
    };
    with_handle(ns, |h| async move {
        let mut found = Vec::new();
        let mut rules = h.rule().get(rtnetlink::IpVersion::V4).execute();
        while let Some(msg) = rules.try_next().await.map_err(nl("list rules"))? {
            if rule_matches(&msg, &probe) {
                found.push(msg);
            }
        }
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

/// Counts IPv4 rules with this iif, table and priority.
pub fn count_port_rules(
    ns: Option<&NetNs>,
    iif: &str,
    table: u32,
    priority: u32,
) -> Result<usize, NetError> {
    let probe = PortRule {
        iif: iif.to_string(),
        ip_proto: 0,
        dport: (0, 0),
        table,
        priority,
    };
    with_handle(ns, |h| async move {
        let mut n = 0;
        let mut rules = h.rule().get(rtnetlink::IpVersion::V4).execute();
        while let Some(msg) = rules.try_next().await.map_err(nl("list rules"))? {
            if rule_matches(&msg, &probe) {
                n += 1;
            }
        }
        Ok(n)
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

/// The IPv4 addresses (with prefix lengths) on link `name`.
pub fn link_ipv4_addrs(
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
        out.dedup();
        Ok(out)
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
