//! Root tests of the pod shortcut (`nsfast pod shortcut`): `nsfast sockmap`'s programs in pod
//! mode between pods of one host. Worlds are the lab's two-host pod topology (throwaway
//! namespaces, removed on drop, also on panic) with the shortcut attached to a test cgroup the
//! peers (`nsfast-testpeer`, separate processes) run in. Counters come from `nsfast -j pod
//! shortcut status`. `NSFAST_BIN` runs another build.

mod common;
use common::{nft_in, nsfast, nsfast_env, nsfast_ok, nsfast_stdin, text};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use nsfast_lab::peer::{self, BidirReport, KillOnDrop, Report};
use nsfast_lab::pods::{ModeRequest, Topology};
use nsfast_lab::require_root;
use nsfast_lab::world::{unique, TestCgroup};
use nsfast_sys::netns::NetNs;
use serde_json::{json, Value};

const GIB: u64 = 1 << 30;

/// The bulk size: 1 GiB, or `NSFAST_TEST_BULK_MIB` MiB (the TCG guests use less).
fn bulk_bytes() -> u64 {
    nsfast_lab::env_number("NSFAST_TEST_BULK_MIB")
        .map(|m| m << 20)
        .unwrap_or(GIB)
}

fn mode() -> ModeRequest {
    match std::env::var("NSFAST_TEST_POD_MODE").as_deref() {
        Ok("netkit") => ModeRequest::Netkit,
        Ok("netkit-l2") => ModeRequest::NetkitL2,
        Ok("veth") => ModeRequest::Veth,
        _ => ModeRequest::Auto,
    }
}

/// The lab's two-host pod topology (pods a0, a1 on host A, b0, b1 on host B) and a cgroup the
/// peers run in; the shortcut enabled on `shortcut_hosts`. Dropped: extra pods deleted, the
/// shortcut disabled, then the topology (pods, hosts) and the cgroup.
struct World {
    extra: Vec<(String, String)>,
    topo: Option<Topology>,
    cg: TestCgroup,
}

impl World {
    fn new(shortcut_hosts: &[usize]) -> Self {
        let topo = Topology::build(&unique("sc"), mode(), 2).expect("build the pod topology");
        let w = World {
            extra: Vec::new(),
            topo: Some(topo),
            cg: TestCgroup::new(),
        };
        for &h in shortcut_hosts {
            w.enable(h);
        }
        w
    }

    fn topo(&self) -> &Topology {
        self.topo.as_ref().expect("topology")
    }

    fn host(&self, h: usize) -> &str {
        self.topo().host_name(h)
    }

    fn enable(&self, h: usize) -> String {
        let cg = self.cg.path().to_string_lossy().into_owned();
        nsfast_ok(&[
            "pod",
            "shortcut",
            "enable",
            "--allow-splice-hole",
            "--host",
            self.host(h),
            "--cgroup",
            &cg,
        ])
    }

    fn pod_ns(&self, h: usize, i: usize) -> NetNs {
        self.topo().pod(h, i).netns().expect("open pod netns")
    }

    fn pod_name(&self, h: usize, i: usize) -> String {
        self.topo().pod(h, i).record.name.clone()
    }

    fn addr(&self, h: usize, i: usize, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.topo().pod(h, i).ip()), port)
    }

    /// `nsfast -j pod shortcut status --host` of host `h`.
    fn status(&self, h: usize) -> Value {
        let out = nsfast_ok(&["-j", "pod", "shortcut", "status", "--host", self.host(h)]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("status JSON {out:?}: {e}"))
    }

    /// Counter `key` of pod `name` on host `h` (0 if the pod is not listed).
    fn pod_counter(&self, h: usize, name: &str, key: &str) -> u64 {
        self.status(h)["pods"][name][key].as_u64().unwrap_or(0)
    }

    /// Adds pod `name` (address `ip`) to host `h` through the CLI with `extra` flags.
    fn add_pod(&mut self, h: usize, name: &str, ip: &str, extra: &[&str]) -> NetNs {
        self.extra
            .push((name.to_string(), self.host(h).to_string()));
        let mut a = vec!["pod", "add", name, "--ip", ip, "--host", self.host(h)];
        a.extend_from_slice(extra);
        nsfast_ok(&a);
        NetNs::open(name).expect("open the new pod's netns")
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for (name, host) in self.extra.drain(..) {
            let _ = nsfast_env(&["pod", "del", &name, "--host", &host], &[]);
        }
        if let Some(t) = &self.topo {
            for h in 0..2 {
                let _ = nsfast_env(
                    &["pod", "shortcut", "disable", "--host", t.host_name(h)],
                    &[],
                );
            }
        }
        drop(self.topo.take());
    }
}

fn args(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn bidir_server(ns: &NetNs, cg: &Path, listen: SocketAddr, bytes: u64, seed: u64) -> KillOnDrop {
    let s = peer::spawn(
        &nsfast_lab::bins::testpeer(),
        ns,
        Some(cg),
        &args(&[
            "bidir-server",
            "--listen",
            &listen.to_string(),
            "--bytes",
            &bytes.to_string(),
            "--seed",
            &seed.to_string(),
        ]),
    );
    peer::wait_listening(ns, listen);
    s
}

fn bidir_client(
    ns: &NetNs,
    cg: &Path,
    connect: SocketAddr,
    bytes: u64,
    seed: u64,
    extra: &[&str],
) -> KillOnDrop {
    let mut a = args(&[
        "bidir-client",
        "--connect",
        &connect.to_string(),
        "--bytes",
        &bytes.to_string(),
        "--seed",
        &seed.to_string(),
    ]);
    a.extend(args(extra));
    peer::spawn(&nsfast_lab::bins::testpeer(), ns, Some(cg), &a)
}

fn check_bidir(c: &BidirReport, s: &BidirReport, bytes: u64) {
    assert_eq!((c.sent, s.sent), (bytes, bytes));
    assert_eq!(
        c.received, bytes,
        "client received {} of {bytes}",
        c.received
    );
    assert_eq!(
        s.received, bytes,
        "server received {} of {bytes}",
        s.received
    );
    assert_eq!(c.received_sha256, s.sent_sha256, "client got other bytes");
    assert_eq!(s.received_sha256, c.sent_sha256, "server got other bytes");
}

/// A byte-exact transfer of `bytes` each way from `cns` to a server in `sns` at `addr`.
fn transfer(cns: &NetNs, sns: &NetNs, cg: &Path, addr: SocketAddr, bytes: u64) {
    transfer_with(cns, sns, cg, addr, bytes, &[]);
}

/// [`transfer`] with more flags for the client.
fn transfer_with(
    cns: &NetNs,
    sns: &NetNs,
    cg: &Path,
    addr: SocketAddr,
    bytes: u64,
    client_args: &[&str],
) {
    let s = bidir_server(sns, cg, addr, bytes, 1);
    let c = bidir_client(cns, cg, addr, bytes, 2, client_args);
    let cr: BidirReport = peer::finish(c, "client");
    let sr: BidirReport = peer::finish(s, "server");
    check_bidir(&cr, &sr, bytes);
}

/// [`transfer`] with the client paced at 16 MiB/s, for the controls that need some bytes
/// redirected: a direction redirects only once its receiver has returned from a read and read
/// everything sent so far, and a transfer that fits in the socket buffers could otherwise be
/// sent whole before a receiver on a loaded machine first reads, all of it on TCP.
fn paced_transfer(cns: &NetNs, sns: &NetNs, cg: &Path, addr: SocketAddr, bytes: u64) {
    let rate = (16u64 << 20).to_string();
    transfer_with(cns, sns, cg, addr, bytes, &["--rate", &rate]);
}

/// Every byte pod `name` sent took the shortcut or, sent before its receiver was seen reading
/// everything sent to it, TCP (the gate: counted as passed, never as a fallback).
fn assert_pod_carried(st: &Value, name: &str, bytes: u64) {
    let c = &st["pods"][name];
    let (r, p) = (
        c["redirected_bytes"].as_u64().unwrap(),
        c["passed_bytes"].as_u64().unwrap(),
    );
    assert_eq!(r + p, bytes, "pod {name}: {st}");
    assert_eq!(c["fallbacks"], 0, "pod {name}: {st}");
    assert_eq!(c["paired"], 1, "pod {name}: {st}");
}

/// [`assert_pod_carried`], and some of the bytes took the shortcut (its first sends may wait
/// on TCP for the receiver's first read).
fn assert_pod_redirected(st: &Value, name: &str, bytes: u64) {
    assert_pod_carried(st, name, bytes);
    let r = st["pods"][name]["redirected_bytes"].as_u64().unwrap();
    assert!(r > 0, "pod {name}: {st}");
}

/// Some of `total` bytes took the shortcut (a direction's bytes stay on TCP while its receiver
/// has not read everything sent to it: in a bulk transfer that can be most of it).
fn assert_some_redirected(st: &Value, total: u64) {
    let r = st["redirected_bytes"].as_u64().unwrap();
    assert!(r > 0, "{r} of {total} bytes redirected: {st}");
}

#[test]
fn two_pods_move_a_gib_each_way_all_of_it_redirected() {
    require_root();
    let w = World::new(&[0]);
    let cg = w.cg.procs();
    let (a0, a1) = (w.pod_name(0, 0), w.pod_name(0, 1));
    let st = w.status(0);
    assert_eq!(st["enabled"], true, "{st}");
    assert!(st["schema_version"].is_u64(), "{st}");
    assert!(
        st["bypasses"]
            .as_str()
            .unwrap()
            .contains("tc and netfilter"),
        "{st}"
    );
    let bytes = bulk_bytes();
    transfer(
        &w.pod_ns(0, 1),
        &w.pod_ns(0, 0),
        &cg,
        w.addr(0, 0, 5001),
        bytes,
    );
    let st = w.status(0);
    for p in [&a0, &a1] {
        let c = &st["pods"][p.as_str()];
        assert_pod_carried(&st, p, bytes);
        assert_eq!(c["shortcut"], true, "pod {p}: {st}");
    }
    assert_some_redirected(&st, 2 * bytes);
    // `pod list` shows the same counters.
    let l: Value =
        serde_json::from_str(&nsfast_ok(&["-j", "pod", "list", "--host", w.host(0)])).unwrap();
    assert_eq!(l["shortcut_enabled"], true, "{l}");
    assert_eq!(
        l["shortcut"][a0.as_str()]["redirected_bytes"],
        st["pods"][a0.as_str()]["redirected_bytes"],
        "{l}"
    );
    let text = nsfast_ok(&["pod", "list", "--host", w.host(0)]);
    let a0_redirected = st["pods"][a0.as_str()]["redirected_bytes"].to_string();
    assert!(
        text.contains("BYTES-REDIRECTED") && text.contains(&a0_redirected),
        "{text}"
    );
}

#[test]
fn pod_to_host_and_pod_to_remote_pod_keep_the_kernel_path() {
    require_root();
    let w = World::new(&[0, 1]);
    let cg = w.cg.procs();
    let bytes = 16 << 20;
    let (a0, a1, b0) = (w.pod_name(0, 0), w.pod_name(0, 1), w.pod_name(1, 0));
    // Host A (its own namespace, in the cgroup) -> pod a0.
    transfer(
        &w.topo().hosts[0],
        &w.pod_ns(0, 0),
        &cg,
        w.addr(0, 0, 5101),
        bytes,
    );
    // Pod b0 of host B, over the wire -> pod a0.
    transfer(
        &w.pod_ns(1, 0),
        &w.pod_ns(0, 0),
        &cg,
        w.addr(0, 0, 5102),
        bytes,
    );
    let (sa, sb) = (w.status(0), w.status(1));
    for (st, p) in [(&sa, &a0), (&sb, &b0)] {
        let c = &st["pods"][p.as_str()];
        assert_eq!(c["redirected_bytes"], 0, "pod {p} was redirected: {st}");
        assert_eq!(c["paired"], 0, "pod {p} was paired: {st}");
        assert!(
            c["passed_bytes"].as_u64().unwrap() >= bytes,
            "pod {p}: {st}"
        );
    }
    assert_eq!(sa["pairs"], 0, "{sa}");
    assert_eq!(sb["pairs"], 0, "{sb}");
    // The same pod with a pod of its own host: redirected (the control).
    paced_transfer(
        &w.pod_ns(0, 1),
        &w.pod_ns(0, 0),
        &cg,
        w.addr(0, 0, 5103),
        bytes,
    );
    assert_pod_redirected(&w.status(0), &a1, bytes);
}

/// A pod whose peer pod stops reading is held back within the queue limit and TCP's own
/// buffers, as with `nsfast sockmap` (pod mode loads the same program with the default limit).
#[test]
fn a_pod_that_stops_reading_holds_the_sending_pod_back() {
    require_root();
    let w = World::new(&[0]);
    peer::assert_stopped_reader_holds_sender_back(
        &w.pod_ns(0, 0),
        &w.pod_ns(0, 1),
        Some(&w.cg.procs()),
        w.addr(0, 0, 5150),
        256 << 20,
        1 << 20,
        nsfast_sockmap::abi::DEFAULT_QUEUE_LIMIT,
        || w.status(0).to_string(),
    );
    // Held back by the queue limit, or (when the receiver stopped while that direction was
    // still on TCP, as in slow TCG guests) by TCP's window.
    let st = w.status(0);
    assert!(
        st["queue_limit"].as_u64().unwrap() >= 1 || st["gated_bytes"].as_u64().unwrap() > 0,
        "{st}"
    );
}

#[test]
fn a_no_shortcut_pod_is_not_redirected() {
    require_root();
    let mut w = World::new(&[0]);
    let cg = w.cg.procs();
    let bytes = 16 << 20;
    let name = unique("sc-x");
    let x = w.add_pod(
        0,
        &name,
        "10.251.1.30/24",
        &["--no-shortcut", "--mode", "veth"],
    );
    let a0 = w.pod_name(0, 0);
    transfer(&x, &w.pod_ns(0, 0), &cg, w.addr(0, 0, 5201), bytes);
    let st = w.status(0);
    assert_eq!(st["pods"][name.as_str()]["shortcut"], false, "{st}");
    assert_eq!(st["pods"][name.as_str()]["redirected_bytes"], 0, "{st}");
    assert_eq!(st["pods"][name.as_str()]["paired"], 0, "{st}");
    assert!(
        st["pods"][name.as_str()]["opted_out"].as_u64().unwrap() >= 1,
        "{st}"
    );
    assert_eq!(st["pods"][a0.as_str()]["redirected_bytes"], 0, "{st}");
    assert_eq!(st["pairs"], 0, "{st}");
    let list = nsfast_ok(&["pod", "list", "--host", w.host(0)]);
    assert!(list.contains("opted-out"), "{list}");
}

/// Dual-stack pods pair over IPv6 too: an IPv6 connection between two pods of one host is
/// redirected byte for byte, as an IPv4 one is.
#[test]
fn ipv6_pod_connections_take_the_shortcut() {
    require_root();
    let mut w = World::new(&[0]);
    let cg = w.cg.procs();
    let bytes = 16 << 20;
    let (n1, n2) = (unique("sc-6a"), unique("sc-6b"));
    let p1 = w.add_pod(0, &n1, "10.251.1.31/24,fd51:1::31/64", &["--mode", "veth"]);
    let p2 = w.add_pod(0, &n2, "10.251.1.32/24,fd51:1::32/64", &["--mode", "veth"]);
    let to: SocketAddr = "[fd51:1::31]:5301".parse().unwrap();
    transfer(&p2, &p1, &cg, to, bytes);
    let st = w.status(0);
    for n in [&n1, &n2] {
        assert_pod_carried(&st, n, bytes);
    }
    assert_some_redirected(&st, 2 * bytes);
}

/// Two worlds with identical pod addresses, each host A with its own shortcut on the same
/// cgroup: 200 connections each from one fixed source port to its own world's tag server, and
/// bulk transfers at the same time; nobody reads the other world's bytes.
#[test]
fn identical_pods_on_two_hosts_never_receive_each_others_bytes() {
    require_root();
    let w1 = World::new(&[0]);
    let w2 = World::new(&[]);
    // w2's host A on w1's cgroup: two pod-mode instances see every socket there.
    let cg_path = w1.cg.path().to_string_lossy().into_owned();
    nsfast_ok(&[
        "pod",
        "shortcut",
        "enable",
        "--allow-splice-hole",
        "--host",
        w2.host(0),
        "--cgroup",
        &cg_path,
    ]);
    let cg = w1.cg.procs();
    let peer_bin = nsfast_lab::bins::testpeer();
    let iterations = 200u64;
    let mut servers = Vec::new();
    let mut clients = Vec::new();
    let mut bulk = Vec::new();
    for (i, w) in [&w1, &w2].into_iter().enumerate() {
        let tag = format!("world-{i}");
        let listen = w.addr(0, 0, 5301);
        let s = peer::spawn(
            &peer_bin,
            &w.pod_ns(0, 0),
            Some(&cg),
            &args(&[
                "tag-server",
                "--listen",
                &listen.to_string(),
                "--tag",
                &tag,
                "--count",
                &iterations.to_string(),
            ]),
        );
        peer::wait_listening(&w.pod_ns(0, 0), listen);
        servers.push(s);
        let bulk_addr = w.addr(0, 0, 5302);
        let bs = bidir_server(&w.pod_ns(0, 0), &cg, bulk_addr, 64 << 20, 10 + i as u64);
        bulk.push((bs, bulk_addr, i));
    }
    for (i, w) in [&w1, &w2].into_iter().enumerate() {
        let bind = w.addr(0, 1, 40000);
        clients.push(peer::spawn(
            &peer_bin,
            &w.pod_ns(0, 1),
            Some(&cg),
            &args(&[
                "tag-client",
                "--connect",
                &w.addr(0, 0, 5301).to_string(),
                "--bind",
                &bind.to_string(),
                "--expect",
                &format!("world-{i}"),
                "--iterations",
                &iterations.to_string(),
            ]),
        ));
    }
    let mut bulk_clients = Vec::new();
    for (bs, addr, i) in bulk {
        let w = [&w1, &w2][i];
        let bc = bidir_client(&w.pod_ns(0, 1), &cg, addr, 64 << 20, 20 + i as u64, &[]);
        bulk_clients.push((bs, bc));
    }
    for c in clients {
        let r: Report = peer::finish(c, "tag client");
        assert_eq!(r.failed, 0, "a client read another world's bytes: {r:?}");
        assert_eq!(r.ok, iterations, "{r:?}");
    }
    for s in servers {
        let _: Report = peer::finish(s, "tag server");
    }
    for (bs, bc) in bulk_clients {
        let cr: BidirReport = peer::finish(bc, "bulk client");
        let sr: BidirReport = peer::finish(bs, "bulk server");
        check_bidir(&cr, &sr, 64 << 20);
    }
    for w in [&w1, &w2] {
        let st = w.status(0);
        assert!(st["pairs"].as_u64().unwrap() >= 1, "{st}");
        let a1 = w.pod_name(0, 1);
        // Most of a1's 64 MiB (its first bytes wait on TCP for the receiver's first read).
        assert!(
            st["pods"][a1.as_str()]["redirected_bytes"]
                .as_u64()
                .unwrap()
                >= 32 << 20,
            "{st}"
        );
    }
}

/// COUNT short connections, one after the other, from pod (0, 1) to an echo server in pod
/// (0, 0) at `port`.
fn short_connections(w: &World, port: u16, count: u64) {
    let cg = w.cg.procs();
    let a = w.addr(0, 0, port);
    let s = peer::spawn(
        &nsfast_lab::bins::testpeer(),
        &w.pod_ns(0, 0),
        Some(&cg),
        &args(&["echo-server", "--listen", &a.to_string()]),
    );
    peer::wait_listening(&w.pod_ns(0, 0), a);
    let c = peer::spawn(
        &nsfast_lab::bins::testpeer(),
        &w.pod_ns(0, 1),
        Some(&cg),
        &args(&[
            "many",
            "--connect",
            &a.to_string(),
            "--conns",
            &count.to_string(),
            "--size",
            "64",
            "--sequential",
        ]),
    );
    let r: Report = peer::finish(c, "short connections");
    assert_eq!((r.ok, r.failed), (count, 0), "{}", r.detail);
    drop(s);
}

/// Admission in pod mode: by default a streak of short connections keeps TCP;
/// `enable --keep-tcp-after 0` joins every one, is recorded and shown, and enabling again
/// with other settings is refused.
#[test]
fn pod_shortcut_admission_is_on_by_default_and_settable() {
    require_root();
    let w = World::new(&[0]);
    let st = w.status(0);
    assert_eq!(
        (&st["keep_tcp_after"], &st["probe_interval_ns"]),
        (&json!(4), &json!(10_000_000)),
        "{st}"
    );
    short_connections(&w, 5601, 40);
    let st = w.status(0);
    assert!(
        st["skipped_short"].as_u64().unwrap() > 0 && st["pairs"].as_u64().unwrap() < 40,
        "a streak of short pod connections keeps TCP: {st}"
    );
    nsfast_ok(&["pod", "shortcut", "disable", "--host", w.host(0)]);
    let cg = w.cg.path().to_string_lossy().into_owned();
    let enable = |extra: &[&str]| {
        let mut a = vec![
            "pod",
            "shortcut",
            "enable",
            "--allow-splice-hole",
            "--host",
            w.host(0),
            "--cgroup",
            &cg,
        ];
        a.extend_from_slice(extra);
        nsfast(&a)
    };
    let o = enable(&["--keep-tcp-after", "0", "--probe-interval", "250ms"]);
    assert!(o.status.success(), "{}", text(&o));
    let st = w.status(0);
    assert_eq!(
        (&st["keep_tcp_after"], &st["probe_interval_ns"]),
        (&json!(0), &json!(250_000_000)),
        "{st}"
    );
    let shown = nsfast_ok(&["pod", "shortcut", "status", "--host", w.host(0)]);
    assert!(
        shown.contains("admission: --keep-tcp-after 0 (every connection joins)"),
        "{shown}"
    );
    short_connections(&w, 5602, 40);
    let st = w.status(0);
    assert_eq!(
        (st["pairs"].as_u64(), st["skipped_short"].as_u64()),
        (Some(40), Some(0)),
        "every connection joins: {st}"
    );
    // The same settings (or none) again: already enabled. Others: refused, nothing changed.
    let o = enable(&["--keep-tcp-after", "0"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(enable(&[]).status.success());
    let o = enable(&["--keep-tcp-after", "4"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("already enabled with --keep-tcp-after 0 --probe-interval 250ms"),
        "{}",
        text(&o)
    );
    assert_eq!(w.status(0)["keep_tcp_after"], json!(0));
}

#[test]
fn disable_mid_transfer_loses_nothing() {
    require_root();
    let w = World::new(&[0]);
    let cg = w.cg.procs();
    let bytes: u64 = 256 << 20;
    let addr = w.addr(0, 0, 5401);
    let s = bidir_server(&w.pod_ns(0, 0), &cg, addr, bytes, 1);
    let mut c = bidir_client(
        &w.pod_ns(0, 1),
        &cg,
        addr,
        bytes,
        2,
        &["--rate", "128000000"],
    );
    let total = 2 * bytes;
    let deadline = Instant::now() + Duration::from_secs(60);
    let at = loop {
        let r = w.status(0)["redirected_bytes"].as_u64().unwrap();
        if r >= total / 4 {
            break r;
        }
        let ended = c.child_mut().try_wait().unwrap().is_some();
        assert!(
            !ended && Instant::now() < deadline,
            "redirected only {r} of {total}"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = nsfast_ok(&["pod", "shortcut", "disable", "--host", w.host(0)]);
    assert!(out.contains("disabled"), "{out}");
    assert!(at < total, "the transfer was over before disable");
    let cr: BidirReport = peer::finish(c, "client");
    let sr: BidirReport = peer::finish(s, "server");
    check_bidir(&cr, &sr, bytes);
    assert_eq!(w.status(0)["enabled"], false);
    let pins = shortcut_pins(w.host(0));
    assert!(pins.is_empty(), "pins left: {pins:?}");
    // Enabled again: new connections take it.
    w.enable(0);
    paced_transfer(
        &w.pod_ns(0, 1),
        &w.pod_ns(0, 0),
        &w.cg.procs(),
        w.addr(0, 0, 5402),
        8 << 20,
    );
    assert_pod_redirected(&w.status(0), &w.pod_name(0, 1), 8 << 20);
}

/// `pod del --all` takes the shortcut with the pods; a host namespace deleted under its pods
/// leaves pod state that `nsfast bench --cleanup` removes, shortcut included (detached).
#[test]
fn pod_del_all_and_bench_cleanup_remove_the_shortcut() {
    require_root();
    let mut w = World::new(&[0, 1]);
    wait_sockops(w.cg.path(), 2, "both hosts enabled");
    let host_a = w.host(0).to_string();
    let out = nsfast_ok(&["pod", "del", "--all", "--host", &host_a]);
    assert!(out.contains("2 pod(s) deleted"), "{out}");
    wait_sockops(w.cg.path(), 1, "host A's pods deleted");
    assert_eq!(w.status(0)["enabled"], false);
    let hb = nsfast_pod::Host::open(Some(w.host(1))).unwrap();
    let (pins, state) = (hb.pin_dir(), hb.state_dir());
    assert!(pins.join("shortcut").exists());
    // Host B's namespace goes without `pod del` (unmounted first, so the topology's drop
    // cannot find it to delete the pods); its pods' namespaces stay (deleted below).
    let topo = w.topo.take().unwrap();
    let pod_names: Vec<String> = topo.pods.iter().map(|p| p.record.name.clone()).collect();
    drop(hb);
    nsfast_sys::netns::delete_named(topo.host_name(1)).expect("unmount host B");
    drop(topo); // host A's pods are gone already; B's cannot be reached: the namespaces close
    for n in &pod_names {
        let _ = nsfast_sys::netns::delete_named(n);
    }
    assert!(
        pins.join("shortcut/link").exists(),
        "the dead host's shortcut is not left for the cleanup"
    );
    wait_sockops(w.cg.path(), 1, "host B gone, before the cleanup");
    let out = nsfast_ok(&["bench", "--cleanup"]);
    assert!(out.contains(&pins.display().to_string()), "{out}");
    assert!(!pins.exists(), "{} left", pins.display());
    assert!(!state.exists(), "{} left", state.display());
    wait_sockops(w.cg.path(), 0, "after the cleanup");
}

/// `shortcut*` entries in host `h`'s pin directory.
fn shortcut_pins(host: &str) -> Vec<PathBuf> {
    let h = nsfast_pod::Host::open(Some(host)).expect("open host");
    std::fs::read_dir(h.pin_dir())
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("shortcut")
        })
        .collect()
}

/// Waits (up to 5 s) until `n` sockops programs are attached to `cg`: the kernel releases a
/// link whose last reference went (unpinned, its process gone) from a workqueue, not at once.
fn wait_sockops(cg: &Path, n: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = sockops_on(cg);
        if now == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {now} sockops programs on {}, expected {n}",
            cg.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How many sockops programs are attached to `cg`.
fn sockops_on(cg: &Path) -> usize {
    let f = std::fs::File::open(cg).unwrap();
    nsfast_sys::bpf::prog_query(
        std::os::fd::AsFd::as_fd(&f),
        nsfast_sys::bpf::BPF_CGROUP_SOCK_OPS,
    )
    .unwrap()
    .len()
}

/// SIGKILL of `pod add` (with the shortcut on) after each step, and of `shortcut enable`
/// after each of its steps: the retry works, the pod takes the shortcut, and exactly one
/// program is attached.
#[test]
fn sigkill_at_each_step_leaves_a_retry_that_works() {
    require_root();
    let mut w = World::new(&[]);
    let cg = w.cg.procs();
    let cg_path = w.cg.path().to_string_lossy().into_owned();
    let host = w.host(0).to_string();
    for step in nsfast_pod::shortcut::ENABLE_STEPS {
        let o = nsfast_env(
            &[
                "pod",
                "shortcut",
                "enable",
                "--allow-splice-hole",
                "--host",
                &host,
                "--cgroup",
                &cg_path,
            ],
            &[(nsfast_pod::pod::CRASH_ENV, step)],
        );
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&o.status),
            Some(9),
            "enable was not killed at {step}: {}",
            text(&o)
        );
        w.enable(0);
        wait_sockops(w.cg.path(), 1, &format!("after a kill at {step}"));
        nsfast_ok(&["pod", "shortcut", "disable", "--host", &host]);
        wait_sockops(w.cg.path(), 0, &format!("after disable ({step})"));
    }
    w.enable(0);
    let steps: Vec<&str> = nsfast_pod::pod::ADD_STEPS
        .iter()
        .copied()
        .filter(|s| !["intent", "ipam"].contains(s))
        .chain(["shortcut"])
        .collect();
    for (n, step) in steps.iter().enumerate() {
        let name = unique(&format!("sc-k{n}"));
        let ip = format!("10.251.1.{}/24", 40 + n);
        let argv = [
            "pod", "add", &name, "--ip", &ip, "--host", &host, "--mode", "veth",
        ];
        w.extra.push((name.clone(), host.clone()));
        let o = nsfast_env(&argv, &[(nsfast_pod::pod::CRASH_ENV, step)]);
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&o.status),
            Some(9),
            "pod add was not killed at {step}: {}",
            text(&o)
        );
        // The retry: a whole pod (or, killed once complete, "already exists").
        let o = nsfast_env(&argv, &[]);
        assert!(
            o.status.success() || String::from_utf8_lossy(&o.stderr).contains("already exists"),
            "retry after a kill at {step}: {}",
            text(&o)
        );
        let ns = NetNs::open(&name).expect("pod netns");
        let port = 5500 + n as u16;
        // Paced: unpaced, 1 MiB fits in the socket buffers and a loaded machine can send it
        // whole before the receiver's first read, all of it on TCP (the gate).
        paced_transfer(&ns, &w.pod_ns(0, 0), &cg, w.addr(0, 0, port), 1 << 20);
        assert_eq!(
            w.pod_counter(0, &name, "redirected_bytes") + w.pod_counter(0, &name, "passed_bytes"),
            1 << 20,
            "pod added after a kill at {step}: {}",
            w.status(0)
        );
        assert!(
            w.pod_counter(0, &name, "redirected_bytes") > 0,
            "pod added after a kill at {step} did not take the shortcut: {}",
            w.status(0)
        );
        nsfast_ok(&["pod", "del", &name, "--host", &host]);
        w.extra.pop();
    }
    wait_sockops(w.cg.path(), 1, "after the pod add kills");
}

/// Runs `nsfast-cni` (the workspace build) inside host namespace `host`.
fn cni(host: &NetNs, cmd: &str, ctr: &str, netns: &str, args: &str, conf: &Value) -> Output {
    cni_env(host, cmd, ctr, netns, args, conf, &[])
}

/// [`cni`] with more environment (`env`).
fn cni_env(
    host: &NetNs,
    cmd: &str,
    ctr: &str,
    netns: &str,
    args: &str,
    conf: &Value,
    env: &[(&str, &str)],
) -> Output {
    use std::io::Write;
    let mut c = Command::new(nsfast_lab::bins::find("nsfast-cni", "NSFAST_CNI_BIN"));
    c.env_remove(nsfast_pod::pod::CRASH_ENV);
    for (k, v) in env {
        c.env(k, v);
    }
    c.env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", ctr)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_ARGS", args)
        .env(
            "CNI_PATH",
            std::env::var("NSFAST_CNI_PATH").unwrap_or_else(|_| "/usr/lib/cni".into()),
        )
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    host.configure_command(&mut c, None);
    let mut child = c.spawn().expect("spawn nsfast-cni");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// `"shortcut": true` in the network config: the first ADD enables the shortcut (on the
/// cgroup2 root), the next pods join it, `NSFAST_SHORTCUT=false` opts one out, a bad value is
/// refused with nothing made, and the last DEL removes the shortcut.
#[test]
fn cni_shortcut_key_enables_it_and_the_arg_opts_out() {
    require_root();
    let cni_path = std::env::var("NSFAST_CNI_PATH").unwrap_or_else(|_| "/usr/lib/cni".into());
    assert!(
        Path::new(&cni_path).join("host-local").is_file(),
        "host-local not found in {cni_path}: apt-get install containernetworking-plugins"
    );
    let tag = unique("sc-cni");
    let host = NetNs::create(&format!("{tag}-h")).expect("host netns");
    let data_dir = tempdir_named(&tag);
    let conf = serde_json::json!({
        "cniVersion": "1.1.0",
        "name": tag,
        "type": "nsfast-cni",
        "mode": "auto",
        "shortcut": true,
        "allowSpliceHole": true,
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": "10.209.7.0/24"}]],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": data_dir.0.display().to_string(),
        },
    });
    struct Ctrs(Vec<(String, NetNs)>, String, Value);
    impl Drop for Ctrs {
        fn drop(&mut self) {
            let host = format!("{}-h", self.1);
            if let Ok(h) = NetNs::open(&host) {
                for (id, ns) in &self.0 {
                    let _ = cni(&h, "DEL", id, &ns.path().display().to_string(), "", &self.2);
                }
            }
            // And whatever a failed ADD kept (an intent whose lease could not be released).
            let _ = nsfast_env(&["pod", "del", "--all", "--host", &host], &[]);
        }
    }
    let mut ctrs = Ctrs(Vec::new(), tag.clone(), conf.clone());
    // Where the splice guard cannot attach (NSFAST_SPLICE_GUARD=off stands for such a
    // kernel), an ADD whose config does not accept the hole fails naming the guard and the
    // key, and enables nothing.
    {
        let mut strict = conf.clone();
        strict.as_object_mut().unwrap().remove("allowSpliceHole");
        let ns = NetNs::create(&unique("sc-ctr")).expect("container netns");
        let o = cni_env(
            &host,
            "ADD",
            "ctr-strict",
            &ns.path().display().to_string(),
            "",
            &strict,
            &[("NSFAST_SPLICE_GUARD", "off")],
        );
        assert!(!o.status.success(), "{}", text(&o));
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        let d = r["details"].as_str().unwrap_or_default();
        assert!(
            d.contains("splice guard cannot attach") && d.contains("--allow-splice-hole"),
            "{r}"
        );
        assert!(!nsfast_pod::Host::open(Some(&format!("{tag}-h")))
            .map(|h| nsfast_pod::shortcut::is_enabled(&h))
            .unwrap_or(false));
        let _ = cni(
            &host,
            "DEL",
            "ctr-strict",
            &ns.path().display().to_string(),
            "",
            &strict,
        );
    }
    let mut ips = Vec::new();
    for (i, args) in [
        "",
        "IgnoreUnknown=1;NSFAST_SHORTCUT=true",
        "IgnoreUnknown=1;NSFAST_SHORTCUT=false",
    ]
    .iter()
    .enumerate()
    {
        let ns = NetNs::create(&unique("sc-ctr")).expect("container netns");
        let id = format!("ctr{i}");
        let o = cni(
            &host,
            "ADD",
            &id,
            &ns.path().display().to_string(),
            args,
            &conf,
        );
        assert!(o.status.success(), "ADD {i}: {}", text(&o));
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        let ip: std::net::Ipv4Addr = r["ips"][0]["address"]
            .as_str()
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        ips.push(ip);
        ctrs.0.push((id, ns));
    }
    // A bad opt-out value: refused, nothing made.
    let bad_ns = NetNs::create(&unique("sc-ctr")).expect("container netns");
    let o = cni(
        &host,
        "ADD",
        "ctrbad",
        &bad_ns.path().display().to_string(),
        "NSFAST_SHORTCUT=maybe",
        &conf,
    );
    assert!(!o.status.success());
    let err: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(err["code"], 4, "{err}");
    assert!(err["msg"].as_str().unwrap().contains("\"maybe\""), "{err}");
    drop(bad_ns);

    let hostname = host.name().to_string();
    let st: Value = serde_json::from_str(&nsfast_ok(&[
        "-j", "pod", "shortcut", "status", "--host", &hostname,
    ]))
    .unwrap();
    assert_eq!(st["enabled"], true, "{st}");
    let root = nsfast_sys::cgroup::cgroup2_mount().unwrap();
    assert_eq!(st["cgroup"], root.display().to_string(), "{st}");
    // Peers anywhere in the cgroup tree: this process's own cgroup.
    let own = own_cgroup_procs();
    let bytes = 8 << 20;
    let a = |i: usize, port| SocketAddr::new(IpAddr::V4(ips[i]), port);
    transfer(&ctrs.0[1].1, &ctrs.0[0].1, &own, a(0, 5601), bytes);
    transfer(&ctrs.0[2].1, &ctrs.0[0].1, &own, a(0, 5602), bytes);
    let st: Value = serde_json::from_str(&nsfast_ok(&[
        "-j", "pod", "shortcut", "status", "--host", &hostname,
    ]))
    .unwrap();
    let pods = st["pods"].as_object().unwrap();
    assert_eq!(pods.len(), 3, "{st}");
    let by_shortcut = |on: bool| {
        pods.values()
            .filter(|p| p["shortcut"] == on)
            .collect::<Vec<_>>()
    };
    let (on, off) = (by_shortcut(true), by_shortcut(false));
    assert_eq!((on.len(), off.len()), (2, 1), "{st}");
    assert_eq!(off[0]["redirected_bytes"], 0, "{st}");
    let carried: u64 = on
        .iter()
        .map(|p| p["redirected_bytes"].as_u64().unwrap() + p["passed_bytes"].as_u64().unwrap())
        .sum();
    // Both transfers' bytes of the shortcut pods: one pod sent `bytes` to each of the other
    // two (to the opted-out one on TCP), the other shortcut pod `bytes` back.
    assert_eq!(carried, 3 * bytes, "{st}");
    assert_some_redirected(&st, 2 * bytes);

    // The last DEL takes the shortcut with it.
    let h = nsfast_pod::Host::open(Some(&hostname)).unwrap();
    for (id, ns) in ctrs.0.drain(..) {
        let o = cni(
            &host,
            "DEL",
            &id,
            &ns.path().display().to_string(),
            "",
            &conf,
        );
        assert!(o.status.success(), "DEL {id}: {}", text(&o));
    }
    assert!(!h.pin_dir().exists(), "{} left", h.pin_dir().display());
    assert!(!h.state_dir().exists(), "{} left", h.state_dir().display());
}

/// A directory under the temp dir, removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir_named(tag: &str) -> TempDir {
    let d = std::env::temp_dir().join(tag);
    std::fs::create_dir_all(&d).unwrap();
    TempDir(d)
}

/// The first of `names` found on PATH-like directories.
fn find_bin(dirs: &[&str], name: &str) -> Option<PathBuf> {
    dirs.iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// A throwaway podman world: a node namespace, podman's storage, run root, CNI config and
/// plugin directories under one temp dir. Dropped: every container removed, the node's pods
/// deleted, the namespace and the directory removed.
struct PodmanWorld {
    dir: TempDir,
    node: Option<NetNs>,
    network: String,
    /// The cgroup parent podman's cgroupfs manager makes (`<cgroup2 root>/libpod_parent`)
    /// when it was not there before: removed with the world.
    libpod_parent: Option<PathBuf>,
}

/// `<cgroup2 root>/libpod_parent` if it does not exist yet (podman will make it).
fn new_libpod_parent() -> Option<PathBuf> {
    let p = nsfast_sys::cgroup::cgroup2_mount()
        .ok()?
        .join("libpod_parent");
    (!p.exists()).then_some(p)
}

/// Removes cgroup directory `dir` and the cgroups below it, deepest first (a cgroup goes only
/// once its processes have exited: a few tries).
fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    for _ in 0..50 {
        match std::fs::remove_dir(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                std::thread::sleep(Duration::from_millis(20))
            }
            _ => return,
        }
    }
    eprintln!("warning: could not remove cgroup {}", dir.display());
}

impl PodmanWorld {
    fn podman(&self, args: &[&str]) -> Output {
        let d = &self.dir.0;
        let node = self.node.as_ref().expect("node");
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", node.path().display()))
            .arg("podman")
            .arg("--root")
            .arg(d.join("root"))
            .arg("--runroot")
            .arg(d.join("runroot"))
            .arg("--tmpdir")
            .arg(d.join("tmp"))
            .args(["--storage-driver", "vfs", "--cgroup-manager", "cgroupfs"])
            .args(["--runtime", "runc", "--events-backend", "file"])
            .args(args)
            .env("CONTAINERS_CONF", d.join("containers.conf"))
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::null());
        c.output().expect("run podman")
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.podman(args);
        assert!(o.status.success(), "podman {args:?}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }
}

impl Drop for PodmanWorld {
    fn drop(&mut self) {
        if let Some(name) = self.node.as_ref().map(|n| n.name().to_string()) {
            let _ = self.podman(&["rm", "-af", "-t", "0"]);
            let _ = nsfast_env(&["pod", "del", "--all", "--host", &name], &[]);
        }
        drop(self.node.take());
        if let Some(p) = &self.libpod_parent {
            remove_cgroup_tree(p);
        }
    }
}

/// A real runtime: podman (CNI backend, runc, cgroupfs) in a throwaway node namespace entered
/// with `nsenter --net`, on an nsfast network with `"shortcut": true`; a busybox httpd container
/// and a wget container talk HTTP over the shortcut (a static page, then a CGI response that
/// streams in paced chunks, as a streaming endpoint does); `podman rm` leaves no pod, device,
/// pin, state or lease behind.
#[test]
fn podman_containers_talk_http_over_the_shortcut_and_rm_leaves_nothing() {
    require_root();
    let dirs = ["/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin"];
    if find_bin(&dirs, "podman").is_none() {
        eprintln!("SKIP: podman is not installed (apt-get install podman; Makefile DEB_TEST)");
        return;
    }
    let busybox = find_bin(&dirs, "busybox").expect("busybox (busybox-static) for the image");
    let cni_path = std::env::var("NSFAST_CNI_PATH").unwrap_or_else(|_| "/usr/lib/cni".into());
    let tag = unique("sc-pm");
    let w = PodmanWorld {
        dir: tempdir_named(&tag),
        node: Some(NetNs::create(&format!("{tag}-node")).expect("node netns")),
        network: tag.clone(),
        libpod_parent: new_libpod_parent(),
    };
    let d = w.dir.0.clone();
    for sub in [
        "rootfs/bin",
        "rootfs/www",
        "net.d",
        "cni-bin",
        "ipam",
        "root",
        "runroot",
        "tmp",
    ] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    // The image: a static busybox and one page, imported from a tarball (no registry).
    std::fs::copy(&busybox, d.join("rootfs/bin/busybox")).unwrap();
    for a in ["sh", "httpd", "wget", "cat", "sleep"] {
        std::os::unix::fs::symlink("busybox", d.join("rootfs/bin").join(a)).unwrap();
    }
    // A static 4 MiB page: httpd sendfile()s it as fast as TCP takes it, so whether wget
    // catches up (and later sends take the shortcut) is a race; it proves the bytes arrive.
    let line = format!("hello from nsfast pod {tag}\n");
    let page = line.repeat((4 << 20) / line.len());
    std::fs::write(d.join("rootfs/www/index.html"), &page).unwrap();
    // The streamed response: 64 chunks of 64 KiB, 20 ms apart. wget drains each chunk
    // before the next, so from the second chunk on the sends find a receiver that has read
    // all of it and are redirected (docs/sockmap.md, "What keeps TCP, and why").
    let chunk = line.repeat((64 << 10) / line.len());
    let stream = chunk.repeat(64);
    std::fs::create_dir_all(d.join("rootfs/www/cgi-bin")).unwrap();
    std::fs::create_dir_all(d.join("rootfs/data")).unwrap();
    std::fs::write(d.join("rootfs/data/chunk"), &chunk).unwrap();
    let cgi = d.join("rootfs/www/cgi-bin/stream");
    std::fs::write(
        &cgi,
        "#!/bin/sh\nprintf 'Content-Type: text/plain\\r\\n\\r\\n'\n\
         i=0\nwhile [ $i -lt 64 ]; do cat /data/chunk; sleep 0.02; i=$((i+1)); done\n",
    )
    .unwrap();
    std::fs::set_permissions(&cgi, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let tar = d.join("rootfs.tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(d.join("rootfs"))
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success(), "tar the rootfs");
    // CNI: nsfast-cni (this build) with host-local IPAM, in podman's own config dirs.
    std::os::unix::fs::symlink(
        nsfast_lab::bins::find("nsfast-cni", "NSFAST_CNI_BIN"),
        d.join("cni-bin/nsfast-cni"),
    )
    .unwrap();
    for p in ["host-local", "loopback"] {
        std::os::unix::fs::symlink(Path::new(&cni_path).join(p), d.join("cni-bin").join(p))
            .unwrap();
    }
    let conflist = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": w.network,
        "plugins": [{
            "type": "nsfast-cni",
            "mode": "auto",
            "shortcut": true,
            "allowSpliceHole": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": "10.212.0.0/24"}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": d.join("ipam").display().to_string(),
            },
        }],
    });
    std::fs::write(
        d.join("net.d").join(format!("{}.conflist", w.network)),
        conflist.to_string(),
    )
    .unwrap();
    std::fs::write(
        d.join("containers.conf"),
        format!(
            "[engine]\ncgroup_manager = \"cgroupfs\"\nruntime = \"runc\"\nevents_logger = \"file\"\n\
             [network]\nnetwork_backend = \"cni\"\nnetwork_config_dir = \"{}\"\n\
             cni_plugin_dirs = [\"{}\"]\n",
            d.join("net.d").display(),
            d.join("cni-bin").display()
        ),
    )
    .unwrap();
    let image = format!("localhost/{tag}:1");
    w.ok(&["import", &tar.display().to_string(), &image]);
    // This sandbox lacks CAP_SYS_RESOURCE: podman's default rlimits (raised) would be refused.
    let ul = [
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
    ];
    let server = format!("{tag}-httpd");
    let mut run = vec!["run", "-d", "--name", &server, "--network", &w.network];
    run.extend_from_slice(&ul);
    run.extend_from_slice(&[&image, "httpd", "-f", "-p", "80", "-h", "/www"]);
    w.ok(&run);
    let fmt = format!(
        "{{{{(index .NetworkSettings.Networks \"{}\").IPAddress}}}}",
        w.network
    );
    let ip = w.ok(&["inspect", &server, "--format", &fmt]);
    let wget = |path: &str| {
        let url = format!("http://{ip}{path}");
        let mut get = vec!["run", "--rm", "--network", &w.network];
        get.extend_from_slice(&ul);
        get.extend_from_slice(&[&image, "wget", "-qO-", &url]);
        // httpd may need a moment to listen: retry the request (a bounded number of times).
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let o = w.podman(&get);
            if o.status.success() {
                break String::from_utf8_lossy(&o.stdout).into_owned();
            }
            assert!(Instant::now() < deadline, "wget {url}: {}", text(&o));
        }
    };
    let node = w.node.as_ref().unwrap().name().to_string();
    let status = || -> Value {
        serde_json::from_str(&nsfast_ok(&[
            "-j", "pod", "shortcut", "status", "--host", &node,
        ]))
        .unwrap()
    };
    let bytes = |st: &Value, k: &str| st[k].as_u64().unwrap();
    assert_eq!(wget("/index.html"), page);
    let st = status();
    assert_eq!(st["enabled"], true, "{st}");
    assert!(bytes(&st, "pairs") >= 1, "HTTP did not pair: {st}");
    let carried = bytes(&st, "redirected_bytes") + bytes(&st, "passed_bytes");
    assert!(carried >= page.len() as u64, "HTTP not carried: {st}");
    assert_eq!(wget("/cgi-bin/stream"), stream);
    let after = status();
    assert!(
        bytes(&after, "pairs") >= 2,
        "the stream did not pair: {after}"
    );
    let redirected = bytes(&after, "redirected_bytes") - bytes(&st, "redirected_bytes");
    eprintln!(
        "static page: {} of {} bytes redirected; stream: {redirected} of {}",
        bytes(&st, "redirected_bytes"),
        page.len(),
        stream.len()
    );
    assert!(
        redirected >= stream.len() as u64 / 2,
        "the streamed response was not redirected ({redirected} of {} bytes): {after}",
        stream.len()
    );
    w.ok(&["rm", "-f", "-t", "0", &server]);
    // Nothing left: no pod, no device but lo, no pin or state, no lease.
    let h = nsfast_pod::Host::open(Some(&node)).unwrap();
    assert_eq!(h.records().unwrap(), Vec::new());
    assert!(!h.pin_dir().exists(), "{} left", h.pin_dir().display());
    assert!(!h.state_dir().exists(), "{} left", h.state_dir().display());
    assert_eq!(nsfast_lab::world::link_names(&node), vec!["lo".to_string()]);
    let leases: Vec<String> = std::fs::read_dir(d.join("ipam").join(&w.network))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lock" && !n.starts_with("last_reserved_ip"))
        .collect();
    assert_eq!(leases, Vec::<String>::new(), "leases left");
}

/// SIGKILL of a CNI ADD with `"shortcut": true` after each step of the enable it makes (and
/// after the pod is complete and registered): DEL leaves nothing, and the next ADD makes a
/// whole pod that takes the shortcut with a reference pod.
#[test]
fn cni_add_killed_at_each_shortcut_step_then_del_and_add_work() {
    require_root();
    let tag = unique("sc-ck");
    let host = NetNs::create(&format!("{tag}-h")).expect("host netns");
    let data_dir = tempdir_named(&tag);
    let conf = serde_json::json!({
        "cniVersion": "1.1.0",
        "name": tag,
        "type": "nsfast-cni",
        "mode": "auto",
        "shortcut": true,
        "allowSpliceHole": true,
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": "10.209.8.0/24"}]],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": data_dir.0.display().to_string(),
        },
    });
    struct Del(String);
    impl Drop for Del {
        fn drop(&mut self) {
            let _ = nsfast_env(&["pod", "del", "--all", "--host", &self.0], &[]);
        }
    }
    let hostname = host.name().to_string();
    let _del = Del(hostname.clone());
    let own = own_cgroup_procs();
    let ip_of = |o: &Output| -> std::net::Ipv4Addr {
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        r["ips"][0]["address"]
            .as_str()
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let h = nsfast_pod::Host::open(Some(&hostname)).unwrap();
    // A live link in shortcut-new/, the shortcut in place but no pod yet, the pod complete and
    // registered (`pod add`'s own steps are covered by sigkill_at_each_step_leaves_a_retry_that_works
    // and the CNI crash tests).
    let steps = ["shortcut-attach", "shortcut-ready", "shortcut"];
    for (n, step) in steps.iter().enumerate() {
        let (a, b) = (
            NetNs::create(&unique("sc-ctr")).unwrap(),
            NetNs::create(&unique("sc-ctr")).unwrap(),
        );
        let (pa, pb) = (
            a.path().display().to_string(),
            b.path().display().to_string(),
        );
        let (ia, ib) = (format!("k{n}a"), format!("k{n}b"));
        let o = cni_env(
            &host,
            "ADD",
            &ia,
            &pa,
            "",
            &conf,
            &[(nsfast_pod::pod::CRASH_ENV, step)],
        );
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&o.status),
            Some(9),
            "ADD not killed at {step}: {}",
            text(&o)
        );
        let o = cni(&host, "DEL", &ia, &pa, "", &conf);
        assert!(
            o.status.success(),
            "DEL after a kill at {step}: {}",
            text(&o)
        );
        assert!(
            h.records().unwrap().is_empty(),
            "a pod left after DEL ({step})"
        );
        assert!(
            !h.pin_dir().join("shortcut").exists() && !h.pin_dir().join("shortcut-new").exists(),
            "the shortcut left after the last DEL ({step})"
        );
        let oa = cni(&host, "ADD", &ia, &pa, "", &conf);
        assert!(
            oa.status.success(),
            "ADD after a kill at {step}: {}",
            text(&oa)
        );
        let ob = cni(&host, "ADD", &ib, &pb, "", &conf);
        assert!(ob.status.success(), "second ADD ({step}): {}", text(&ob));
        let addr = SocketAddr::new(IpAddr::V4(ip_of(&oa)), 5700 + n as u16);
        let _ = ip_of(&ob);
        transfer(&b, &a, &own, addr, 1 << 20);
        let st: Value = serde_json::from_str(&nsfast_ok(&[
            "-j", "pod", "shortcut", "status", "--host", &hostname,
        ]))
        .unwrap();
        assert_eq!(
            st["redirected_bytes"].as_u64().unwrap() + st["passed_bytes"].as_u64().unwrap(),
            2 << 20,
            "after a kill at {step}: {st}"
        );
        for (id, p) in [(&ia, &pa), (&ib, &pb)] {
            let o = cni(&host, "DEL", id, p, "", &conf);
            assert!(o.status.success(), "DEL ({step}): {}", text(&o));
        }
        assert!(!h.pin_dir().exists(), "pins left ({step})");
    }
}

/// This process's cgroup2 `cgroup.procs` (peers started there are under the cgroup2 root).
fn own_cgroup_procs() -> PathBuf {
    let root = nsfast_sys::cgroup::cgroup2_mount().unwrap();
    let rel = std::fs::read_to_string("/proc/self/cgroup")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_string))
        .unwrap_or_else(|| "/".into());
    PathBuf::from(format!("{}{}/cgroup.procs", root.display(), rel))
}

/// Bad input: one error naming the value; nothing made (no state or pins for the host).
#[test]
fn bad_input_is_refused_and_changes_nothing() {
    require_root();
    let host = NetNs::create(&unique("sc-bad")).expect("host netns");
    let h = nsfast_pod::Host::open(Some(host.name())).unwrap();
    for (cg, why) in [
        ("/nonexistent-nsfsc", "does not exist"),
        ("/proc", "not a cgroup2 directory"),
    ] {
        let o = nsfast_env(
            &[
                "pod",
                "shortcut",
                "enable",
                "--allow-splice-hole",
                "--host",
                host.name(),
                "--cgroup",
                cg,
            ],
            &[],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{}", text(&o));
        assert!(
            err.contains(&format!("invalid --cgroup {cg}")) && err.contains(why),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(!h.state_dir().exists() && !h.pin_dir().exists());
    }
    let o = nsfast_env(&["pod", "shortcut", "status", "--host", "/etc/passwd"], &[]);
    assert!(!o.status.success(), "{}", text(&o));
    let out = nsfast_ok(&["pod", "shortcut", "disable", "--host", host.name()]);
    assert!(out.contains("was not enabled"), "{out}");
    assert!(!h.state_dir().exists() && !h.pin_dir().exists());
}

/// A failed first `pod add` on a host whose shortcut is on but has no pods leaves the shortcut
/// enabled: the failed add's undo must not treat it as a last `del`, which takes the host's
/// state and the shortcut with it.
#[test]
fn a_failed_first_pod_add_leaves_the_shortcut_enabled() {
    require_root();
    let host = NetNs::create(&unique("sc-fail")).expect("host netns");
    let cg = TestCgroup::new();
    let cgs = cg.path().to_string_lossy().into_owned();
    let h = nsfast_pod::Host::open(Some(host.name())).unwrap();
    let status = || -> Value {
        serde_json::from_str(&nsfast_ok(&[
            "-j",
            "pod",
            "shortcut",
            "status",
            "--host",
            host.name(),
        ]))
        .unwrap()
    };
    nsfast_ok(&[
        "pod",
        "shortcut",
        "enable",
        "--allow-splice-hole",
        "--host",
        host.name(),
        "--cgroup",
        &cgs,
    ]);
    assert_eq!(status()["enabled"], true);
    // A pod whose namespace name is taken: refused before anything is made.
    let taken = NetNs::create(&unique("sc-taken")).expect("netns");
    let o = nsfast_env(
        &[
            "pod",
            "add",
            taken.name(),
            "--ip",
            "10.251.9.2/24",
            "--host",
            host.name(),
        ],
        &[],
    );
    assert!(!o.status.success(), "{}", text(&o));
    let st = status();
    assert_eq!(
        st["enabled"], true,
        "the failed add disabled the shortcut: {st}"
    );
    assert_eq!(sockops_on(cg.path()), 1, "the sockops link is gone");
    // The shortcut still works for the next pod, and the last pod's del then removes it.
    let name = unique("sc-ok");
    nsfast_ok(&[
        "pod",
        "add",
        &name,
        "--ip",
        "10.251.9.4/24",
        "--host",
        host.name(),
    ]);
    assert!(status()["pods"][name.as_str()]["shortcut"] == true);
    nsfast_ok(&["pod", "del", &name, "--host", host.name()]);
    assert_eq!(status()["enabled"], false);
    assert!(!h.state_dir().exists() && !h.pin_dir().exists());
}

/// A socket that outlives its pod (the pod deleted while a process in its namespace keeps a
/// connection) keeps counting into its pod's counter slot: that slot is not given to the next
/// pod while the old namespace lives, so the new pod's counters stay its own.
#[test]
fn a_socket_outliving_its_pod_never_counts_into_the_next_pod() {
    require_root();
    let mut w = World::new(&[0]);
    let cg = w.cg.procs();
    let old = unique("sc-old");
    let ons = w.add_pod(0, &old, "10.251.1.40/24", &[]);
    // Never finished: with its device gone the old pod's FIN cannot leave; the peers are
    // killed on drop.
    let bytes: u64 = 1 << 30;
    let addr = w.addr(0, 0, 5601);
    let _s = bidir_server(&w.pod_ns(0, 0), &cg, addr, bytes, 1);
    let mut c = bidir_client(&ons, &cg, addr, bytes, 2, &["--rate", "16000000"]);
    drop(ons);
    let total = |w: &World| w.status(0)["redirected_bytes"].as_u64().unwrap();
    let wait_growth = |w: &World, c: &mut KillOnDrop, from: u64, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let now = total(w);
            if now >= from + (1 << 20) {
                return now;
            }
            let ended = c.child_mut().try_wait().unwrap().is_some();
            assert!(
                !ended && Instant::now() < deadline,
                "{what}: stuck at {now}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait_growth(&w, &mut c, 0, "before the del");
    assert!(w.pod_counter(0, &old, "paired") == 1, "{}", w.status(0));
    // The pod goes; its client keeps the namespace (and the connection) alive.
    nsfast_ok(&["pod", "del", &old, "--host", w.host(0)]);
    w.extra.retain(|(n, _)| n != &old);
    let new = unique("sc-new");
    let _nns = w.add_pod(0, &new, "10.251.1.41/24", &[]);
    // The old connection goes on sending by redirect (counted in the host's total).
    let from = total(&w);
    wait_growth(&w, &mut c, from, "after the new pod");
    let st = w.status(0);
    let n = &st["pods"][new.as_str()];
    assert_eq!(n["shortcut"], true, "{st}");
    assert_eq!(
        n["redirected_bytes"], 0,
        "the old pod's socket counted into {new}: {st}"
    );
    assert_eq!(n["redirected_msgs"], 0, "{st}");
    assert_eq!(n["paired"], 0, "{st}");
}

/// A `--host-firewall` pod's TCP meets the host's netfilter rules with the shortcut enabled:
/// a connection is set up, then a host `forward` rule drops its port, and the bytes sent
/// after it must not arrive (through the shortcut they would). Its namespace shows as off
/// the shortcut in status.
#[test]
fn host_firewall_pods_stay_off_the_shortcut() {
    require_root();
    let mut w = World::new(&[0]);
    let cg = w.cg.procs();
    let (na, nb) = (unique("sc-fa"), unique("sc-fb"));
    let fa = w.add_pod(
        0,
        &na,
        "10.251.1.40/24",
        &["--host-firewall", "--mode", "veth"],
    );
    let fb = w.add_pod(
        0,
        &nb,
        "10.251.1.41/24",
        &["--host-firewall", "--mode", "veth"],
    );
    const PORT: u16 = 7300;
    let addr: SocketAddr = format!("10.251.1.41:{PORT}").parse().unwrap();
    let bytes = 1 << 20;
    // The client connects at once and sends only once the rule is in place (it waits for
    // the file `go`); both peers give up after 8 s.
    let tmp = tempdir_named(&unique("sc-fw"));
    let go = tmp.0.join("go");
    let server = peer::spawn(
        &nsfast_lab::bins::testpeer(),
        &fb,
        Some(&cg),
        &args(&[
            "--timeout",
            "8",
            "bidir-server",
            "--listen",
            &addr.to_string(),
            "--bytes",
            &bytes.to_string(),
            "--seed",
            "1",
        ]),
    );
    peer::wait_listening(&fb, addr);
    let client = peer::spawn(
        &nsfast_lab::bins::testpeer(),
        &fa,
        Some(&cg),
        &args(&[
            "--timeout",
            "8",
            "bidir-client",
            "--connect",
            &addr.to_string(),
            "--bytes",
            &bytes.to_string(),
            "--seed",
            "2",
            "--start-when",
            &go.to_string_lossy(),
        ]),
    );
    peer::wait_established(&fa, addr);
    let host = NetNs::open(w.host(0)).expect("host netns");
    nft_in(&host, &["add", "table", "ip", "nsfast_test"]);
    nft_in(
        &host,
        &[
            "add",
            "chain",
            "ip",
            "nsfast_test",
            "nsf_fwd",
            "{ type filter hook forward priority 0 ; policy accept ; }",
        ],
    );
    nft_in(
        &host,
        &[
            "add",
            "rule",
            "ip",
            "nsfast_test",
            "nsf_fwd",
            "tcp",
            "dport",
            "7300",
            "counter",
            "drop",
        ],
    );
    std::fs::write(&go, b"").unwrap();
    let (_, _, cerr) = peer::finish_raw(client);
    let (ok, out, err) = peer::finish_raw(server);
    assert!(
        !ok,
        "the server received what the host's forward rule drops: {out} {err} (client: {cerr})"
    );
    // The server cannot finish either way (the client's FIN is TCP's, and dropped); what
    // tells the paths apart is whether the client's bytes went past the rule by redirect.
    let st = w.status(0);
    assert_eq!(
        st["pods"][na.as_str()]["redirected_bytes"],
        0,
        "bytes of a --host-firewall pod bypassed the host's forward drop rule: {st}"
    );
    for n in [&na, &nb] {
        assert_eq!(st["pods"][n.as_str()]["shortcut"], false, "{st}");
    }
    assert_eq!(st["pods"][na.as_str()]["paired"], 0, "{st}");
}

/// NetworkPolicy state of host `host`, removed on drop (also on panic).
struct Policies {
    host: String,
    dir: PathBuf,
}

impl Policies {
    fn new(host: &str) -> Self {
        let key = nsfast_pod::Host::open(Some(host)).unwrap().key;
        Policies {
            host: host.to_string(),
            dir: PathBuf::from(nsfast_pod::policy::POLICY_ROOT).join(key),
        }
    }

    fn apply(&self, yaml: &str) {
        let o = nsfast_stdin(&["policy", "apply", "-f", "-", "--host", &self.host], yaml);
        assert!(o.status.success(), "policy apply: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("server-ingress"),
            "{}",
            text(&o)
        );
    }
}

impl Drop for Policies {
    fn drop(&mut self) {
        let _ = nsfast_env(
            &["policy", "delete", "server-ingress", "--host", &self.host],
            &[],
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The server pods' ingress isolated, every pod of the namespace allowed in.
const ALLOW_NAMESPACE: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-ingress}
spec:
  podSelector: {matchLabels: {role: server}}
  ingress:
  - from: [{podSelector: {}}]
";

/// The server pods' ingress isolated, nothing allowed in.
const DENY_ALL: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-ingress}
spec:
  podSelector: {matchLabels: {role: server}}
  policyTypes: [Ingress]
";

/// A NetworkPolicy change reaches connections already open, on TCP (`shortcut` false) and
/// through the shortcut: one that still allows a connection keeps it, byte-exact (and, through
/// the shortcut, on it), one that denies it stops it. Only the server's ingress is isolated,
/// so the server's packets to the client meet no rule: a datapath that took them for the start
/// of a flow would let the client's packets through as its replies.
fn a_policy_change_reaches_open_connections(shortcut: bool) {
    require_root();
    let mut w = World::new(if shortcut { &[0] } else { &[] });
    let cg = w.cg.procs();
    let (sname, cname) = (unique("sc-ps"), unique("sc-pc"));
    let sns = w.add_pod(0, &sname, "10.251.1.50/24", &["--label", "role=server"]);
    let cns = w.add_pod(0, &cname, "10.251.1.51/24", &[]);
    let pol = Policies::new(w.host(0));
    let server = |port| SocketAddr::new("10.251.1.50".parse().unwrap(), port);
    // 8 MiB each way at 2 MiB/s: the change lands mid-transfer.
    let bytes: u64 = 8 << 20;
    let rate = (2u64 << 20).to_string();

    let s = bidir_server(&sns, &cg, server(5500), bytes, 1);
    let c = bidir_client(&cns, &cg, server(5500), bytes, 2, &["--rate", &rate]);
    std::thread::sleep(Duration::from_millis(700));
    pol.apply(ALLOW_NAMESPACE);
    let cr: BidirReport = peer::finish(c, "client");
    let sr: BidirReport = peer::finish(s, "server");
    check_bidir(&cr, &sr, bytes);
    if shortcut {
        let st = w.status(0);
        assert_eq!(st["policy_denied"], 0, "{st}");
        assert_pod_redirected(&st, &cname, bytes);
    }

    // Denied mid-transfer: the client's bytes stop reaching the server, which never sees EOF.
    let s = bidir_server(&sns, &cg, server(5501), bytes, 1);
    let c = peer::spawn(
        &nsfast_lab::bins::testpeer(),
        &cns,
        Some(&cg),
        &args(&[
            "--timeout",
            "6",
            "bidir-client",
            "--connect",
            &server(5501).to_string(),
            "--bytes",
            &bytes.to_string(),
            "--seed",
            "2",
            "--rate",
            &rate,
        ]),
    );
    std::thread::sleep(Duration::from_millis(700));
    if shortcut {
        let st = w.status(0);
        assert!(
            st["pods"][cname.as_str()]["redirected_bytes"]
                .as_u64()
                .unwrap()
                > 0,
            "the connection was not on the shortcut before the change: {st}"
        );
    }
    pol.apply(DENY_ALL);
    let (ok, out, err) = peer::finish_raw(c);
    assert!(
        !ok,
        "the client finished a transfer its policy denies: {out} {err}"
    );
    drop(s);
    let list: Value =
        serde_json::from_str(&nsfast_ok(&["-j", "pod", "list", "--host", w.host(0)])).unwrap();
    let drops = list["policy_drops"][sname.as_str()].as_u64().unwrap_or(0);
    assert!(drops > 0, "no packet to {sname} was dropped: {list}");
    if shortcut {
        let st = w.status(0);
        assert!(st["policy_denied"].as_u64().unwrap() >= 1, "{st}");
    }
}

#[test]
fn a_policy_change_reaches_open_connections_on_tcp() {
    a_policy_change_reaches_open_connections(false);
}

#[test]
fn a_policy_change_reaches_open_connections_through_the_shortcut() {
    a_policy_change_reaches_open_connections(true);
}

/// Where the splice guard cannot attach (`NSFAST_SPLICE_GUARD=off` stands for such a kernel),
/// `pod shortcut enable` refuses with one line that names the missing feature and
/// `--allow-splice-hole`, and enables nothing; with the flag it enables, and a later enable
/// that does not accept the hole is refused rather than told "already enabled".
#[test]
fn without_the_splice_guard_enable_refuses_unless_the_hole_is_accepted() {
    require_root();
    let w = World::new(&[]);
    let cg = w.cg.path().to_string_lossy().into_owned();
    let enable = |accept: bool| {
        let mut a = vec![
            "pod",
            "shortcut",
            "enable",
            "--host",
            w.host(0),
            "--cgroup",
            &cg,
        ];
        if accept {
            a.push("--allow-splice-hole");
        }
        nsfast_env(&a, &[("NSFAST_SPLICE_GUARD", "off")])
    };
    let o = enable(false);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("splice guard cannot attach") && err.contains("--allow-splice-hole"),
        "{err}"
    );
    assert_eq!(w.status(0)["enabled"], false);
    let o = enable(true);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(w.status(0)["enabled"], true);
    let o = enable(false);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("runs without the splice guard"),
        "{}",
        text(&o)
    );
}

/// The shortcut's state file is private, as the pod records beside it are.
#[test]
fn the_shortcut_state_file_is_private() {
    use std::os::unix::fs::PermissionsExt;
    require_root();
    let w = World::new(&[0]);
    let host = nsfast_pod::Host::open(Some(w.host(0))).unwrap();
    let files: Vec<PathBuf> = std::fs::read_dir(host.state_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("shortcut"))
        })
        .collect();
    assert!(
        !files.is_empty(),
        "no shortcut state in {}",
        host.state_dir().display()
    );
    for f in files {
        let mode = std::fs::metadata(&f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}: {mode:o}", f.display());
    }
}
