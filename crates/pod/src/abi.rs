//! Mirrors of the BPF side's types and names (`bpf/lib/pod_endpoints.h`, `bpf/pod.bpf.c`).

use std::net::{Ipv4Addr, Ipv6Addr};

/// Endpoint table map (IPv4 addresses).
pub const MAP_ENDPOINTS: &str = "nsf_pod_eps";
/// Endpoint table map of IPv6 addresses (`struct nsf_ip6` keys).
pub const MAP_ENDPOINTS6: &str = "nsf_pod_eps6";
/// The pods' IPv6 gateway, answered by the BPF NDP responder (`NSF_GW6_*`).
pub const GATEWAY6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
/// Per-CPU counter array.
pub const MAP_COUNTERS: &str = "nsf_pod_cnt";
/// TCX ingress of a pod's host-side veth.
pub const PROG_FROM_CONTAINER: &str = "nsf_pod_from_container";
/// TCX ingress of an uplink (wire) device.
pub const PROG_FROM_WIRE: &str = "nsf_pod_from_wire";
/// `BPF_NETKIT_PEER` program for L2 netkit pairs.
pub const PROG_NETKIT_PEER_L2: &str = "nsf_pod_netkit_peer_l2";
/// `BPF_NETKIT_PEER` program for L3 netkit pairs.
pub const PROG_NETKIT_PEER_L3: &str = "nsf_pod_netkit_peer_l3";
/// `BPF_NETKIT_PRIMARY` program.
pub const PROG_NETKIT_PRIMARY: &str = "nsf_pod_netkit_primary";

/// A program's name as the kernel reports it (BPF_OBJ_NAME_LEN: 15 characters).
pub fn kernel_name(name: &str) -> &str {
    &name[..name.len().min(15)]
}

/// `NSF_EP_NETKIT`.
pub const EP_NETKIT: u32 = 1;
/// `NSF_EP_L3`.
pub const EP_L3: u32 = 2;
/// `NSF_EP_HOST_FW`: the pod's traffic goes to the host stack (netfilter) instead of being
/// redirected.
pub const EP_HOST_FW: u32 = 4;

/// `struct nsf_endpoint`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Endpoint {
    pub ifindex: u32,
    pub flags: u32,
    pub pod_mac: [u8; 6],
    pub host_mac: [u8; 6],
}

// SAFETY: Endpoint is repr(C), has no padding (4 + 4 + 6 + 6 = 20 bytes, alignment 4) and
// every bit pattern is a valid value.
unsafe impl aya::Pod for Endpoint {}

/// The endpoint table key of `ip`: the address in network byte order, as the BPF side reads
/// `iphdr.daddr`.
pub fn ip_key(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

/// The IPv6 endpoint table key of `ip`: its 16 bytes as on the wire (`struct nsf_ip6`).
pub fn ip6_key(ip: Ipv6Addr) -> [u8; 16] {
    ip.octets()
}

/// Counter slots, in `enum` order of `pod_endpoints.h`, with the names `pod list --json` uses
/// (`pod_not_ipv4` keeps its name: it also counts IPv6 from link-local or unspecified
/// sources, see `pod_endpoints.h`).
pub const COUNTERS: [&str; 10] = [
    "pod_to_pod",
    "fib_redirect",
    "fib_redirect_neigh",
    "pod_to_stack",
    "wire_to_pod",
    "wire_to_stack",
    "arp_reply",
    "pod_not_ipv4",
    "spoofed",
    "ndp_reply",
];

/// Counter indexes.
pub mod cnt {
    pub const POD_TO_POD: u32 = 0;
    pub const FIB_REDIRECT: u32 = 1;
    pub const FIB_NEIGH: u32 = 2;
    pub const POD_TO_STACK: u32 = 3;
    pub const WIRE_TO_POD: u32 = 4;
    pub const WIRE_TO_STACK: u32 = 5;
    pub const ARP_REPLY: u32 = 6;
    pub const NOT_IPV4: u32 = 7;
    pub const SPOOFED: u32 = 8;
    pub const NDP_REPLY: u32 = 9;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_layout() {
        assert_eq!(std::mem::size_of::<Endpoint>(), 20);
        assert_eq!(std::mem::offset_of!(Endpoint, pod_mac), 8);
        assert_eq!(std::mem::offset_of!(Endpoint, host_mac), 14);
    }

    #[test]
    fn key_is_network_order() {
        let k = ip_key(Ipv4Addr::new(10, 1, 2, 3));
        assert_eq!(k.to_ne_bytes(), [10, 1, 2, 3]);
    }
}
