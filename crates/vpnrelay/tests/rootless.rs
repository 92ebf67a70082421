//! Root integration tests: a real RootlessKit + slirp4netns world (and one with pasta) run by
//! an unprivileged tenant inside a throwaway "host" namespace (see `nsfast_lab::rootless`). Everything of
//! vpnrelay runs as the tenant. The world is torn down on every exit path (Drop guards).
//!
//! Needs root and: rootlesskit slirp4netns uidmap iproute2 nftables util-linux
//! (wireguard-go wireguard-tools iperf3 for the WireGuard test).

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use nsfast_lab::rootless::{
    self as testbed, Echo, Pinger, World, WorldOpts, BRIDGE, GLUETUN2_IP, GLUETUN2_PORT,
    GLUETUN_IP, GLUETUN_PORT, SERVER_IP, VPN_PORT,
};

/// One world at a time: the tests share 2 cores and the tenant.
fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

/// The `vpnrelay` binary of this workspace, built on demand with the same profile
/// (`VPNRELAY_TEST_BIN` overrides it, e.g. with the static build from ./build.sh).
fn vpnrelay_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("VPNRELAY_TEST_BIN") {
            return PathBuf::from(p);
        }
        let exe = std::env::current_exe().expect("test exe");
        let profile_dir = exe
            .parent()
            .and_then(|p| p.parent())
            .expect("target/<profile>");
        let release = profile_dir.ends_with("release");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = std::process::Command::new(cargo);
        cmd.args(["build", "-q", "-p", "nsfast", "--bin", "vpnrelay"]);
        if release {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("running cargo build for vpnrelay");
        assert!(st.success(), "cargo build -p nsfast --bin vpnrelay failed");
        let bin = profile_dir.join("vpnrelay");
        assert!(bin.exists(), "{} missing after build", bin.display());
        bin
    })
    .clone()
}

fn server() -> SocketAddrV4 {
    SocketAddrV4::new(SERVER_IP, VPN_PORT)
}

/// A running vpnrelay command whose stderr is collected line by line.
struct Proc {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    fn spawn(w: &World, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut cmd = w.vpnrelay(&vpnrelay_bin(), args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Proc::spawn_cmd(cmd)
    }

    fn spawn_cmd(mut cmd: std::process::Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn vpnrelay");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l2 = lines.clone();
        let err = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("  vpnrelay| {line}");
                l2.lock().unwrap().push(line);
            }
        });
        Proc { child, lines }
    }

    fn log(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    fn wait_line(&self, pat: &str, timeout: Duration) -> Option<String> {
        let until = Instant::now() + timeout;
        loop {
            if let Some(l) = self.log().into_iter().find(|l| l.contains(pat)) {
                return Some(l);
            }
            if Instant::now() > until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    fn exited(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }

    fn count(&self, pat: &str) -> usize {
        self.log().iter().filter(|l| l.contains(pat)).count()
    }

    fn term(&mut self) -> std::process::ExitStatus {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        self.wait(Duration::from_secs(20))
    }

    fn wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let until = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                // Let the reader thread drain the last lines.
                std::thread::sleep(Duration::from_millis(100));
                return s;
            }
            assert!(
                Instant::now() < until,
                "vpnrelay did not exit in time; log: {:#?}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.term_quiet();
        }
    }
}

impl Proc {
    fn term_quiet(&mut self) -> std::io::Result<()> {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let until = Instant::now() + Duration::from_secs(15);
        while self.child.try_wait()?.is_none() {
            if Instant::now() > until {
                self.child.kill()?;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        Ok(())
    }
}

/// The host-side source the relay logged for the flow from `client_port`.
fn logged_host_source(line: &str) -> SocketAddrV4 {
    let s = line
        .split("host socket ")
        .nth(1)
        .expect("host socket in flow line");
    s.split(';')
        .next()
        .unwrap()
        .trim()
        .parse()
        .expect("address")
}

/// The host sockets of the flows the relay opened for clients starting with `client`
/// (`172.30.0.2:`), from its flow lines.
fn relayed(p: &Proc, client: &str) -> Vec<SocketAddrV4> {
    let pat = format!(" flow {client}");
    p.log()
        .iter()
        .filter(|l| l.contains(&pat) && l.contains("(host socket "))
        .map(|l| logged_host_source(l))
        .collect()
}

/// Pings with `tries` distinct payloads (`<prefix> <n>`) until one is echoed; returns it.
fn ping_retry(s: &std::net::UdpSocket, prefix: &str, tries: usize) -> Option<String> {
    (0..tries)
        .map(|t| format!("{prefix} {t}"))
        .find(|p| testbed::ping(s, p.as_bytes()))
}

fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + timeout;
    while Instant::now() < until {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    f()
}

/// The rootless world bench's slirp4netns/vpnrelay topologies build.
fn build(detach: bool) -> World {
    use nsfast_lab::topology::Topology as _;
    WorldOpts {
        detach_netns: detach,
        ..Default::default()
    }
    .expect_built(&tenant())
}

/// The lab's tenant, created if missing.
fn tenant() -> testbed::Tenant {
    nsfast_lab::test_user::ensure().expect("the lab's tenant")
}

fn handover(w: &World) {
    let echo = Echo::start(&w.server, server()).unwrap();
    let g = w.gluetun_ns().unwrap();
    let sock = testbed::client(&g, 40000, server()).unwrap();
    let pinger = Pinger::start(sock, Duration::from_millis(20));
    // Docker's path first: the server sees slirp4netns's socket.
    assert!(
        pinger.wait_more(5, Duration::from_secs(10)),
        "no echo through slirp4netns"
    );
    let slirp_src = echo.last_source().unwrap();

    let mut relay = Proc::spawn(w, &["transparent", BRIDGE, "51820"], &[]);
    let line = relay
        .wait_line(
            "flow 172.30.0.2:40000 -> 10.201.0.2:51820",
            Duration::from_secs(15),
        )
        .unwrap_or_else(|| panic!("no flow line; log: {:#?}", relay.log()));
    assert!(
        relay.count("moved 1 tunnel") == 1,
        "hand-over count: {:#?}",
        relay.log()
    );
    let relay_src = logged_host_source(&line);
    assert_ne!(relay_src, slirp_src);
    assert!(
        wait_until(Duration::from_secs(5), || echo.last_source()
            == Some(relay_src)),
        "server did not see the relay's socket {relay_src}: {:?}",
        echo.sources()
    );
    assert!(
        pinger.wait_more(10, Duration::from_secs(10)),
        "no echo through the relay"
    );
    assert!(w.rules().unwrap().contains("lookup 4820"));

    // Back to Docker's path on stop, without restarting anything.
    let st = relay.term();
    assert!(st.success(), "relay exit {st}; log {:#?}", relay.log());
    assert!(!w.rules().unwrap().contains("4820"), "rule left behind");
    assert!(
        wait_until(Duration::from_secs(5), || echo
            .last_source()
            .is_some_and(|s| s != relay_src)),
        "server still sees the relay: {:?}",
        echo.sources()
    );
    assert!(
        pinger.wait_more(10, Duration::from_secs(10)),
        "no echo after the hand-back"
    );
}

#[test]
fn tunnel_moves_to_the_relay_and_back() {
    let _s = serial();
    let w = build(false);
    handover(&w);
}

/// RootlessKit >= 2.0 for `--detach-netns` (Debian 12 has 1.1): `$VPNRELAY_ROOTLESSKIT2`, or
/// Debian unstable's package fetched by scripts/fetch-rootlesskit2.sh (private apt
/// configuration, `dpkg -x` into build/; the system's apt sources are not touched).
fn rootlesskit2() -> PathBuf {
    if let Some(p) = std::env::var_os("VPNRELAY_ROOTLESSKIT2") {
        return PathBuf::from(p);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::process::Command::new(root.join("scripts/fetch-rootlesskit2.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("running scripts/fetch-rootlesskit2.sh");
    assert!(
        out.status.success(),
        "the --detach-netns layout needs RootlessKit >= 2.0 and scripts/fetch-rootlesskit2.sh could not fetch it"
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// A real rootless dockerd (Debian 12's docker.io 20.10 and dockerd-rootless.sh, unpacked by
/// scripts/fetch-docker.sh, never installed) with a container from a local image tarball.
/// Docker 20.10 starts RootlessKit without --state-dir: vpnrelay finds dockerd through
/// $XDG_RUNTIME_DIR/docker.pid.
#[test]
fn real_rootless_dockerd_tunnel_moves_to_the_relay_and_back() {
    let _s = serial();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::process::Command::new(root.join("scripts/fetch-docker.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("running scripts/fetch-docker.sh");
    assert!(out.status.success(), "scripts/fetch-docker.sh failed");
    let docker = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let w = World::build(
        &WorldOpts {
            docker: Some(docker),
            ..Default::default()
        },
        &tenant(),
    )
    .expect("building the rootless Docker world");
    handover(&w);
}

/// `--detach-netns` (RootlessKit >= 2.0): the namespace is bind-mounted at <state>/netns.
#[test]
fn detach_netns_layout() {
    let _s = serial();
    let rk = rootlesskit2();
    let w = World::build(
        &WorldOpts {
            detach_netns: true,
            rootlesskit: Some(rk),
            ..Default::default()
        },
        &tenant(),
    )
    .expect("building the detach-netns world");
    assert!(
        w.state_dir().join("netns").exists()
            || std::path::Path::new(&format!(
                "/proc/{}/root{}",
                w.child_pid,
                w.state_dir().join("netns").display()
            ))
            .exists()
    );
    handover(&w);
}

/// Runs scripts/`script` (a fetch script: prints one path), or says why it could not.
fn fetched(script: &str) -> Result<PathBuf, String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::process::Command::new(root.join("scripts").join(script))
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running scripts/{script}: {e}"))?;
    if !out.status.success() {
        return Err(format!("scripts/{script} failed ({})", out.status));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// The pasta world's RootlessKit 2 and pasta (`$VPNRELAY_ROOTLESSKIT2`, `$NSFAST_PASTA`, else
/// Debian unstable's packages fetched by scripts/fetch-rootlesskit2.sh and
/// scripts/fetch-pasta.sh), or why they could not be fetched.
fn pasta_tools() -> Result<(PathBuf, PathBuf), String> {
    let rk = match std::env::var_os("VPNRELAY_ROOTLESSKIT2") {
        Some(p) => PathBuf::from(p),
        None => fetched("fetch-rootlesskit2.sh")?,
    };
    let pasta = match std::env::var_os("NSFAST_PASTA") {
        Some(p) => PathBuf::from(p),
        None => fetched("fetch-pasta.sh")?,
    };
    Ok((rk, pasta))
}

/// The world with RootlessKit 2 `--net=pasta` instead of slirp4netns: pasta runs as the
/// tenant in the host namespace, and datagrams of every size from 1 to 1472 bytes go from
/// "gluetun" to the server and back byte for byte (stop-and-wait, so a lost datagram is sent
/// again rather than failing the test; a wrong byte fails it).
#[test]
fn pasta_world_carries_udp_byte_exactly() {
    let _s = serial();
    let (rk, pasta) = match pasta_tools() {
        Ok(t) => t,
        Err(why) => {
            eprintln!("SKIP pasta_world_carries_udp_byte_exactly: the packages could not be fetched: {why}");
            return;
        }
    };
    let w = World::build(
        &WorldOpts {
            rootlesskit: Some(rk),
            pasta: Some(pasta),
            ..Default::default()
        },
        &tenant(),
    )
    .expect("building the pasta world");
    assert_eq!(w.net, "pasta");
    let cmdlines: Vec<String> = w
        .processes()
        .into_iter()
        .filter_map(|p| std::fs::read(format!("/proc/{p}/cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .collect();
    assert!(
        cmdlines.iter().any(|c| c.contains("pasta")),
        "no pasta process in the world: {cmdlines:#?}"
    );
    assert!(
        !cmdlines.iter().any(|c| c.contains("slirp4netns")),
        "slirp4netns in a pasta world: {cmdlines:#?}"
    );

    let srv = w
        .server
        .run(|| std::net::UdpSocket::bind(server()))
        .expect("server netns")
        .expect("server socket");
    srv.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let cli = w
        .gluetun_ns()
        .expect("gluetun netns")
        .run(|| -> std::io::Result<std::net::UdpSocket> {
            let s = std::net::UdpSocket::bind(SocketAddrV4::new(GLUETUN_IP, 40100))?;
            s.connect(server())?;
            Ok(s)
        })
        .expect("gluetun netns")
        .expect("client socket");
    cli.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut sizes: Vec<usize> = (0..190).map(|i| 1 + (i * 61) % 1472).collect();
    sizes.extend([1, 2, 64, 512, 1280, 1420, 1471, 1472]);
    let mut buf = vec![0u8; 65536];
    let mut seen_from = None;
    for (i, len) in sizes.iter().enumerate() {
        let p: Vec<u8> = (0..*len)
            .map(|j| (i.wrapping_mul(131) ^ j.wrapping_mul(7) ^ (j >> 8)) as u8)
            .collect();
        let mut got = None;
        for _try in 0..5 {
            cli.send(&p).unwrap();
            if let Ok((n, from)) = srv.recv_from(&mut buf) {
                got = Some((buf[..n].to_vec(), from));
                break;
            }
        }
        let (data, from) = got.unwrap_or_else(|| {
            panic!("datagram {i} ({len} bytes) never reached the server through pasta")
        });
        assert_eq!(data, p, "datagram {i} ({len} bytes) changed on the way up");
        let std::net::SocketAddr::V4(from) = from else {
            panic!("IPv6 source {from}")
        };
        // pasta's host socket, in the world's host namespace.
        assert_eq!(*from.ip(), testbed::HOST_IP, "source {from}");
        assert!(
            seen_from.is_none() || seen_from == Some(from),
            "the flow changed its source: {seen_from:?} then {from}"
        );
        seen_from = Some(from);
        // And back: the reply reaches the client unchanged.
        let reply: Vec<u8> = p.iter().rev().map(|b| !b).collect();
        let mut back = None;
        for _try in 0..5 {
            srv.send_to(&reply, from).unwrap();
            if let Ok(n) = cli.recv(&mut buf) {
                back = Some(buf[..n].to_vec());
                break;
            }
        }
        let back =
            back.unwrap_or_else(|| panic!("reply {i} ({len} bytes) never came back through pasta"));
        assert_eq!(
            back, reply,
            "reply {i} ({len} bytes) changed on the way down"
        );
    }
}

/// One flow's counters from the relay's stats file.
#[derive(Debug, Clone, Copy)]
struct FlowStats {
    up_datagrams: u64,
    down_datagrams: u64,
}

fn flow_stats(w: &World, client: &str) -> Option<FlowStats> {
    let st = w.relay_stats()?;
    let f = st["flows"]
        .as_array()?
        .iter()
        .find(|f| f["client"] == client)?
        .clone();
    Some(FlowStats {
        up_datagrams: f["up_datagrams"].as_u64()?,
        down_datagrams: f["down_datagrams"].as_u64()?,
    })
}

/// A UDP receiver with UDP GRO on: a datagram the sender passed as one GSO send arrives here
/// as one super-datagram (veth keeps GSO packets whole for a GRO socket), so it sees whether
/// the relay coalesced. Counts each 1400-byte datagram by its 4-byte index and records the
/// most datagrams seen in one receive; echoes everything one datagram at a time.
struct GroSink {
    stop: Arc<std::sync::atomic::AtomicBool>,
    seen: Arc<Mutex<std::collections::BTreeSet<u32>>>,
    most: Arc<std::sync::atomic::AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

const BURST: u32 = 200;
const DGRAM: usize = 1400;

impl GroSink {
    /// Receives on `sock` (echoing to the sender when `echo`).
    fn start(sock: std::net::UdpSocket, echo: bool) -> GroSink {
        use std::os::fd::AsFd;
        use std::sync::atomic::Ordering;
        assert!(
            nsfast_sys::udp::enable_gro(sock.as_fd()).unwrap(),
            "UDP GRO needed to see coalescing"
        );
        let _ = nsfast_sys::udp::set_buffers(sock.as_fd(), 16 << 20);
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (st, se, mo) = (stop.clone(), seen.clone(), most.clone());
        let thread = std::thread::spawn(move || {
            let mut rx = nsfast_sys::udp::RecvBatch::new(16);
            while !st.load(Ordering::Relaxed) {
                let Ok(n) = rx.recv(sock.as_fd()) else {
                    continue;
                };
                for i in 0..n {
                    let (data, meta) = rx.get(i);
                    let segs: Vec<&[u8]> = data.chunks(meta.stride.max(1)).collect();
                    mo.fetch_max(segs.len(), Ordering::Relaxed);
                    for seg in segs {
                        if seg.len() == DGRAM {
                            let idx = u32::from_le_bytes(seg[..4].try_into().unwrap());
                            se.lock().unwrap().insert(idx);
                        }
                        if echo {
                            if let Some(src) = meta.src {
                                let _ = sock.send_to(seg, src);
                            }
                        }
                    }
                }
            }
        });
        GroSink {
            stop,
            seen,
            most,
            thread: Some(thread),
        }
    }

    fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    fn most(&self) -> usize {
        self.most.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn clear(&self) {
        self.seen.lock().unwrap().clear();
        self.most.store(0, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for GroSink {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sends [`BURST`] datagrams of [`DGRAM`] bytes (index in the first 4 bytes) from `sock`
/// as fast as it can: what a batching relay would coalesce.
fn burst(sock: &std::net::UdpSocket) {
    for i in 0..BURST {
        let mut d = [0x5au8; DGRAM];
        d[..4].copy_from_slice(&i.to_le_bytes());
        sock.send(&d).unwrap();
    }
}

/// The relay started with `env`; the client socket on `port` (its echoes land in a GRO
/// receiver); one ping sets the flow up. Returns the relay and the client-side receiver.
fn gro_world_flow(
    w: &World,
    env: &[(&str, &str)],
    port: u16,
) -> (Proc, std::net::UdpSocket, GroSink) {
    let relay = Proc::spawn(w, &["transparent", BRIDGE, "51820"], env);
    relay
        .wait_line("relay running", Duration::from_secs(15))
        .unwrap_or_else(|| panic!("relay did not start; log {:#?}", relay.log()));
    let g = w.gluetun_ns().unwrap();
    let sock = testbed::client(&g, port, server()).unwrap();
    let recv = sock.try_clone().unwrap();
    let client = GroSink::start(recv, false);
    let flow = format!("flow 172.30.0.2:{port} -> ");
    let mut i = 0;
    while relay.count(&flow) == 0 {
        i += 1;
        assert!(i < 50, "no flow line; log {:#?}", relay.log());
        let _ = sock.send(format!("hello {i}").as_bytes());
        let _ = relay.wait_line(&flow, Duration::from_millis(200));
    }
    (relay, sock, client)
}

#[test]
fn single_datagrams_when_gro_and_gso_are_switched_off() {
    let _s = serial();
    let w = build(false);
    let srv = w
        .server
        .run(|| std::net::UdpSocket::bind(server()))
        .unwrap()
        .unwrap();
    let sink = GroSink::start(srv, true);
    let (mut relay, sock, client) = gro_world_flow(
        &w,
        &[("VPNRELAY_NO_GRO", "1"), ("VPNRELAY_NO_GSO", "1")],
        40030,
    );
    assert_eq!(
        relay.count("UDP GRO off (VPNRELAY_NO_GRO set)"),
        1,
        "{:#?}",
        relay.log()
    );
    assert_eq!(
        relay.count("UDP GSO off (VPNRELAY_NO_GSO set)"),
        1,
        "{:#?}",
        relay.log()
    );
    sink.clear();
    client.clear();
    burst(&sock);
    // Every datagram arrives, each on its own, both ways.
    let all = BURST as usize;
    assert!(
        wait_until(Duration::from_secs(10), || sink.count() == all
            && client.count() == all),
        "server got {} of {all}, client got {} of {all} echoes",
        sink.count(),
        client.count()
    );
    assert_eq!(
        (sink.most(), client.most()),
        (1, 1),
        "with GSO off the relay coalesced datagrams (most per receive: server, client)"
    );
    // ... and through the relay: its counters for this flow hold the burst both ways.
    assert!(
        wait_until(Duration::from_secs(5), || flow_stats(
            &w,
            "172.30.0.2:40030"
        )
        .is_some_and(
            |f| f.up_datagrams > u64::from(BURST) && f.down_datagrams > u64::from(BURST)
        )),
        "relay counters: {:?}",
        w.relay_stats()
    );
    assert!(relay.term().success());

    // Positive control: the same burst with GSO on is coalesced, and these receivers see it
    // (the relay batches what one recvmmsg returns, so a burst may need repeating).
    let (mut relay, sock, client) = gro_world_flow(&w, &[], 40031);
    assert_eq!(relay.count("UDP GSO on"), 1, "{:#?}", relay.log());
    let mut tries = 0;
    while sink.most() <= 1 && client.most() <= 1 {
        tries += 1;
        assert!(
            tries <= 20,
            "GSO on: no coalesced datagram seen in 20 bursts: the check above could not see coalescing"
        );
        sink.clear();
        client.clear();
        burst(&sock);
        wait_until(Duration::from_secs(3), || sink.count() == all);
    }
    assert!(relay.term().success());
}

#[test]
fn killing_the_parent_hands_tunnels_back() {
    let _s = serial();
    let w = build(false);
    let echo = Echo::start(&w.server, server()).unwrap();
    let g = w.gluetun_ns().unwrap();
    let pinger = Pinger::start(
        testbed::client(&g, 40020, server()).unwrap(),
        Duration::from_millis(20),
    );
    let mut relay = Proc::spawn(&w, &["transparent", BRIDGE, "51820"], &[]);
    let line = relay
        .wait_line("flow 172.30.0.2:40020", Duration::from_secs(15))
        .unwrap_or_else(|| panic!("no flow; log {:#?}", relay.log()));
    let relay_src = logged_host_source(&line);
    assert!(wait_until(Duration::from_secs(5), || echo.last_source()
        == Some(relay_src)));
    // SIGKILL the parent (setpriv exec'd into it): the child gets SIGTERM (PR_SET_PDEATHSIG)
    // and hands the tunnels back by itself.
    relay.child.kill().unwrap();
    let _ = relay.child.wait();
    assert!(
        wait_until(Duration::from_secs(5), || !w
            .rules()
            .unwrap()
            .contains("4820")),
        "rule left behind after the parent died"
    );
    assert!(
        wait_until(Duration::from_secs(5), || echo
            .last_source()
            .is_some_and(|s| s != relay_src)),
        "tunnel did not fall back: {:?}",
        echo.sources()
    );
    assert!(pinger.wait_more(10, Duration::from_secs(5)));
}

#[test]
fn sigkill_falls_back_to_slirp_and_supervisor_brings_it_back() {
    let _s = serial();
    let w = build(false);
    let echo = Echo::start(&w.server, server()).unwrap();
    let g = w.gluetun_ns().unwrap();
    let pinger = Pinger::start(
        testbed::client(&g, 40010, server()).unwrap(),
        Duration::from_millis(20),
    );
    assert!(pinger.wait_more(3, Duration::from_secs(10)));
    // With its metrics endpoint, in the world's host namespace (a port of its own there).
    let mut sup = Proc::spawn(
        &w,
        &["supervise", BRIDGE, "51820", "--metrics-listen", "9466"],
        &[],
    );
    let line = sup
        .wait_line("flow 172.30.0.2:40010", Duration::from_secs(15))
        .unwrap_or_else(|| panic!("no flow; log {:#?}", sup.log()));
    let first = logged_host_source(&line);
    assert!(wait_until(Duration::from_secs(5), || echo.last_source() == Some(first)));

    // SIGKILL the relay (the process inside the rootless namespaces) mid-transfer.
    let relay_child = w
        .processes()
        .into_iter()
        .find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains("__child\0relay"))
                .unwrap_or(false)
        })
        .expect("relay child process");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(relay_child as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // The tunnel keeps working through slirp4netns...
    assert!(
        wait_until(Duration::from_secs(5), || echo
            .last_source()
            .is_some_and(|s| s != first)),
        "no fallback to slirp4netns: {:?}; log {:#?}",
        echo.sources(),
        sup.log()
    );
    assert!(
        pinger.wait_more(10, Duration::from_secs(5)),
        "tunnel broken after SIGKILL"
    );
    // ... and comes back when the supervisor restarts the relay (backoff 5 s).
    assert!(
        wait_until(Duration::from_secs(20), || sup
            .count("flow 172.30.0.2:40010")
            >= 2),
        "relay did not return; log {:#?}",
        sup.log()
    );
    let line = sup
        .log()
        .into_iter()
        .rfind(|l| l.contains("flow 172.30.0.2:40010"))
        .unwrap();
    let second = logged_host_source(&line);
    assert!(wait_until(Duration::from_secs(5), || echo.last_source()
        == Some(second)));
    assert!(pinger.wait_more(10, Duration::from_secs(5)));
    // The endpoint counted the restart and serves the new relay's counters (its stats file
    // is written about once a second).
    let metrics = || -> String {
        w.host
            .run(|| {
                use std::io::{Read, Write};
                let mut s = std::net::TcpStream::connect("127.0.0.1:9466").ok()?;
                s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
                let mut page = String::new();
                s.read_to_string(&mut page).ok()?;
                Some(page)
            })
            .unwrap()
            .unwrap_or_default()
    };
    let want = [
        format!("vpnrelay_supervisor_restarts_total{{bridge=\"{BRIDGE}\"}} 1\n"),
        format!("vpnrelay_relay_running{{bridge=\"{BRIDGE}\"}} 1\n"),
        format!("vpnrelay_flows_open{{bridge=\"{BRIDGE}\"}} 1\n"),
    ];
    assert!(
        wait_until(Duration::from_secs(10), || {
            let page = metrics();
            want.iter().all(|l| page.contains(l.as_str()))
        }),
        "metrics lack {want:?}: {}",
        metrics()
    );
    let st = sup.term();
    assert!(st.success());
    assert!(!w.rules().unwrap().contains("4820"));
}

#[test]
fn sixty_fifth_flow_keeps_dockers_path_and_idle_flows_close() {
    let _s = serial();
    let w = build(false);
    let echo = Echo::start(&w.server, server()).unwrap();
    let g = w.gluetun_ns().unwrap();
    let relay = Proc::spawn(
        &w,
        &["transparent", BRIDGE, "51820"],
        &[
            ("VPNRELAY_IDLE_TIMEOUT", "4"),
            ("VPNRELAY_MAX_FLOWS_PER_CLIENT", "64"),
        ],
    );
    relay
        .wait_line("relay running", Duration::from_secs(15))
        .expect("relay up");
    let socks: Vec<_> = (0..65u16)
        .map(|i| testbed::client(&g, 41000 + i, server()).unwrap())
        .collect();
    for (i, s) in socks.iter().take(64).enumerate() {
        assert!(
            ping_retry(s, &format!("hello {i}"), 2).is_some(),
            "flow {i} got no echo; log {:#?}",
            relay.log()
        );
    }
    assert!(
        wait_until(Duration::from_secs(5), || relayed(&relay, "172.30.0.2:")
            .len()
            == 64),
        "want 64 flow lines; log {:#?}",
        relay.log()
    );
    let hosts = relayed(&relay, "172.30.0.2:");
    // The 65th is refused with a log line and keeps Docker's path: it reaches the server
    // from slirp4netns, not from one of the relay's host sockets.
    let p = ping_retry(&socks[64], "one too many", 6)
        .unwrap_or_else(|| panic!("the refused flow got no echo; log {:#?}", relay.log()));
    relay
        .wait_line(
            "refusing flow 172.30.0.2:41064 -> 10.201.0.2:51820",
            Duration::from_secs(5),
        )
        .unwrap_or_else(|| panic!("no refusal line; log {:#?}", relay.log()));
    let src = echo
        .source_of(p.as_bytes())
        .expect("server saw the refused flow");
    assert!(
        !hosts.contains(&src),
        "refused flow came from the relay ({src})"
    );
    // The first 64 still work.
    for s in socks.iter().take(64).step_by(9) {
        assert!(testbed::ping(s, b"still here"));
    }
    // Idle timeout closes flows; then the 65th, still in use, moves into the relay.
    assert!(
        wait_until(Duration::from_secs(15), || relay.count("closed: idle")
            >= 64),
        "flows not closed; log {:#?}",
        relay.log()
    );
    let mut n = 0;
    assert!(
        wait_until(Duration::from_secs(20), || {
            n += 1;
            let _ = testbed::ping(&socks[64], format!("now there is room {n}").as_bytes());
            relay.count(" flow 172.30.0.2:41064 -> 10.201.0.2:51820 (host socket") == 1
        }),
        "the 65th did not move to the relay; log {:#?}",
        relay.log()
    );
    assert!(
        !w.rules().unwrap().contains("from 172.30.0.2"),
        "hand-back rule left"
    );
}

/// Per-client quota: container A opens 64 flows; it holds 8 in the relay (the default
/// quota), the other 56 keep Docker's path (they still reach the server, through
/// slirp4netns), and container B's tunnel still gets into the relay.
#[test]
fn one_container_cannot_starve_another() {
    let _s = serial();
    let w = build(false);
    let echo = Echo::start(&w.server, server()).unwrap();
    let mut relay = Proc::spawn(&w, &["transparent", BRIDGE, "51820"], &[]);
    relay
        .wait_line("relay running", Duration::from_secs(15))
        .unwrap_or_else(|| panic!("relay did not start; log {:#?}", relay.log()));
    let g = w.gluetun_ns().unwrap();
    let socks: Vec<_> = (0..64u16)
        .map(|i| testbed::client(&g, 42000 + i, server()).unwrap())
        .collect();
    let answered: Vec<String> = socks
        .iter()
        .enumerate()
        .map(|(i, s)| {
            ping_retry(s, &format!("a{i}"), 6).unwrap_or_else(|| {
                panic!(
                    "flow {i} of container A got no echo; log {:#?}",
                    relay.log()
                )
            })
        })
        .collect();
    let hosts = relayed(&relay, &format!("{GLUETUN_IP}:"));
    assert_eq!(
        hosts.len(),
        8,
        "A's flows in the relay; log {:#?}",
        relay.log()
    );
    assert_eq!(
        relay.count(&format!("refusing flow {GLUETUN_IP}:")),
        56,
        "{:#?}",
        relay.log()
    );
    let via_relay = answered
        .iter()
        .filter(|p| {
            let src = echo
                .source_of(p.as_bytes())
                .expect("server saw the payload");
            hosts.contains(&src)
        })
        .count();
    assert_eq!(
        (via_relay, answered.len() - via_relay),
        (8, 56),
        "A's flows through (the relay, slirp4netns)"
    );
    let rules = w.rules().unwrap();
    assert_eq!(
        rules
            .lines()
            .filter(|l| l.contains(&format!("from {GLUETUN_IP} ")) && l.contains("lookup main"))
            .count(),
        56,
        "{rules}"
    );

    // Container B's tunnel gets into the relay.
    let g2 = w.gluetun2_ns().unwrap();
    let b = testbed::client(&g2, 40100, server()).unwrap();
    let p = ping_retry(&b, "b", 6)
        .unwrap_or_else(|| panic!("container B got no echo; log {:#?}", relay.log()));
    let line = relay
        .wait_line(
            &format!("flow {GLUETUN2_IP}:40100 -> 10.201.0.2:51820 (host socket"),
            Duration::from_secs(5),
        )
        .unwrap_or_else(|| panic!("B's tunnel was not relayed; log {:#?}", relay.log()));
    assert_eq!(
        echo.source_of(p.as_bytes()),
        Some(logged_host_source(&line))
    );
    assert!(
        wait_until(Duration::from_secs(5), || w.relay_stats().is_some_and(
            |s| s["flows_open"] == 9 && s["refused_handed_back"] == 56
        )),
        "stats {:?}",
        w.relay_stats()
    );
    assert!(relay.term().success());
    let rules = w.rules().unwrap();
    assert!(
        !rules.contains("4820") && !rules.contains("from 172.30.0."),
        "rules left: {rules}"
    );
    // The refused flows keep working on Docker's path.
    assert!(ping_retry(&socks[63], "after", 3).is_some());
}

/// The per-client quota belongs to the bridge port, not to the source address: container A
/// (port vb0) sends from eight addresses of its own (`ip addr add` inside its namespace), two
/// flows from each; it holds 8 flows in the relay (the default quota) and its other 8 keep
/// Docker's path. Container B (port vb1) then gets its full quota of 8 into the relay. The
/// stats file names each client by its port with the addresses seen from it.
#[test]
fn forged_source_addresses_share_their_ports_quota() {
    let _s = serial();
    let w = build(false);
    let echo = Echo::start(&w.server, server()).unwrap();
    let forged: Vec<Ipv4Addr> = (10..18).map(|i| Ipv4Addr::new(172, 30, 0, i)).collect();
    let adds: Vec<String> = forged
        .iter()
        .map(|a| format!("ip addr add {a}/24 dev vg0"))
        .collect();
    w.rootless_sh(&format!(
        "nsenter --net={} sh -c '{}'",
        w.gluetun_path().display(),
        adds.join(" && ")
    ))
    .expect("eight more addresses in container A");
    let mut relay = Proc::spawn(&w, &["transparent", BRIDGE, "51820"], &[]);
    relay
        .wait_line("relay running", Duration::from_secs(15))
        .unwrap_or_else(|| panic!("relay did not start; log {:#?}", relay.log()));
    let g = w.gluetun_ns().unwrap();
    let socks: Vec<_> = forged
        .iter()
        .flat_map(|&a| (0..2u16).map(move |j| SocketAddrV4::new(a, 43000 + j)))
        .map(|local| testbed::client_from(&g, local, server()).unwrap())
        .collect();
    let answered: Vec<String> = socks
        .iter()
        .enumerate()
        .map(|(i, s)| {
            ping_retry(s, &format!("forged {i}"), 6).unwrap_or_else(|| {
                panic!(
                    "flow {i} of container A got no echo; log {:#?}",
                    relay.log()
                )
            })
        })
        .collect();
    let hosts: Vec<SocketAddrV4> = forged
        .iter()
        .flat_map(|a| relayed(&relay, &format!("{a}:")))
        .collect();
    assert_eq!(
        hosts.len(),
        8,
        "A's flows in the relay (one quota for its port, whatever the source); log {:#?}",
        relay.log()
    );
    assert_eq!(
        relay.count("refusing flow 172.30.0.1"),
        8,
        "{:#?}",
        relay.log()
    );
    let via_relay = answered
        .iter()
        .filter(|p| {
            let src = echo
                .source_of(p.as_bytes())
                .expect("server saw the payload");
            hosts.contains(&src)
        })
        .count();
    assert_eq!(
        (via_relay, answered.len() - via_relay),
        (8, 8),
        "A's flows through (the relay, slirp4netns)"
    );

    // Container B still gets its own full quota.
    let g2 = w.gluetun2_ns().unwrap();
    let b: Vec<_> = (0..8u16)
        .map(|i| testbed::client(&g2, 43100 + i, server()).unwrap())
        .collect();
    for (i, s) in b.iter().enumerate() {
        let p = ping_retry(s, &format!("b{i}"), 6)
            .unwrap_or_else(|| panic!("flow {i} of B got no echo; log {:#?}", relay.log()));
        let line = relay
            .wait_line(
                &format!(
                    "flow {GLUETUN2_IP}:{} -> 10.201.0.2:51820 (host socket",
                    43100 + i as u16
                ),
                Duration::from_secs(5),
            )
            .unwrap_or_else(|| panic!("B's flow {i} was not relayed; log {:#?}", relay.log()));
        assert_eq!(
            echo.source_of(p.as_bytes()),
            Some(logged_host_source(&line))
        );
    }
    assert_eq!(relay.count(&format!("refusing flow {GLUETUN2_IP}:")), 0);

    // The stats name each client by its port, with the addresses seen from it.
    let client_of = |s: &serde_json::Value, port: &str| {
        s["clients"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["port"] == port).cloned())
    };
    let mut want_a: Vec<String> = forged.iter().map(|a| a.to_string()).collect();
    want_a.sort();
    assert!(
        wait_until(Duration::from_secs(5), || w.relay_stats().is_some_and(
            |s| {
                let addrs = |c: &serde_json::Value| {
                    let mut v: Vec<String> = c["addresses"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|x| x.as_str().map(String::from))
                                .collect()
                        })
                        .unwrap_or_default();
                    v.sort();
                    v
                };
                s["flows_open"] == 16
                    && s["refused_handed_back"] == 8
                    && client_of(&s, GLUETUN_PORT).is_some_and(|c| {
                        c["flows"] == 8 && c["handed_back"] == 8 && addrs(&c) == want_a
                    })
                    && client_of(&s, GLUETUN2_PORT).is_some_and(|c| {
                        c["flows"] == 8 && addrs(&c) == vec![GLUETUN2_IP.to_string()]
                    })
            }
        )),
        "stats {:#?}",
        w.relay_stats()
    );
    let tables = || w.rootless_sh("nft list tables bridge").unwrap();
    assert!(tables().contains("vpnrelay-br-vpn"), "{}", tables());
    assert!(relay.term().success());
    let rules = w.rules().unwrap();
    assert!(
        !rules.contains("4820") && !rules.contains("from 172.30.0."),
        "rules left: {rules}"
    );
    assert!(!tables().contains("vpnrelay"), "table left: {}", tables());
}

/// Started as root, every daemon command refuses at once with one error line and changes
/// nothing (no rule, no file in the tenant's runtime folder).
#[test]
fn refuses_to_run_as_root() {
    let _s = serial();
    let w = build(false);
    let before = w.rules().unwrap();
    for args in [
        vec!["transparent", BRIDGE, "51820"],
        vec!["supervise", BRIDGE, "51820"],
        vec!["cleanup", BRIDGE, "51820"],
        vec!["__child", "relay", BRIDGE, "51820"],
    ] {
        let mut cmd = std::process::Command::new(vpnrelay_bin());
        cmd.args(&args)
            .env("XDG_RUNTIME_DIR", &w.runtime_dir)
            .env("VPNRELAY_DOCKER_STATE", w.state_dir());
        w.host.configure_command(&mut cmd, None);
        let mut p = Proc::spawn_cmd(cmd);
        let st = p.wait(Duration::from_secs(15));
        assert!(!st.success(), "{args:?} as root succeeded");
        let log = p.log();
        let errors: Vec<_> = log.iter().filter(|l| l.contains("error")).collect();
        assert_eq!(errors.len(), 1, "{args:?}: {log:#?}");
        assert!(
            errors[0].contains("refusing to run as root")
                && errors[0].contains("run it as that user"),
            "{args:?}: {log:#?}"
        );
    }
    assert_eq!(w.rules().unwrap(), before, "root run changed the rules");
    assert!(
        !w.runtime_dir.join("vpnrelay").exists(),
        "root run created files in the tenant's runtime folder"
    );
    // Positive control: the same command as the tenant runs.
    let mut relay = Proc::spawn(&w, &["transparent", BRIDGE, "51820"], &[]);
    relay
        .wait_line("relay running", Duration::from_secs(15))
        .unwrap_or_else(|| panic!("relay did not start as the tenant; log {:#?}", relay.log()));
    assert!(relay.term().success());
}

/// A lock file replaced by a symbolic link (to a file of the tenant's) is refused with one
/// error naming it; the link's target keeps its content and mtime.
#[test]
fn symlinked_lock_files_are_refused_and_their_targets_kept() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let _s = serial();
    let w = build(false);
    let own = |p: &std::path::Path| {
        let st = std::process::Command::new("chown")
            .arg("-h")
            .arg(format!("{}:{}", w.tenant.uid, w.tenant.gid))
            .arg(p)
            .status()
            .unwrap();
        assert!(st.success());
    };
    let victim = w.runtime_dir.join("victim");
    std::fs::write(&victim, b"precious\n").unwrap();
    own(&victim);
    let old = nix::sys::time::TimeSpec::new(1_000_000_000, 0);
    nix::sys::stat::utimensat(
        nix::fcntl::AT_FDCWD,
        &victim,
        &old,
        &old,
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    )
    .unwrap();
    let dir = w.runtime_dir.join("vpnrelay");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    own(&dir);
    for (what, cmd) in [("relay", "transparent"), ("supervise", "supervise")] {
        let link = dir.join(format!("{what}-{BRIDGE}.lock"));
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        own(&link);
        let mut p = Proc::spawn(&w, &[cmd, BRIDGE, "51820"], &[]);
        let exited = wait_until(Duration::from_secs(15), || p.exited());
        let meta = std::fs::metadata(&victim).unwrap();
        assert_eq!(
            std::fs::read(&victim).unwrap(),
            b"precious\n",
            "{cmd} wrote through the symlinked lock file"
        );
        assert_eq!((meta.mtime(), meta.mtime_nsec()), (1_000_000_000, 0));
        assert!(exited, "{cmd} runs despite a symlinked lock file");
        let st = p.wait(Duration::from_secs(1));
        assert!(!st.success());
        let log = p.log();
        let errors: Vec<_> = log.iter().filter(|l| l.contains("error")).collect();
        assert_eq!(errors.len(), 1, "{log:#?}");
        assert!(
            errors[0].contains("symbolic link") && errors[0].contains(&link.display().to_string()),
            "{log:#?}"
        );
        std::fs::remove_file(&link).unwrap();
    }
    assert!(!w.rules().unwrap().contains("4820"));
    // Positive control: without the link the relay takes its lock and writes its PID there.
    let mut relay = Proc::spawn(&w, &["transparent", BRIDGE, "51820"], &[]);
    relay
        .wait_line("relay running", Duration::from_secs(15))
        .unwrap_or_else(|| panic!("relay did not start; log {:#?}", relay.log()));
    let lock = dir.join(format!("relay-{BRIDGE}.lock"));
    assert_eq!(
        std::fs::read_to_string(&lock).unwrap().trim(),
        relay.child.id().to_string()
    );
    assert!(relay.term().success());
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious\n");
}

#[test]
fn single_instance_cleanup_no_root_and_bad_input() {
    let _s = serial();
    let w = build(false);
    let mut sup = Proc::spawn(&w, &["supervise", BRIDGE, "51820"], &[]);
    sup.wait_line("relay running", Duration::from_secs(15))
        .unwrap_or_else(|| panic!("supervisor did not start the relay; log {:#?}", sup.log()));

    // A second supervisor exits at once, successfully (a cron line is enough).
    let t = Instant::now();
    let out = w
        .vpnrelay(&vpnrelay_bin(), &["supervise", BRIDGE, "51820"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already runs"));

    // cleanup while a relay runs does nothing.
    let out = w
        .vpnrelay(&vpnrelay_bin(), &["cleanup", BRIDGE, "51820"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing to clean up"));
    assert!(
        w.rules().unwrap().contains("lookup 4820"),
        "cleanup removed a live rule"
    );

    // No vpnrelay process runs as root.
    let bin = std::fs::canonicalize(vpnrelay_bin()).unwrap();
    let mut seen = 0;
    for pid in w.processes() {
        let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else {
            continue;
        };
        if exe != bin {
            continue;
        }
        seen += 1;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let uids = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        for u in uids.split_whitespace().skip(1) {
            assert_eq!(
                u,
                w.tenant.uid.to_string(),
                "vpnrelay pid {pid} runs as {uids}"
            );
        }
    }
    assert!(
        seen >= 3,
        "expected supervisor, relay and child; saw {seen}"
    );

    // SIGTERM: rule gone, no process left.
    assert!(sup.term().success());
    assert!(!w.rules().unwrap().contains("4820"));
    assert!(
        wait_until(Duration::from_secs(5), || !w.processes().into_iter().any(
            |p| std::fs::read_link(format!("/proc/{p}/exe"))
                .map(|e| e == bin)
                .unwrap_or(false)
        )),
        "vpnrelay processes left behind"
    );

    // A stale rule (as after a crash) is removed by cleanup.
    w.rootless_sh("ip rule add iif br-vpn ipproto udp dport 51820 lookup 4820 priority 4820")
        .unwrap();
    let out = w
        .vpnrelay(&vpnrelay_bin(), &["cleanup", BRIDGE, "51820"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!w.rules().unwrap().contains("4820"));

    // Docker down (no RootlessKit state): the supervisor keeps retrying with backoff and
    // stops promptly on SIGTERM.
    let mut down = Proc::spawn(
        &w,
        &["supervise", "br-other", "51820"],
        &[("VPNRELAY_DOCKER_STATE", "/nonexistent/state")],
    );
    down.wait_line("restarting in 5 s", Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no backoff line; log {:#?}", down.log()));
    let t = Instant::now();
    assert!(down.term().success());
    assert!(t.elapsed() < Duration::from_secs(3));

    // Bad input: one clear error naming the value, nothing changed.
    let before = w.rules().unwrap();
    for (args, env, needle) in [
        (
            vec!["transparent", "br-nope", "51820"],
            vec![],
            "\"br-nope\"",
        ),
        (vec!["transparent", BRIDGE, "0"], vec![], "\"0\""),
        (vec!["transparent", BRIDGE, "70000"], vec![], "\"70000\""),
        (vec!["transparent", BRIDGE, "51820,x"], vec![], "\"x\""),
        (vec!["cleanup", BRIDGE, "1-"], vec![], "1-"),
        (
            vec!["transparent", BRIDGE, "51820"],
            vec![("VPNRELAY_DOCKER_STATE", "/nonexistent/state")],
            "/nonexistent/state",
        ),
        (
            vec!["transparent", BRIDGE, "51820"],
            vec![("VPNRELAY_RULE", "main")],
            "\"main\"",
        ),
        (
            vec![
                "transparent",
                BRIDGE,
                "51820",
                "--max-flows-per-client",
                "0",
            ],
            vec![],
            "'0'",
        ),
        (
            vec!["transparent", BRIDGE, "51820"],
            vec![("VPNRELAY_MAX_FLOWS_PER_CLIENT", "lots")],
            "'lots'",
        ),
    ] {
        let mut cmd = w.vpnrelay(&vpnrelay_bin(), &args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        let errors: Vec<_> = err.lines().filter(|l| l.contains("error")).collect();
        assert_eq!(errors.len(), 1, "{args:?}: want one error line, got {err}");
        assert!(errors[0].contains(needle), "{args:?}: {err}");
    }
    // Another user (nobody) pointed at this tenant's Docker: no permission, nothing changed.
    let state = w.state_dir();
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(vpnrelay_bin())
        .args(["transparent", BRIDGE, "51820"])
        .env("VPNRELAY_DOCKER_STATE", &state)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("no permission"), "{err}");
    assert_eq!(
        err.lines().filter(|l| l.contains("error")).count(),
        1,
        "{err}"
    );
    assert_eq!(w.rules().unwrap(), before, "bad input changed the rules");
}

#[test]
fn wireguard_tunnel_carries_iperf3_tcp_through_the_relay() {
    let _s = serial();
    let w = build(false);
    let mut wg = testbed::WireGuard::start(&w).expect("WireGuard tunnel over slirp4netns");
    let port = testbed::WG_PORT.to_string();
    let relay = Proc::spawn(&w, &["transparent", BRIDGE, &port], &[]);
    // The running tunnel (persistent keepalive every second) moves to the relay.
    relay
        .wait_line("flow 172.30.0.2:", Duration::from_secs(15))
        .unwrap_or_else(|| panic!("WireGuard flow not relayed; log {:#?}", relay.log()));
    assert!(
        relay.count(&format!("-> 10.201.0.2:{port}")) >= 1,
        "{:#?}",
        relay.log()
    );
    // Evidence that the tunnel's bytes went through the relay (slirp4netns would carry the
    // same iperf3 run): the relay's own counters for the WireGuard flow grow by at least the
    // TCP payload the server received (WireGuard adds its headers on top).
    let up_bytes = || -> Option<u64> {
        let st = w.relay_stats()?;
        st["flows"]
            .as_array()?
            .iter()
            .filter(|f| f["server"] == format!("10.201.0.2:{port}"))
            .map(|f| f["up_bytes"].as_u64())
            .sum()
    };
    assert!(
        wait_until(Duration::from_secs(5), || up_bytes().is_some()),
        "no relay counters for the WireGuard flow: {:?}",
        w.relay_stats()
    );
    let before = up_bytes().unwrap();
    let run = wg.iperf3_run(&w, 3.0).expect("iperf3 through the tunnel");
    assert!(run.bytes > 0, "iperf3 moved nothing");
    assert!(
        wait_until(Duration::from_secs(5), || up_bytes()
            .is_some_and(|b| b - before >= run.bytes)),
        "the relay carried {} bytes up while iperf3 delivered {} bytes: the tunnel did not go through the relay",
        up_bytes().unwrap_or(0) - before,
        run.bytes
    );
    drop(relay);
    wg.stop_in(&w);
}

/// `status --bridge NAME` is scriptable: a bad name is a usage error (2), a bridge without
/// stats or whose relay does not run a failure (1) after its status is shown, a running one
/// success; without a selector, status lists what there is and succeeds.
#[test]
fn status_of_one_bridge_exits_nonzero_unless_its_relay_runs() {
    use std::os::unix::fs::{chown, PermissionsExt};
    let root = std::env::temp_dir().join(nsfast_lab::name::unique("vr-status"));
    struct Gone(PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _gone = Gone(root.clone());
    std::fs::create_dir_all(&root).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let nobody = Some(65534);
    let status = |args: &[&str]| {
        let out = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(vpnrelay_bin())
            .arg("status")
            .arg("--runtime-dir")
            .arg(&root)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, _, err) = status(&["--bridge", "bad/bridge"]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("\"bad/bridge\"") && err.contains("--bridge"),
        "{err}"
    );
    let (code, _, err) = status(&["--bridge", "br-none"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no stats for bridge br-none"), "{err}");
    let (code, out, err) = status(&[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("no relay stats"), "{out}");

    // A relay that ran for br-x and stopped: its stats stay, its lock is not held.
    let dir = root.join("vpnrelay");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    chown(&dir, nobody, nobody).unwrap();
    for (name, body) in [
        ("relay-br-x.stats", "{\"flows_open\":0}\n"),
        ("relay-br-x.lock", "4242\n"),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        chown(&p, nobody, nobody).unwrap();
    }
    let (code, out, err) = status(&["--bridge", "br-x"]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(out.contains("br-x") && out.contains("stopped"), "{out}");
    assert!(
        err.contains("the relay of bridge br-x is not running"),
        "{err}"
    );
    let (code, out, err) = status(&["--bridge", "br-x", "--json"]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(out.contains("\"running\":false"), "{out}");
    let (code, _, err) = status(&[]);
    assert_eq!(code, Some(0), "{err}");

    // Its lock held, as a running relay holds it: success.
    let lock = std::fs::File::open(dir.join("relay-br-x.lock")).unwrap();
    let held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| e)
        .unwrap();
    let (code, out, err) = status(&["--bridge", "br-x"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("running"), "{out}");
    drop(held);
}
