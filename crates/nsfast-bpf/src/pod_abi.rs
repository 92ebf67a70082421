//! Mirrors of the pod datapath's types and names (`bpf/lib/pod_endpoints.h`, `bpf/lib/pod_policy.h`, `bpf/pod.bpf.c`; the
//! object [`crate::POD`]), used by crate nsfast-pod.

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
/// TCX egress of a pod's host-side veth: what the host stack sends into the pod.
pub const PROG_TO_CONTAINER: &str = "nsf_pod_to_container";
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

/// NetworkPolicy maps (`bpf/lib/pod_policy.h`, `bpf/lib/pod_policy_rules.h`).
pub const MAP_POL_IDS: &str = "nsf_pol_ids";
pub const MAP_POL_ISO: &str = "nsf_pol_iso";
pub const MAP_POL_PEERS: &str = "nsf_pol_peers";
pub const MAP_POL_CIDRS: &str = "nsf_pol_cidrs";
pub const MAP_POL_FLOWS: &str = "nsf_pol_flows";
pub const MAP_POL_DROPS: &str = "nsf_pol_drops";
/// The policy generation (one `u32`): one more after each change of the tables.
pub const MAP_POL_GEN: &str = "nsf_pol_gen";
/// The rule tables and generation (`bpf/lib/pod_policy_rules.h`), which the pod shortcut's
/// sockmap object shares with the host's pod programs.
pub const POLICY_RULE_MAPS: [&str; 5] = [
    MAP_POL_IDS,
    MAP_POL_ISO,
    MAP_POL_PEERS,
    MAP_POL_CIDRS,
    MAP_POL_GEN,
];
/// Every policy map, pinned per host like the endpoint table.
pub const POLICY_MAPS: [&str; 7] = [
    MAP_POL_IDS,
    MAP_POL_ISO,
    MAP_POL_PEERS,
    MAP_POL_CIDRS,
    MAP_POL_FLOWS,
    MAP_POL_DROPS,
    MAP_POL_GEN,
];
/// `NSF_POL_INGRESS`, `NSF_POL_EGRESS`.
pub const POL_INGRESS: u32 = 0;
pub const POL_EGRESS: u32 = 1;
/// `NSF_POL_RANGES`: port ranges in one port set.
pub const POL_RANGES: usize = 16;

/// `struct nsf_pol_range`; `proto` 0: every protocol and port.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolRange {
    pub lo: u16,
    pub hi: u16,
    pub proto: u8,
    pub pad: [u8; 3],
}

/// `struct nsf_pol_ports`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolPorts {
    pub n: u32,
    pub r: [PolRange; POL_RANGES],
}

/// `struct nsf_pol_addr`: an IPv6 address, or an IPv4 one as `::ffff:a.b.c.d`, as 16 bytes in
/// network order.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolAddr(pub [u8; 16]);

impl PolAddr {
    pub fn new(ip: std::net::IpAddr) -> Self {
        match ip {
            std::net::IpAddr::V4(a) => Self(a.to_ipv6_mapped().octets()),
            std::net::IpAddr::V6(a) => Self(a.octets()),
        }
    }

    /// The address; an IPv4 one for the `::ffff:` form.
    pub fn ip(&self) -> std::net::IpAddr {
        Ipv6Addr::from(self.0).to_canonical()
    }
}

/// `struct nsf_pol_id_key`: the address `addr` of a local pod in table slot `slot`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolIdKey {
    pub slot: u32,
    pub addr: PolAddr,
}

/// `NSF_POL_SLOT_DIR`: direction `dir` in table slot `slot`.
pub const fn pol_slot_dir(dir: u32, slot: u32) -> u32 {
    dir | slot << 1
}

/// `struct nsf_pol_iso_key`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolIsoKey {
    pub pod: u32,
    pub dir: u32,
}

/// `struct nsf_pol_peer_key`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolPeerKey {
    pub pod: u32,
    pub peer: u32,
    pub dir: u32,
}

/// The data of `struct nsf_pol_cidr_key` after its `prefixlen` (aya's `lpm_trie::Key`
/// holds that): the pod, the direction in network order, the peer address. A prefix of `n`
/// bits of the 128-bit peer address has prefix length `64 + n` (an IPv4 prefix of `n` bits
/// is `96 + n` bits of its `::ffff:` form).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolCidrData {
    pub pod: u32,
    pub dir_be: u32,
    pub addr: PolAddr,
}

/// `NSF_PROTO_TCP`: IPPROTO_TCP, as `nsf_pol_flow.proto` holds it.
pub const PROTO_TCP: u32 = 6;

/// `struct nsf_pol_flow`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PolFlow {
    pub saddr: PolAddr,
    pub daddr: PolAddr,
    pub sport: u16,
    pub dport: u16,
    pub proto: u32,
}

// SAFETY: PolRange is repr(C) without padding (2 + 2 + 1 + 3 = 8 bytes, alignment 2) and
// every bit pattern is a valid value.
unsafe impl aya::Pod for PolRange {}
// SAFETY: PolPorts is repr(C) without padding (4 + 16 * 8 = 132 bytes, alignment 4; the
// ranges' alignment 2 divides 4) and every bit pattern is a valid value.
unsafe impl aya::Pod for PolPorts {}
// SAFETY: PolIsoKey is repr(C), two u32, no padding; every bit pattern is valid.
unsafe impl aya::Pod for PolIsoKey {}
// SAFETY: PolPeerKey is repr(C), three u32, no padding; every bit pattern is valid.
unsafe impl aya::Pod for PolPeerKey {}
// SAFETY: PolAddr is repr(C), 16 bytes, no padding; every bit pattern is valid.
unsafe impl aya::Pod for PolAddr {}
// SAFETY: PolIdKey is repr(C) without padding (4 + 16 = 20 bytes, alignment 4) and every bit
// pattern is a valid value.
unsafe impl aya::Pod for PolIdKey {}
// SAFETY: PolCidrData is repr(C) without padding (4 + 4 + 16 = 24 bytes, alignment 4) and
// every bit pattern is valid.
unsafe impl aya::Pod for PolCidrData {}
// SAFETY: PolFlow is repr(C) without padding (16 + 16 + 2 + 2 + 4 = 40 bytes, alignment 4)
// and every bit pattern is a valid value.
unsafe impl aya::Pod for PolFlow {}

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
    fn policy_layouts() {
        assert_eq!(std::mem::size_of::<PolRange>(), 8);
        assert_eq!(std::mem::size_of::<PolPorts>(), 4 + 8 * POL_RANGES);
        assert_eq!(std::mem::size_of::<PolIsoKey>(), 8);
        assert_eq!(std::mem::size_of::<PolPeerKey>(), 12);
        assert_eq!(std::mem::size_of::<PolIdKey>(), 20);
        assert_eq!(std::mem::size_of::<PolCidrData>(), 24);
        assert_eq!(std::mem::size_of::<PolFlow>(), 40);
        assert_eq!(std::mem::offset_of!(PolRange, proto), 4);
        assert_eq!(std::mem::offset_of!(PolFlow, sport), 32);
    }

    /// The object's policy maps have the key and value sizes of the mirrors here (an LPM
    /// key is the prefix length then the data).
    #[test]
    fn policy_maps_of_the_object_match_the_mirrors() {
        use std::mem::size_of;
        let want: [(&str, usize, usize); 7] = [
            (MAP_POL_IDS, size_of::<PolIdKey>(), 4),
            (MAP_POL_ISO, size_of::<PolIsoKey>(), 4),
            (
                MAP_POL_PEERS,
                size_of::<PolPeerKey>(),
                size_of::<PolPorts>(),
            ),
            (
                MAP_POL_CIDRS,
                4 + size_of::<PolCidrData>(),
                size_of::<PolPorts>(),
            ),
            (MAP_POL_FLOWS, size_of::<PolFlow>(), 4),
            (MAP_POL_DROPS, size_of::<PolAddr>(), 8),
            (MAP_POL_GEN, 4, 4),
        ];
        let (pod, sockmap) = (
            crate::map_layouts(crate::POD),
            crate::map_layouts(crate::SOCKMAP),
        );
        for (name, key, value) in want {
            for (object, layouts) in [(crate::POD, &pod), (crate::SOCKMAP, &sockmap)] {
                let Some(l) = layouts.get(name) else {
                    assert!(
                        !POLICY_RULE_MAPS.contains(&name) || object != crate::SOCKMAP,
                        "{name} missing from the sockmap object"
                    );
                    continue;
                };
                assert_eq!(
                    (l.key_size as usize, l.value_size as usize),
                    (key, value),
                    "{name}"
                );
            }
            assert!(pod.contains_key(name), "{name}");
        }
    }

    #[test]
    fn pol_addr_holds_ipv4_in_its_mapped_form() {
        let a = PolAddr::new("10.1.2.3".parse().unwrap());
        assert_eq!(a.0[10..], [0xff, 0xff, 10, 1, 2, 3]);
        assert_eq!(a.ip(), "10.1.2.3".parse::<std::net::IpAddr>().unwrap());
        let b = PolAddr::new("fd00::1".parse().unwrap());
        assert_eq!(b.ip(), "fd00::1".parse::<std::net::IpAddr>().unwrap());
    }

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
