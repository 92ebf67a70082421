//! Root integration test of nodes joined by a real routing daemon (`nsfast_lab::bird`): three
//! node namespaces on one bridge, nsfast pods on each (`nsfast pod add --host NODE`), BIRD 2
//! on each with the shipped `dist/bird/bird.conf` exchanging the pod CIDRs over eBGP. Pods
//! reach pods on other nodes over nsfast's BPF path (counters, a byte-exact TCP transfer, a
//! UDP probe); a killed BIRD's CIDR leaves the other nodes' kernel tables within the hold
//! time and a connect to it fails at once. Nothing touches the initial network namespace.

mod common;
use common::{counter as c, nsfast_bin, pod_counters};

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use nsfast_lab::bird::{self, BirdSpec, BirdWorld, NodePod};
use nsfast_lab::peer::{self, BidirReport};
use nsfast_lab::require_root;
use nsfast_lab::topology::Topology as _;
use nsfast_lab::world::unique;

const NODES: usize = 3;
const BULK: u64 = 4 << 20;
const UDP_ROUNDS: usize = 20;

/// Node `n`'s datapath counters.
fn counters(w: &BirdWorld, n: usize) -> serde_json::Value {
    pod_counters(w.node_name(n))
}

/// Pod → wire through the FIB: `bpf_fib_lookup` then `bpf_redirect` (neighbour known) or
/// `bpf_redirect_neigh` (not yet).
fn fib_out(v: &serde_json::Value) -> u64 {
    c(v, "fib_redirect") + c(v, "fib_redirect_neigh")
}

/// `BULK` bytes each way between `client` and a server in `server`, checked against the
/// streams' own hashes.
fn tcp_bulk(client: &NodePod, server: &NodePod, port: u16) {
    let bin = nsfast_lab::bins::testpeer();
    let addr = SocketAddr::new(IpAddr::V4(server.ip), port);
    let (a, b) = (addr.to_string(), BULK.to_string());
    let srv_ns = server.netns();
    let srv = peer::spawn(
        &bin,
        &srv_ns,
        None,
        &[
            "--timeout",
            "30",
            "bidir-server",
            "--listen",
            &a,
            "--bytes",
            &b,
            "--seed",
            "1",
        ]
        .map(String::from),
    );
    peer::wait_listening(&srv_ns, addr);
    let cli = peer::spawn(
        &bin,
        &client.netns(),
        None,
        &[
            "--timeout",
            "30",
            "bidir-client",
            "--connect",
            &a,
            "--bytes",
            &b,
            "--seed",
            "2",
        ]
        .map(String::from),
    );
    let cr: BidirReport = peer::finish(cli, "client");
    let sr: BidirReport = peer::finish(srv, "server");
    assert_eq!(
        (cr.received, sr.received),
        (BULK, BULK),
        "bytes received (client, server)"
    );
    assert_eq!(
        cr.received_sha256,
        nsfast_lab::stream::sha256_of(1, BULK),
        "the client got other bytes than the server's stream"
    );
    assert_eq!(
        sr.received_sha256,
        nsfast_lab::stream::sha256_of(2, BULK),
        "the server got other bytes than the client's stream"
    );
}

/// `UDP_ROUNDS` datagrams from `client` to an echo in `server`, each echoed back intact.
fn udp_probe(client: &NodePod, server: &NodePod, port: u16) {
    let addr = SocketAddr::new(IpAddr::V4(server.ip), port);
    let srv = server
        .netns()
        .run(|| UdpSocket::bind(addr))
        .unwrap()
        .expect("bind UDP echo");
    srv.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        for _ in 0..UDP_ROUNDS {
            let (n, from) = srv.recv_from(&mut buf).expect("UDP echo: receive");
            srv.send_to(&buf[..n], from).expect("UDP echo: send");
        }
    });
    let s = client
        .netns()
        .run(|| UdpSocket::bind("0.0.0.0:0"))
        .unwrap()
        .expect("bind UDP client");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    for i in 0..UDP_ROUNDS {
        let msg = format!("probe {i:04} from {} to {}", client.ip, server.ip);
        s.send_to(msg.as_bytes(), addr).unwrap();
        let mut buf = [0u8; 1500];
        let (n, from) = s
            .recv_from(&mut buf)
            .unwrap_or_else(|e| panic!("UDP echo from {addr}: {e}"));
        assert_eq!((from, &buf[..n]), (addr, msg.as_bytes()));
    }
    echo.join().unwrap();
}

/// One TCP round trip from `client` to an echo on `server`.
fn tcp_ping(client: &NodePod, server: &NodePod, port: u16) {
    let addr = SocketAddr::new(IpAddr::V4(server.ip), port);
    let l = server
        .netns()
        .run(|| std::net::TcpListener::bind(addr))
        .unwrap()
        .expect("bind");
    let echo = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).expect("read");
        s.write_all(&buf[..n]).expect("echo");
    });
    let mut s = client
        .netns()
        .run(|| TcpStream::connect_timeout(&addr, Duration::from_secs(5)))
        .unwrap()
        .unwrap_or_else(|e| panic!("TCP connect {} -> {addr}: {e}", client.ip));
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).expect("TCP echo");
    assert_eq!(&buf, b"ping");
    echo.join().unwrap();
}

/// Waits up to `within` for `cond`; the time it took, or `None`.
fn within(within: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        if cond() {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

fn route_table(w: &BirdWorld, n: usize) -> String {
    format!("{:?}", w.bird_routes(n).unwrap_or_default())
}

#[test]
fn pods_on_three_bgp_nodes_reach_each_other_and_a_stopped_bird_withdraws_its_cidr() {
    require_root();
    let mut w = BirdSpec {
        nodes: NODES,
        nsfast: nsfast_bin(),
    }
    .expect_built(&unique("bgp"));
    let pods: Vec<NodePod> = (0..NODES)
        .map(|n| w.add_pod(n, 0).unwrap_or_else(|e| panic!("{e:#}")))
        .collect();
    w.start_birds().unwrap_or_else(|e| panic!("{e:#}"));
    w.wait_established(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e:#}"));

    // Every node's kernel routes every other node's pod CIDR via that node, as BIRD put it.
    for n in 0..NODES {
        let others: Vec<usize> = (0..NODES).filter(|&m| m != n).collect();
        let t = within(Duration::from_secs(10), || {
            others.iter().all(|&m| w.has_cidr_of(n, m).unwrap())
        });
        assert!(
            t.is_some(),
            "node {n}: routes to the other nodes' pod CIDRs missing after 10 s: {}\n{}",
            route_table(&w, n),
            w.protocols(n)
        );
        let routes = w.bird_routes(n).unwrap();
        for &m in &others {
            let r = routes.iter().find(|r| r.dst == bird::pod_cidr(m)).unwrap();
            assert_eq!(
                (r.prefix, r.gateway),
                (bird::POD_PREFIX, Some(bird::node_ip(m))),
                "node {n}: route to node {m}'s CIDR: {routes:?}"
            );
        }
        assert!(
            !routes.iter().any(|r| r.dst == bird::pod_cidr(n)),
            "node {n} installed its own CIDR: {routes:?}"
        );
    }

    // Pod → remote pod over nsfast's BPF path: out through the node's FIB (fib_redirect or
    // fib_redirect_neigh), in from the wire straight into the pod (wire_to_pod).
    // TCP, node 0 ↔ node 2: every packet, GSO packets of up to 64 KB included (so at least
    // BULK / 64 KiB each way), and none handed to the nodes' stacks (pod_to_stack).
    let snap =
        |w: &BirdWorld| -> Vec<serde_json::Value> { (0..NODES).map(|n| counters(w, n)).collect() };
    let grew = |before: &[serde_json::Value],
                after: &[serde_json::Value],
                what: &str,
                want: [u64; NODES]| {
        for n in 0..NODES {
            let out = fib_out(&after[n]) - fib_out(&before[n]);
            let inn = c(&after[n], "wire_to_pod") - c(&before[n], "wire_to_pod");
            assert!(
                out >= want[n] && inn >= want[n],
                "{what}: node {n}: pod -> wire through the FIB {out}, wire -> pod {inn}, \
                 expected at least {} each: before {} after {}",
                want[n],
                before[n],
                after[n]
            );
        }
    };
    let before = snap(&w);
    tcp_bulk(&pods[0], &pods[2], 18100);
    let after = snap(&w);
    let gso = BULK / 65536;
    grew(&before, &after, "TCP 0 <-> 2", [gso, 0, gso]);
    for n in 0..NODES {
        assert_eq!(
            c(&after[n], "pod_to_stack"),
            c(&before[n], "pod_to_stack"),
            "TCP 0 <-> 2: node {n} handed pod packets to its stack: before {} after {}",
            before[n],
            after[n]
        );
    }
    // UDP, node 1 -> node 2 and node 0 -> node 1, echoed back: every datagram.
    let r = UDP_ROUNDS as u64;
    let before = after;
    udp_probe(&pods[1], &pods[2], 18101);
    udp_probe(&pods[0], &pods[1], 18102);
    let after = snap(&w);
    grew(&before, &after, "UDP 1 -> 2, 0 -> 1", [r, 2 * r, r]);

    // Node 2's BIRD dies: nodes 0 and 1 drop its CIDR within the hold time (its TCP session
    // closes, so in practice at once), and a connect to its pod fails at once.
    let pid = w.kill_bird(2).unwrap_or_else(|e| panic!("{e:#}"));
    for n in [0, 1] {
        let t = within(bird::HOLD_TIME + Duration::from_secs(1), || {
            !w.has_cidr_of(n, 2).unwrap()
        });
        assert!(
            t.is_some(),
            "node {n} still routes node 2's CIDR {}/{} after BIRD (pid {pid}) was killed: {}\n{}",
            bird::pod_cidr(2),
            bird::POD_PREFIX,
            route_table(&w, n),
            w.protocols(n)
        );
        eprintln!(
            "node {n}: node 2's CIDR gone from the kernel table {:?} after its BIRD was killed",
            t.unwrap()
        );
    }
    for from in [&pods[0], &pods[1]] {
        let to = SocketAddr::new(IpAddr::V4(pods[2].ip), 18103);
        let t0 = Instant::now();
        let r = from
            .netns()
            .run(|| TcpStream::connect_timeout(&to, Duration::from_secs(10)))
            .unwrap();
        let took = t0.elapsed();
        let err = match r {
            Ok(_) => panic!(
                "{} reached {to} after node 2's routes were withdrawn",
                from.ip
            ),
            Err(e) => e,
        };
        assert!(
            matches!(
                err.raw_os_error(),
                Some(nix::libc::ENETUNREACH) | Some(nix::libc::EHOSTUNREACH)
            ),
            "connect {} -> {to}: {err} ({:?}), expected ENETUNREACH or EHOSTUNREACH",
            from.ip,
            err.kind()
        );
        assert!(
            took < Duration::from_secs(2),
            "connect {} -> {to} failed only after {took:?}",
            from.ip
        );
        eprintln!("connect {} -> {to}: {err} after {took:?}", from.ip);
    }
    // The two others still reach each other.
    assert!(w.has_cidr_of(0, 1).unwrap() && w.has_cidr_of(1, 0).unwrap());
    tcp_ping(&pods[0], &pods[1], 18104);
}
