//! BPF_PROG_TEST_RUN tests of the pod programs' decisions (`bpf/pod.bpf.c`,
//! `bpf/lib/pod_route.h`): verdicts, rewritten frames and counters, each run inside a
//! throwaway network namespace (the FIB cases use a veth pair there). Needs root.

use std::net::{Ipv4Addr, Ipv6Addr};

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray};
use aya::programs::{SchedClassifier, TestRun, TestRunOptions};
use aya::Ebpf;
use nsfast_lab::require_root;
use nsfast_lab::world::{unique, VethPair};
use nsfast_pod::abi::{self, cnt, Endpoint};
use nsfast_sys::net;
use nsfast_sys::netns::NetNs;

const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;
const TC_ACT_REDIRECT: u32 = 7;
const NETKIT_NEXT: u32 = u32::MAX; // -1
const NETKIT_DROP: u32 = 2;
/// The device a test run's skb comes from without a ctx ifindex: the throwaway namespace's
/// loopback. Pod B, the sender of most frames here, "sits" on it: the programs accept a
/// packet only from the device its source address belongs to.
const LO: u32 = 1;

const POD_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xa1];
const HOST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xb1];
const SRC_POD_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xa2];
const SRC_HOST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xb2];
const POD_A: Ipv4Addr = Ipv4Addr::new(10, 251, 1, 10);
const POD_B: Ipv4Addr = Ipv4Addr::new(10, 251, 1, 11);
const POD_A6: Ipv6Addr = Ipv6Addr::new(0xfd51, 0, 0, 1, 0, 0, 0, 0x10);
const POD_B6: Ipv6Addr = Ipv6Addr::new(0xfd51, 0, 0, 1, 0, 0, 0, 0x11);
const GW6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

struct Harness {
    ebpf: Ebpf,
}

impl Harness {
    fn new() -> Self {
        let mut ebpf = Ebpf::load(nsfast_bpf::POD).expect("load pod object");
        for p in [
            abi::PROG_FROM_CONTAINER,
            abi::PROG_FROM_WIRE,
            abi::PROG_NETKIT_PEER_L2,
            abi::PROG_NETKIT_PEER_L3,
            abi::PROG_NETKIT_PRIMARY,
            abi::PROG_TO_CONTAINER,
        ] {
            let prog: &mut SchedClassifier = ebpf.program_mut(p).unwrap().try_into().unwrap();
            prog.load()
                .unwrap_or_else(|e| panic!("verifier rejects {p}: {e:?}"));
        }
        Self { ebpf }
    }

    fn endpoint(&mut self, ip: Ipv4Addr, ep: Endpoint) {
        let mut m: BpfHashMap<&mut MapData, u32, Endpoint> =
            BpfHashMap::try_from(self.ebpf.map_mut(abi::MAP_ENDPOINTS).unwrap()).unwrap();
        m.insert(abi::ip_key(ip), ep, 0).unwrap();
    }

    fn endpoint6(&mut self, ip: Ipv6Addr, ep: Endpoint) {
        let mut m: BpfHashMap<&mut MapData, [u8; 16], Endpoint> =
            BpfHashMap::try_from(self.ebpf.map_mut(abi::MAP_ENDPOINTS6).unwrap()).unwrap();
        m.insert(abi::ip6_key(ip), ep, 0).unwrap();
    }

    /// [`Harness::with_pods_on`] with an IPv6 address for each pod too (dual-stack).
    fn with_dual_pods_on(mut self, src_ifindex: u32) -> Self {
        self = self.with_pods_on(src_ifindex);
        self.endpoint6(
            POD_A6,
            Endpoint {
                ifindex: 100,
                flags: 0,
                pod_mac: POD_MAC,
                host_mac: HOST_MAC,
            },
        );
        self.endpoint6(
            POD_B6,
            Endpoint {
                ifindex: src_ifindex,
                flags: 0,
                pod_mac: SRC_POD_MAC,
                host_mac: SRC_HOST_MAC,
            },
        );
        self
    }

    /// Two pods: A (destination, ifindex 100) and B (source, on the loopback: see [`LO`]).
    fn with_pods(self) -> Self {
        self.with_pods_on(LO)
    }

    /// Two pods: A (destination, ifindex 100) and B (source, host-side device `src_ifindex`).
    fn with_pods_on(mut self, src_ifindex: u32) -> Self {
        self.endpoint(
            POD_A,
            Endpoint {
                ifindex: 100,
                flags: 0,
                pod_mac: POD_MAC,
                host_mac: HOST_MAC,
            },
        );
        self.endpoint(
            POD_B,
            Endpoint {
                ifindex: src_ifindex,
                flags: 0,
                pod_mac: SRC_POD_MAC,
                host_mac: SRC_HOST_MAC,
            },
        );
        self
    }

    /// Policy tables in `slot`: pod A (id 1, both addresses) isolated for ingress, pod B
    /// (id 2) allowed into it on every port when `allow_b`.
    fn isolate_a(&mut self, slot: u32, allow_b: bool) {
        use std::net::IpAddr;
        let mut ids: BpfHashMap<&mut MapData, abi::PolIdKey, u32> =
            BpfHashMap::try_from(self.ebpf.map_mut(abi::MAP_POL_IDS).unwrap()).unwrap();
        for (ip, id) in [
            (IpAddr::V4(POD_A), 1),
            (IpAddr::V6(POD_A6), 1),
            (IpAddr::V4(POD_B), 2),
            (IpAddr::V6(POD_B6), 2),
        ] {
            let k = abi::PolIdKey {
                slot,
                addr: abi::PolAddr::new(ip),
            };
            ids.insert(k, id, 0).unwrap();
        }
        let dir = abi::pol_slot_dir(abi::POL_INGRESS, slot);
        let mut iso: BpfHashMap<&mut MapData, abi::PolIsoKey, u32> =
            BpfHashMap::try_from(self.ebpf.map_mut(abi::MAP_POL_ISO).unwrap()).unwrap();
        iso.insert(abi::PolIsoKey { pod: 1, dir }, 1, 0).unwrap();
        if allow_b {
            let mut all = abi::PolPorts {
                n: 1,
                ..Default::default()
            };
            all.r[0].hi = u16::MAX;
            let mut peers: BpfHashMap<&mut MapData, abi::PolPeerKey, abi::PolPorts> =
                BpfHashMap::try_from(self.ebpf.map_mut(abi::MAP_POL_PEERS).unwrap()).unwrap();
            peers
                .insert(
                    abi::PolPeerKey {
                        pod: 1,
                        peer: 2,
                        dir,
                    },
                    all,
                    0,
                )
                .unwrap();
        }
    }

    fn set_generation(&mut self, gen: u32) {
        let mut g: aya::maps::Array<&mut MapData, u32> =
            aya::maps::Array::try_from(self.ebpf.map_mut(abi::MAP_POL_GEN).unwrap()).unwrap();
        g.set(0, gen, 0).unwrap();
    }

    fn counter(&self, i: u32) -> u64 {
        let a: PerCpuArray<&MapData, u64> =
            PerCpuArray::try_from(self.ebpf.map(abi::MAP_COUNTERS).unwrap()).unwrap();
        a.get(&i, 0).unwrap().iter().sum()
    }

    /// Runs `prog` on `frame` (optionally with `__sk_buff.ifindex`): (verdict, frame out).
    fn run(&self, prog: &str, frame: &[u8], ifindex: Option<u32>) -> (u32, Vec<u8>) {
        self.run_from(prog, frame, ifindex, None)
    }

    /// [`Harness::run`], also with `__sk_buff.ingress_ifindex` (the device a packet came in
    /// on; 0 for what the host itself sends).
    fn run_from(
        &self,
        prog: &str,
        frame: &[u8],
        ifindex: Option<u32>,
        ingress_ifindex: Option<u32>,
    ) -> (u32, Vec<u8>) {
        let p: &SchedClassifier = self.ebpf.program(prog).unwrap().try_into().unwrap();
        let mut out = vec![0u8; frame.len() + 256];
        // struct __sk_buff up to and including `ifindex` (offset 40; ingress_ifindex at 36).
        let mut ctx = [0u8; 44];
        if let Some(i) = ifindex {
            ctx[40..44].copy_from_slice(&i.to_ne_bytes());
        }
        if let Some(i) = ingress_ifindex {
            ctx[36..40].copy_from_slice(&i.to_ne_bytes());
        }
        let with_ctx = ifindex.is_some() || ingress_ifindex.is_some();
        let r = p
            .test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                ctx_in: with_ctx.then_some(&ctx[..]),
                ..Default::default()
            })
            .expect("BPF_PROG_TEST_RUN");
        out.truncate(r.data_size_out as usize);
        (r.return_value, out)
    }
}

fn eth(dst: [u8; 6], src: [u8; 6], proto: u16) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&dst);
    v.extend_from_slice(&src);
    v.extend_from_slice(&proto.to_be_bytes());
    v
}

/// Ethernet + IPv4 + UDP (checksums left zero: the programs do not check them).
fn udp_frame(src: Ipv4Addr, dst: Ipv4Addr, dst_mac: [u8; 6]) -> Vec<u8> {
    let mut v = eth(dst_mac, SRC_POD_MAC, 0x0800);
    let payload = b"nsfast";
    let tot = 20 + 8 + payload.len() as u16;
    v.extend_from_slice(&[0x45, 0]);
    v.extend_from_slice(&tot.to_be_bytes());
    v.extend_from_slice(&[0, 1, 0x40, 0, 64, 17, 0, 0]);
    v.extend_from_slice(&src.octets());
    v.extend_from_slice(&dst.octets());
    let sum = ip_checksum(&v[14..34]);
    v[24..26].copy_from_slice(&sum.to_be_bytes());
    v.extend_from_slice(&4000u16.to_be_bytes());
    v.extend_from_slice(&5000u16.to_be_bytes());
    v.extend_from_slice(&(8 + payload.len() as u16).to_be_bytes());
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(payload);
    v
}

/// The IPv4 header checksum of `hdr` (with its checksum field as it is: 0 to compute, the
/// stored value to verify, which then gives 0).
fn ip_checksum(hdr: &[u8]) -> u16 {
    let mut sum: u32 = hdr
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// `f` with its TTL set to `ttl` and the header checksum recomputed.
fn with_ttl(f: &[u8], ttl: u8) -> Vec<u8> {
    let mut v = f.to_vec();
    v[22] = ttl;
    v[24..26].copy_from_slice(&[0, 0]);
    let sum = ip_checksum(&v[14..34]);
    v[24..26].copy_from_slice(&sum.to_be_bytes());
    v
}

/// Checks that `out` is `orig` with the TTL one lower and a valid header checksum.
fn assert_routed(orig: &[u8], out: &[u8]) {
    assert_eq!(out[22], orig[22] - 1, "TTL decremented");
    assert_eq!(
        ip_checksum(&out[14..34]),
        0,
        "IPv4 header checksum still valid"
    );
    let mut a = orig[14..].to_vec();
    let mut b = out[14..].to_vec();
    for v in [&mut a, &mut b] {
        v[8] = 0;
        v[10] = 0;
        v[11] = 0;
    }
    assert_eq!(a, b, "nothing else in the IP packet changed");
}

fn arp_request(sender_mac: [u8; 6], sip: Ipv4Addr, tip: Ipv4Addr) -> Vec<u8> {
    let mut v = eth([0xff; 6], sender_mac, 0x0806);
    v.extend_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 1]);
    v.extend_from_slice(&sender_mac);
    v.extend_from_slice(&sip.octets());
    v.extend_from_slice(&[0; 6]);
    v.extend_from_slice(&tip.octets());
    v
}

/// Ethernet + IPv6 + `next` header `nh` with `payload` (hop limit `hl`).
fn ip6_frame(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    dst_mac: [u8; 6],
    nh: u8,
    hl: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut v = eth(dst_mac, SRC_POD_MAC, 0x86dd);
    v.extend_from_slice(&[0x60, 0, 0, 0]);
    v.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    v.extend_from_slice(&[nh, hl]);
    v.extend_from_slice(&src.octets());
    v.extend_from_slice(&dst.octets());
    v.extend_from_slice(payload);
    v
}

/// Ethernet + IPv6 + UDP (checksum left zero).
fn udp6_frame(src: Ipv6Addr, dst: Ipv6Addr, dst_mac: [u8; 6]) -> Vec<u8> {
    let mut udp = Vec::new();
    udp.extend_from_slice(&4000u16.to_be_bytes());
    udp.extend_from_slice(&5000u16.to_be_bytes());
    udp.extend_from_slice(&14u16.to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(b"nsfast");
    ip6_frame(src, dst, dst_mac, 17, 64, &udp)
}

/// The ICMPv6 checksum of `msg` (RFC 8200 8.1 pseudo header): with the checksum field 0 it
/// computes it; over a message with its checksum it gives 0 if the checksum is right.
fn icmp6_checksum(src: &[u8], dst: &[u8], msg: &[u8]) -> u16 {
    let mut b = Vec::new();
    b.extend_from_slice(src);
    b.extend_from_slice(dst);
    b.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    b.extend_from_slice(&[0, 0, 0, 58]);
    b.extend_from_slice(msg);
    if b.len() % 2 == 1 {
        b.push(0);
    }
    ip_checksum(&b)
}

/// An ICMPv6 message from `src` to `dst` (hop limit `hl`), checksum filled in.
fn icmp6_frame(src: Ipv6Addr, dst: Ipv6Addr, hl: u8, mut msg: Vec<u8>) -> Vec<u8> {
    msg[2..4].copy_from_slice(&[0, 0]);
    let c = icmp6_checksum(&src.octets(), &dst.octets(), &msg);
    msg[2..4].copy_from_slice(&c.to_be_bytes());
    ip6_frame(src, dst, [0x33, 0x33, 0xff, 0, 0, 1], 58, hl, &msg)
}

/// A neighbour solicitation from `src` for `target` (to its solicited-node group), with a
/// source link-layer address option if `sllao`.
fn ns_frame(src: Ipv6Addr, target: Ipv6Addr, sllao: bool) -> Vec<u8> {
    let t = target.octets();
    let group = Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(t[13]),
        u16::from_be_bytes([t[14], t[15]]),
    );
    let mut msg = vec![135, 0, 0, 0, 0, 0, 0, 0];
    msg.extend_from_slice(&t);
    if sllao {
        msg.extend_from_slice(&[1, 1]);
        msg.extend_from_slice(&SRC_POD_MAC);
    }
    icmp6_frame(src, group, 255, msg)
}

/// An ICMPv6 message of `typ` with `target` (NA: flags S|O; RA/redirect: the same layout is
/// enough for the type check).
fn nd_frame(typ: u8, src: Ipv6Addr, dst: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let mut msg = vec![typ, 0, 0, 0, 0x60, 0, 0, 0];
    msg.extend_from_slice(&target.octets());
    icmp6_frame(src, dst, 255, msg)
}

/// Checks that `out` is a neighbour advertisement for `target` from the host (`host_mac`) to
/// `pod_ip` at `pod_mac`, with a correct ICMPv6 checksum.
fn assert_na(out: &[u8], target: Ipv6Addr, pod_ip: Ipv6Addr, pod_mac: [u8; 6], host_mac: [u8; 6]) {
    assert_eq!(
        out.len(),
        14 + 40 + 32,
        "Ethernet + IPv6 + NA + TLLAO: {out:02x?}"
    );
    assert_eq!(&out[0..6], &pod_mac, "to the asking pod's MAC");
    assert_eq!(&out[6..12], &host_mac, "from the host-side MAC");
    assert_eq!(&out[12..14], &[0x86, 0xdd]);
    assert_eq!(out[14] >> 4, 6, "IPv6");
    assert_eq!(&out[18..20], &32u16.to_be_bytes(), "payload length");
    assert_eq!(out[20], 58, "ICMPv6");
    assert_eq!(out[21], 255, "hop limit 255 (RFC 4861 7.1.2)");
    assert_eq!(&out[22..38], &target.octets(), "source = the target");
    assert_eq!(
        &out[38..54],
        &pod_ip.octets(),
        "destination = the solicitor"
    );
    let na = &out[54..];
    assert_eq!(na[0], 136, "neighbour advertisement");
    assert_eq!(na[1], 0, "code 0");
    assert_eq!(na[4], 0xe0, "router, solicited, override");
    assert_eq!(&na[8..24], &target.octets(), "target");
    assert_eq!(&na[24..26], &[2, 1], "target link-layer address option");
    assert_eq!(&na[26..32], &host_mac, "target MAC = the host-side MAC");
    assert_eq!(
        icmp6_checksum(&out[22..38], &out[38..54], na),
        0,
        "ICMPv6 checksum of {na:02x?}"
    );
    assert_ne!(&na[2..4], &[0, 0], "checksum filled in");
}

/// Runs `f` on a thread inside a throwaway namespace.
fn in_netns(f: impl FnOnce() + Send) {
    require_root();
    let ns = NetNs::create(&unique("pb")).expect("netns");
    ns.run(f).expect("test body");
}

#[test]
fn pod_to_local_pod_is_redirected_into_the_peer_untouched() {
    in_netns(|| {
        let h = Harness::new().with_pods();
        let f = udp_frame(POD_B, POD_A, SRC_HOST_MAC);
        let (rc, out) = h.run(abi::PROG_FROM_CONTAINER, &f, None);
        assert_eq!(rc, TC_ACT_REDIRECT);
        // bpf_redirect_peer scrubs the skb to PACKET_HOST; writing the TTL or a MAC would
        // copy the head of every (cloned) TCP segment, which is what the fast path avoids.
        assert_eq!(out, f, "a hop inside one host leaves the frame as it is");
        assert_eq!(h.counter(cnt::POD_TO_POD), 1);
        assert_eq!(h.counter(cnt::POD_TO_STACK), 0);
        // TTL 1 between local pods: delivered like a bridge would; from the wire (a routed
        // hop): left to the stack, which answers with ICMP time exceeded.
        let ttl1 = with_ttl(&f, 1);
        assert_eq!(
            h.run(abi::PROG_FROM_CONTAINER, &ttl1, None),
            (TC_ACT_REDIRECT, ttl1.clone())
        );
        assert_eq!(h.counter(cnt::POD_TO_POD), 2);
        let wire_ttl1 = with_ttl(
            &udp_frame(
                Ipv4Addr::new(10, 251, 2, 10),
                POD_A,
                [0x02, 0, 0, 0, 0, 0xee],
            ),
            1,
        );
        assert_eq!(
            h.run(abi::PROG_FROM_WIRE, &wire_ttl1, None),
            (TC_ACT_OK, wire_ttl1)
        );
        assert_eq!(h.counter(cnt::WIRE_TO_POD), 0);
    });
}

#[test]
fn unknown_destination_without_route_goes_to_the_stack_unchanged() {
    in_netns(|| {
        let h = Harness::new().with_pods();
        let f = udp_frame(POD_B, Ipv4Addr::new(10, 9, 9, 9), SRC_HOST_MAC);
        let (rc, out) = h.run(abi::PROG_FROM_CONTAINER, &f, None);
        assert_eq!(rc, TC_ACT_OK);
        assert_eq!(out, f);
        assert_eq!(h.counter(cnt::POD_TO_STACK), 1);
        assert_eq!(h.counter(cnt::POD_TO_POD), 0);
    });
}

#[test]
fn arp_request_from_a_pod_is_answered_with_the_host_mac() {
    in_netns(|| {
        let h = Harness::new().with_pods();
        let gw = Ipv4Addr::new(169, 254, 1, 1);
        let f = arp_request(SRC_POD_MAC, POD_B, gw);
        let (rc, out) = h.run(abi::PROG_FROM_CONTAINER, &f, None);
        assert_eq!(
            rc, TC_ACT_REDIRECT,
            "sent back out of the asking pod's host device"
        );
        assert_eq!(&out[0..6], &SRC_POD_MAC);
        assert_eq!(&out[6..12], &SRC_HOST_MAC);
        assert_eq!(&out[20..22], &[0, 2], "ARP reply");
        assert_eq!(&out[22..28], &SRC_HOST_MAC, "sender MAC = host-side MAC");
        assert_eq!(&out[28..32], &gw.octets(), "sender IP = the asked address");
        assert_eq!(&out[32..38], &SRC_POD_MAC);
        assert_eq!(&out[38..42], &POD_B.octets());
        assert_eq!(h.counter(cnt::ARP_REPLY), 1);

        // Gratuitous ARP from the pod's own address is left to the stack.
        let g = arp_request(SRC_POD_MAC, POD_B, POD_B);
        assert_eq!(h.run(abi::PROG_FROM_CONTAINER, &g, None), (TC_ACT_OK, g));
        assert_eq!(h.counter(cnt::ARP_REPLY), 1);
        assert_eq!(h.counter(cnt::SPOOFED), 0);
    });
}

#[test]
fn arp_with_a_foreign_sender_ip_is_not_answered_and_counted_as_spoofed() {
    in_netns(|| {
        let h = Harness::new().with_pods();
        let gw = Ipv4Addr::new(169, 254, 1, 1);
        // Pod B (on LO) claims pod A's address (A's device is 100), then an address no pod has.
        for (i, sip) in [POD_A, Ipv4Addr::new(10, 9, 9, 9)].into_iter().enumerate() {
            let f = arp_request(SRC_POD_MAC, sip, gw);
            assert_eq!(
                h.run(abi::PROG_FROM_CONTAINER, &f, None),
                (TC_ACT_SHOT, f.clone()),
                "ARP request with sender {sip} from pod B's device"
            );
            assert_eq!(
                h.run(abi::PROG_NETKIT_PEER_L2, &f, None).0,
                NETKIT_DROP,
                "netkit L2, sender {sip}"
            );
            assert_eq!(h.counter(cnt::SPOOFED), 3 * i as u64 + 2);
            // Gratuitous ARP claiming the foreign address: dropped too.
            let g = arp_request(SRC_POD_MAC, sip, sip);
            assert_eq!(h.run(abi::PROG_FROM_CONTAINER, &g, None).0, TC_ACT_SHOT);
            assert_eq!(h.counter(cnt::SPOOFED), 3 * i as u64 + 3);
        }
        assert_eq!(h.counter(cnt::ARP_REPLY), 0);
        // The pod's own sender IP is answered.
        let own = arp_request(SRC_POD_MAC, POD_B, gw);
        assert_eq!(
            h.run(abi::PROG_FROM_CONTAINER, &own, None).0,
            TC_ACT_REDIRECT
        );
        assert_eq!(
            h.run(abi::PROG_NETKIT_PEER_L2, &own, None).0,
            TC_ACT_REDIRECT
        );
        assert_eq!(h.counter(cnt::ARP_REPLY), 2);
    });
}

#[test]
fn spoofed_source_is_dropped_and_counted_own_source_is_redirected() {
    in_netns(|| {
        let mut h = Harness::new().with_pods();
        let pod_c = Ipv4Addr::new(10, 251, 1, 12);
        h.endpoint(
            pod_c,
            Endpoint {
                ifindex: 102,
                flags: 0,
                pod_mac: [0x02, 0, 0, 0, 0, 0xa3],
                host_mac: [0x02, 0, 0, 0, 0, 0xb3],
            },
        );
        // From pod B's device (LO): pod C's address (another local pod) and an address no pod
        // has, to a local pod (A), a remote address and a host address.
        let mut spoofed = 0;
        for src in [pod_c, Ipv4Addr::new(10, 9, 9, 9)] {
            for dst in [
                POD_A,
                Ipv4Addr::new(10, 77, 1, 1),
                Ipv4Addr::new(127, 0, 0, 1),
            ] {
                let f = udp_frame(src, dst, SRC_HOST_MAC);
                for (prog, drop) in [
                    (abi::PROG_FROM_CONTAINER, TC_ACT_SHOT),
                    (abi::PROG_NETKIT_PEER_L2, NETKIT_DROP),
                    (abi::PROG_NETKIT_PEER_L3, NETKIT_DROP),
                ] {
                    assert_eq!(
                        h.run(prog, &f, None),
                        (drop, f.clone()),
                        "{prog}: {src} -> {dst} from pod B's device"
                    );
                    spoofed += 1;
                    assert_eq!(h.counter(cnt::SPOOFED), spoofed);
                }
            }
        }
        assert_eq!(h.counter(cnt::POD_TO_POD), 0);
        assert_eq!(h.counter(cnt::POD_TO_STACK), 0);
        assert_eq!(h.counter(cnt::FIB_NEIGH) + h.counter(cnt::FIB_REDIRECT), 0);
        // Pod B's own address from its own device: redirected into pod A as before.
        let own = udp_frame(POD_B, POD_A, SRC_HOST_MAC);
        assert_eq!(
            h.run(abi::PROG_FROM_CONTAINER, &own, None),
            (TC_ACT_REDIRECT, own.clone())
        );
        assert_eq!(
            h.run(abi::PROG_NETKIT_PEER_L3, &own, None).0,
            TC_ACT_REDIRECT
        );
        assert_eq!(h.counter(cnt::POD_TO_POD), 2);
        // The same frame when pod B's address belongs to another device (102) than the one it
        // arrives on (LO): refused.
        let mut h2 = Harness::new();
        h2.endpoint(
            POD_B,
            Endpoint {
                ifindex: 102,
                ..Default::default()
            },
        );
        assert_eq!(h2.run(abi::PROG_FROM_CONTAINER, &own, None).0, TC_ACT_SHOT);
        assert_eq!(h2.counter(cnt::SPOOFED), 1);
        assert_eq!(h.counter(cnt::SPOOFED), spoofed);
    });
}

#[test]
fn wire_frame_claiming_a_local_pod_source_is_dropped() {
    in_netns(|| {
        let h = Harness::new().with_pods();
        let f = udp_frame(POD_B, POD_A, [0x02, 0, 0, 0, 0, 0xee]);
        assert_eq!(h.run(abi::PROG_FROM_WIRE, &f, None), (TC_ACT_SHOT, f));
        assert_eq!(h.counter(cnt::SPOOFED), 1);
        assert_eq!(h.counter(cnt::WIRE_TO_POD), 0);
    });
}

#[test]
fn host_firewall_pods_go_to_the_stack_after_the_source_check() {
    in_netns(|| {
        let mut h = Harness::new().with_pods();
        let to_a = udp_frame(POD_B, POD_A, SRC_HOST_MAC);
        // Destination A asks for the host firewall: B -> A goes to the stack, untouched.
        h.endpoint(
            POD_A,
            Endpoint {
                ifindex: 100,
                flags: abi::EP_HOST_FW,
                pod_mac: POD_MAC,
                host_mac: HOST_MAC,
            },
        );
        assert_eq!(
            h.run(abi::PROG_FROM_CONTAINER, &to_a, None),
            (TC_ACT_OK, to_a.clone())
        );
        assert_eq!(h.run(abi::PROG_NETKIT_PEER_L2, &to_a, None).0, NETKIT_NEXT);
        let wire = udp_frame(
            Ipv4Addr::new(10, 251, 2, 10),
            POD_A,
            [0x02, 0, 0, 0, 0, 0xee],
        );
        assert_eq!(h.run(abi::PROG_FROM_WIRE, &wire, None), (TC_ACT_OK, wire));
        assert_eq!(h.counter(cnt::WIRE_TO_STACK), 1);
        assert_eq!(h.counter(cnt::WIRE_TO_POD), 0);
        // Source B asks for it (A does not): B -> A and B -> remote go to the stack.
        h.endpoint(
            POD_A,
            Endpoint {
                ifindex: 100,
                flags: 0,
                pod_mac: POD_MAC,
                host_mac: HOST_MAC,
            },
        );
        h.endpoint(
            POD_B,
            Endpoint {
                ifindex: LO,
                flags: abi::EP_HOST_FW,
                pod_mac: SRC_POD_MAC,
                host_mac: SRC_HOST_MAC,
            },
        );
        assert_eq!(
            h.run(abi::PROG_FROM_CONTAINER, &to_a, None),
            (TC_ACT_OK, to_a.clone())
        );
        let remote = udp_frame(POD_B, Ipv4Addr::new(10, 77, 1, 1), SRC_HOST_MAC);
        assert_eq!(
            h.run(abi::PROG_FROM_CONTAINER, &remote, None),
            (TC_ACT_OK, remote)
        );
        assert_eq!(h.counter(cnt::POD_TO_STACK), 4);
        assert_eq!(h.counter(cnt::POD_TO_POD), 0);
        // The source check still applies: B's device claiming A's address is dropped.
        let spoof = udp_frame(POD_A, POD_B, SRC_HOST_MAC);
        assert_eq!(h.run(abi::PROG_FROM_CONTAINER, &spoof, None).0, TC_ACT_SHOT);
        assert_eq!(h.counter(cnt::SPOOFED), 1);
        // ARP is still answered for a host-firewall pod.
        let arp = arp_request(SRC_POD_MAC, POD_B, Ipv4Addr::new(169, 254, 1, 1));
        assert_eq!(
            h.run(abi::PROG_FROM_CONTAINER, &arp, None).0,
            TC_ACT_REDIRECT
        );
    });
}

#[test]
fn ipv6_other_ethertypes_and_malformed_frames_from_a_pod_are_dropped() {
    in_netns(|| {
        let h = Harness::new().with_pods();
        // These pods are IPv4-only: IPv6 from them has no address of theirs as its source
        // (the host stack would take it with any source).
        let mut v6 = eth(SRC_HOST_MAC, SRC_POD_MAC, 0x86dd);
        v6.extend_from_slice(&[0x60; 40]);
        assert_eq!(
            h.run(abi::PROG_FROM_CONTAINER, &v6, None),
            (TC_ACT_SHOT, v6.clone())
        );
        assert_eq!(h.run(abi::PROG_NETKIT_PEER_L3, &v6, None).0, NETKIT_DROP);
        assert_eq!(h.counter(cnt::SPOOFED), 2);
        let mut other = eth(SRC_HOST_MAC, SRC_POD_MAC, 0x88cc); // LLDP
        other.extend_from_slice(&[0; 40]);
        assert_eq!(h.run(abi::PROG_FROM_CONTAINER, &other, None).0, TC_ACT_SHOT);
        assert_eq!(h.counter(cnt::NOT_IPV4), 1);
        // An IPv4 header with a bad IHL (< 5) to a known pod: dropped, not redirected.
        let mut bad = udp_frame(POD_B, POD_A, SRC_HOST_MAC);
        bad[14] = 0x44;
        assert_eq!(
            h.run(abi::PROG_FROM_CONTAINER, &bad, None),
            (TC_ACT_SHOT, bad)
        );
        // An ARP frame that is not Ethernet/IPv4 ARP (hlen 8).
        let mut arp = arp_request(SRC_POD_MAC, POD_B, Ipv4Addr::new(169, 254, 1, 1));
        arp[18] = 8;
        assert_eq!(h.run(abi::PROG_FROM_CONTAINER, &arp, None).0, TC_ACT_SHOT);
        assert_eq!(h.counter(cnt::NOT_IPV4), 3);
        assert_eq!(h.counter(cnt::POD_TO_POD), 0);
        assert_eq!(h.counter(cnt::SPOOFED), 2);
    });
}

#[test]
fn wire_to_pod_is_redirected_into_the_pod_and_others_go_to_the_stack() {
    in_netns(|| {
        let mut h = Harness::new().with_pods();
        let wire_mac = [0x02, 0, 0, 0, 0, 0xee];
        let f = udp_frame(Ipv4Addr::new(10, 251, 2, 10), POD_A, wire_mac);
        let (rc, out) = h.run(abi::PROG_FROM_WIRE, &f, None);
        assert_eq!(rc, TC_ACT_REDIRECT);
        assert_eq!(
            &out[0..12],
            &f[0..12],
            "MACs untouched (the peer redirect ignores them)"
        );
        assert_routed(&f, &out);
        assert_eq!(h.counter(cnt::WIRE_TO_POD), 1);

        let other = udp_frame(
            Ipv4Addr::new(10, 251, 2, 10),
            Ipv4Addr::new(10, 250, 0, 1),
            wire_mac,
        );
        assert_eq!(h.run(abi::PROG_FROM_WIRE, &other, None), (TC_ACT_OK, other));
        assert_eq!(h.counter(cnt::WIRE_TO_STACK), 1);

        // An L3 (netkit) pod's device is an Ethernet device too: redirected like the others.
        let l3 = Ipv4Addr::new(10, 251, 1, 30);
        h.endpoint(
            l3,
            Endpoint {
                ifindex: 102,
                flags: abi::EP_NETKIT | abi::EP_L3,
                ..Default::default()
            },
        );
        let f3 = udp_frame(Ipv4Addr::new(10, 251, 2, 10), l3, wire_mac);
        let (rc, _) = h.run(abi::PROG_FROM_WIRE, &f3, None);
        assert_eq!(rc, TC_ACT_REDIRECT, "wire -> L3 netkit pod");
        assert_eq!(h.counter(cnt::WIRE_TO_STACK), 1);
        assert_eq!(h.counter(cnt::WIRE_TO_POD), 2);
    });
}

#[test]
fn netkit_peer_program_uses_netkit_verdicts() {
    in_netns(|| {
        let h = Harness::new().with_pods();
        let f = udp_frame(POD_B, POD_A, SRC_HOST_MAC);
        let (rc, out) = h.run(abi::PROG_NETKIT_PEER_L2, &f, None);
        assert_eq!(
            rc, TC_ACT_REDIRECT,
            "NETKIT_REDIRECT == TC_ACT_REDIRECT == 7"
        );
        // netkit runs eth_type_trans for its peer: the MACs must be the pod's and the host's.
        assert_eq!(&out[0..6], &POD_MAC);
        assert_eq!(&out[6..12], &HOST_MAC);
        assert_eq!(&out[12..], &f[12..], "TTL kept, nothing else changed");
        // L3 netkit devices carry an Ethernet header too: the L3 program parses it.
        let (rc, out) = h.run(abi::PROG_NETKIT_PEER_L3, &f, None);
        assert_eq!(rc, TC_ACT_REDIRECT, "L3 peer program on an Ethernet frame");
        assert_eq!(&out[0..6], &POD_MAC);
        let other = udp_frame(POD_B, Ipv4Addr::new(10, 9, 9, 9), SRC_HOST_MAC);
        assert_eq!(
            h.run(abi::PROG_NETKIT_PEER_L2, &other, None),
            (NETKIT_NEXT, other.clone())
        );
        assert_eq!(h.run(abi::PROG_NETKIT_PRIMARY, &other, None).0, NETKIT_NEXT);
    });
}

/// pod -> wire: bpf_fib_lookup through a real route in a throwaway namespace.
#[test]
fn pod_to_remote_uses_the_fib_then_redirect_neigh_or_mac_rewrite() {
    require_root();
    let w = VethPair::new();
    let nl = w.client.netlink().unwrap();
    let dev = VethPair::CLIENT_IF;
    let ifindex = nl.link_index(dev).unwrap();
    let dev_mac = nl.link_mac(dev).unwrap();
    let remote = Ipv4Addr::new(10, 77, 1, 1);
    let gw = std::net::IpAddr::V4(VethPair::SERVER_V4);
    nl.add_route(
        std::net::IpAddr::V4(Ipv4Addr::new(10, 77, 0, 0)),
        16,
        Some(gw),
        None,
    )
    .unwrap();
    w.client
        .run(|| {
            let h = Harness::new().with_pods_on(ifindex);
            let f = udp_frame(POD_B, remote, SRC_HOST_MAC);

            // Forwarding off: bpf_fib_lookup refuses (FWD_DISABLED) -> stack.
            std::fs::write("/proc/sys/net/ipv4/ip_forward", "0").unwrap();
            assert_eq!(
                h.run(abi::PROG_FROM_CONTAINER, &f, Some(ifindex)),
                (TC_ACT_OK, f.clone())
            );
            assert_eq!(h.counter(cnt::POD_TO_STACK), 1);

            std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").unwrap();
            // No neighbour entry for the gateway yet: bpf_redirect_neigh.
            let (rc, _) = h.run(abi::PROG_FROM_CONTAINER, &f, Some(ifindex));
            assert_eq!(rc, TC_ACT_REDIRECT);
            assert_eq!(h.counter(cnt::FIB_NEIGH), 1);

            // Local destination: the stack.
            let local = udp_frame(POD_B, VethPair::CLIENT_V4, SRC_HOST_MAC);
            assert_eq!(
                h.run(abi::PROG_FROM_CONTAINER, &local, Some(ifindex)),
                (TC_ACT_OK, local)
            );
            assert_eq!(h.counter(cnt::POD_TO_STACK), 2);
        })
        .unwrap();
    // With a neighbour entry: MACs from the FIB, plain bpf_redirect.
    let gw_mac = [0x02, 0, 0, 0, 0, 0x77];
    nl.add_neighbour(dev, gw, gw_mac).unwrap();
    w.client
        .run(|| {
            let h = Harness::new().with_pods_on(ifindex);
            let f = udp_frame(POD_B, remote, SRC_HOST_MAC);
            let (rc, out) = h.run(abi::PROG_FROM_CONTAINER, &f, Some(ifindex));
            assert_eq!(rc, TC_ACT_REDIRECT);
            assert_eq!(&out[0..6], &gw_mac, "destination MAC = the gateway's");
            assert_eq!(&out[6..12], &dev_mac, "source MAC = the egress device's");
            assert_routed(&f, &out);
            assert_eq!(h.counter(cnt::FIB_REDIRECT), 1);
            assert_eq!(h.counter(cnt::FIB_NEIGH), 0);
        })
        .unwrap();
}

/// The raw netkit `BPF_LINK_CREATE` (`nsfast_sys::bpf::netkit`). On a netkit kernel (the VM
/// matrix): attaching the peer program on the primary's ifindex works, on the peer's ifindex
/// it is refused (EACCES), on a veth it is not a netkit device (ENXIO). Without netkit (this
/// host) the kernel's stub answers EINVAL, and nsfast never gets that far (see the probe).
#[test]
fn netkit_link_create_attaches_on_the_primary_only() {
    use nsfast_sys::bpf::netkit;
    use std::os::fd::AsFd;
    require_root();
    let w = VethPair::new();
    // From the harness (NSFAST_EXPECT_NETKIT / the kernel config), not the probe under test.
    let has_netkit = nsfast_lab::kernel::expect(nsfast_lab::kernel::Feature::Netkit);
    assert_eq!(
        net::probe_netkit().unwrap(),
        has_netkit,
        "netkit probe vs kernel config"
    );
    let pod = NetNs::create(&unique("nk")).unwrap();
    let (client_nl, pod_nl) = (w.client.netlink().unwrap(), pod.netlink().unwrap());
    if has_netkit {
        client_nl
            .create_netkit("nk0", "nktmp0", &pod_nl, "eth0", net::NetkitMode::L3)
            .unwrap();
    }
    let veth_idx = client_nl.link_index(VethPair::CLIENT_IF).unwrap();
    let nk_idx = has_netkit.then(|| client_nl.link_index("nk0").unwrap());
    w.client
        .run(|| {
            let h = Harness::new();
            let prog: &SchedClassifier = h
                .ebpf
                .program(abi::PROG_NETKIT_PEER_L3)
                .unwrap()
                .try_into()
                .unwrap();
            let fd = prog.fd().unwrap();
            let on_veth = netkit::link_create(fd.as_fd(), veth_idx, netkit::BPF_NETKIT_PEER)
                .expect_err("netkit attach on a veth");
            if let Some(idx) = nk_idx {
                assert_eq!(on_veth.raw_os_error(), Some(libc::ENXIO), "{on_veth}");
                let link = netkit::link_create(fd.as_fd(), idx, netkit::BPF_NETKIT_PEER)
                    .expect("netkit attach on the primary");
                drop(link); // closing the only reference detaches
            } else {
                assert_eq!(on_veth.raw_os_error(), Some(libc::EINVAL), "{on_veth}");
            }
        })
        .unwrap();
    if has_netkit {
        // The peer's ifindex is refused: programs go on the primary.
        let peer_idx = pod_nl.link_index("eth0").unwrap();
        pod.run(|| {
            let h = Harness::new();
            let prog: &SchedClassifier = h
                .ebpf
                .program(abi::PROG_NETKIT_PEER_L3)
                .unwrap()
                .try_into()
                .unwrap();
            let e = netkit::link_create(
                prog.fd().unwrap().as_fd(),
                peer_idx,
                netkit::BPF_NETKIT_PEER,
            )
            .expect_err("attach on the peer");
            assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
        })
        .unwrap();
    }
}

#[test]
fn ndp_solicitation_for_the_gateway_is_answered_with_a_checksummed_advertisement() {
    in_netns(|| {
        let h = Harness::new().with_dual_pods_on(LO);
        // With and without the source link-layer address option (the reply is longer than
        // the shorter request: the frame grows).
        for (i, sllao) in [true, false].into_iter().enumerate() {
            let f = ns_frame(POD_B6, GW6, sllao);
            let (rc, out) = h.run(abi::PROG_FROM_CONTAINER, &f, None);
            assert_eq!(rc, TC_ACT_REDIRECT, "sent back into the asking pod");
            assert_na(&out, GW6, POD_B6, SRC_POD_MAC, SRC_HOST_MAC);
            assert_eq!(h.counter(cnt::NDP_REPLY), i as u64 + 1);
        }
        // netkit L2 answers the same way.
        let f = ns_frame(POD_B6, GW6, true);
        let (rc, out) = h.run(abi::PROG_NETKIT_PEER_L2, &f, None);
        assert_eq!(rc, TC_ACT_REDIRECT);
        assert_na(&out, GW6, POD_B6, SRC_POD_MAC, SRC_HOST_MAC);
        // An on-link peer (a /64 pod asks for pod A directly): the host answers for it too,
        // as ARP does (everything goes via the host).
        let f = ns_frame(POD_B6, POD_A6, true);
        let (rc, out) = h.run(abi::PROG_FROM_CONTAINER, &f, None);
        assert_eq!(rc, TC_ACT_REDIRECT);
        assert_na(&out, POD_A6, POD_B6, SRC_POD_MAC, SRC_HOST_MAC);
        assert_eq!(h.counter(cnt::NDP_REPLY), 4);
        // Asking for its own address: left to the stack, not answered.
        let own = ns_frame(POD_B6, POD_B6, true);
        assert_eq!(
            h.run(abi::PROG_FROM_CONTAINER, &own, None),
            (TC_ACT_OK, own)
        );
        // Not hop limit 255 (RFC 4861: not from the link): dropped, not answered.
        let mut far = ns_frame(POD_B6, GW6, true);
        far[21] = 64;
        assert_eq!(h.run(abi::PROG_FROM_CONTAINER, &far, None).0, TC_ACT_SHOT);
        // The pod's link-local chatter (DAD from ::, an NS from fe80::...): dropped.
        for src in ["::", "fe80::aa:bb"] {
            let f = ns_frame(src.parse().unwrap(), GW6, false);
            assert_eq!(
                h.run(abi::PROG_FROM_CONTAINER, &f, None).0,
                TC_ACT_SHOT,
                "{src}"
            );
        }
        assert_eq!(h.counter(cnt::NOT_IPV4), 3);
        assert_eq!(h.counter(cnt::NDP_REPLY), 4);
        assert_eq!(h.counter(cnt::SPOOFED), 0);
    });
}

#[test]
fn ndp_and_router_messages_claiming_other_addresses_are_dropped_as_spoofed() {
    in_netns(|| {
        let h = Harness::new().with_dual_pods_on(LO);
        let host_ll: Ipv6Addr = "fe80::b1".parse().unwrap();
        let mut spoofed = 0;
        let mut check = |f: Vec<u8>, what: &str| {
            assert_eq!(
                h.run(abi::PROG_FROM_CONTAINER, &f, None),
                (TC_ACT_SHOT, f.clone()),
                "{what}"
            );
            spoofed += 1;
            assert_eq!(h.counter(cnt::SPOOFED), spoofed, "{what}");
        };
        // Pod B (on LO) solicits from pod A's address and from an address no pod has.
        check(ns_frame(POD_A6, GW6, true), "NS from pod A's address");
        check(
            ns_frame("fd51::1:0:0:99".parse().unwrap(), GW6, true),
            "NS from an unassigned address",
        );
        // ... advertises pod A's address and the gateway's, from its own address.
        check(nd_frame(136, POD_B6, host_ll, POD_A6), "NA for pod A");
        check(nd_frame(136, POD_B6, host_ll, GW6), "NA for the gateway");
        // ... poses as the gateway or as a router.
        check(nd_frame(136, GW6, host_ll, GW6), "NA from fe80::1");
        check(udp6_frame(GW6, POD_A6, SRC_HOST_MAC), "UDP from fe80::1");
        check(
            nd_frame(134, POD_B6, host_ll, POD_B6),
            "router advertisement",
        );
        check(nd_frame(137, POD_B6, host_ll, POD_A6), "redirect");
        assert_eq!(h.counter(cnt::NDP_REPLY), 0);
        // Its own address advertised (answering the host's solicitation): to the stack.
        let na = nd_frame(136, POD_B6, host_ll, POD_B6);
        assert_eq!(h.run(abi::PROG_FROM_CONTAINER, &na, None), (TC_ACT_OK, na));
        assert_eq!(h.counter(cnt::SPOOFED), spoofed);
    });
}

#[test]
fn ipv6_spoofed_source_is_dropped_and_own_source_is_redirected() {
    in_netns(|| {
        let mut h = Harness::new().with_dual_pods_on(LO);
        let pod_c6: Ipv6Addr = "fd51::1:0:0:12".parse().unwrap();
        h.endpoint6(
            pod_c6,
            Endpoint {
                ifindex: 102,
                ..Default::default()
            },
        );
        let mut spoofed = 0;
        for src in [pod_c6, "fd51::1:0:0:99".parse().unwrap()] {
            for dst in [POD_A6, "fd77::1".parse().unwrap(), "::1".parse().unwrap()] {
                let f = udp6_frame(src, dst, SRC_HOST_MAC);
                for (prog, drop) in [
                    (abi::PROG_FROM_CONTAINER, TC_ACT_SHOT),
                    (abi::PROG_NETKIT_PEER_L2, NETKIT_DROP),
                    (abi::PROG_NETKIT_PEER_L3, NETKIT_DROP),
                ] {
                    assert_eq!(
                        h.run(prog, &f, None),
                        (drop, f.clone()),
                        "{prog}: {src} -> {dst} from pod B's device"
                    );
                    spoofed += 1;
                    assert_eq!(h.counter(cnt::SPOOFED), spoofed);
                }
            }
        }
        assert_eq!(h.counter(cnt::POD_TO_POD), 0);
        assert_eq!(h.counter(cnt::POD_TO_STACK), 0);
        // Its own address: into pod A, untouched (veth), MACs rewritten (netkit).
        let own = udp6_frame(POD_B6, POD_A6, SRC_HOST_MAC);
        assert_eq!(
            h.run(abi::PROG_FROM_CONTAINER, &own, None),
            (TC_ACT_REDIRECT, own.clone())
        );
        let (rc, out) = h.run(abi::PROG_NETKIT_PEER_L2, &own, None);
        assert_eq!(rc, TC_ACT_REDIRECT);
        assert_eq!(&out[0..12], &[POD_MAC, HOST_MAC].concat());
        assert_eq!(&out[12..], &own[12..]);
        assert_eq!(h.counter(cnt::POD_TO_POD), 2);
        // To the host's own link (link-local, multicast): the stack.
        for dst in ["fe80::b1", "ff02::2"] {
            let f = udp6_frame(POD_B6, dst.parse().unwrap(), SRC_HOST_MAC);
            assert_eq!(h.run(abi::PROG_FROM_CONTAINER, &f, None), (TC_ACT_OK, f));
        }
        assert_eq!(h.counter(cnt::POD_TO_STACK), 2);
        // An IPv4-only pod (no IPv6 entry) sending IPv6 from any address: dropped.
        let mut h4 = Harness::new().with_pods();
        h4.endpoint6(
            POD_A6,
            Endpoint {
                ifindex: 100,
                ..Default::default()
            },
        );
        let f = udp6_frame(POD_B6, POD_A6, SRC_HOST_MAC);
        assert_eq!(h4.run(abi::PROG_FROM_CONTAINER, &f, None).0, TC_ACT_SHOT);
        assert_eq!(h4.counter(cnt::SPOOFED), 1);
        assert_eq!(h.counter(cnt::SPOOFED), spoofed);
    });
}

#[test]
fn ipv6_wire_to_pod_is_redirected_with_the_hop_limit_lowered() {
    in_netns(|| {
        let h = Harness::new().with_dual_pods_on(LO);
        let wire_mac = [0x02, 0, 0, 0, 0, 0xee];
        let remote: Ipv6Addr = "fd51::2:0:0:10".parse().unwrap();
        let f = udp6_frame(remote, POD_A6, wire_mac);
        let (rc, out) = h.run(abi::PROG_FROM_WIRE, &f, None);
        assert_eq!(rc, TC_ACT_REDIRECT);
        assert_eq!(out[21], f[21] - 1, "hop limit decremented");
        let (mut a, mut b) = (f.clone(), out.clone());
        a[21] = 0;
        b[21] = 0;
        assert_eq!(a, b, "nothing else changed");
        assert_eq!(h.counter(cnt::WIRE_TO_POD), 1);
        // Hop limit 1: the stack (ICMPv6 time exceeded).
        let mut hl1 = f.clone();
        hl1[21] = 1;
        assert_eq!(h.run(abi::PROG_FROM_WIRE, &hl1, None), (TC_ACT_OK, hl1));
        // Not a pod: the stack. Claiming a local pod's source: dropped.
        let other = udp6_frame(remote, "fd51::9".parse().unwrap(), wire_mac);
        assert_eq!(h.run(abi::PROG_FROM_WIRE, &other, None), (TC_ACT_OK, other));
        assert_eq!(h.counter(cnt::WIRE_TO_STACK), 2);
        let spoof = udp6_frame(POD_B6, POD_A6, wire_mac);
        assert_eq!(
            h.run(abi::PROG_FROM_WIRE, &spoof, None),
            (TC_ACT_SHOT, spoof)
        );
        assert_eq!(h.counter(cnt::SPOOFED), 1);
        assert_eq!(h.counter(cnt::WIRE_TO_POD), 1);
    });
}

/// pod -> wire over IPv6: bpf_fib_lookup (AF_INET6) through a real route.
#[test]
fn ipv6_pod_to_remote_uses_the_fib_then_redirect_neigh_or_mac_rewrite() {
    require_root();
    let w = VethPair::new();
    let nl = w.client.netlink().unwrap();
    let dev = VethPair::CLIENT_IF;
    let ifindex = nl.link_index(dev).unwrap();
    let dev_mac = nl.link_mac(dev).unwrap();
    let remote: Ipv6Addr = "fd77::1".parse().unwrap();
    let gw = std::net::IpAddr::V6(VethPair::SERVER_V6);
    nl.add_route("fd77::".parse().unwrap(), 16, Some(gw), None)
        .unwrap();
    let fwd = "/proc/sys/net/ipv6/conf/all/forwarding";
    w.client
        .run(|| {
            let h = Harness::new().with_dual_pods_on(ifindex);
            let f = udp6_frame(POD_B6, remote, SRC_HOST_MAC);
            std::fs::write(fwd, "0").unwrap();
            assert_eq!(
                h.run(abi::PROG_FROM_CONTAINER, &f, Some(ifindex)),
                (TC_ACT_OK, f.clone()),
                "forwarding off: the stack"
            );
            std::fs::write(fwd, "1").unwrap();
            let (rc, _) = h.run(abi::PROG_FROM_CONTAINER, &f, Some(ifindex));
            assert_eq!(rc, TC_ACT_REDIRECT);
            assert_eq!(
                h.counter(cnt::FIB_NEIGH),
                1,
                "no neighbour: bpf_redirect_neigh"
            );
            let local = udp6_frame(POD_B6, VethPair::CLIENT_V6, SRC_HOST_MAC);
            assert_eq!(
                h.run(abi::PROG_FROM_CONTAINER, &local, Some(ifindex)),
                (TC_ACT_OK, local)
            );
            assert_eq!(h.counter(cnt::POD_TO_STACK), 2);
        })
        .unwrap();
    let gw_mac = [0x02, 0, 0, 0, 0, 0x77];
    nl.add_neighbour(dev, gw, gw_mac).unwrap();
    w.client
        .run(|| {
            let h = Harness::new().with_dual_pods_on(ifindex);
            let f = udp6_frame(POD_B6, remote, SRC_HOST_MAC);
            let (rc, out) = h.run(abi::PROG_FROM_CONTAINER, &f, Some(ifindex));
            assert_eq!(rc, TC_ACT_REDIRECT);
            assert_eq!(&out[0..6], &gw_mac, "destination MAC = the gateway's");
            assert_eq!(&out[6..12], &dev_mac, "source MAC = the egress device's");
            assert_eq!(out[21], f[21] - 1, "hop limit decremented");
            assert_eq!(&out[22..], &f[22..]);
            assert_eq!(h.counter(cnt::FIB_REDIRECT), 1);
        })
        .unwrap();
}

/// Pod B's and pod A's link-local addresses (as `add` makes them: endpoint entries like
/// their global addresses').
fn ll_b() -> Ipv6Addr {
    nsfast_pod::pod::pod_link_local(POD_B6)
}
fn ll_a() -> Ipv6Addr {
    nsfast_pod::pod::pod_link_local(POD_A6)
}

impl Harness {
    /// [`Harness::with_dual_pods_on`] plus both pods' link-local endpoint entries.
    fn with_link_locals_on(mut self, src_ifindex: u32) -> Self {
        self = self.with_dual_pods_on(src_ifindex);
        for (ip, ifindex, pod_mac, host_mac) in [
            (ll_a(), 100, POD_MAC, HOST_MAC),
            (ll_b(), src_ifindex, SRC_POD_MAC, SRC_HOST_MAC),
        ] {
            self.endpoint6(
                ip,
                Endpoint {
                    ifindex,
                    flags: 0,
                    pod_mac,
                    host_mac,
                },
            );
        }
        self
    }
}

#[test]
fn ndp_from_a_pods_own_link_local_address_is_answered_and_anothers_is_spoofed() {
    in_netns(|| {
        let h = Harness::new().with_link_locals_on(LO);
        assert!(ll_b().segments()[0] == 0xfe80 && ll_b() != ll_a());
        // The pod kernel's solicitation for the gateway from its link-local address
        // (multicast, and the unicast probe of a stale entry): answered, to that address.
        let f = ns_frame(ll_b(), GW6, true);
        let (rc, out) = h.run(abi::PROG_FROM_CONTAINER, &f, None);
        assert_eq!(rc, TC_ACT_REDIRECT, "{out:02x?}");
        assert_na(&out, GW6, ll_b(), SRC_POD_MAC, SRC_HOST_MAC);
        let mut msg = vec![135, 0, 0, 0, 0, 0, 0, 0];
        msg.extend_from_slice(&GW6.octets());
        let mut probe = icmp6_frame(ll_b(), GW6, 255, msg);
        probe[0..6].copy_from_slice(&SRC_HOST_MAC);
        let (rc, out) = h.run(abi::PROG_FROM_CONTAINER, &probe, None);
        assert_eq!(rc, TC_ACT_REDIRECT);
        assert_na(&out, GW6, ll_b(), SRC_POD_MAC, SRC_HOST_MAC);
        // netkit L2 the same.
        let (rc, out) = h.run(abi::PROG_NETKIT_PEER_L2, &f, None);
        assert_eq!(rc, TC_ACT_REDIRECT);
        assert_na(&out, GW6, ll_b(), SRC_POD_MAC, SRC_HOST_MAC);
        assert_eq!(h.counter(cnt::NDP_REPLY), 3);
        // Its own address advertised from its link-local one: to the stack.
        let na = nd_frame(136, ll_b(), "fe80::b1".parse().unwrap(), POD_B6);
        assert_eq!(h.run(abi::PROG_FROM_CONTAINER, &na, None), (TC_ACT_OK, na));
        assert_eq!(h.counter(cnt::SPOOFED), 0);
        // Pod B using pod A's link-local address, or advertising pod A's / the gateway's
        // address, or a router advertisement, from its own: spoofed.
        let mut spoofed = 0;
        for (f, what) in [
            (
                ns_frame(ll_a(), GW6, true),
                "NS from pod A's link-local address",
            ),
            (nd_frame(136, ll_b(), GW6, POD_A6), "NA for pod A"),
            (nd_frame(136, ll_b(), GW6, GW6), "NA for the gateway"),
            (nd_frame(134, ll_b(), GW6, POD_B6), "router advertisement"),
            (
                udp6_frame(ll_a(), POD_A6, SRC_HOST_MAC),
                "UDP from pod A's link-local",
            ),
        ] {
            assert_eq!(
                h.run(abi::PROG_FROM_CONTAINER, &f, None).0,
                TC_ACT_SHOT,
                "{what}"
            );
            spoofed += 1;
            assert_eq!(h.counter(cnt::SPOOFED), spoofed, "{what}");
        }
        // Anything but NDP from its own link-local address: dropped, not routed.
        let before = h.counter(cnt::NOT_IPV4);
        let u = udp6_frame(ll_b(), POD_A6, SRC_HOST_MAC);
        assert_eq!(h.run(abi::PROG_FROM_CONTAINER, &u, None).0, TC_ACT_SHOT);
        assert_eq!(h.counter(cnt::NOT_IPV4), before + 1);
        assert_eq!(h.counter(cnt::POD_TO_POD), 0);
        assert_eq!(h.counter(cnt::NDP_REPLY), 3);
        // From the wire, a pod's link-local address is no destination: the stack.
        let w = udp6_frame("fd51:2::9".parse().unwrap(), ll_a(), HOST_MAC);
        assert_eq!(h.run(abi::PROG_FROM_WIRE, &w, None), (TC_ACT_OK, w));
        assert_eq!(h.counter(cnt::WIRE_TO_POD), 0);
    });
}

/// `payload` behind the extension headers `exts` (each: its number and its body after the
/// next-header byte, `None` for a fragment header with `offset`): what `ip6_frame` carries.
fn behind_exts(exts: &[(u8, u16)], upper: u8, payload: &[u8]) -> (u8, Vec<u8>) {
    let mut body = Vec::new();
    for (i, (_, frag_off)) in exts.iter().enumerate() {
        let next = exts.get(i + 1).map_or(upper, |e| e.0);
        if exts[i].0 == 44 {
            body.push(next);
            body.push(0);
            body.extend_from_slice(&(frag_off << 3).to_be_bytes());
            body.extend_from_slice(&[0, 0, 0, 7]);
        } else {
            // Hop-by-hop / destination options / routing layout, 8 bytes: PadN.
            body.extend_from_slice(&[next, 0, 1, 4, 0, 0, 0, 0]);
        }
    }
    body.extend_from_slice(payload);
    (exts.first().map_or(upper, |e| e.0), body)
}

#[test]
fn ndp_hidden_behind_extension_headers_is_dropped_as_spoofed() {
    in_netns(|| {
        let h = Harness::new().with_dual_pods_on(LO);
        let na_for = |target: Ipv6Addr, typ: u8| {
            let mut m = vec![typ, 0, 0, 0, 0x60, 0, 0, 0];
            m.extend_from_slice(&target.octets());
            m
        };
        let dst: Ipv6Addr = "fe80::b1".parse().unwrap();
        let mut spoofed = 0;
        for (exts, typ, target, what) in [
            (
                vec![(0u8, 0u16)],
                136u8,
                POD_A6,
                "NA for pod A behind hop-by-hop",
            ),
            (
                vec![(60, 0)],
                136,
                GW6,
                "NA for the gateway behind destination options",
            ),
            (vec![(0, 0), (60, 0)], 134, POD_B6, "RA behind two headers"),
            (vec![(44, 0)], 136, POD_A6, "NA in a first fragment"),
            (
                vec![(43, 0)],
                137,
                POD_A6,
                "redirect behind a routing header",
            ),
            (vec![(0, 0)], 136, POD_B6, "even an NA for its own address"),
            (vec![(0, 0)], 135, GW6, "NS behind hop-by-hop"),
        ] {
            let (nh, body) = behind_exts(&exts, 58, &na_for(target, typ));
            let f = ip6_frame(POD_B6, dst, SRC_HOST_MAC, nh, 255, &body);
            assert_eq!(
                h.run(abi::PROG_FROM_CONTAINER, &f, None),
                (TC_ACT_SHOT, f.clone()),
                "{what}"
            );
            assert_eq!(
                h.run(abi::PROG_NETKIT_PEER_L2, &f, None).0,
                NETKIT_DROP,
                "{what}"
            );
            spoofed += 2;
            assert_eq!(h.counter(cnt::SPOOFED), spoofed, "{what}");
        }
        assert_eq!(h.counter(cnt::NDP_REPLY), 0);
        // Ordinary traffic behind extension headers is routed as before: UDP behind
        // destination options, an echo request behind hop-by-hop, a later fragment.
        let udp = [
            0x0f, 0xa0, 0x13, 0x88, 0, 14, 0, 0, b'n', b's', b'f', b'a', b's', b't',
        ];
        let echo = [128, 0, 0, 0, 0, 1, 0, 1];
        for (exts, upper, payload, what) in [
            (
                vec![(60u8, 0u16)],
                17u8,
                &udp[..],
                "UDP behind destination options",
            ),
            (
                vec![(0, 0)],
                58,
                &echo[..],
                "echo request behind hop-by-hop",
            ),
            (
                vec![(44, 3)],
                58,
                &na_for(POD_A6, 136)[..],
                "a later fragment",
            ),
        ] {
            let (nh, body) = behind_exts(&exts, upper, payload);
            let f = ip6_frame(POD_B6, POD_A6, SRC_HOST_MAC, nh, 64, &body);
            assert_eq!(
                h.run(abi::PROG_FROM_CONTAINER, &f, None).0,
                TC_ACT_REDIRECT,
                "{what}"
            );
        }
        assert_eq!(h.counter(cnt::SPOOFED), spoofed);
        // A chain longer than the walk, or cut short: dropped as malformed.
        let before = h.counter(cnt::NOT_IPV4);
        let (nh, body) = behind_exts(&[(60, 0); 9], 58, &na_for(POD_A6, 136));
        let long = ip6_frame(POD_B6, POD_A6, SRC_HOST_MAC, nh, 255, &body);
        assert_eq!(h.run(abi::PROG_FROM_CONTAINER, &long, None).0, TC_ACT_SHOT);
        let cut = ip6_frame(POD_B6, POD_A6, SRC_HOST_MAC, 0, 255, &[58, 4, 1, 2]);
        assert_eq!(h.run(abi::PROG_FROM_CONTAINER, &cut, None).0, TC_ACT_SHOT);
        assert_eq!(h.counter(cnt::NOT_IPV4), before + 2);
        assert_eq!(h.counter(cnt::SPOOFED), spoofed);
    });
}

/// NetworkPolicy over IPv6 as over IPv4, in the slot of the current generation only: pod A
/// isolated for ingress drops B's IPv4 and IPv6 alike (from B, from the wire, and from the
/// host stack at the to-pod program); allowing B lets B's through; the rules written in the
/// other slot are not seen until the generation says so.
#[test]
fn policy_checks_ipv6_and_the_host_stacks_inbound_in_the_current_slot() {
    in_netns(|| {
        let mut h = Harness::new().with_dual_pods_on(LO);
        let wire_mac = [0x02, 0, 0, 0, 0, 0xee];
        let outside4 = Ipv4Addr::new(192, 0, 2, 1);
        let outside6: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let from_b4 = udp_frame(POD_B, POD_A, SRC_HOST_MAC);
        let from_b6 = udp6_frame(POD_B6, POD_A6, SRC_HOST_MAC);
        let wire4 = udp_frame(outside4, POD_A, wire_mac);
        let wire6 = udp6_frame(outside6, POD_A6, wire_mac);
        let stack4 = udp_frame(outside4, POD_A, POD_MAC);
        let stack6 = udp6_frame(outside6, POD_A6, POD_MAC);
        let verdicts = |h: &Harness| {
            [
                h.run(abi::PROG_FROM_CONTAINER, &from_b4, None).0,
                h.run(abi::PROG_FROM_CONTAINER, &from_b6, None).0,
                h.run(abi::PROG_FROM_WIRE, &wire4, None).0,
                h.run(abi::PROG_FROM_WIRE, &wire6, None).0,
                h.run_from(abi::PROG_TO_CONTAINER, &stack4, None, Some(5)).0,
                h.run_from(abi::PROG_TO_CONTAINER, &stack6, None, Some(5)).0,
                h.run_from(abi::PROG_NETKIT_PRIMARY, &stack6, None, Some(5))
                    .0,
            ]
        };
        let open = [
            TC_ACT_REDIRECT,
            TC_ACT_REDIRECT,
            TC_ACT_REDIRECT,
            TC_ACT_REDIRECT,
            TC_ACT_OK,
            TC_ACT_OK,
            NETKIT_NEXT,
        ];
        assert_eq!(verdicts(&h), open, "no policy");
        // Generation 1 reads slot 1: rules written in slot 0 are not seen yet.
        h.set_generation(1);
        h.isolate_a(0, false);
        assert_eq!(verdicts(&h), open, "rules of the other slot");
        h.isolate_a(1, false);
        assert_eq!(
            verdicts(&h),
            [
                TC_ACT_SHOT,
                TC_ACT_SHOT,
                TC_ACT_SHOT,
                TC_ACT_SHOT,
                TC_ACT_SHOT,
                TC_ACT_SHOT,
                NETKIT_DROP
            ],
            "A isolated"
        );
        h.isolate_a(1, true);
        assert_eq!(
            verdicts(&h),
            [
                TC_ACT_REDIRECT,
                TC_ACT_REDIRECT,
                TC_ACT_SHOT,
                TC_ACT_SHOT,
                TC_ACT_SHOT,
                TC_ACT_SHOT,
                NETKIT_DROP
            ],
            "B allowed, the rest denied"
        );
        // A local pod's packet met the policies at its source, and the node's own traffic
        // (in on no device) is always allowed: the to-pod program passes both.
        let from_pod = udp6_frame(POD_B6, POD_A6, POD_MAC);
        assert_eq!(
            h.run_from(abi::PROG_TO_CONTAINER, &from_pod, None, Some(5))
                .0,
            TC_ACT_OK
        );
        assert_eq!(h.run(abi::PROG_TO_CONTAINER, &stack4, None).0, TC_ACT_OK);
        assert_eq!(h.run(abi::PROG_TO_CONTAINER, &stack6, None).0, TC_ACT_OK);
        // The pod's own link: the gateway's neighbour advertisement (the NDP responder sends
        // it back out of the pod's device) reaches an isolated pod.
        let na = nd_frame(136, GW6, POD_A6, GW6);
        assert_eq!(
            h.run_from(abi::PROG_TO_CONTAINER, &na, None, Some(5)).0,
            TC_ACT_OK
        );
    });
}
