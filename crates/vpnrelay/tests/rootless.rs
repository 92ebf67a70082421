//! Root integration tests: a real RootlessKit + slirp4netns world run by an unprivileged
//! tenant inside a throwaway "host" namespace (see `nsfast_vpnrelay::testbed`). Everything of
//! vpnrelay runs as the tenant. The world is torn down on every exit path (Drop guards).
//!
//! Needs root and: rootlesskit slirp4netns uidmap iproute2 nftables util-linux
//! (wireguard-go wireguard-tools iperf3 for the WireGuard test).

use std::io::{BufRead, BufReader};
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use nsfast_vpnrelay::testbed::{self, Echo, Pinger, World, WorldOpts, BRIDGE, SERVER_IP, VPN_PORT};

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

fn build(detach: bool) -> World {
    World::build(&WorldOpts {
        detach_netns: detach,
        ..Default::default()
    })
    .expect("building the rootless world")
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
    let w = World::build(&WorldOpts {
        docker: Some(docker),
        ..Default::default()
    })
    .expect("building the rootless Docker world");
    handover(&w);
}

/// `--detach-netns` (RootlessKit >= 2.0): the namespace is bind-mounted at <state>/netns.
#[test]
fn detach_netns_layout() {
    let _s = serial();
    let rk = rootlesskit2();
    let w = World::build(&WorldOpts {
        detach_netns: true,
        rootlesskit: Some(rk),
        ..Default::default()
    })
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

#[test]
fn single_datagrams_when_gro_and_gso_are_switched_off() {
    let _s = serial();
    let w = build(false);
    let echo = Echo::start(&w.server, server()).unwrap();
    let g = w.gluetun_ns().unwrap();
    let relay = Proc::spawn(
        &w,
        &["transparent", BRIDGE, "51820"],
        &[("VPNRELAY_NO_GRO", "1"), ("VPNRELAY_NO_GSO", "1")],
    );
    relay
        .wait_line("relay running", Duration::from_secs(15))
        .unwrap_or_else(|| panic!("relay did not start; log {:#?}", relay.log()));
    assert!(
        relay.count("UDP GRO off (VPNRELAY_NO_GRO set)") == 1,
        "{:#?}",
        relay.log()
    );
    assert!(
        relay.count("UDP GSO off (VPNRELAY_NO_GSO set)") == 1,
        "{:#?}",
        relay.log()
    );
    let sock = testbed::client(&g, 40030, server()).unwrap();
    // A burst of equal-sized datagrams (what GSO would coalesce) arrives intact.
    for i in 0..200u32 {
        let _ = sock.send(&[i as u8; 1400]);
    }
    let mut got = 0;
    let mut buf = [0u8; 2048];
    while let Ok(n) = sock.recv(&mut buf) {
        assert_eq!(n, 1400);
        got += 1;
    }
    assert!(got > 0, "nothing came back through the relay");
    let line = relay
        .wait_line("flow 172.30.0.2:40030", Duration::from_secs(5))
        .unwrap();
    assert_eq!(echo.last_source(), Some(logged_host_source(&line)));
    assert!(testbed::ping(&sock, b"single"));
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
    let mut sup = Proc::spawn(&w, &["supervise", BRIDGE, "51820"], &[]);
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
    let st = sup.term();
    assert!(st.success());
    assert!(!w.rules().unwrap().contains("4820"));
}

#[test]
fn sixty_fifth_flow_is_refused_and_idle_flows_close() {
    let _s = serial();
    let w = build(false);
    let _echo = Echo::start(&w.server, server()).unwrap();
    let g = w.gluetun_ns().unwrap();
    let relay = Proc::spawn(
        &w,
        &["transparent", BRIDGE, "51820"],
        &[("VPNRELAY_IDLE_TIMEOUT", "4")],
    );
    relay
        .wait_line("relay running", Duration::from_secs(15))
        .expect("relay up");
    let socks: Vec<_> = (0..65u16)
        .map(|i| testbed::client(&g, 41000 + i, server()).unwrap())
        .collect();
    for (i, s) in socks.iter().take(64).enumerate() {
        assert!(
            testbed::ping(s, format!("hello {i}").as_bytes()) || testbed::ping(s, b"again"),
            "flow {i} got no echo; log {:#?}",
            relay.log()
        );
    }
    assert!(
        wait_until(Duration::from_secs(5), || relay.count("flow 172.30.0.2:")
            == 64),
        "want 64 flow lines; log {:#?}",
        relay.log()
    );
    // The 65th is refused with a log line and gets nothing.
    assert!(!testbed::ping(&socks[64], b"one too many"));
    relay
        .wait_line(
            "refusing flow 172.30.0.2:41064 -> 10.201.0.2:51820",
            Duration::from_secs(5),
        )
        .unwrap_or_else(|| panic!("no refusal line; log {:#?}", relay.log()));
    // The first 64 still work.
    for s in socks.iter().take(64).step_by(9) {
        assert!(testbed::ping(s, b"still here"));
    }
    // Idle timeout closes flows; then there is room for the 65th.
    assert!(
        wait_until(Duration::from_secs(15), || relay.count("closed: idle")
            >= 64),
        "flows not closed; log {:#?}",
        relay.log()
    );
    assert!(testbed::ping(&socks[64], b"now there is room") || testbed::ping(&socks[64], b"again"));
    assert!(relay
        .wait_line("flow 172.30.0.2:41064 -> ", Duration::from_secs(5))
        .is_some());
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
    let gbps = wg.iperf3(&w, 3.0).expect("iperf3 through the tunnel");
    assert!(gbps > 0.0, "iperf3 moved nothing");
    drop(relay);
    wg.stop_in(&w);
}
