//! The free functions of the older API: each takes the namespace (`None`: the caller's) and
//! opens a [`Netlink`] handle for that one call.
//!
//! TODO(lab merge): callers in topology code. Kept only for test and topology code (the
//! worlds in `crates/lab` — `world.rs`, `pods.rs`, `ptp.rs`, `rootless.rs` — `crates/bench`
//! and the integration tests); product code opens one handle per namespace per operation
//! instead.
//! Remove once those callers hold handles.

use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};

use super::{NetError, NetkitMode, Netlink, PortRule, TcFilterInfo};
use crate::netns::NetNs;

/// [`Netlink::link_index`] in `ns`.
pub fn link_index(ns: Option<&NetNs>, name: &str) -> Result<u32, NetError> {
    Netlink::of(ns)?.link_index(name)
}

/// [`Netlink::link_up`] in `ns`.
pub fn link_up(ns: Option<&NetNs>, name: &str) -> Result<(), NetError> {
    Netlink::of(ns)?.link_up(name)
}

/// [`Netlink::link_exists`] in `ns`.
pub fn link_exists(ns: Option<&NetNs>, name: &str) -> Result<bool, NetError> {
    Netlink::of(ns)?.link_exists(name)
}

/// [`Netlink::link_mac`] in `ns`.
pub fn link_mac(ns: Option<&NetNs>, name: &str) -> Result<[u8; 6], NetError> {
    Netlink::of(ns)?.link_mac(name)
}

/// [`Netlink::rename_link`] in `ns`.
pub fn rename_link(ns: Option<&NetNs>, old: &str, new: &str) -> Result<(), NetError> {
    Netlink::of(ns)?.rename_link(old, new)
}

/// [`Netlink::delete_link`] in `ns`.
pub fn delete_link(ns: Option<&NetNs>, name: &str) -> Result<(), NetError> {
    Netlink::of(ns)?.delete_link(name)
}

/// [`Netlink::create_veth`] from `ns_a` to `ns_b`.
pub fn create_veth(ns_a: &NetNs, name_a: &str, ns_b: &NetNs, name_b: &str) -> Result<(), NetError> {
    let a = ns_a.netlink()?;
    let b = ns_b.netlink()?;
    a.create_veth(name_a, &b, name_b)
}

/// [`Netlink::create_veth_into`] from `host` to `pod`.
pub fn create_veth_into(
    host: Option<&NetNs>,
    host_name: &str,
    tmp_name: &str,
    pod: &NetNs,
    pod_name: &str,
) -> Result<(), NetError> {
    let h = Netlink::of(host)?;
    h.create_veth_into(host_name, tmp_name, &pod.netlink()?, pod_name)
}

/// [`Netlink::create_netkit`] from `host` to `pod`.
pub fn create_netkit(
    host: Option<&NetNs>,
    primary: &str,
    peer: &str,
    pod: &NetNs,
    pod_name: &str,
    mode: NetkitMode,
) -> Result<(), NetError> {
    let h = Netlink::of(host)?;
    h.create_netkit(primary, peer, &pod.netlink()?, pod_name, mode)
}

/// [`Netlink::add_address`] in `ns`.
pub fn add_address(
    ns: Option<&NetNs>,
    name: &str,
    addr: IpAddr,
    prefix: u8,
) -> Result<(), NetError> {
    Netlink::of(ns)?.add_address(name, addr, prefix)
}

/// [`Netlink::link_ipv4_addresses`] in `ns`.
pub fn link_ipv4_addresses(
    ns: Option<&NetNs>,
    name: &str,
) -> Result<Vec<(Ipv4Addr, u8)>, NetError> {
    Netlink::of(ns)?.link_ipv4_addresses(name)
}

/// [`Netlink::add_route`] in `ns`.
pub fn add_route(
    ns: Option<&NetNs>,
    dst: IpAddr,
    prefix: u8,
    gateway: Option<IpAddr>,
    dev: Option<&str>,
) -> Result<(), NetError> {
    Netlink::of(ns)?.add_route(dst, prefix, gateway, dev)
}

/// [`Netlink::add_link_route`] in `ns`.
pub fn add_link_route(
    ns: Option<&NetNs>,
    dst: Ipv4Addr,
    prefix: u8,
    dev: &str,
) -> Result<(), NetError> {
    Netlink::of(ns)?.add_link_route(dst, prefix, dev)
}

/// [`Netlink::add_neighbour`] in `ns`.
pub fn add_neighbour(
    ns: Option<&NetNs>,
    dev: &str,
    ip: IpAddr,
    mac: [u8; 6],
) -> Result<(), NetError> {
    Netlink::of(ns)?.add_neighbour(dev, ip, mac)
}

/// [`Netlink::tc_filters`] in `ns`.
pub fn tc_filters(
    ns: Option<&NetNs>,
    ifname: &str,
    ingress: bool,
) -> Result<Vec<TcFilterInfo>, NetError> {
    Netlink::of(ns)?.tc_filters(ifname, ingress)
}

/// [`Netlink::has_clsact`] in `ns`.
pub fn has_clsact(ns: Option<&NetNs>, ifname: &str) -> Result<bool, NetError> {
    Netlink::of(ns)?.has_clsact(ifname)
}

/// [`Netlink::tc_filter_delete`] in `ns`.
pub fn tc_filter_delete(
    ns: Option<&NetNs>,
    ifname: &str,
    ifindex: Option<u32>,
    ingress: bool,
    priority: u16,
    handle: u32,
) -> Result<bool, NetError> {
    Netlink::of(ns)?.tc_filter_delete(ifname, ifindex, ingress, priority, handle)
}

/// [`Netlink::delete_clsact`] in `ns`.
pub fn delete_clsact(
    ns: Option<&NetNs>,
    ifname: &str,
    ifindex: Option<u32>,
) -> Result<bool, NetError> {
    Netlink::of(ns)?.delete_clsact(ifname, ifindex)
}

/// [`Netlink::add_port_rule`] in `ns`.
pub fn add_port_rule(ns: Option<&NetNs>, r: &PortRule) -> Result<(), NetError> {
    Netlink::of(ns)?.add_port_rule(r)
}

/// [`Netlink::delete_port_rules`] in `ns`.
pub fn delete_port_rules(
    ns: Option<&NetNs>,
    iif: &str,
    table: u32,
    priority: u32,
) -> Result<usize, NetError> {
    Netlink::of(ns)?.delete_port_rules(iif, table, priority)
}

/// [`Netlink::delete_port_rules_from`] in `ns`.
pub fn delete_port_rules_from(
    ns: Option<&NetNs>,
    iif: &str,
    table: u32,
    priority: u32,
    from: SocketAddrV4,
) -> Result<usize, NetError> {
    Netlink::of(ns)?.delete_port_rules_from(iif, table, priority, from)
}

/// [`Netlink::count_port_rules`] in `ns`.
pub fn count_port_rules(
    ns: Option<&NetNs>,
    iif: &str,
    table: u32,
    priority: u32,
) -> Result<usize, NetError> {
    Netlink::of(ns)?.count_port_rules(iif, table, priority)
}

/// [`Netlink::add_local_default_route`] in `ns`.
pub fn add_local_default_route(ns: Option<&NetNs>, table: u32) -> Result<(), NetError> {
    Netlink::of(ns)?.add_local_default_route(table)
}

/// [`Netlink::delete_local_default_route`] in `ns`.
pub fn delete_local_default_route(ns: Option<&NetNs>, table: u32) -> Result<(), NetError> {
    Netlink::of(ns)?.delete_local_default_route(table)
}

/// [`Netlink::count_any_rules_to_table`] in `ns`.
pub fn count_any_rules_to_table(ns: Option<&NetNs>, table: u32) -> Result<usize, NetError> {
    Netlink::of(ns)?.count_any_rules_to_table(table)
}
