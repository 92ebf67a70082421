//! Root integration tests of dual-stack pods (docs/pod.md, "Dual-stack pods"): two throwaway
//! "hosts" (network namespaces) joined by a veth wire with IPv4 and IPv6, pods made by the
//! `nsfast` binary with `--ip IPV4,IPV6`; IPv6 TCP and UDP pod <-> pod, pod <-> remote pod,
//! wire -> pod, IPv4 in the same pods, the NDP responder, and IPv6 spoofing (another pod's or
//! an unassigned source, forged neighbour and router advertisements) dropped and counted.
//! Nothing touches the initial network namespace; the hosts (and with them the pods' devices)
//! are removed when a test ends, passed or failed. The datapath is veth here; the VM matrix
//! sets NSFAST_TEST_POD_MODE=netkit or netkit-l2 to run the same tests on netkit.

mod common;
use common::{nsfast, nsfast_bin, nsfast_ok};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::time::Duration;

use nsfast_lab::require_root;
use nsfast_lab::world::unique;
use nsfast_sys::netns::NetNs;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

const TIMEOUT: Duration = Duration::from_secs(5);
const ROUNDS: usize = 10;
const WIRE_IF: &str = "wire0";

/// `NSFAST_TEST_POD_MODE` (veth, netkit, netkit-l2), veth by default.
fn mode() -> String {
    common::pod_mode_str()
}

fn wire4(h: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 250, 0, 1 + h as u8)
}
fn wire6(h: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd50, 0, 0, 0, 0, 0, 0, 1 + h as u16)
}
fn pod4(h: usize, i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 251, 1 + h as u8, 10 + i as u8)
}
fn pod6(h: usize, i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd51, 1 + h as u16, 0, 0, 0, 0, 0, 0x10 + i as u16)
}

/// Two hosts joined by a veth wire (10.250.0.0/24, fd50::/64), each routing the other's pod
/// prefixes (10.251.H.0/24, fd51:H::/64) over it; `pods[h]` pods on host h, dual-stack, made
/// with the CLI. Dropping it runs `pod del --all` on each host, then deletes the hosts.
struct Dual {
    hosts: [NetNs; 2],
    pods: [Vec<(String, NetNs)>; 2],
}

impl Dual {
    fn new(pods: [usize; 2]) -> Self {
        require_root();
        let a = NetNs::create(&unique("dha")).expect("host a");
        let b = NetNs::create(&unique("dhb")).expect("host b");
        let mut d = Dual {
            hosts: [a, b],
            pods: [Vec::new(), Vec::new()],
        };
        for ns in &d.hosts {
            for k in ["all", "default"] {
                nsfast_sys::net::set_sysctl(
                    Some(ns),
                    &format!("net.ipv6.conf.{k}.accept_dad"),
                    "0",
                )
                .unwrap();
            }
        }
        let nl = [d.hosts[0].netlink().unwrap(), d.hosts[1].netlink().unwrap()];
        nl[0]
            .create_veth_into(WIRE_IF, "wiretmp0", &nl[1], WIRE_IF)
            .expect("wire");
        for (h, nl) in nl.iter().enumerate() {
            let o = 1 - h;
            nl.add_address(WIRE_IF, wire4(h).into(), 24).unwrap();
            nl.add_address(WIRE_IF, wire6(h).into(), 64).unwrap();
            let net4 = Ipv4Addr::new(10, 251, 1 + o as u8, 0);
            nl.add_route(net4.into(), 24, Some(wire4(o).into()), None)
                .unwrap();
            let net6 = Ipv6Addr::new(0xfd51, 1 + o as u16, 0, 0, 0, 0, 0, 0);
            nl.add_route(net6.into(), 64, Some(wire6(o).into()), None)
                .unwrap();
        }
        for (h, &n) in pods.iter().enumerate() {
            for i in 0..n {
                let name = unique(&format!("d{}", ["a", "b"][h]));
                let ip = format!("{}/24,{}/64", pod4(h, i), pod6(h, i));
                let host = d.hosts[h].name().to_string();
                nsfast_ok(&[
                    "pod",
                    "add",
                    &name,
                    "--host",
                    &host,
                    "--ip",
                    &ip,
                    "--uplink",
                    WIRE_IF,
                    "--mode",
                    &mode(),
                ]);
                let ns = NetNs::open(&name).expect("pod netns");
                d.pods[h].push((name, ns));
            }
        }
        d
    }

    fn host(&self, h: usize) -> String {
        self.hosts[h].name().to_string()
    }

    fn pod(&self, h: usize, i: usize) -> &NetNs {
        &self.pods[h][i].1
    }

    fn list(&self, h: usize) -> serde_json::Value {
        serde_json::from_str(&nsfast_ok(&[
            "pod",
            "list",
            "--host",
            &self.host(h),
            "--json",
        ]))
        .unwrap()
    }

    fn counter(&self, h: usize, k: &str) -> u64 {
        let v = self.list(h);
        v["counters"][k]
            .as_u64()
            .unwrap_or_else(|| panic!("counter {k} missing: {}", v["counters"]))
    }
}

impl Drop for Dual {
    fn drop(&mut self) {
        for h in 0..2 {
            let host = self.host(h);
            let out = nsfast(&["pod", "del", "--all", "--host", &host]);
            if !out.status.success() {
                eprintln!(
                    "cleanup of {host}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        // The host namespaces (and the wire) go when `hosts` drops.
    }
}

/// TCP (one connection, ROUNDS messages) and UDP (ROUNDS datagrams) from `from` to an echo
/// server in `srv` on `ip`:`port`, both checked.
fn exchange(from: &NetNs, srv: &NetNs, ip: IpAddr, port: u16) {
    let addr = SocketAddr::new(ip, port);
    let l = srv
        .run(|| TcpListener::bind(addr))
        .unwrap()
        .unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    let u = srv.run(|| UdpSocket::bind(addr)).unwrap().unwrap();
    u.set_read_timeout(Some(TIMEOUT)).unwrap();
    let tcp = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        let mut buf = [0u8; 64];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => s.write_all(&buf[..n]).expect("echo"),
            }
        }
    });
    let udp = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        for _ in 0..ROUNDS {
            let (n, peer) = u.recv_from(&mut buf).expect("udp echo recv");
            u.send_to(&buf[..n], peer).unwrap();
        }
    });
    from.run(|| {
        let mut s = TcpStream::connect_timeout(&addr, TIMEOUT)
            .unwrap_or_else(|e| panic!("TCP connect {addr}: {e}"));
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        for i in 0..ROUNDS {
            let msg = format!("tcp {i:04}");
            s.write_all(msg.as_bytes()).unwrap();
            let mut buf = vec![0u8; msg.len()];
            s.read_exact(&mut buf)
                .unwrap_or_else(|e| panic!("TCP echo from {addr}: {e}"));
            assert_eq!(buf, msg.as_bytes());
        }
        let bind: SocketAddr = match ip {
            IpAddr::V4(_) => "0.0.0.0:0".parse().unwrap(),
            IpAddr::V6(_) => "[::]:0".parse().unwrap(),
        };
        let c = UdpSocket::bind(bind).unwrap();
        c.set_read_timeout(Some(TIMEOUT)).unwrap();
        for i in 0..ROUNDS {
            let msg = format!("udp {i:04}");
            c.send_to(msg.as_bytes(), addr).unwrap();
            let mut buf = [0u8; 64];
            let (n, peer) = c
                .recv_from(&mut buf)
                .unwrap_or_else(|e| panic!("UDP echo from {addr}: {e}"));
            assert_eq!(peer, addr);
            assert_eq!(&buf[..n], msg.as_bytes());
        }
    })
    .unwrap();
    tcp.join().unwrap();
    udp.join().unwrap();
}

/// Polls `cond` until it holds; panics naming `what` after [`TIMEOUT`].
fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    common::wait_for(what, TIMEOUT, cond)
}

#[test]
fn dual_stack_pods_talk_ipv6_and_ipv4_locally_across_the_wire_and_from_the_wire() {
    let d = Dual::new([2, 1]);
    let (a0, a1, b0) = (d.pod(0, 0), d.pod(0, 1), d.pod(1, 0));

    // The state and `pod list` carry both addresses.
    let l = d.list(0);
    let p = l["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == d.pods[0][0].0.as_str())
        .unwrap()
        .clone();
    assert_eq!(p["ip"], pod4(0, 0).to_string(), "{p}");
    assert_eq!(p["ip6"], pod6(0, 0).to_string(), "{p}");
    assert_eq!(p["prefix6"], 64, "{p}");
    assert_eq!(p["gateway6"], "fe80::1", "{p}");
    assert_eq!(
        p["ips"],
        serde_json::json!([format!("{}/24", pod4(0, 0)), format!("{}/64", pod6(0, 0))]),
        "{p}"
    );
    let text = nsfast_ok(&["pod", "list", "--host", &d.host(0)]);
    assert!(
        text.contains(&format!("{}/24,{}/64", pod4(0, 0), pod6(0, 0))),
        "{text}"
    );

    // IPv6 pod <-> pod on one host: the peer redirect, after the NDP responder answered.
    let before = d.counter(0, "pod_to_pod");
    exchange(a0, a1, pod6(0, 1).into(), 7101);
    exchange(a1, a0, pod6(0, 0).into(), 7102);
    let n = d.counter(0, "pod_to_pod") - before;
    assert!(n >= (4 * 2 * ROUNDS) as u64, "IPv6 pod_to_pod grew by {n}");
    if mode() != "netkit" {
        assert!(d.counter(0, "ndp_reply") >= 1, "{}", d.list(0)["counters"]);
    }
    assert_eq!(
        d.counter(0, "fib_redirect") + d.counter(0, "fib_redirect_neigh"),
        0
    );

    // IPv6 pod <-> remote pod: the FIB out to the wire, the wire program into the pod.
    exchange(a0, b0, pod6(1, 0).into(), 7103);
    exchange(b0, a0, pod6(0, 0).into(), 7104);
    for h in 0..2 {
        let v = d.list(h)["counters"].clone();
        let out = v["fib_redirect"].as_u64().unwrap() + v["fib_redirect_neigh"].as_u64().unwrap();
        assert!(
            out >= (2 * 2 * ROUNDS) as u64,
            "host {h}: pod->wire {out}: {v}"
        );
        assert!(
            v["wire_to_pod"].as_u64().unwrap() >= (2 * 2 * ROUNDS) as u64,
            "host {h}: wire->pod: {v}"
        );
    }

    // Wire -> pod from a non-pod source: host B's own stack to pod a0 over IPv6.
    let before = d.counter(0, "wire_to_pod");
    exchange(&d.hosts[1], a0, pod6(0, 0).into(), 7105);
    assert!(d.counter(0, "wire_to_pod") - before >= (2 * ROUNDS) as u64);

    // IPv4 still works in the same pods, locally and across the wire.
    exchange(a0, a1, pod4(0, 1).into(), 7106);
    exchange(a0, b0, pod4(1, 0).into(), 7107);
    assert_eq!(d.counter(0, "spoofed"), 0);
}

/// Sends one UDP datagram from `src` (an address the attacker added to its own device, as a
/// root process in its pod can) to `dst`:`port`.
fn send_from(ns: &NetNs, src: Ipv6Addr, dst: Ipv6Addr, port: u16, payload: &[u8]) {
    ns.run(|| {
        let s = UdpSocket::bind(SocketAddr::new(src.into(), 40000))?;
        s.send_to(payload, SocketAddr::new(dst.into(), port))
    })
    .unwrap()
    .unwrap_or_else(|e| panic!("send {src} -> {dst}: {e}"));
}

/// A raw ICMPv6 message (the kernel fills in the checksum) of `typ` with `target`, from
/// `src` (the pod's own address) to all nodes on its eth0, hop limit 255 (as NDP must be).
fn send_nd(ns: &NetNs, src: Ipv6Addr, typ: u8, target: Ipv6Addr) {
    let mut msg = vec![typ, 0, 0, 0, 0x60, 0, 0, 0];
    msg.extend_from_slice(&target.octets());
    ns.run(|| -> std::io::Result<()> {
        let s = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?;
        // Its own address, not the link-local one source selection would pick for ff02::1.
        s.bind(&SockAddr::from(SocketAddr::new(src.into(), 0)))?;
        s.set_multicast_hops_v6(255)?;
        s.set_unicast_hops_v6(255)?;
        let idx = nix::net::if_::if_nametoindex("eth0").map_err(std::io::Error::from)?;
        let to = std::net::SocketAddrV6::new("ff02::1".parse().unwrap(), 0, 0, idx);
        match s.send_to(&msg, &SockAddr::from(to)) {
            // netkit runs the program inside the pod's transmit: the drop is reported at once.
            Err(e)
                if e.raw_os_error() == Some(nix::libc::ENOBUFS) && mode().starts_with("netkit") =>
            {
                Ok(())
            }
            r => r.map(|_| ()),
        }
    })
    .unwrap()
    .unwrap_or_else(|e| panic!("send ICMPv6 type {typ}: {e}"));
}

#[test]
fn ipv6_spoofing_from_a_pod_is_dropped_and_counted() {
    let d = Dual::new([3, 1]);
    let (a0, a1, a2, b0) = (d.pod(0, 0), d.pod(0, 1), d.pod(0, 2), d.pod(1, 0));
    let nobody: Ipv6Addr = "fd51:1::99".parse().unwrap();
    // The attacker (a0) adds pod a1's address and one nobody has to its own device.
    let anl = a0.netlink().unwrap();
    for a in [pod6(0, 1), nobody] {
        anl.add_address("eth0", a.into(), 128).unwrap();
    }
    let rx = |ns: &NetNs, ip: Ipv6Addr, port: u16| {
        let s = ns.run(|| UdpSocket::bind((ip, port))).unwrap().unwrap();
        s.set_nonblocking(true).unwrap();
        s
    };
    // Towards a local pod (a2), the remote pod (b0) and host A's wire address.
    let targets = [
        (rx(a2, pod6(0, 2), 7201), pod6(0, 2)),
        (rx(b0, pod6(1, 0), 7202), pod6(1, 0)),
        (rx(&d.hosts[0], wire6(0), 7203), wire6(0)),
    ];
    let mut buf = [0u8; 64];
    // a0's own address arrives (the positive control), sent first so that a0's neighbour
    // entry for the next hop is resolved: the forged datagrams then leave a0 themselves (not
    // only a neighbour solicitation from the forged source, which is dropped too, and whose
    // failure would drop the queued datagrams after three probes).
    let genuine = |sock: &UdpSocket, dst: Ipv6Addr, port: u16, buf: &mut [u8]| {
        send_from(a0, pod6(0, 0), dst, port, b"genuine");
        let mut got = None;
        wait_for(&format!("genuine datagram to {dst}"), || {
            match sock.recv_from(buf) {
                Ok((n, from)) => {
                    got = Some((buf[..n].to_vec(), from));
                    true
                }
                Err(_) => false,
            }
        });
        let (payload, from) = got.unwrap();
        assert_eq!(
            payload, b"genuine",
            "to {dst}: only the genuine datagram arrives"
        );
        assert_eq!(from, SocketAddr::new(pod6(0, 0).into(), 40000));
    };
    for (sock, dst) in &targets {
        let port = sock.local_addr().unwrap().port();
        genuine(sock, *dst, port, &mut buf);
        for forged in [pod6(0, 1), nobody] {
            let before = d.counter(0, "spoofed");
            send_from(a0, forged, *dst, port, b"forged");
            wait_for(&format!("spoofed > {before} ({forged} -> {dst})"), || {
                if let Ok((n, from)) = sock.recv_from(&mut buf) {
                    panic!(
                        "{dst} received {:?} from {from}, forged with source {forged}",
                        String::from_utf8_lossy(&buf[..n])
                    );
                }
                d.counter(0, "spoofed") > before
            });
        }
        genuine(sock, *dst, port, &mut buf);
    }

    // NDP spoofing: advertising pod a1's address or the gateway's, router advertisements.
    if mode() != "netkit" {
        for (typ, target) in [
            (136, pod6(0, 1)),
            (136, "fe80::1".parse().unwrap()),
            (134, pod6(0, 0)),
        ] {
            let before = d.counter(0, "spoofed");
            send_nd(a0, pod6(0, 0), typ, target);
            wait_for(&format!("ICMPv6 {typ} for {target} counted"), || {
                d.counter(0, "spoofed") > before
            });
        }
    }
    // The victim a1 still works over IPv6 with the remote pod.
    exchange(a1, b0, pod6(1, 0).into(), 7204);
}

#[test]
fn bad_ip_lists_are_one_clear_error_and_change_nothing() {
    require_root();
    let host = NetNs::create(&unique("dhx")).unwrap();
    let name = unique("dx");
    for (ip, needle) in [
        (
            "10.0.0.1/24,10.0.0.2/24",
            "a second IPv4 address \"10.0.0.2/24\"",
        ),
        (
            "fd00::1/64,fd00::2/64",
            "a second IPv6 address \"fd00::2/64\"",
        ),
        ("fe80::5/64", "\"fe80::5/64\""),
        ("10.0.0.1/24,", "an empty address"),
        ("fd00::1/200", "\"fd00::1/200\""),
    ] {
        let out = nsfast(&["pod", "add", &name, "--host", host.name(), "--ip", ip]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--ip {ip}: {err}");
        assert!(err.contains(needle), "--ip {ip}: {err}");
        // One error line (clap adds its pointer to --help).
        assert_eq!(
            err.lines()
                .filter(|l| !l.trim().is_empty() && *l != "For more information, try '--help'.")
                .count(),
            1,
            "{err}"
        );
    }
    assert!(NetNs::open(&name).is_err(), "no pod namespace made");
    let l = nsfast_ok(&["pod", "list", "--host", host.name(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&l).unwrap();
    assert_eq!(v["pods"].as_array().unwrap().len(), 0, "{v}");
    // Repeated --ip works like the comma list: an IPv6-only pod too.
    nsfast_ok(&[
        "pod",
        "add",
        &name,
        "--host",
        host.name(),
        "--ip",
        "fd52::5/64",
    ]);
    let l: serde_json::Value = serde_json::from_str(&nsfast_ok(&[
        "pod",
        "list",
        "--host",
        host.name(),
        "--json",
    ]))
    .unwrap();
    assert_eq!(l["pods"][0]["ip6"], "fd52::5", "{l}");
    // An IPv6-only pod has no IPv4 address in the JSON (no `"ip": "0.0.0.0"`), `ips` lists
    // what it has.
    assert_eq!(
        l["pods"][0]["ips"],
        serde_json::json!(["fd52::5/64"]),
        "{l}"
    );
    for k in ["ip", "prefix", "gateway"] {
        assert!(l["pods"][0].get(k).is_none(), "{k} in {l}");
    }
    // Its IPv6 address is taken: a second pod with it is refused, nothing made.
    let other = unique("dx");
    let out = nsfast(&[
        "pod",
        "add",
        &other,
        "--host",
        host.name(),
        "--ip",
        "10.0.0.9/24,fd52::5/64",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!("address fd52::5 is already used by pod {name:?}")),
        "{err}"
    );
    assert!(
        NetNs::open(&other).is_err(),
        "no namespace for the refused pod"
    );
    nsfast_ok(&["pod", "del", "--all", "--host", host.name()]);
}

/// SIGKILL of a dual-stack `pod add` after its endpoint entries are in (the last step before
/// the record is complete): both entries are undone by the next `add` (which then works) or
/// by `del`; nothing of either family is left in the host's endpoint tables.
#[test]
fn dual_stack_add_killed_after_the_endpoints_is_undone_by_add_or_del() {
    let d = Dual::new([1, 0]); // pod a0 keeps the host's maps pinned throughout
    let host = d.host(0);
    let h = nsfast_pod::Host::open(Some(&host)).unwrap();
    let (v4, v6) = (pod4(0, 5), pod6(0, 5));
    let ip = format!("{v4}/24,{v6}/64");
    let present = |ip: IpAddr| {
        nsfast_pod::datapath::endpoint_get(&h, ip)
            .unwrap()
            .is_some()
    };
    for then in ["add", "del"] {
        let name = unique("dk");
        let args = [
            "pod",
            "add",
            &name,
            "--host",
            &host,
            "--ip",
            &ip,
            "--mode",
            &mode(),
        ];
        let out = Command::new(nsfast_bin())
            .args(args)
            .env("RUST_LOG", "error")
            .env(nsfast_pod::pod::CRASH_ENV, "endpoint")
            .output()
            .unwrap();
        assert!(!out.status.success(), "the add was to be killed");
        assert!(
            present(v4.into()) && present(v6.into()),
            "killed after both entries"
        );
        if then == "add" {
            nsfast_ok(&args);
            assert!(present(v4.into()) && present(v6.into()));
            let r = h.record(&name).unwrap().unwrap();
            assert!(!r.pending && r.ip6 == Some(v6), "{r:?}");
        }
        nsfast_ok(&["pod", "del", &name, "--host", &host]);
        assert!(!present(v4.into()), "{then}: IPv4 endpoint left");
        assert!(!present(v6.into()), "{then}: IPv6 endpoint left");
        assert!(NetNs::open(&name).is_err(), "{then}: pod namespace left");
    }
    assert!(present(pod6(0, 0).into()), "the other pod's entry kept");
}

/// `ip -6 neigh show fe80::1 dev eth0` in pod namespace `name`.
fn gateway_neigh(name: &str) -> String {
    let o = Command::new("ip")
        .args(["-n", name, "-6", "neigh", "show", "fe80::1", "dev", "eth0"])
        .output()
        .expect("run ip");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A raw ICMPv6 neighbour solicitation for fe80::1 from link-local `src` on eth0 (hop limit
/// 255), to the gateway's solicited-node group.
fn send_ns_from_link_local(ns: &NetNs, src: Ipv6Addr) {
    let mut msg = vec![135, 0, 0, 0, 0, 0, 0, 0];
    msg.extend_from_slice(&GW6.octets());
    ns.run(|| -> std::io::Result<()> {
        let idx = nix::net::if_::if_nametoindex("eth0").map_err(std::io::Error::from)?;
        let s = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?;
        s.bind(&SockAddr::from(std::net::SocketAddrV6::new(src, 0, 0, idx)))?;
        s.set_multicast_hops_v6(255)?;
        let to = std::net::SocketAddrV6::new("ff02::1:ff00:1".parse().unwrap(), 0, 0, idx);
        match s.send_to(&msg, &SockAddr::from(to)) {
            Err(e)
                if e.raw_os_error() == Some(nix::libc::ENOBUFS) && mode().starts_with("netkit") =>
            {
                Ok(())
            }
            r => r.map(|_| ()),
        }
    })
    .unwrap()
    .unwrap_or_else(|e| panic!("send NS from {src}: {e}"));
}

const GW6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// The pod's own kernel resolves the gateway from its link-local address (as it does for a
/// neighbour probe): `add` gives the pod one link-local address the datapath knows, and the
/// solicitation from it is answered (the entry becomes reachable at the host-side MAC). Another
/// pod's link-local address used as source is spoofing. (netkit L3 has no NDP.)
#[test]
fn the_pods_link_local_solicitations_are_answered_and_anothers_link_local_is_spoofed() {
    if mode() == "netkit" {
        eprintln!("netkit L3 pods have no neighbour discovery: nothing to test");
        return;
    }
    let d = Dual::new([2, 0]);
    let (name, a0) = (&d.pods[0][0].0, d.pod(0, 0));
    let ll = nsfast_pod::pod::pod_link_local(pod6(0, 0));
    let other_ll = nsfast_pod::pod::pod_link_local(pod6(0, 1));
    let addrs = a0.netlink().unwrap().link_ipv6_addresses("eth0").unwrap();
    let lls: Vec<_> = addrs
        .iter()
        .filter(|(a, _)| a.segments()[0] & 0xffc0 == 0xfe80)
        .collect();
    assert_eq!(
        lls,
        vec![&(ll, 64)],
        "the pod's link-local addresses: {addrs:?}"
    );
    let l = d.list(0);
    let host_mac = l["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name.as_str())
        .unwrap()["host_mac"]
        .as_str()
        .unwrap()
        .to_string();
    // A datagram from the link-local address to fe80::1: the kernel solicits fe80::1 from
    // the datagram's source, the link-local address.
    Command::new("ip")
        .args(["-n", name, "-6", "neigh", "flush", "dev", "eth0"])
        .status()
        .unwrap();
    let replies = d.counter(0, "ndp_reply");
    a0.run(|| {
        let idx = nix::net::if_::if_nametoindex("eth0").unwrap();
        let s = UdpSocket::bind(std::net::SocketAddrV6::new(ll, 0, 0, idx)).unwrap();
        let _ = s.send_to(b"probe", std::net::SocketAddrV6::new(GW6, 9, 0, idx));
    })
    .unwrap();
    wait_for("the gateway's neighbour entry at the host-side MAC", || {
        let n = gateway_neigh(name);
        n.contains(&host_mac) && !n.contains("FAILED") && !n.contains("INCOMPLETE")
    });
    assert!(d.counter(0, "ndp_reply") > replies);
    // Pod a0 takes pod a1's link-local address and solicits from it: dropped, spoofed.
    a0.netlink()
        .unwrap()
        .add_address("eth0", other_ll.into(), 64)
        .unwrap();
    let (spoofed, replies) = (d.counter(0, "spoofed"), d.counter(0, "ndp_reply"));
    send_ns_from_link_local(a0, other_ll);
    wait_for("spoofed + 1", || d.counter(0, "spoofed") > spoofed);
    assert_eq!(
        d.counter(0, "ndp_reply"),
        replies,
        "answered a forged solicitation"
    );
}
