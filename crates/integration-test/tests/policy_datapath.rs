//! Root test of NetworkPolicy in the BPF datapath: the upstream netpol world (namespaces x,
//! y, z; pods a, b, c) as nine veth pods of one throwaway host, each serving TCP and UDP on
//! ports 80 and 81, plus `ext`, a namespace on the wire behind the host's uplink (veth
//! `up0`, the wire program attached), and for every case of `nsfast_policy::cases` (applied
//! with `nsfast policy apply`), every probe between them (pod to pod, pod to wire, wire to
//! pod), TCP connect and UDP echo, compared with the reference evaluator. A TCP connect needs
//! the SYN-ACK back and a UDP probe the echo, so replies of allowed connections are tested
//! too. The pods are dual-stack and the wire carries both families: every case runs in IPv4
//! and again in IPv6 (its addresses and ipBlocks rendered in IPv6). Run as root.
//!
//! Sabotage check (docs/pod.md, "NetworkPolicy"): disabling one rule kind in
//! bpf/lib/pod_policy.h (the any-peer entry, the per-peer entry, the prefix table, the
//! isolation lookup, the port match, the reply flows) makes this test fail.

mod common;
use common::{nsfast, nsfast_ok, nsfast_stdin, text};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nsfast_lab::require_root;
use nsfast_lab::world::unique;
use nsfast_policy::cases;
use nsfast_policy::Protocol;
use nsfast_sys::netns::{self, NetNs};

/// How long a probe waits for its answer. A probe that times out is tried again with
/// [`retry_timeout`] before it counts as denied: on a loaded machine an allowed probe can
/// miss the first wait, while a denied one can never pass.
const TIMEOUT: Duration = Duration::from_millis(400);

/// 1.5 s, or `NSFAST_TEST_POLICY_RETRY_MS` (the VM guests under TCG need longer).
fn retry_timeout() -> Duration {
    Duration::from_millis(env_number("NSFAST_TEST_POLICY_RETRY_MS", 1500))
}

/// The number in environment variable `var`, or `default`.
fn env_number<T: std::str::FromStr>(var: &str, default: T) -> T {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The environment's selection: `NSFAST_TEST_POLICY_CASE` (comma-separated parts of case
/// names; every case without it) and `NSFAST_TEST_POLICY_FAMILIES` (`4`, `6` or `4,6`, the
/// default).
fn selected(var: &str, what: &str) -> bool {
    std::env::var(var).map_or(true, |v| v.split(',').any(|p| what.contains(p.trim())))
}

fn addr(e: &str) -> IpAddr {
    if e == cases::EXT {
        return "192.0.2.1".parse().unwrap();
    }
    let (n, p) = e.split_once('/').unwrap();
    let ni = cases::NAMESPACES.iter().position(|x| *x == n).unwrap() as u8;
    let pi = cases::PODS.iter().position(|x| *x == p).unwrap() as u8;
    IpAddr::V4(Ipv4Addr::new(10, 79, 0, 10 + ni * 10 + pi))
}

/// An endpoint's address in one family.
type AddrOf = dyn Fn(&str) -> IpAddr;

/// The IPv6 address of the same endpoint.
fn addr6(e: &str) -> IpAddr {
    match addr(e) {
        IpAddr::V4(a) if e == cases::EXT => IpAddr::V6(Ipv6Addr::new(
            0xfd79,
            2,
            0,
            0,
            0,
            0,
            0,
            u16::from(a.octets()[3]),
        )),
        IpAddr::V4(a) => IpAddr::V6(Ipv6Addr::new(
            0xfd79,
            0,
            0,
            0,
            0,
            0,
            0,
            u16::from(a.octets()[3]),
        )),
        v6 => v6,
    }
}

/// The host, its nine pods and the wire; everything goes on drop (also on panic).
struct World {
    host: String,
    wire: String,
    pods: Vec<(String, String)>, // (endpoint name x/a, pod/netns name)
    policy_dir: PathBuf,
    stop: Arc<AtomicBool>,
}

impl Drop for World {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = nsfast(&["pod", "del", "--all", "--host", &self.host]);
        for (_, p) in &self.pods {
            let _ = netns::delete_named(p);
        }
        let _ = std::fs::remove_dir_all(&self.policy_dir);
        let _ = std::fs::remove_dir(nsfast_pod::policy::POLICY_ROOT);
        let _ = std::fs::remove_dir("/run/nsfast");
        let _ = netns::delete_named(&self.host);
        let _ = netns::delete_named(&self.wire);
    }
}

fn build() -> World {
    let host = unique("nph");
    NetNs::create(&host).unwrap().persist();
    let key = nsfast_pod::Host::open(Some(&host)).unwrap().key;
    let wire = unique("npw");
    NetNs::create(&wire).unwrap().persist();
    // The wire: veth up0 (host) <-> eth0 (wire), 192.0.2.0/24 and fd79:2::/64, the pods'
    // subnets routed back (netlink: the VM guests have no iproute2).
    let (hn, wn) = (
        NetNs::open(&host).unwrap().netlink().unwrap(),
        NetNs::open(&wire).unwrap().netlink().unwrap(),
    );
    hn.create_veth_into("up0", "wiretmp0", &wn, "eth0")
        .expect("wire");
    hn.add_address("up0", "192.0.2.254".parse().unwrap(), 24)
        .unwrap();
    hn.add_address("up0", "fd79:2::fe".parse().unwrap(), 64)
        .unwrap();
    wn.add_address("eth0", "192.0.2.1".parse().unwrap(), 24)
        .unwrap();
    wn.add_address("eth0", "fd79:2::1".parse().unwrap(), 64)
        .unwrap();
    wn.add_route(
        "10.79.0.0".parse().unwrap(),
        24,
        Some("192.0.2.254".parse().unwrap()),
        None,
    )
    .unwrap();
    wn.add_route(
        "fd79::".parse().unwrap(),
        64,
        Some("fd79:2::fe".parse().unwrap()),
        None,
    )
    .unwrap();
    let mut w = World {
        host: host.clone(),
        wire: wire.clone(),
        pods: Vec::new(),
        policy_dir: PathBuf::from(nsfast_pod::policy::POLICY_ROOT).join(key),
        stop: Arc::new(AtomicBool::new(false)),
    };
    let mode = common::pod_mode_str();
    for n in cases::NAMESPACES {
        for p in cases::PODS {
            let e = format!("{n}/{p}");
            let pod = unique(&format!("{n}{p}"));
            w.pods.push((e.clone(), pod.clone()));
            let ip = format!("{}/24,{}/64", addr(&e), addr6(&e));
            let mut args = vec![
                "pod",
                "add",
                &pod,
                "--ip",
                &ip,
                "--host",
                &host,
                "--mode",
                &mode,
                "--namespace",
                n,
                "--uplink",
                "up0",
            ];
            let label = format!("pod={p}");
            args.extend(["--label", &label]);
            let named: Vec<String> = cases::named_ports()
                .iter()
                .map(|np| format!("{}={}/{}", np.name, np.port, np.protocol))
                .collect();
            for np in &named {
                args.extend(["--named-port", np]);
            }
            let o = nsfast(&args);
            assert!(o.status.success(), "pod add {e}: {}", text(&o));
        }
    }
    for n in cases::NAMESPACES {
        let l = format!("ns={n}");
        nsfast_ok(&["policy", "namespace", n, "--label", &l, "--host", &host]);
    }
    for (_, pod) in &w.pods {
        serve(pod, w.stop.clone());
    }
    serve(&wire, w.stop.clone());
    w
}

/// TCP listeners (accept and close) and UDP echo sockets on ports 80 and 81 in `pod`.
fn serve(pod: &str, stop: Arc<AtomicBool>) {
    let ns = NetNs::open(pod).unwrap();
    for port in cases::PORTS {
        let (tcp, udp) = ns
            .run(|| {
                // Both families (a dual-stack socket: IPv4 arrives v4-mapped).
                let any = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
                (
                    TcpListener::bind(any).unwrap(),
                    UdpSocket::bind(any).unwrap(),
                )
            })
            .unwrap();
        tcp.set_nonblocking(true).unwrap();
        let s = stop.clone();
        std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match tcp.accept() {
                    Ok((mut c, _)) => {
                        let _ = c.write_all(b"k");
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        udp.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let s = stop.clone();
        std::thread::spawn(move || {
            let mut b = [0u8; 64];
            while !s.load(Ordering::SeqCst) {
                if let Ok((n, from)) = udp.recv_from(&mut b) {
                    let _ = udp.send_to(&b[..n], from);
                }
            }
        });
    }
}

/// Whether a connection from netns `src` to `dst:port` gets through (TCP: connected and
/// the server's byte read; UDP: the echo came back).
fn probe(src: &str, dst: IpAddr, protocol: Protocol, port: u16, wait: Duration) -> bool {
    let ns = NetNs::open(src).unwrap();
    let to = SocketAddr::new(dst, port);
    ns.run(move || match protocol {
        Protocol::Tcp => {
            let Ok(mut c) = TcpStream::connect_timeout(&to, wait) else {
                return false;
            };
            c.set_read_timeout(Some(wait)).unwrap();
            let mut b = [0u8; 1];
            matches!(c.read(&mut b), Ok(1))
        }
        _ => {
            let u = UdpSocket::bind(if dst.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }).unwrap();
            u.set_read_timeout(Some(wait)).unwrap();
            let mut b = [0u8; 8];
            // Two tries: the first datagram may wait for the pod's ARP of its gateway.
            for _ in 0..2 {
                let _ = u.send_to(b"ping", to);
                if matches!(u.recv_from(&mut b), Ok((4, _))) {
                    return true;
                }
            }
            false
        }
    })
    .unwrap()
}

fn apply(host: &str, yaml: &str) {
    let o = nsfast_stdin(&["policy", "apply", "-f", "-", "--host", host], yaml);
    assert!(o.status.success(), "policy apply: {}\n{yaml}", text(&o));
}

fn delete_all(host: &str) {
    let v: serde_json::Value =
        serde_json::from_str(&nsfast_ok(&["-j", "policy", "list", "--host", host])).unwrap();
    for p in v["policies"].as_array().unwrap() {
        let (n, ns) = (
            p["metadata"]["name"].as_str().unwrap(),
            p["metadata"]["namespace"].as_str().unwrap(),
        );
        nsfast_ok(&["policy", "delete", n, "-n", ns, "--host", host]);
    }
}

#[test]
fn the_datapath_decides_every_upstream_case_as_the_evaluator() {
    require_root();
    let w = build();
    let netns_of = |e: &str| {
        if e == cases::EXT {
            return w.wire.clone();
        }
        w.pods.iter().find(|(n, _)| n == e).unwrap().1.clone()
    };
    let mut failures = Vec::new();
    let mut allowed_seen = 0usize;
    let mut denied_seen = 0usize;
    let families: [(&str, &AddrOf); 2] = [("IPv4", &addr), ("IPv6", &addr6)];
    for (family, addr) in families {
        if !selected("NSFAST_TEST_POLICY_FAMILIES", &family[3..]) {
            continue;
        }
        let world = cases::world(addr);
        // The named cases, then the generated ones (seed `NSFAST_TEST_POLICY_SEED`, default
        // 1; `NSFAST_TEST_POLICY_GENERATED` of them, default 8), all against the evaluator.
        let seed: u64 = env_number("NSFAST_TEST_POLICY_SEED", 1);
        let n: usize = env_number("NSFAST_TEST_POLICY_GENERATED", 8);
        let generated = cases::generated(seed, n);
        let named = cases::cases();
        let all = named.iter().map(|c| (c.name.to_string(), c.yaml)).chain(
            generated
                .iter()
                .enumerate()
                .map(|(i, y)| (format!("generated seed {seed} #{i}"), y.as_str())),
        );
        for (name, template) in all {
            if !selected("NSFAST_TEST_POLICY_CASE", &name) {
                continue;
            }
            delete_all(&w.host);
            let yaml = cases::render(template, addr);
            if !yaml.trim().is_empty() {
                apply(&w.host, &yaml);
            }
            let policies: Vec<_> = nsfast_policy::parse(&yaml)
                .unwrap()
                .into_iter()
                .map(|p| p.policy)
                .collect();
            let probes = cases::probes(&world, addr);
            let run = |wait: Duration, which: &dyn Fn(usize) -> bool| -> Vec<Option<bool>> {
                std::thread::scope(|s| {
                    let hs: Vec<_> = probes
                        .iter()
                        .enumerate()
                        .map(|(i, (src, dst, probe))| {
                            let go = which(i);
                            let src_ns = netns_of(src);
                            let (proto, port, dst_ip) = (probe.protocol, probe.port, addr(dst));
                            s.spawn(move || {
                                go.then(|| probe_fn(&src_ns, dst_ip, proto, port, wait))
                            })
                        })
                        .collect();
                    hs.into_iter().map(|h| h.join().unwrap()).collect()
                })
            };
            let first = run(TIMEOUT, &|_| true);
            let again = run(retry_timeout(), &|i| first[i] == Some(false));
            let results: Vec<(String, bool, bool)> = probes
                .iter()
                .enumerate()
                .map(|(i, (src, dst, probe))| {
                    let want = nsfast_policy::allowed(&world, &policies, probe);
                    let label = format!("{src} -> {dst} {}/{}", probe.protocol, probe.port);
                    (
                        label,
                        want,
                        first[i] == Some(true) || again[i] == Some(true),
                    )
                })
                .collect();
            let mut wrong = Vec::new();
            for (label, want, got) in results {
                if want {
                    allowed_seen += 1;
                } else {
                    denied_seen += 1;
                }
                if want != got {
                    wrong.push(format!(
                        "{label}: evaluator {}, datapath {}",
                        if want { "allow" } else { "deny" },
                        if got { "allow" } else { "deny" }
                    ));
                }
            }
            if !wrong.is_empty() {
                let doc = if name.starts_with("generated") {
                    format!("\n{yaml}")
                } else {
                    String::new()
                };
                failures.push(format!(
                    "{} in {family} ({} wrong):\n    {}{doc}",
                    name,
                    wrong.len(),
                    wrong.join("\n    ")
                ));
            }
        }
    }
    // The drops were counted per pod.
    let l: serde_json::Value =
        serde_json::from_str(&nsfast_ok(&["-j", "pod", "list", "--host", &w.host])).unwrap();
    let drops: u64 = l["policy_drops"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        allowed_seen > 0 && denied_seen > 0,
        "{allowed_seen} allowed, {denied_seen} denied"
    );
    assert!(drops > 0, "no policy drop counted: {l}");
    // The wire probes took the BPF paths (the uplink program in, fib + redirect out).
    let c = |k: &str| l["counters"][k].as_u64().unwrap_or(0);
    assert!(c("wire_to_pod") > 0, "{l}");
    assert!(c("fib_redirect") + c("fib_neigh") > 0, "{l}");
}

fn probe_fn(src: &str, dst: IpAddr, proto: Protocol, port: u16, wait: Duration) -> bool {
    probe(src, dst, proto, port, wait)
}
