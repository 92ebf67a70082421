//! Root integration tests of the pod datapath's anti-spoofing and of the host-firewall switch
//! (docs/pod.md, "Anti-spoofing" and "Host netfilter"): a raw socket in one pod forging
//! another pod's source address towards a local pod, a remote pod and the host; forged ARP;
//! and an nftables drop rule in the throwaway host namespace that pods made with
//! `--host-firewall` meet and other pods bypass. Nothing touches the initial network
//! namespace. The datapath is veth here; the VM matrix sets NSFAST_TEST_POD_MODE=netkit or
//! netkit-l2 to run the same tests on netkit.

mod common;
use common::{nsfast, nsfast_ok, pod_mode_str};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use nsfast_lab::pods::{self as topology, PodsSpec, Topology};
use nsfast_lab::require_root;
use nsfast_lab::topology::Topology as _;
use nsfast_lab::world::unique;
use nsfast_pod::ModeRequest;
use nsfast_sys::netns::NetNs;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

const TIMEOUT: Duration = Duration::from_secs(5);
const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

fn mode() -> ModeRequest {
    pod_mode_str()
        .parse()
        .expect("NSFAST_TEST_POD_MODE: veth, netkit or netkit-l2")
}

/// A counter of `host` as `nsfast pod list --host H --json` shows it.
fn counter(host: &str, name: &str) -> u64 {
    let v: serde_json::Value =
        serde_json::from_str(&nsfast_ok(&["pod", "list", "--host", host, "--json"])).unwrap();
    v["counters"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("counter {name} missing in {}", v["counters"]))
}

/// Polls `cond` until it holds; panics naming `what` after [`TIMEOUT`].
fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    common::wait_for(what, TIMEOUT, cond)
}

/// An IPv4 + UDP datagram from `src`:`sport` to `dst`:`dport` (UDP checksum 0 = none; the
/// kernel fills in the IP checksum and length of an IP_HDRINCL packet).
fn ipv4_udp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16, payload: &[u8]) -> Vec<u8> {
    let tot = (20 + 8 + payload.len()) as u16;
    let mut v = vec![0x45, 0];
    v.extend_from_slice(&tot.to_be_bytes());
    v.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
    v.extend_from_slice(&src.octets());
    v.extend_from_slice(&dst.octets());
    v.extend_from_slice(&sport.to_be_bytes());
    v.extend_from_slice(&dport.to_be_bytes());
    v.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(payload);
    v
}

/// Sends one UDP datagram with source `src` from a raw socket (IPPROTO_RAW: IP_HDRINCL) in
/// `ns`: the kernel routes it by destination and sends whatever source it is given.
fn raw_send(ns: &NetNs, src: Ipv4Addr, dst: Ipv4Addr, dport: u16, payload: &[u8]) {
    let pkt = ipv4_udp(src, 40000, dst, dport, payload);
    ns.run(|| {
        let s = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(255)))?;
        s.send_to(&pkt, &SockAddr::from(SocketAddrV4::new(dst, 0)))
    })
    .unwrap()
    .unwrap_or_else(|e| panic!("raw send {src} -> {dst}: {e}"));
}

/// A UDP socket in `ns` bound to `ip`:`port`.
fn udp_rx(ns: &NetNs, ip: Ipv4Addr, port: u16) -> UdpSocket {
    let s = ns
        .run(|| UdpSocket::bind((ip, port)))
        .unwrap()
        .unwrap_or_else(|e| panic!("bind {ip}:{port}: {e}"));
    s.set_nonblocking(true).unwrap();
    s
}

/// `attacker` forges `forged` as source towards `rx` (bound to `dst`:`port`): the datagram
/// never arrives and `host`'s `spoofed` counter rises by one (waited for: once it has risen
/// the datagram was dropped, it cannot arrive later). Then the positive control: the same raw
/// send with the attacker's own address `own` arrives, from `own`.
fn forged_is_dropped_own_arrives(
    host: &str,
    attacker: &NetNs,
    own: Ipv4Addr,
    forged: Ipv4Addr,
    rx: &UdpSocket,
    dst: Ipv4Addr,
    port: u16,
) {
    let mut buf = [0u8; 64];
    let before = counter(host, "spoofed");
    raw_send(attacker, forged, dst, port, b"forged");
    wait_for(&format!("spoofed > {before} ({forged} -> {dst})"), || {
        if let Ok((n, from)) = rx.recv_from(&mut buf) {
            panic!(
                "{dst}:{port} received {:?} from {from}: a datagram forged with source {forged}",
                String::from_utf8_lossy(&buf[..n])
            );
        }
        counter(host, "spoofed") > before
    });
    assert_eq!(counter(host, "spoofed"), before + 1, "{forged} -> {dst}");

    raw_send(attacker, own, dst, port, b"genuine");
    let mut got = None;
    wait_for(
        &format!("the genuine datagram {own} -> {dst}"),
        || match rx.recv_from(&mut buf) {
            Ok((n, from)) => {
                got = Some((buf[..n].to_vec(), from));
                true
            }
            Err(_) => false,
        },
    );
    let (payload, from) = got.unwrap();
    assert_eq!(payload, b"genuine", "the first datagram is the genuine one");
    assert_eq!(from, SocketAddr::from((own, 40000)));
    assert_eq!(
        counter(host, "spoofed"),
        before + 1,
        "own source not counted"
    );
}

/// The two-host pod world bench builds, `pods_per_host` pods a host, in this run's mode.
fn pods(prefix: &str, pods_per_host: usize) -> Topology {
    PodsSpec {
        mode: mode(),
        attach: nsfast_pod::AttachRequest::Auto,
        pods_per_host,
    }
    .expect_built(prefix)
}

/// Pods A (a0), B (a1), C (a2) on host A, a remote pod on host B: A forges B's address (and
/// a remote pod's, and one nobody has) towards C, towards the remote pod over the wire and
/// towards the host; every forged datagram is dropped and counted, the genuine one arrives.
#[test]
fn raw_socket_in_a_pod_cannot_send_with_another_pods_source() {
    require_root();
    let t = pods(&unique("sp"), 3);
    let host = t.host_name(0).to_string();
    let (a, b, c) = (t.pod(0, 0), t.pod(0, 1), t.pod(0, 2));
    let remote = t.pod(1, 0);
    let a_ns = a.netns().unwrap();

    // pod -> local pod: A claims B's address towards C.
    let rx_c = udp_rx(&c.netns().unwrap(), c.ip(), 7001);
    forged_is_dropped_own_arrives(&host, &a_ns, a.ip(), b.ip(), &rx_c, c.ip(), 7001);
    // ... and the remote pod's, and an address no pod has.
    for forged in [remote.ip(), Ipv4Addr::new(10, 9, 9, 9)] {
        forged_is_dropped_own_arrives(&host, &a_ns, a.ip(), forged, &rx_c, c.ip(), 7001);
    }
    // pod -> wire: A claims B's address towards the remote pod; no pod on host B gets it.
    let rx_remote = udp_rx(&remote.netns().unwrap(), remote.ip(), 7002);
    forged_is_dropped_own_arrives(&host, &a_ns, a.ip(), b.ip(), &rx_remote, remote.ip(), 7002);
    // pod -> host: A claims B's address towards a service on host A's wire address.
    let rx_host = udp_rx(&t.hosts[0], topology::host_ip(0), 7003);
    forged_is_dropped_own_arrives(
        &host,
        &a_ns,
        a.ip(),
        b.ip(),
        &rx_host,
        topology::host_ip(0),
        7003,
    );
    // Host B saw nothing forged: host A dropped it all.
    assert_eq!(counter(t.host_name(1), "spoofed"), 0);
}

/// An ARP request in Ethernet framing, broadcast, asking for `tip` as `sip`.
fn arp_request(mac: [u8; 6], sip: Ipv4Addr, tip: Ipv4Addr) -> Vec<u8> {
    let mut v = vec![0xff; 6];
    v.extend_from_slice(&mac);
    v.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    v.extend_from_slice(&mac);
    v.extend_from_slice(&sip.octets());
    v.extend_from_slice(&[0; 6]);
    v.extend_from_slice(&tip.octets());
    v
}

/// A packet socket for ARP bound to device `ifindex` (in the calling thread's namespace).
fn arp_socket(ifindex: u32) -> Socket {
    const ETH_P_ARP: u16 = 0x0806;
    let proto = i32::from(ETH_P_ARP.to_be());
    let s = Socket::new(Domain::PACKET, Type::RAW, Some(Protocol::from(proto))).expect("AF_PACKET");
    // SAFETY: `try_init` hands us zeroed storage large enough for any socket address; we
    // write one fully initialised sockaddr_ll into it and report its size.
    let (_, addr) = unsafe {
        SockAddr::try_init(|storage, len| {
            let mut sll: nix::libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = nix::libc::AF_PACKET as u16;
            sll.sll_protocol = ETH_P_ARP.to_be();
            sll.sll_ifindex = ifindex as i32;
            std::ptr::write(storage.cast::<nix::libc::sockaddr_ll>(), sll);
            *len = std::mem::size_of::<nix::libc::sockaddr_ll>() as nix::libc::socklen_t;
            Ok(())
        })
    }
    .unwrap();
    s.bind(&addr).expect("bind AF_PACKET");
    s.set_nonblocking(true).unwrap();
    s
}

/// Whether `frame` is an ARP reply telling `tip` that `sip` is at some MAC.
fn is_arp_reply(frame: &[u8], sip: Ipv4Addr, tip: Ipv4Addr) -> bool {
    frame.len() >= 42
        && frame[12..14] == [0x08, 0x06]
        && frame[20..22] == [0, 2]
        && frame[28..32] == sip.octets()
        && frame[38..42] == tip.octets()
}

/// Pod A asks for the gateway's MAC claiming pod B's address: no answer, `spoofed` rises;
/// the same request with its own address is answered (veth and netkit L2; L3 has no ARP).
#[test]
fn arp_with_another_pods_sender_ip_is_not_answered() {
    require_root();
    if mode() == ModeRequest::Netkit {
        eprintln!("netkit L3 pods have no ARP (IFF_NOARP): nothing to test");
        return;
    }
    let t = pods(&unique("sa"), 2);
    let host = t.host_name(0).to_string();
    let (a, b) = (t.pod(0, 0), t.pod(0, 1));
    let a_ns = a.netns().unwrap();
    let pod_if = &a.record.pod_if;
    let a_nl = a_ns.netlink().unwrap();
    let ifindex = a_nl.link_index(pod_if).unwrap();
    let mac = a_nl.link_mac(pod_if).unwrap();
    drop(a_nl);
    let s = a_ns.run(|| arp_socket(ifindex)).unwrap();
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 1500];
    let mut replied = |tip: Ipv4Addr| -> bool {
        let mut seen = false;
        while let Ok(n) = s.recv(&mut buf) {
            // SAFETY: recv initialised the first n bytes.
            let f: Vec<u8> = buf[..n]
                .iter()
                .map(|b| unsafe { b.assume_init() })
                .collect();
            seen |= is_arp_reply(&f, GATEWAY, tip);
        }
        seen
    };

    let before = counter(&host, "spoofed");
    // netkit runs the peer program inside the sender's transmit, so a packet socket learns of
    // the drop at once (NET_XMIT_DROP -> ENOBUFS); on veth the program runs later.
    match s.send(&arp_request(mac, b.ip(), GATEWAY)) {
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) && mode() != ModeRequest::Veth => {}
        Err(e) => panic!("send the forged ARP request: {e}"),
    }
    wait_for("spoofed to rise after the forged ARP request", || {
        assert!(
            !replied(b.ip()),
            "forged ARP request (sender {}) answered",
            b.ip()
        );
        counter(&host, "spoofed") > before
    });
    assert_eq!(counter(&host, "spoofed"), before + 1);
    let replies = counter(&host, "arp_reply");

    s.send(&arp_request(mac, a.ip(), GATEWAY)).unwrap();
    wait_for("the ARP reply to pod A's own request", || replied(a.ip()));
    assert_eq!(counter(&host, "arp_reply"), replies + 1);
    assert_eq!(counter(&host, "spoofed"), before + 1);
}

/// Pods made with the `nsfast` binary on one throwaway host; `pod del --all` on drop, then
/// the host namespace goes.
struct FwHost {
    ns: Option<NetNs>,
}

impl FwHost {
    fn name(&self) -> String {
        self.ns.as_ref().unwrap().name().to_string()
    }

    fn add(&self, name: &str, ip: Ipv4Addr, host_firewall: bool) -> serde_json::Value {
        let host = self.name();
        let cidr = format!("{ip}/24");
        let mode = pod_mode_str();
        let mut args = vec![
            "pod", "add", name, "--ip", &cidr, "--host", &host, "--mode", &mode, "--json",
        ];
        if host_firewall {
            args.push("--host-firewall");
        }
        let v: serde_json::Value = serde_json::from_str(&nsfast_ok(&args)).unwrap();
        assert_eq!(v["record"]["host_firewall"], host_firewall, "{v}");
        v["record"].clone()
    }

    /// Runs `nft ARGS` in the host namespace.
    fn nft(&self, args: &[&str]) -> String {
        common::nft_in(self.ns.as_ref().unwrap(), args)
    }

    /// Packets the drop rule has matched (its `counter`).
    fn dropped(&self) -> u64 {
        let chain = self.nft(&["list", "chain", "ip", "nsfast_test", "nsf_fwd"]);
        let at = chain
            .find("counter packets ")
            .unwrap_or_else(|| panic!("no counter in {chain}"));
        chain[at + 16..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }
}

impl Drop for FwHost {
    fn drop(&mut self) {
        let host = self.name();
        let out = nsfast(&["pod", "del", "--all", "--host", &host]);
        if !out.status.success() {
            eprintln!(
                "cleanup of {host}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        self.ns.take();
    }
}

/// `n` datagrams from pod `from` to `to_ip`:`port` in pod `to`; how many arrived (read
/// until all have, or for at most [`TIMEOUT`]: callers expect all of them).
fn udp_delivered(from: &NetNs, to: &NetNs, to_ip: Ipv4Addr, port: u16, n: usize) -> usize {
    let rx = udp_rx(to, to_ip, port);
    let tx = from
        .run(|| UdpSocket::bind("0.0.0.0:0"))
        .unwrap()
        .expect("bind");
    for i in 0..n {
        tx.send_to(format!("dgram {i}").as_bytes(), (to_ip, port))
            .unwrap();
    }
    let mut got = 0;
    let mut buf = [0u8; 64];
    let deadline = Instant::now() + TIMEOUT;
    while got < n && Instant::now() < deadline {
        match rx.recv_from(&mut buf) {
            Ok(_) => got += 1,
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    got
}

/// The host-firewall switch, proved with an nftables drop rule on the host's forward hook
/// for UDP to port 7100: between two `--host-firewall` pods the traffic takes the host stack
/// (works without the rule, `pod_to_stack` grows, `pod_to_pod` does not) and the rule blocks
/// it (its counter rises, nothing arrives); between two ordinary pods the same rule is
/// bypassed (everything arrives by redirect, the rule's counter does not move). The source
/// check still applies to a host-firewall pod.
#[test]
fn host_firewall_pods_meet_host_netfilter_other_pods_bypass_it() {
    require_root();
    const PORT: u16 = 7100;
    const N: usize = 10;
    let h = FwHost {
        ns: Some(NetNs::create(&unique("fw")).expect("host netns")),
    };
    let host = h.name();
    let p = unique("f");
    let ips: Vec<Ipv4Addr> = (0..4).map(|i| Ipv4Addr::new(10, 252, 1, 10 + i)).collect();
    let names: Vec<String> = (0..4).map(|i| format!("{p}-{i}")).collect();
    // 0, 1: host firewall; 2, 3: not.
    for i in 0..4 {
        h.add(&names[i], ips[i], i < 2);
    }
    let ns: Vec<NetNs> = names.iter().map(|n| NetNs::open(n).unwrap()).collect();
    let list: serde_json::Value =
        serde_json::from_str(&nsfast_ok(&["pod", "list", "--host", &host, "--json"])).unwrap();
    let fw = list["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["host_firewall"] == true)
        .count();
    assert_eq!(fw, 2, "two host-firewall pods listed: {list}");

    // Host firewall, no rule yet: delivered through the host stack.
    let (pod_to_pod, to_stack) = (counter(&host, "pod_to_pod"), counter(&host, "pod_to_stack"));
    assert_eq!(
        udp_delivered(&ns[0], &ns[1], ips[1], PORT, N),
        N,
        "fw pod -> fw pod"
    );
    assert_eq!(counter(&host, "pod_to_pod"), pod_to_pod, "not redirected");
    assert!(counter(&host, "pod_to_stack") >= to_stack + N as u64);

    // The drop rule on the host's forward hook.
    h.nft(&["add", "table", "ip", "nsfast_test"]);
    h.nft(&[
        "add",
        "chain",
        "ip",
        "nsfast_test",
        "nsf_fwd",
        "{ type filter hook forward priority 0 ; policy accept ; }",
    ]);
    h.nft(&[
        "add",
        "rule",
        "ip",
        "nsfast_test",
        "nsf_fwd",
        "udp",
        "dport",
        &PORT.to_string(),
        "counter",
        "drop",
    ]);

    // Host firewall: the rule sees and drops every datagram (waited for on its counter;
    // once it has dropped all N, none of them can arrive any more).
    let rx = udp_rx(&ns[1], ips[1], PORT);
    let tx = ns[0].run(|| UdpSocket::bind("0.0.0.0:0")).unwrap().unwrap();
    let dropped = h.dropped();
    for i in 0..N {
        tx.send_to(format!("dgram {i}").as_bytes(), (ips[1], PORT))
            .unwrap();
    }
    wait_for("the nftables drop rule to match all N datagrams", || {
        h.dropped() >= dropped + N as u64
    });
    let mut buf = [0u8; 64];
    assert!(
        rx.recv_from(&mut buf).is_err(),
        "a host-firewall pod received traffic the host's nftables rule dropped"
    );
    assert_eq!(counter(&host, "pod_to_pod"), pod_to_pod);

    // Ordinary pods: the same rule is bypassed, the BPF redirect carries everything.
    let dropped = h.dropped();
    assert_eq!(
        udp_delivered(&ns[2], &ns[3], ips[3], PORT, N),
        N,
        "ordinary pod -> pod under the drop rule"
    );
    assert!(counter(&host, "pod_to_pod") >= pod_to_pod + N as u64);
    assert_eq!(
        h.dropped(),
        dropped,
        "the rule never saw the redirected traffic"
    );

    // A host-firewall pod still cannot forge a source.
    let spoofed = counter(&host, "spoofed");
    let rx3 = udp_rx(&ns[3], ips[3], PORT + 2);
    raw_send(&ns[0], ips[1], ips[3], PORT + 2, b"forged");
    wait_for("spoofed to rise (host-firewall pod)", || {
        assert!(rx3.recv_from(&mut buf).is_err(), "forged datagram arrived");
        counter(&host, "spoofed") > spoofed
    });
}
