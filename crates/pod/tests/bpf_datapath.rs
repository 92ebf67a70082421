//! BPF_PROG_TEST_RUN tests of the pod programs' decisions (`bpf/pod.bpf.c`,
//! `bpf/lib/pod_route.h`): verdicts, rewritten frames and counters, each run inside a
//! throwaway network namespace (the FIB cases use a veth pair there). Needs root.

use std::net::Ipv4Addr;

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

    fn counter(&self, i: u32) -> u64 {
        let a: PerCpuArray<&MapData, u64> =
            PerCpuArray::try_from(self.ebpf.map(abi::MAP_COUNTERS).unwrap()).unwrap();
        a.get(&i, 0).unwrap().iter().sum()
    }

    /// Runs `prog` on `frame` (optionally with `__sk_buff.ifindex`): (verdict, frame out).
    fn run(&self, prog: &str, frame: &[u8], ifindex: Option<u32>) -> (u32, Vec<u8>) {
        let p: &SchedClassifier = self.ebpf.program(prog).unwrap().try_into().unwrap();
        let mut out = vec![0u8; frame.len() + 256];
        // struct __sk_buff up to and including `ifindex` (offset 40).
        let mut ctx = [0u8; 44];
        if let Some(i) = ifindex {
            ctx[40..44].copy_from_slice(&i.to_ne_bytes());
        }
        let r = p
            .test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                ctx_in: ifindex.map(|_| &ctx[..]),
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
        // Pods are IPv4-only; the host stack would take IPv6 with any source.
        let mut v6 = eth(SRC_HOST_MAC, SRC_POD_MAC, 0x86dd);
        v6.extend_from_slice(&[0x60; 40]);
        assert_eq!(
            h.run(abi::PROG_FROM_CONTAINER, &v6, None),
            (TC_ACT_SHOT, v6.clone())
        );
        assert_eq!(h.run(abi::PROG_NETKIT_PEER_L3, &v6, None).0, NETKIT_DROP);
        let mut other = eth(SRC_HOST_MAC, SRC_POD_MAC, 0x88cc); // LLDP
        other.extend_from_slice(&[0; 40]);
        assert_eq!(h.run(abi::PROG_FROM_CONTAINER, &other, None).0, TC_ACT_SHOT);
        assert_eq!(h.counter(cnt::NOT_IPV4), 3);
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
        assert_eq!(h.counter(cnt::NOT_IPV4), 5);
        assert_eq!(h.counter(cnt::POD_TO_POD), 0);
        assert_eq!(h.counter(cnt::SPOOFED), 0);
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
