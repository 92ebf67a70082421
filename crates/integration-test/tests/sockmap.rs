//! Root integration tests of `nsfast sockmap`, each in its own throwaway namespaces and cgroup.
//! Peers are separate processes (`nsfast-testpeer`) started inside a namespace and a cgroup,
//! as real applications would be. Run as root (`make test`).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nsfast_lab::peer::{self, BidirReport, KillOnDrop, Report};
use nsfast_lab::require_root;
use nsfast_lab::world::{TestCgroup, VethPair};
use nsfast_sockmap::{Options, Shortcut, Stats};

const GIB: u64 = 1 << 30;
/// `off` leaves the splice guard out, as on a kernel that refuses it.
const GUARD_ENV: &str = "NSFAST_SPLICE_GUARD";

fn peer_bin() -> PathBuf {
    nsfast_lab::bins::testpeer()
}

/// The binary under test (`$NSFAST_BIN`, else the workspace's build).
use nsfast_lab::bins::nsfast as nsfast_bin;

/// Bulk volume for the big transfer; NSFAST_TEST_BULK_MIB lowers it for slow (TCG) guests.
fn bulk_bytes() -> u64 {
    nsfast_lab::env_number("NSFAST_TEST_BULK_MIB")
        .map(|m| m << 20)
        .unwrap_or(GIB)
}

/// Ping-pong rounds of the tokio echo test (default 20,000); NSFAST_TEST_ROUNDS lowers it for
/// slow (TCG) guests, where a round trip takes ~2.4 ms.
fn pingpong_rounds() -> u64 {
    nsfast_lab::env_number("NSFAST_TEST_ROUNDS").unwrap_or(20_000)
}

/// Every byte the peers sent took the shortcut, except the bytes a direction sent while its
/// receiver had not yet been seen reading everything sent to it (the gate: those stay on TCP,
/// counted as gated; in a bulk transfer that can be most of a small one), and no direction
/// fell back to TCP for good.
fn assert_carried(st: &Stats, total: u64) {
    assert_eq!(st.redirected_bytes + st.gated_bytes, total, "{st:?}");
    assert_eq!(st.passed_bytes, st.gated_bytes, "{st:?}");
    assert_eq!(
        (
            st.tainted,
            st.splice_pass,
            st.rx_missing,
            st.redirect_failed
        ),
        (0, 0, 0, 0),
        "{st:?}"
    );
    assert!(st.redirected_bytes > 0, "no byte took the shortcut: {st:?}");
}

fn args(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn server_addr(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(VethPair::SERVER_V4), port)
}

fn attach(cg: &TestCgroup) -> Shortcut {
    Shortcut::attach(&Options {
        allow_splice_hole: true,
        cgroup: Some(cg.path().to_path_buf()),
        ..Default::default()
    })
    .expect("attach the shortcut")
}

/// [`attach`] with admission off (`--keep-tcp-after 0`): every connection joins. For the tests
/// of pairing itself, whose many short connections admission would otherwise keep on TCP.
fn attach_joining_all(cg: &TestCgroup) -> Shortcut {
    Shortcut::attach(&Options {
        allow_splice_hole: true,
        cgroup: Some(cg.path().to_path_buf()),
        keep_tcp_after: Some(0),
        ..Default::default()
    })
    .expect("attach the shortcut")
}

/// Starts a peer (`argv`: its subcommand and flags) in the pair's server namespace and waits
/// until it listens on `listen`.
fn server_peer(
    w: &VethPair,
    procs: Option<&Path>,
    listen: SocketAddr,
    argv: &[&str],
) -> KillOnDrop {
    let s = peer::spawn(&peer_bin(), &w.server, procs, &args(argv));
    peer::wait_listening(&w.server, listen);
    s
}

/// Starts a peer in the pair's client namespace.
fn client_peer(w: &VethPair, procs: Option<&Path>, argv: &[&str]) -> KillOnDrop {
    peer::spawn(&peer_bin(), &w.client, procs, &args(argv))
}

/// Starts a `bidir-server` peer on `listen` in the pair's server namespace and waits until
/// it listens.
fn bidir_server(
    w: &VethPair,
    procs: Option<&Path>,
    listen: SocketAddr,
    bytes: u64,
    seed: u64,
) -> KillOnDrop {
    server_peer(
        w,
        procs,
        listen,
        &[
            "bidir-server",
            "--listen",
            &listen.to_string(),
            "--bytes",
            &bytes.to_string(),
            "--seed",
            &seed.to_string(),
        ],
    )
}

/// Starts a `bidir-client` peer in the pair's client namespace; `extra` are more flags
/// (`--rate`, `--start-when`).
fn bidir_client(
    w: &VethPair,
    procs: Option<&Path>,
    connect: SocketAddr,
    bytes: u64,
    seed: u64,
    extra: &[&str],
) -> KillOnDrop {
    let (connect, bytes, seed) = (connect.to_string(), bytes.to_string(), seed.to_string());
    let mut argv: Vec<&str> = vec![
        "bidir-client",
        "--connect",
        &connect,
        "--bytes",
        &bytes,
        "--seed",
        &seed,
    ];
    argv.extend_from_slice(extra);
    client_peer(w, procs, &argv)
}

/// Runs a bidirectional transfer between the pair's namespaces and checks it byte-exact.
fn bidir_transfer(
    w: &VethPair,
    cg: Option<&TestCgroup>,
    server: SocketAddr,
    connect: SocketAddr,
    bytes: u64,
) {
    bidir_transfer_with(w, cg, server, connect, bytes, &[]);
}

/// The positive controls' transfer: [`bidir_transfer`] with the client paced at 16 MiB/s.
/// A direction redirects only once its receiver has returned from a read and read everything
/// sent so far (the gate), and a small transfer fits in the socket buffers: unpaced, a sender
/// that outruns a receiver not yet scheduled (a loaded CI machine, a TCG guest) sends all of
/// it on TCP and the control sees nothing redirected.
fn paced_transfer(w: &VethPair, cg: &TestCgroup, addr: SocketAddr, bytes: u64) {
    let rate = (16u64 << 20).to_string();
    bidir_transfer_with(w, Some(cg), addr, addr, bytes, &["--rate", &rate]);
}

/// [`bidir_transfer`] with more arguments for the client (`--rate B/s`).
fn bidir_transfer_with(
    w: &VethPair,
    cg: Option<&TestCgroup>,
    server: SocketAddr,
    connect: SocketAddr,
    bytes: u64,
    client_args: &[&str],
) {
    let procs = cg.map(|c| c.procs());
    let srv = bidir_server(w, procs.as_deref(), server, bytes, 1);
    let cli = bidir_client(w, procs.as_deref(), connect, bytes, 2, client_args);
    let c: BidirReport = peer::finish(cli, "client");
    let s: BidirReport = peer::finish(srv, "server");
    assert_eq!(c.sent, bytes);
    assert_eq!(s.sent, bytes);
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
    assert_eq!(
        c.received_sha256, s.sent_sha256,
        "client got other bytes than the server sent"
    );
    assert_eq!(
        s.received_sha256, c.sent_sha256,
        "server got other bytes than the client sent"
    );
}

#[test]
fn bulk_both_directions_at_once_is_byte_exact_and_redirected() {
    require_root();
    let w = VethPair::new();
    let cg = TestCgroup::new();
    let sc = attach(&cg);
    let bytes = bulk_bytes();
    bidir_transfer(&w, Some(&cg), server_addr(5001), server_addr(5001), bytes);
    let st = sc.stats().unwrap();
    assert_eq!(st.pairs, 1, "{st:?}");
    // Both directions went through the shortcut.
    assert_carried(&st, 2 * bytes);
}

#[test]
fn ipv6_and_v4_mapped_sockets_take_the_shortcut() {
    require_root();
    let w = VethPair::new();
    let cg = TestCgroup::new();
    let sc = attach(&cg);
    let bytes = 32 << 20;
    let v6 = SocketAddr::new(IpAddr::V6(VethPair::SERVER_V6), 5002);
    bidir_transfer(&w, Some(&cg), v6, v6, bytes);
    // A v4-mapped IPv6 client against a plain IPv4 server.
    let mapped: SocketAddr = format!("[::ffff:{}]:5003", VethPair::SERVER_V4)
        .parse()
        .unwrap();
    bidir_transfer(&w, Some(&cg), server_addr(5003), mapped, bytes);
    let st = sc.stats().unwrap();
    assert_eq!(st.pairs, 2, "{st:?}");
    assert_carried(&st, 4 * bytes);
}

/// Two namespace pairs with identical addresses and ports at the same time, in one cgroup
/// under one shortcut; connections are re-made from the same source port again and again
/// (entries of one pair come and go while the other's remain). Each client must only ever
/// receive its own server's bytes.
#[test]
fn identical_addresses_in_two_namespace_pairs_never_mix() {
    require_root();
    let pairs = [VethPair::new(), VethPair::new()];
    let cg = TestCgroup::new();
    let sc = attach_joining_all(&cg);
    let iterations = 300u64;
    let procs = cg.procs();
    let servers: Vec<_> = pairs
        .iter()
        .enumerate()
        .map(|(i, w)| {
            server_peer(
                w,
                Some(&procs),
                server_addr(6000),
                &[
                    "tag-server",
                    "--listen",
                    "10.99.0.2:6000",
                    "--tag",
                    &format!("server-of-pair-{i}:"),
                    "--count",
                    &iterations.to_string(),
                ],
            )
        })
        .collect();
    let clients: Vec<_> = pairs
        .iter()
        .enumerate()
        .map(|(i, w)| {
            client_peer(
                w,
                Some(&procs),
                &[
                    "tag-client",
                    "--connect",
                    "10.99.0.2:6000",
                    "--bind",
                    "10.99.0.1:40000",
                    "--expect",
                    &format!("server-of-pair-{i}:"),
                    "--iterations",
                    &iterations.to_string(),
                ],
            )
        })
        .collect();
    for (i, c) in clients.into_iter().enumerate() {
        let r: Report = peer::finish(c, &format!("client of pair {i}"));
        assert_eq!(r.failed, 0, "pair {i}: {}", r.detail);
        assert_eq!(r.ok, iterations);
    }
    for (i, s) in servers.into_iter().enumerate() {
        let r: Report = peer::finish(s, &format!("server of pair {i}"));
        assert_eq!(r.ok, iterations);
    }
    let st = sc.stats().unwrap();
    assert!(
        st.pairs >= iterations,
        "most connections should be paired: {st:?}"
    );
    assert!(st.redirected_msgs >= iterations, "{st:?}");
    // Conflicts are allowed: when both pairs' handshakes land in the same tick of the kernel's
    // ISN clock (seen once in 300 under QEMU TCG on 6.1, whose clock is coarse), the two
    // connections share a pair key, the same-role guard poisons it and neither is paired — the
    // safe outcome. The safety property is the check above: no client ever read foreign bytes.
    assert!(st.pair_conflicts * 10 <= iterations, "{st:?}");
}

/// The same, with long bulk transfers running at once in both pairs.
#[test]
fn identical_addresses_concurrent_bulk_transfers_stay_apart() {
    require_root();
    let pairs = [VethPair::new(), VethPair::new()];
    let cg = TestCgroup::new();
    let sc = attach(&cg);
    let procs = cg.procs();
    // 64 MiB per direction and pair (256 MiB in all); NSFAST_TEST_BULK_MIB lowers it in guests.
    let bytes: u64 = bulk_bytes().min(64 << 20);
    let mut running = Vec::new();
    for (i, w) in pairs.iter().enumerate() {
        let s = bidir_server(w, Some(&procs), server_addr(5001), bytes, 10 + i as u64);
        let c = bidir_client(
            w,
            Some(&procs),
            server_addr(5001),
            bytes,
            20 + i as u64,
            &[],
        );
        running.push((s, c));
    }
    let reports: Vec<(BidirReport, BidirReport)> = running
        .into_iter()
        .map(|(s, c)| (peer::finish(s, "server"), peer::finish(c, "client")))
        .collect();
    for (i, (s, c)) in reports.iter().enumerate() {
        assert_eq!(
            c.received_sha256, s.sent_sha256,
            "pair {i}: client got foreign bytes"
        );
        assert_eq!(
            s.received_sha256, c.sent_sha256,
            "pair {i}: server got foreign bytes"
        );
    }
    assert_ne!(reports[0].0.sent_sha256, reports[1].0.sent_sha256);
    let st = sc.stats().unwrap();
    assert_eq!(st.pairs, 2, "{st:?}");
    assert_carried(&st, 4 * bytes);
}

#[test]
fn half_close_then_reply_does_not_hang() {
    require_root();
    let w = VethPair::new();
    let cg = TestCgroup::new();
    let sc = attach(&cg);
    let a = server_addr(5004);
    let s = server_peer(
        &w,
        Some(&cg.procs()),
        a,
        &[
            "--timeout",
            "20",
            "halfclose-server",
            "--listen",
            &a.to_string(),
        ],
    );
    let c = client_peer(
        &w,
        Some(&cg.procs()),
        &[
            "--timeout",
            "20",
            "halfclose-client",
            "--connect",
            &a.to_string(),
            "--bytes",
            "3000000",
        ],
    );
    let r: Report = peer::finish(c, "half-close client");
    assert_eq!(r.ok, 1);
    let _: Report = peer::finish(s, "half-close server");
    let st = sc.stats().unwrap();
    assert_eq!(st.pairs, 1, "{st:?}");
    // The client's bytes and the server's reply (r.detail).
    assert_carried(&st, 3_000_000 + r.detail.len() as u64);
}

#[test]
fn a_thousand_concurrent_connections_echo_checksummed_messages() {
    require_root();
    let w = VethPair::new();
    let cg = TestCgroup::new();
    let sc = attach_joining_all(&cg);
    let a = server_addr(5005);
    let s = server_peer(
        &w,
        Some(&cg.procs()),
        a,
        &["echo-server", "--listen", &a.to_string(), "--count", "1000"],
    );
    let c = client_peer(
        &w,
        Some(&cg.procs()),
        &[
            "many",
            "--connect",
            &a.to_string(),
            "--conns",
            "1000",
            "--size",
            "8192",
        ],
    );
    let r: Report = peer::finish(c, "1000 connections");
    assert_eq!((r.ok, r.failed), (1000, 0), "{}", r.detail);
    let sr: Report = peer::finish(s, "echo server");
    assert_eq!((sr.ok, sr.failed), (1000, 0));
    let st = sc.stats().unwrap();
    assert!(
        st.pairs >= 990,
        "nearly all connections should pair: {st:?}"
    );
    // One message each way per connection. A request is sent before its receiver has read,
    // so it stays on TCP (the gate); a reply takes the shortcut when the client's read was
    // already attempted (EAGAIN counts: it shows a recvmsg reader). None fell back.
    assert!(st.redirected_msgs + st.gated_msgs >= 2000, "{st:?}");
    assert_eq!((st.tainted, st.redirect_failed), (0, 0), "{st:?}");
}

#[test]
fn tokio_echo_never_stalls_and_fionread_counts_redirected_bytes() {
    require_root();
    let w = VethPair::new();
    let cg = TestCgroup::new();
    let sc = attach(&cg);
    let rounds = pingpong_rounds();
    let a = server_addr(5006);
    let s = server_peer(
        &w,
        Some(&cg.procs()),
        a,
        &[
            "--timeout",
            "600",
            "echo-server",
            "--listen",
            &a.to_string(),
            "--count",
            "1",
        ],
    );
    let c = client_peer(
        &w,
        Some(&cg.procs()),
        // The claim is "never stalls": the peer fails any round whose reply takes over 5 s.
        // The overall budget only bounds the run: 20,000 round trips took over 60 s in a
        // TCG guest on a loaded host (6.12, 2026-12-01) without any round stalling (the VM
        // line runs 5,000: 49 s -> ~12 s).
        &[
            "--timeout",
            "600",
            "pingpong",
            "--connect",
            &a.to_string(),
            "--rounds",
            &rounds.to_string(),
            "--size",
            "100",
        ],
    );
    let r: Report = peer::finish(c, "ping-pong");
    assert_eq!(r.ok, rounds);
    let _: Report = peer::finish(s, "echo server");
    let before = sc.stats().unwrap();
    // Every round but the first (sent before either end had read) took the shortcut.
    assert!(before.redirected_msgs >= 2 * (rounds - 1), "{before:?}");

    // FIONREAD on the receiving socket must report bytes that arrived through the redirect.
    let b = server_addr(5007);
    let s = server_peer(
        &w,
        Some(&cg.procs()),
        b,
        &[
            "--timeout",
            "30",
            "fionread-server",
            "--listen",
            &b.to_string(),
            "--bytes",
            "100000",
        ],
    );
    let c = client_peer(
        &w,
        Some(&cg.procs()),
        &[
            "--timeout",
            "30",
            "send-client",
            "--connect",
            &b.to_string(),
            "--bytes",
            "100000",
        ],
    );
    let fr: Report = peer::finish(s, "fionread server");
    let _: Report = peer::finish(c, "send client");
    let after = sc.stats().unwrap();
    assert!(
        after.redirected_bytes >= before.redirected_bytes + 100_000,
        "{after:?}"
    );
    // FIONREAD counts bytes queued by redirects on 6.12+ (checked on 6.12, 6.18, 7.2); 6.1
    // reports 0 (checked in the VM matrix), which `nsfast sockmap run` warns about.
    let expected = if nsfast_sockmap::fionread_counts_redirects() {
        100_000
    } else {
        0
    };
    assert_eq!(fr.value, expected, "FIONREAD: {}", fr.detail);
    assert_eq!(fr.ok, 1, "FIONREAD after reading: {}", fr.detail);
}

#[test]
fn processes_outside_the_cgroup_are_untouched() {
    require_root();
    let w = VethPair::new();
    let attached = TestCgroup::new();
    let other = TestCgroup::new();
    let sc = attach(&attached);
    bidir_transfer(
        &w,
        Some(&other),
        server_addr(5008),
        server_addr(5008),
        16 << 20,
    );
    bidir_transfer(&w, None, server_addr(5009), server_addr(5009), 16 << 20);
    assert_eq!(sc.stats().unwrap(), Stats::default());
    // The positive control: the same transfer inside the attached cgroup is redirected, so
    // the zeros above are the other processes', not a shortcut that sees nothing.
    paced_transfer(&w, &attached, server_addr(5014), 1 << 20);
    let st = sc.stats().unwrap();
    assert_eq!(st.pairs, 1, "{st:?}");
    assert_carried(&st, 2 << 20);
}

#[test]
fn connections_established_before_run_keep_the_normal_path() {
    require_root();
    let w = VethPair::new();
    let cg = TestCgroup::new();
    let a = server_addr(5010);
    let bytes: u64 = 32 << 20;
    let s = bidir_server(&w, Some(&cg.procs()), a, bytes, 1);
    // Connected first; the shortcut is attached once the connection is ESTABLISHED, and the
    // client sends (slowly) only after that.
    let tmp = TmpDir::new();
    let go = tmp.0.join("go");
    let c = bidir_client(
        &w,
        Some(&cg.procs()),
        a,
        bytes,
        2,
        &["--start-when", &go.to_string_lossy(), "--rate", "64000000"],
    );
    peer::wait_established(&w.client, a);
    let sc = attach(&cg);
    std::fs::write(&go, b"").unwrap();
    let cr: BidirReport = peer::finish(c, "client");
    let sr: BidirReport = peer::finish(s, "server");
    assert_eq!(cr.received_sha256, sr.sent_sha256);
    assert_eq!(sr.received_sha256, cr.sent_sha256);
    let st = sc.stats().unwrap();
    assert_eq!((st.pairs, st.redirected_msgs), (0, 0), "{st:?}");
    // The positive control: a connection made after the attach, same cgroup, same check,
    // is paired and redirected (so the zero above is the old connection's, not a blind spot).
    let small: u64 = 1 << 20;
    paced_transfer(&w, &cg, server_addr(5013), small);
    let st = sc.stats().unwrap();
    assert_eq!(st.pairs, 1, "{st:?}");
    assert_carried(&st, 2 * small);
}

fn wait_for_instance(pid: u32, attached: bool) -> nsfast_sockmap::Instance {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(i) = nsfast_sockmap::instances()
            .unwrap()
            .into_iter()
            .find(|i| i.loader_pid == pid && i.attached == attached)
        {
            return i;
        }
        assert!(
            Instant::now() < deadline,
            "no instance of loader {pid} with attached={attached}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn_run(cg: &TestCgroup) -> KillOnDrop {
    KillOnDrop::new(
        Command::new(nsfast_bin())
            .args(["sockmap", "run", "--allow-splice-hole", "--cgroup"])
            .arg(cg.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn nsfast sockmap run"),
    )
}

/// SIGKILL the loader mid-transfer: the transfer finishes byte-exact, and a new `run` on the
/// same cgroup starts cleanly and works.
#[test]
fn sigkill_of_the_loader_mid_transfer_loses_nothing() {
    require_root();
    let w = VethPair::new();
    let cg = TestCgroup::new();
    let mut loader = spawn_run(&cg);
    let inst = wait_for_instance(loader.id(), true);
    assert_eq!(inst.cgroup_path.as_deref(), Some(cg.path()));

    let a = server_addr(5011);
    // 256 MiB each way (NSFAST_TEST_BULK_MIB x 4 when that is less: 64 MiB in the VM line,
    // where generating and hashing 512 MiB took ~30 s).
    let bytes: u64 = (256 << 20).min(4 * bulk_bytes());
    let s = bidir_server(&w, Some(&cg.procs()), a, bytes, 1);
    // ~2 s of transfer (half the bytes per second); the kill lands once a quarter of it (both
    // directions together) went through the shortcut, and before all of it did.
    let rate = (bytes / 2).to_string();
    let mut c = bidir_client(&w, Some(&cg.procs()), a, bytes, 2, &["--rate", &rate]);
    let total = 2 * bytes;
    let deadline = Instant::now() + Duration::from_secs(60);
    let at_kill = loop {
        let i = wait_for_instance(loader.id(), true);
        if i.stats.redirected_bytes >= total / 4 {
            break i.stats;
        }
        let ended = c.child_mut().try_wait().unwrap().is_some();
        assert!(
            !ended && Instant::now() < deadline,
            "the shortcut redirected only {} of {total} bytes {}: {:?}",
            i.stats.redirected_bytes,
            if ended {
                "and the client is done"
            } else {
                "in 60 s"
            },
            i.stats
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    loader.child_mut().kill().expect("SIGKILL the loader");
    assert!(
        at_kill.redirected_bytes < total,
        "the transfer was over before the kill: {at_kill:?}"
    );
    let _ = loader.child_mut().wait();
    let cr: BidirReport = peer::finish(c, "client");
    let sr: BidirReport = peer::finish(s, "server");
    assert_eq!(cr.received, bytes);
    assert_eq!(sr.received, bytes);
    assert_eq!(cr.received_sha256, sr.sent_sha256);
    assert_eq!(sr.received_sha256, cr.sent_sha256);

    // The next run attaches cleanly to the same cgroup and takes new connections.
    let loader2 = spawn_run(&cg);
    let pid2 = loader2.id();
    wait_for_instance(pid2, true);
    paced_transfer(&w, &cg, server_addr(5012), 8 << 20);
    let inst = wait_for_instance(pid2, true);
    assert_eq!(inst.stats.pairs, 1, "{:?}", inst.stats);
    assert_carried(&inst.stats, 2 * (8 << 20));
    // SIGTERM: detaches and exits 0.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid2 as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = loader2.take().wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(nsfast_sockmap::instances()
        .unwrap()
        .iter()
        .all(|i| i.loader_pid != pid2 || !i.attached));
}

/// `status` shows the options a `run` was given, in its lines and its JSON.
#[test]
fn status_names_the_settings_run_was_given() {
    require_root();
    let cg = TestCgroup::new();
    let loader = KillOnDrop::new(
        Command::new(nsfast_bin())
            .args(["sockmap", "run", "--allow-splice-hole", "--cgroup"])
            .arg(cg.path())
            .args(["--queue-limit", "4M", "--keep-tcp-after", "2"])
            .args(["--probe-interval", "250ms"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nsfast sockmap run"),
    );
    let inst = wait_for_instance(loader.id(), true);
    assert_eq!(
        inst.settings,
        Some(nsfast_sockmap::Settings {
            queue_limit: 4 << 20,
            keep_tcp_after: 2,
            probe_interval_ns: 250_000_000,
        })
    );
    let out = Command::new(nsfast_bin())
        .args(["sockmap", "status"])
        .output()
        .expect("run nsfast sockmap status");
    let text = String::from_utf8_lossy(&out.stdout);
    let head = format!("cgroup {} ", cg.path().display());
    let mine: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with(&head))
        .take(2)
        .collect();
    assert_eq!(
        mine.get(1)
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")),
        Some("settings --queue-limit 4M --keep-tcp-after 2 --probe-interval 250ms".into()),
        "{text}"
    );
    let out = Command::new(nsfast_bin())
        .args(["-j", "sockmap", "status"])
        .output()
        .expect("run nsfast -j sockmap status");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    let me = v["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["loader_pid"] == loader.id())
        .expect("this loader's instance in the JSON");
    assert_eq!(
        me["settings"],
        serde_json::json!({
            "queue_limit": 4 << 20,
            "keep_tcp_after": 2,
            "probe_interval_ns": 250_000_000u64,
        })
    );
}

/// `sockmap status --cgroup PATH` is a check a script can test: exit 1 while nothing is
/// attached to that cgroup, 0 once an instance is (listing only that cgroup's), 2 for a
/// bad slice name.
#[test]
fn status_of_one_cgroup_exits_nonzero_unless_an_instance_is_attached_there() {
    require_root();
    let cg = TestCgroup::new();
    let path = cg.path().to_string_lossy().into_owned();
    let status = |args: &[&str]| {
        let o = Command::new(nsfast_bin())
            .args(args)
            .output()
            .expect("run nsfast");
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, _, err) = status(&["sockmap", "status", "--cgroup", &path]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("no nsfast sockmap instance is attached to"),
        "{err}"
    );
    let (code, _, err) = status(&["sockmap", "status", "--slice", "bad/name"]);
    assert_eq!(code, Some(2), "{err}");
    let _sc = attach(&cg);
    let (code, out, err) = status(&["-j", "sockmap", "status", "--cgroup", &path]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let list = v["instances"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{v}");
    assert_eq!(list[0]["cgroup_path"], path.as_str(), "{v}");
    let (code, _, err) = status(&["sockmap", "status"]);
    assert_eq!(code, Some(0), "{err}");
}

fn run_cli(args: &[&str]) -> (bool, String) {
    let out = Command::new(nsfast_bin())
        .args(args)
        .output()
        .expect("run nsfast");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_input_gives_one_clear_error_and_attaches_nothing() {
    require_root();
    // Loaders seen now; an earlier test's draining instance may go away meanwhile, so the
    // check is "no new loader", not "the same count".
    let loaders = || {
        nsfast_sockmap::instances()
            .unwrap()
            .into_iter()
            .map(|i| i.loader_pid)
            .collect::<std::collections::BTreeSet<_>>()
    };
    let before = loaders();
    let (ok, err) = run_cli(&["sockmap", "run", "--ports", "80,70000"]);
    assert!(!ok);
    assert!(
        err.contains("invalid port \"70000\" in --ports: must be 1-65535"),
        "{err}"
    );
    let (ok, err) = run_cli(&["sockmap", "run", "--exclude-ports", "http"]);
    assert!(!ok);
    assert!(
        err.contains("\"http\"") && err.contains("--exclude-ports"),
        "{err}"
    );
    let (ok, err) = run_cli(&["sockmap", "run", "--cgroup", "/tmp"]);
    assert!(!ok);
    assert!(err.contains("/tmp is not a cgroup2 directory"), "{err}");
    let (ok, err) = run_cli(&[
        "sockmap",
        "run",
        "--cgroup",
        "/sys/fs/cgroup/unified/nsft-does-not-exist",
    ]);
    assert!(!ok);
    assert!(err.contains("does not exist"), "{err}");
    let after = loaders();
    assert!(
        after.is_subset(&before),
        "new instances: {after:?} vs {before:?}"
    );

    // A second run on the same cgroup is refused while the first runs.
    let cg = TestCgroup::new();
    let mut first = spawn_run(&cg);
    wait_for_instance(first.id(), true);
    let (ok, err) = run_cli(&[
        "sockmap",
        "run",
        "--allow-splice-hole",
        "--cgroup",
        cg.path().to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(err.contains("already attached"), "{err}");
    assert!(err.contains(&format!("loader pid {}", first.id())), "{err}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    assert!(first.child_mut().wait().unwrap().success());
}

/// Runs `conns` one-message connections one after another from the client namespace to the
/// echo server at `a` (`--sequential`: as a TCP_CRR client) and checks every echo.
fn sequential_conns(w: &VethPair, cg: &TestCgroup, a: SocketAddr, conns: u64) -> Report {
    let c = client_peer(
        w,
        Some(&cg.procs()),
        &[
            "many",
            "--connect",
            &a.to_string(),
            "--conns",
            &conns.to_string(),
            "--size",
            "100",
            "--sequential",
        ],
    );
    let r: Report = peer::finish(c, "sequential connections");
    assert_eq!((r.ok, r.failed), (conns, 0), "{}", r.detail);
    r
}

/// One connection of `rounds` round trips to the echo server at `a`.
fn one_pingpong(w: &VethPair, cg: &TestCgroup, a: SocketAddr, rounds: u64) {
    let c = client_peer(
        w,
        Some(&cg.procs()),
        &[
            "pingpong",
            "--connect",
            &a.to_string(),
            "--rounds",
            &rounds.to_string(),
        ],
    );
    let r: Report = peer::finish(c, "pingpong");
    assert_eq!(r.failed, 0, "{}", r.detail);
}

/// [`attach`] with the given probe interval (`--probe-interval`).
fn attach_probing_every(cg: &TestCgroup, interval: Duration) -> Shortcut {
    Shortcut::attach(&Options {
        allow_splice_hole: true,
        cgroup: Some(cg.path().to_path_buf()),
        probe_interval: Some(interval),
        ..Default::default()
    })
    .expect("attach the shortcut")
}

/// An echo server for the admission tests at `a`, in the cgroup.
fn admission_echo_server(w: &VethPair, cg: &TestCgroup, a: SocketAddr) -> KillOnDrop {
    server_peer(
        w,
        Some(&cg.procs()),
        a,
        &[
            "--timeout",
            "300",
            "echo-server",
            "--listen",
            &a.to_string(),
        ],
    )
}

#[test]
fn short_connections_in_a_row_keep_tcp_and_a_long_one_after_a_pause_joins() {
    require_root();
    let w = VethPair::new();
    let cg = TestCgroup::new();
    // No probe in this test's time: which connections join is exact.
    let sc = attach_probing_every(&cg, Duration::from_secs(3600));
    let a = server_addr(5007);
    let _s = admission_echo_server(&w, &cg, a);
    let n = 200;
    let r = sequential_conns(&w, &cg, a, n);
    let st = sc.stats().unwrap();
    let after = u64::from(nsfast_sockmap::abi::DEFAULT_ADMIT_AFTER);
    // The first `after` join, and both ends of every later one keep TCP without joining. A
    // close recorded only after the next connections' ESTABLISHED lets those join too (or
    // one of their ends, which then stays unpaired): some slack. Connections that keep TCP
    // keep the streak's window open; only a stall of a second between two (an emulated guest)
    // starts a new streak, of `after` more: a bound by the time they took.
    let window_ms = nsfast_sockmap::abi::ADMIT_WINDOW_NS / 1_000_000;
    let streaks = 1 + r.elapsed_ms / window_ms;
    assert!(
        st.pairs >= after && st.pairs <= streaks * (after + 4),
        "a streak of short connections keeps the next ones off the shortcut ({} ms for {n}): {st:?}",
        r.elapsed_ms
    );
    assert!(
        st.skipped_short >= 2 * (n - streaks * (after + 4)),
        "both ends of every connection that does not join keep TCP: {st:?}"
    );
    // An end that joined while its peer kept TCP stays unpaired and sends by TCP: it is
    // tainted at its first send, once. Every end that paired sent only by the shortcut.
    let unpaired = st
        .sockets_added
        .checked_sub(2 * st.pairs)
        .unwrap_or_else(|| panic!("a pair counts two added ends: {st:?}"));
    assert!(
        st.tainted <= unpaired,
        "only unpaired ends fall back: {st:?}"
    );
    assert_eq!(st.redirect_failed, 0, "{st:?}");
    // After a pause longer than the window, a long connection joins and is carried; what it
    // carried resets the history, so the next short connections join again.
    std::thread::sleep(Duration::from_millis(1200));
    let before = sc.stats().unwrap();
    one_pingpong(&w, &cg, a, 200);
    let mid = sc.stats().unwrap();
    assert_eq!(mid.pairs, before.pairs + 1, "{mid:?}");
    // 400 sends, all but the gated first few redirected; a client that sent its first
    // request before the server's ESTABLISHED paired them sends it all by TCP (tainted: a
    // timing, as in a slow guest), and then only the replies are.
    let tainted = mid.tainted - before.tainted;
    assert!(tainted <= 1, "{mid:?}");
    assert!(
        mid.redirected_msgs >= before.redirected_msgs + 300 - 200 * tainted,
        "the long connection takes the shortcut: {mid:?}"
    );
    // The pingpong's first end records at its close, which can come after the peer exits:
    // wait for it (`closed` counts the closes of first ends).
    let deadline = Instant::now() + Duration::from_secs(30);
    while sc.stats().unwrap().closed <= before.closed {
        assert!(
            Instant::now() < deadline,
            "the pingpong's first end never closed: {:?}",
            sc.stats().unwrap()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    sequential_conns(&w, &cg, a, after);
    let end = sc.stats().unwrap();
    assert_eq!(
        end.pairs,
        mid.pairs + after,
        "a connection that gained resets the history: {end:?}"
    );
    assert_eq!(end.skipped_short, mid.skipped_short, "{end:?}");
}

#[test]
fn a_probe_joins_at_both_ends_once_the_probe_interval_has_passed() {
    require_root();
    let w = VethPair::new();
    let cg = TestCgroup::new();
    let sc = attach_probing_every(&cg, Duration::from_millis(100));
    let a = server_addr(5009);
    let _s = admission_echo_server(&w, &cg, a);
    let after = u64::from(nsfast_sockmap::abi::DEFAULT_ADMIT_AFTER);
    sequential_conns(&w, &cg, a, after + 10);
    let before = sc.stats().unwrap();
    assert!(before.skipped_short > 0, "a streak keeps TCP: {before:?}");
    // Within the 1 s window (moved on by the last connections, which kept TCP) but past the
    // probe interval: the next connection is a probe, and pairs only if both ends agree on it
    // (a lone end stays unpaired).
    std::thread::sleep(Duration::from_millis(200));
    sequential_conns(&w, &cg, a, 1);
    let st = sc.stats().unwrap();
    assert_eq!(
        (st.pairs, st.skipped_short),
        (before.pairs + 1, before.skipped_short),
        "the probe joins at both ends: {st:?}"
    );
    // (A client that sends before the server's ESTABLISHED has paired them sends that
    // direction by TCP, `tainted`: a timing, as in a slow guest, not a failure.)
    assert_eq!(st.redirect_failed, 0, "{st:?}");
}

#[test]
fn keep_tcp_after_zero_joins_every_connection() {
    require_root();
    let w = VethPair::new();
    let cg = TestCgroup::new();
    let sc = attach_joining_all(&cg);
    let a = server_addr(5008);
    let _s = admission_echo_server(&w, &cg, a);
    let n = 100;
    sequential_conns(&w, &cg, a, n);
    let st = sc.stats().unwrap();
    assert_eq!((st.pairs, st.skipped_short), (n, 0), "{st:?}");
}

#[test]
fn port_filters_select_connections() {
    require_root();
    let w = VethPair::new();
    let cg = TestCgroup::new();
    let sc = Shortcut::attach(&Options {
        allow_splice_hole: true,
        cgroup: Some(cg.path().to_path_buf()),
        ports: Some(nsfast_sys::ports::PortList::parse("--ports", "5100-5102").unwrap()),
        exclude_ports: Some(nsfast_sys::ports::PortList::parse("--exclude-ports", "5101").unwrap()),
        queue_limit: None,
        keep_tcp_after: None,
        probe_interval: None,
    })
    .unwrap();
    let bytes = 1 << 20;
    paced_transfer(&w, &cg, server_addr(5100), bytes); // included
    bidir_transfer(&w, Some(&cg), server_addr(5101), server_addr(5101), bytes); // excluded
    bidir_transfer(&w, Some(&cg), server_addr(5200), server_addr(5200), bytes); // not listed
    let st = sc.stats().unwrap();
    assert_eq!(st.pairs, 1, "{st:?}");
    assert_carried(&st, 2 * bytes);
    assert_eq!(
        st.skipped_port, 4,
        "two ends of two skipped connections: {st:?}"
    );
}

/// A socket that was in the shortcut, disconnected (connect(AF_UNSPEC)) and connected again
/// somewhere the shortcut does not go keeps nothing of its first connection: SO_ZEROCOPY,
/// which the shortcut refuses only on connections in it, is allowed, as without the shortcut.
#[test]
fn a_reconnected_socket_that_does_not_join_is_plain_tcp() {
    require_root();
    let w = VethPair::new();
    let cg = TestCgroup::new();
    let sc = Shortcut::attach(&Options {
        allow_splice_hole: true,
        cgroup: Some(cg.path().to_path_buf()),
        exclude_ports: Some(nsfast_sys::ports::PortList::parse("--exclude-ports", "5111").unwrap()),
        ..Default::default()
    })
    .unwrap();
    let (first, then) = (server_addr(5110), server_addr(5111));
    let _s1 = admission_echo_server(&w, &cg, first);
    let _s2 = admission_echo_server(&w, &cg, then);
    let c = client_peer(
        &w,
        Some(&cg.procs()),
        &[
            "reconnect-client",
            "--first",
            &first.to_string(),
            "--then",
            &then.to_string(),
        ],
    );
    let r: Report = peer::finish(c, "reconnect client");
    let st = sc.stats().unwrap();
    assert_eq!(st.pairs, 1, "the first connection joins: {st:?}");
    assert!(st.redirected_msgs > 0, "{st:?}");
    assert_eq!(st.skipped_port, 2, "the second does not: {st:?}");
    assert_eq!(r.detail, "ok", "SO_ZEROCOPY on the second connection");
}

/// One stream-client -> splice-server transfer through the shortcut; returns the server's
/// report after checking it byte-exact.
fn splice_transfer(
    w: &VethPair,
    cg: &TestCgroup,
    port: u16,
    bytes: u64,
    recv_first: u64,
) -> Report {
    let a = server_addr(port);
    let s = server_peer(
        w,
        Some(&cg.procs()),
        a,
        &[
            "--timeout",
            "60",
            "splice-server",
            "--listen",
            &a.to_string(),
            "--recv-first",
            &recv_first.to_string(),
        ],
    );
    let c = client_peer(
        w,
        Some(&cg.procs()),
        &[
            "--timeout",
            "60",
            "stream-client",
            "--connect",
            &a.to_string(),
            "--bytes",
            &bytes.to_string(),
        ],
    );
    let cr: Report = peer::finish(c, "stream client");
    let sr: Report = peer::finish(s, "splice server");
    assert_eq!(
        sr.value, bytes,
        "the splice reader got {} of {bytes} bytes",
        sr.value
    );
    assert_eq!(cr.detail, peer::stream_client_sha256(bytes));
    assert_eq!(
        sr.detail.split(' ').next(),
        Some(cr.detail.as_str()),
        "the splice reader got other bytes than were sent"
    );
    sr
}

/// Runs `nft ARGS` in `ns`; its stdout.
fn nft(ns: &nsfast_sys::netns::NetNs, args: &[&str]) -> String {
    let out = ns
        .run(|| Command::new("nft").args(args).output())
        .expect("enter the namespace")
        .unwrap_or_else(|e| panic!("run nft (nftables installed?): {e}"));
    assert!(
        out.status.success(),
        "nft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A client's first sends can leave before its server's end is established: the handshake's
/// last ACK is still in flight, or waits for a softirq on a busy host. Here the server's
/// namespace drops that ACK, so the client's first data segment completes the handshake and
/// its first send always comes before the server's end exists. Those bytes take TCP; the
/// direction still joins the shortcut once the server has read them, and nothing falls back
/// for good.
#[test]
fn a_client_that_sends_before_its_server_is_established_still_joins() {
    require_root();
    let w = VethPair::new();
    let cg = TestCgroup::new();
    let sc = attach(&cg);
    let port = 5550;
    nft(&w.server, &["add", "table", "inet", "nsf_test"]);
    nft(
        &w.server,
        &[
            "add",
            "chain",
            "inet",
            "nsf_test",
            "input",
            "{ type filter hook input priority 0 ; policy accept ; }",
        ],
    );
    // The client's first pure ACK towards the port is the handshake's last.
    let port_s = port.to_string();
    nft(
        &w.server,
        &[
            "add", "rule", "inet", "nsf_test", "input", "tcp", "dport", &port_s, "tcp", "flags",
            "==", "ack", "limit", "rate", "1/hour", "burst", "1", "packets", "counter", "drop",
        ],
    );
    let bytes = 8 << 20;
    paced_transfer(&w, &cg, server_addr(port), bytes);
    let rules = nft(&w.server, &["list", "chain", "inet", "nsf_test", "input"]);
    assert!(
        rules.contains("counter packets 1 "),
        "the handshake's last ACK was not dropped: {rules}"
    );
    let st = sc.stats().unwrap();
    assert_carried(&st, 2 * bytes);
    assert!(st.gated_bytes > 0, "{st:?}");
}

#[test]
fn a_splice_reader_gets_every_byte() {
    require_root();
    let w = VethPair::new();
    let cg = TestCgroup::new();
    let sc = attach(&cg);
    let bytes = 16 << 20;
    // A reader that only splices (Go's io.Copy, `nsfast vsock relay --path splice`): the
    // sender never redirects into it, so splice sees every byte on TCP.
    let r = splice_transfer(&w, &cg, 5300, bytes, 0);
    assert!(
        r.detail.ends_with(&format!("spliced {bytes}")),
        "{}",
        r.detail
    );
    let st = sc.stats().unwrap();
    assert_eq!(st.redirected_bytes, 0, "{st:?}");
    assert_eq!(st.passed_bytes, bytes, "{st:?}");
    // One that reads with recv first and then splices (HAProxy): where the splice guard runs
    // it refuses a splice with shortcut bytes unread, so the reader falls back to read(2);
    // without the guard a switch while bytes wait in the shortcut queue cannot be seen, and
    // the test shows only the guarded case.
    if sc.splice_guard() {
        for i in 0..20u16 {
            splice_transfer(&w, &cg, 5301 + i, 4 << 20, 64 << 10);
        }
        let st = sc.stats().unwrap();
        assert!(st.splice_readers >= 21, "{st:?}");
    } else {
        eprintln!("splice guard not attached on this kernel: recv-then-splice part skipped");
    }
}

#[test]
fn a_receiver_that_stops_reading_holds_the_sender_back() {
    require_root();
    let w = VethPair::new();
    let cg = TestCgroup::new();
    let sc = attach(&cg);
    peer::assert_stopped_reader_holds_sender_back(
        &w.server,
        &w.client,
        Some(&cg.procs()),
        server_addr(5400),
        256 << 20,
        1 << 20,
        nsfast_sockmap::abi::DEFAULT_QUEUE_LIMIT,
        || format!("{:?}", sc.stats().unwrap()),
    );
    // Held back by the queue limit, or (when the receiver stopped while that direction was
    // still on TCP, as in slow TCG guests) by TCP's window.
    let st = sc.stats().unwrap();
    assert!(st.queue_limit >= 1 || st.gated_bytes > 0, "{st:?}");
}

/// `runs` transfers of `bytes` from a stream-client through the proxy listening on
/// `proxy_port` (started by the caller) to a fresh backend on `backend_port`, each checked
/// byte-exact at the backend; then no direction of `sc` may have fallen back for good.
fn through_proxy(
    sc: &Shortcut,
    w: &VethPair,
    cg: &TestCgroup,
    proxy_port: u16,
    backend_port: u16,
    runs: u32,
    bytes: u64,
) {
    let want = peer::stream_client_sha256(bytes);
    let (p, b) = (server_addr(proxy_port), server_addr(backend_port));
    for run in 0..runs {
        let s = server_peer(
            w,
            Some(&cg.procs()),
            b,
            &[
                "--timeout",
                "60",
                "hold-server",
                "--listen",
                &b.to_string(),
                "--hold-ms",
                "0",
            ],
        );
        let c = client_peer(
            w,
            Some(&cg.procs()),
            &[
                "--timeout",
                "60",
                "stream-client",
                "--connect",
                &p.to_string(),
                "--bytes",
                &bytes.to_string(),
            ],
        );
        let _: Report = peer::finish(c, "stream client");
        let sr: Report = peer::finish(s, "backend");
        assert_eq!(
            sr.value, bytes,
            "run {run}: the backend got {} of {bytes} bytes",
            sr.value
        );
        assert_eq!(sr.detail, want, "run {run}: the backend got other bytes");
    }
    let st = sc.stats().unwrap();
    eprintln!("{st:?}");
    assert_eq!((st.tainted, st.redirect_failed), (0, 0), "{st:?}");
}

/// Transfers per proxy test (default 100); NSFAST_TEST_PROXY_RUNS lowers it for TCG guests.
fn proxy_runs() -> u32 {
    nsfast_lab::env_number("NSFAST_TEST_PROXY_RUNS")
        .map(|n| n as u32)
        .unwrap_or(100)
}

/// A scratch directory under /tmp, removed on drop.
struct TmpDir(PathBuf);

impl TmpDir {
    fn new() -> Self {
        let p = std::env::temp_dir().join(nsfast_lab::name::unique("sm-tmp"));
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A Debian program the test needs (make deps installs it).
fn program(name: &str) -> PathBuf {
    for d in ["/usr/sbin", "/usr/bin", "/usr/lib/go/bin", "/bin"] {
        let p = Path::new(d).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!("{name} not found: install it (make deps)");
}

#[test]
fn haproxy_with_splice_is_byte_exact() {
    require_root();
    let w = VethPair::new();
    let cg = TestCgroup::new();
    let sc = attach(&cg);
    // HAProxy reads the first bytes with recv, then splices: only the splice guard keeps the
    // bytes redirected meanwhile from being missed (this host refuses BPF trampolines, so
    // the test runs in the VM matrix; here the backend got 15,360 of 1,048,576 bytes).
    if !sc.splice_guard() {
        eprintln!("splice guard not attached on this kernel: skipped");
        return;
    }
    let dir = TmpDir::new();
    let cfg = dir.path().join("haproxy.cfg");
    let (p, b) = (server_addr(5500), server_addr(5501));
    std::fs::write(
        &cfg,
        format!(
            "global\n  maxconn 64\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 60s\n  \
             timeout server 60s\n  option splice-request\n  option splice-response\n\
             frontend f\n  bind {p}\n  default_backend b\nbackend b\n  server s1 {b}\n"
        ),
    )
    .unwrap();
    let cfg = cfg.display().to_string();
    let _haproxy = peer::spawn(
        &program("haproxy"),
        &w.server,
        Some(&cg.procs()),
        &args(&["-db", "-f", &cfg]),
    );
    peer::wait_listening(&w.server, p);
    through_proxy(&sc, &w, &cg, 5500, 5501, proxy_runs(), 1 << 20);
}

#[test]
fn go_io_copy_proxy_is_byte_exact() {
    require_root();
    let w = VethPair::new();
    let cg = TestCgroup::new();
    let sc = attach(&cg);
    let dir = TmpDir::new();
    // A TCP proxy as Go programs write it: io.Copy between two *net.TCPConn, which splices.
    std::fs::write(
        dir.path().join("proxy.go"),
        r#"package main

import (
	"io"
	"net"
	"os"
)

func main() {
	l, err := net.Listen("tcp", os.Args[1])
	if err != nil {
		panic(err)
	}
	for {
		c, err := l.Accept()
		if err != nil {
			panic(err)
		}
		go func(c net.Conn) {
			defer c.Close()
			b, err := net.Dial("tcp", os.Args[2])
			if err != nil {
				return
			}
			defer b.Close()
			go func() {
				io.Copy(b, c)
				b.(*net.TCPConn).CloseWrite()
			}()
			io.Copy(c, b)
		}(c)
	}
}
"#,
    )
    .unwrap();
    let bin = dir.path().join("proxy");
    let out = Command::new(program("go"))
        .args(["build", "-o"])
        .arg(&bin)
        .arg("proxy.go")
        .current_dir(dir.path())
        .env("GOCACHE", dir.path().join("cache"))
        .env("GOPATH", dir.path().join("gopath"))
        .env("GO111MODULE", "off")
        .env("CGO_ENABLED", "0")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "go build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (p, b) = (server_addr(5510), server_addr(5511));
    let _proxy = peer::spawn(
        &bin,
        &w.server,
        Some(&cg.procs()),
        &args(&[&p.to_string(), &b.to_string()]),
    );
    peer::wait_listening(&w.server, p);
    through_proxy(&sc, &w, &cg, 5510, 5511, proxy_runs(), 1 << 20);
}

#[test]
fn nsfast_splice_relay_is_byte_exact() {
    require_root();
    let w = VethPair::new();
    let cg = TestCgroup::new();
    let sc = attach(&cg);
    let (p, b) = (server_addr(5520), server_addr(5521));
    let _relay = peer::spawn(
        &nsfast_bin(),
        &w.server,
        Some(&cg.procs()),
        &args(&[
            "vsock",
            "relay",
            "--path",
            "splice",
            "--fork",
            &format!("tcp-listen:{},bind={}", p.port(), p.ip()),
            &format!("tcp:{b}"),
        ]),
    );
    peer::wait_listening(&w.server, p);
    through_proxy(&sc, &w, &cg, 5520, 5521, proxy_runs(), 1 << 20);
}

/// Waits until the shortcut's pairing maps hold `want` entries (the closes that remove them
/// finish after the peers that made them exit); panics with what they hold after 60 s.
fn wait_map_entries(sc: &Shortcut, want: nsfast_sockmap::MapEntries, when: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = sc.map_entries().expect("read the pairing maps");
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{when}: the maps hold {got:?}, want {want:?}: {:?}",
            sc.stats().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every map entry a connection makes goes when it closes: 100,000 connections come and go
/// (every one joins) while one stays open and idle; then the maps hold the idle connection's
/// entries alone, it still takes the shortcut, and once it closes they are empty. (An entry
/// that outlived its connection filled the LRU maps, which then evicted the idle connection's
/// and sent its bytes by TCP.)
#[test]
fn every_map_entry_goes_with_its_connection_and_an_idle_one_keeps_the_shortcut() {
    use nsfast_sockmap::MapEntries;
    use std::io::{BufRead, Write};
    require_root();
    let w = VethPair::new();
    // 100,000 connections from one address to one port: without TIME_WAIT buckets a closed
    // connection frees its port at once (as the bench's crr namespaces do).
    for ns in [&w.client, &w.server] {
        nsfast_sys::net::set_sysctl(Some(ns), "net.ipv4.tcp_max_tw_buckets", "0").unwrap();
    }
    let cg = TestCgroup::new();
    let sc = attach_joining_all(&cg);
    let a = server_addr(5011);
    let _s = admission_echo_server(&w, &cg, a);
    let rounds = 200;
    let mut idle = client_peer(
        &w,
        Some(&cg.procs()),
        &[
            "--timeout",
            "600",
            "idle-client",
            "--connect",
            &a.to_string(),
            "--rounds",
            &rounds.to_string(),
        ],
    );
    let stderr = idle.child_mut().stderr.take().unwrap();
    let mut said = String::new();
    std::io::BufReader::new(stderr)
        .read_line(&mut said)
        .unwrap();
    assert_eq!(said.trim(), "idle", "the idle client's first round trips");
    let one = MapEntries {
        pending: 0,
        peers: 1,
        rx: 2,
    };
    wait_map_entries(&sc, one, "one idle connection");
    let before = sc.stats().unwrap();
    assert_eq!(before.pairs, 1, "{before:?}");

    let (clients, each) = (4u64, 25_000u64);
    let churn: Vec<KillOnDrop> = (0..clients)
        .map(|_| {
            client_peer(
                &w,
                Some(&cg.procs()),
                &[
                    "--timeout",
                    "900",
                    "many",
                    "--connect",
                    &a.to_string(),
                    "--conns",
                    &each.to_string(),
                    "--size",
                    "100",
                    "--sequential",
                ],
            )
        })
        .collect();
    for c in churn {
        let r: Report = peer::finish(c, "churning client");
        assert_eq!((r.ok, r.failed), (each, 0), "{}", r.detail);
    }
    wait_map_entries(&sc, one, "after the churn");
    let churned = sc.stats().unwrap();
    assert!(
        churned.pairs >= before.pairs + clients * each * 99 / 100,
        "the churn's connections joined: {churned:?}"
    );

    // The idle connection, through it all: its next round trips take the shortcut.
    writeln!(idle.child_mut().stdin.as_mut().unwrap(), "go").unwrap();
    let r: Report = peer::finish(idle, "idle client");
    assert_eq!(r.ok, 2 * rounds);
    let after = sc.stats().unwrap();
    assert_eq!(after.rx_missing, before.rx_missing, "{after:?}");
    assert_eq!(after.tainted, churned.tainted, "{after:?}");
    assert!(
        after.redirected_msgs >= churned.redirected_msgs + 2 * rounds - 2,
        "the idle connection's round trips take the shortcut: {after:?}"
    );
    wait_map_entries(&sc, MapEntries::default(), "every connection closed");
}

/// Where the splice guard cannot attach (`NSFAST_SPLICE_GUARD=off` stands for such a kernel on
/// any kernel), `sockmap run` refuses to start with one line that names the missing feature
/// and the flag that accepts the risk, and attaches nothing: a reader that switches from recv
/// to splice could otherwise miss redirected bytes. With `--allow-splice-hole` it runs.
#[test]
fn without_the_splice_guard_run_refuses_unless_the_hole_is_accepted() {
    require_root();
    let cg = TestCgroup::new();
    let run = |accept: bool| {
        let mut c = Command::new(nsfast_bin());
        c.args(["sockmap", "run"]);
        if accept {
            c.arg("--allow-splice-hole");
        }
        c.arg("--cgroup")
            .arg(cg.path())
            .env(GUARD_ENV, "off")
            .env_remove("NSFAST_ALLOW_SPLICE_HOLE")
            .env("RUST_LOG", "warn");
        c
    };
    let out = run(false).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("splice guard cannot attach")
            && err.contains(&format!("turned off by {}=off", GUARD_ENV))
            && err.contains("--allow-splice-hole"),
        "{err}"
    );
    let f = std::fs::File::open(cg.path()).unwrap();
    let attached = nsfast_sys::bpf::prog_query(
        std::os::fd::AsFd::as_fd(&f),
        nsfast_sys::bpf::BPF_CGROUP_SOCK_OPS,
    )
    .unwrap();
    assert!(attached.is_empty(), "a refused run attached {attached:?}");

    let mut accepted = KillOnDrop::new(
        run(true)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let i = wait_for_instance(accepted.id(), true);
    assert_eq!(i.cgroup_path.as_deref(), Some(cg.path()), "{i:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(accepted.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    assert!(accepted.child_mut().wait().unwrap().success());
}

/// SIGHUP (a hang-up, `systemctl reload`) leaves `run` attached: detaching would stop the
/// shortcut for good, since `run` then exits 0 and `Restart=on-failure` does not restart it.
/// SIGTERM still detaches.
#[test]
fn sighup_leaves_run_attached_and_sigterm_detaches() {
    use std::io::BufRead;
    require_root();
    let cg = TestCgroup::new();
    let mut loader = spawn_run(&cg);
    let pid = loader.id();
    wait_for_instance(pid, true);
    let signal = |s| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), s).unwrap();
    signal(nix::sys::signal::Signal::SIGHUP);
    // The loader says what it did with the signal (its log is on stderr, read to its end so
    // that the loader's later lines have a reader; the channel closing means it exited).
    let stderr = loader.child_mut().stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if l.contains("SIGHUP") {
                let _ = tx.send(l);
            }
        }
    });
    let said = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
    assert!(
        said.contains("nothing to reload, still running"),
        "after SIGHUP: {said:?}"
    );
    assert!(
        loader.child_mut().try_wait().unwrap().is_none(),
        "run exited"
    );
    let i = wait_for_instance(pid, true);
    assert_eq!(i.cgroup_path.as_deref(), Some(cg.path()));
    signal(nix::sys::signal::Signal::SIGTERM);
    assert!(loader.child_mut().wait().unwrap().success());
}
