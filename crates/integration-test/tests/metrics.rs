//! Root integration tests of the metrics (docs/metrics.md): `nsfast metrics` passes Debian's
//! `promtool check metrics`, and a real `prometheus` scraping `nsfast sockmap run
//! --metrics-listen` inside a throwaway network namespace sees the shortcut's counters after
//! traffic (asked through Prometheus' own HTTP API). Run as root (`make test`); `promtool`
//! and `prometheus` come from the Debian package `prometheus` (`make deps`).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nsfast_lab::bins::nsfast as nsfast_bin;
use nsfast_lab::peer::{self, BidirReport, KillOnDrop};
use nsfast_lab::require_root;
use nsfast_lab::world::{TestCgroup, VethPair};
use nsfast_sys::netns::NetNs;

/// A folder of this test's own, removed when dropped (also when the test fails).
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(nsfast_lab::name::unique(tag));
        std::fs::create_dir_all(&d).expect("create the scratch folder");
        Self(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `nsfast sockmap run --cgroup CG EXTRA...`, in `ns` when given; stderr to `log`.
fn spawn_run(cg: &TestCgroup, ns: Option<&NetNs>, extra: &[&str], log: &Path) -> KillOnDrop {
    let mut cmd = Command::new(nsfast_bin());
    cmd.args(["sockmap", "run", "--allow-splice-hole", "--cgroup"])
        .arg(cg.path())
        .args(extra)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"));
    if let Some(ns) = ns {
        ns.configure_command(&mut cmd, None);
    }
    KillOnDrop::new(cmd.spawn().expect("spawn nsfast sockmap run"))
}

/// Waits until loader `pid`'s instance is attached.
fn wait_attached(pid: u32, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !nsfast_sockmap::instances()
        .unwrap()
        .iter()
        .any(|i| i.loader_pid == pid && i.attached)
    {
        assert!(
            Instant::now() < deadline,
            "sockmap run (pid {pid}) not attached after 10 s: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGTERM to `run`: it detaches and exits 0.
fn stop(run: KillOnDrop, log: &Path) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let st = run.take().wait().unwrap();
    assert!(
        st.success(),
        "sockmap run: {st}: {}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

/// A byte-exact transfer of `bytes` each way between the pair's namespaces, both peers in `cg`,
/// the client paced.
fn transfer(w: &VethPair, cg: &TestCgroup, port: u16, bytes: u64) {
    let procs = cg.procs();
    let listen = SocketAddr::new(IpAddr::V4(VethPair::SERVER_V4), port).to_string();
    let n = bytes.to_string();
    // Paced at 16 MiB/s: the server drains each send, so the client's sends find a receiver
    // that has read all of it and are redirected (an unpaced burst may stay gated).
    let rate = (16u64 << 20).to_string();
    let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let bin = nsfast_lab::bins::testpeer();
    let s = peer::spawn(
        &bin,
        &w.server,
        Some(&procs),
        &args(&[
            "bidir-server",
            "--listen",
            &listen,
            "--bytes",
            &n,
            "--seed",
            "1",
        ]),
    );
    peer::wait_listening(&w.server, listen.parse().unwrap());
    let c = peer::spawn(
        &bin,
        &w.client,
        Some(&procs),
        &args(&[
            "bidir-client",
            "--connect",
            &listen,
            "--bytes",
            &n,
            "--seed",
            "2",
            "--rate",
            &rate,
        ]),
    );
    let cr: BidirReport = peer::finish(c, "client");
    let sr: BidirReport = peer::finish(s, "server");
    assert_eq!((cr.received, sr.received), (bytes, bytes));
    assert_eq!(cr.received_sha256, sr.sent_sha256);
}

/// `promtool check metrics` on `text`: no problem found.
fn promtool_check(text: &[u8]) {
    let mut p = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool (Debian package prometheus; make deps installs it)");
    p.stdin.take().unwrap().write_all(text).unwrap();
    let out = p.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}: {}{}\n--- input:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(text)
    );
}

#[test]
fn nsfast_metrics_passes_promtool_and_names_the_running_instance() {
    require_root();
    let cg = TestCgroup::new();
    let dir = Scratch::new("promtool");
    let log = dir.0.join("run.log");
    let run = spawn_run(&cg, None, &[], &log);
    wait_attached(run.id(), &log);

    let out = Command::new(nsfast_bin()).arg("metrics").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let series = format!(
        "nsfast_sockmap_redirected_bytes_total{{cgroup=\"{}\",mode=\"run\"}} ",
        cg.path().display()
    );
    assert!(text.contains(&series), "no {series:?} in\n{text}");
    promtool_check(text.as_bytes());

    // -o: the same document, written whole into the file the textfile collector reads.
    let file = dir.0.join("nsfast.prom");
    let st = Command::new(nsfast_bin())
        .args(["metrics", "-o"])
        .arg(&file)
        .status()
        .unwrap();
    assert!(st.success());
    let written = std::fs::read(&file).unwrap();
    promtool_check(&written);
    assert!(String::from_utf8_lossy(&written).contains(&series));
    let left: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
    stop(run, &log);
}

/// GET `path` from `addr` inside `ns`; the body, or `None` while nothing answers.
fn http_get(ns: &NetNs, addr: SocketAddr, path: &str) -> Option<String> {
    ns.run(|| -> std::io::Result<String> {
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })
    .expect("enter the namespace")
    .ok()
    .and_then(|r| r.split_once("\r\n\r\n").map(|(_, b)| b.to_string()))
}

#[test]
fn prometheus_scrapes_sockmap_run_and_sees_redirected_bytes() {
    require_root();
    let w = VethPair::new();
    let cg = TestCgroup::new();
    let dir = Scratch::new("prom");
    let log = dir.0.join("run.log");
    // Inside the pair's server namespace: its loopback is this test's alone, so fixed ports
    // cannot collide with anything else on the machine.
    let metrics = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9464);
    let api = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9090);
    let run = spawn_run(&cg, Some(&w.server), &["--metrics-listen", "9464"], &log);
    wait_attached(run.id(), &log);
    peer::wait_listening(&w.server, metrics);

    let config = dir.0.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  \
             - job_name: nsfast\n    static_configs:\n      - targets: ['{metrics}']\n"
        ),
    )
    .unwrap();
    let mut cmd = Command::new("prometheus");
    cmd.arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.0.join("data").display()
        ))
        .arg(format!("--web.listen-address={api}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.0.join("prometheus.log")).unwrap());
    w.server.configure_command(&mut cmd, None);
    let _prom = KillOnDrop::new(
        cmd.spawn()
            .expect("run prometheus (Debian package prometheus; make deps installs it)"),
    );

    transfer(&w, &cg, 5001, 4 << 20);

    let query = "/api/v1/query?query=nsfast_sockmap_redirected_bytes_total";
    let deadline = Instant::now() + Duration::from_secs(60);
    let (value, labels) = loop {
        let body = http_get(&w.server, api, query);
        let found = body.as_deref().and_then(|b| {
            let v: serde_json::Value = serde_json::from_str(b).ok()?;
            let r = v["data"]["result"].as_array()?.first()?.clone();
            let value: f64 = r["value"][1].as_str()?.parse().ok()?;
            (value > 0.0).then_some((value, r["metric"].clone()))
        });
        if let Some(f) = found {
            break f;
        }
        assert!(
            Instant::now() < deadline,
            "prometheus has no nsfast_sockmap_redirected_bytes_total > 0 after 60 s: last \
             answer {body:?}; prometheus log: {}; sockmap run log: {}",
            std::fs::read_to_string(dir.0.join("prometheus.log")).unwrap_or_default(),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(value > 0.0);
    assert_eq!(labels["job"], "nsfast", "{labels}");
    assert_eq!(labels["mode"], "run", "{labels}");
    assert_eq!(
        labels["cgroup"].as_str(),
        Some(cg.path().to_str().unwrap()),
        "{labels}"
    );
    // The pair is counted as well, and the target is up.
    let pairs = http_get(
        &w.server,
        api,
        "/api/v1/query?query=nsfast_sockmap_pairs_total",
    )
    .expect("query pairs");
    assert!(pairs.contains("\"value\":["), "{pairs}");
    let up = http_get(&w.server, api, "/api/v1/query?query=up").expect("query up");
    assert!(up.contains("\"1\"]"), "target not up: {up}");
    stop(run, &log);
}
