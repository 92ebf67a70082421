//! `nsfast bench` end to end: bad arguments, a tiny real run (JSON + SVG), and SIGINT in the
//! middle of a run leaving nothing behind. The real runs need root; they fail without it.

use nsfast_lab::require_root;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_nsfast");

fn leftovers(pid: u32) -> Vec<String> {
    let prefix = nsfast_lab::name::run_prefix_of(pid);
    let mut left: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with(&format!("{prefix}-")))
                .collect()
        })
        .unwrap_or_default();
    let cg = Path::new("/sys/fs/cgroup/unified").join(&prefix);
    let cg2 = Path::new("/sys/fs/cgroup").join(&prefix);
    for c in [cg, cg2] {
        if c.exists() {
            left.push(c.display().to_string());
        }
    }
    left
}

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(EXE).arg("bench").args(args).output().unwrap()
}

/// Bad values are clap errors (exit 2) naming the option and the value, on one line, plus
/// clap's hint.
#[test]
fn bad_arguments_give_one_clear_error() {
    for (flag, value, bad, meta) in [
        ("--topologies", "host,vxlan", "vxlan", "LIST"),
        ("--rounds", "0", "0", "N"),
        ("--request-size", "-5", "-5", "SIZE"),
        ("--udp-size", "-1", "-1", "SIZE"),
        ("--stream-size", "12Q", "12Q", "SIZE"),
        ("--duration", "0", "0", "DURATION"),
        ("--workloads", "tcp_rr", "tcp_rr", "LIST"),
        ("--placement", "numa", "numa", "LIST"),
        ("--tenant", "nosuchuser", "nosuchuser", "USER"),
        ("--tenant", "root", "root", "USER"),
    ] {
        let args = [flag, value];
        let want = format!("error: invalid value '{bad}' for '{flag} <{meta}>'");
        let out = bench(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 2, "{args:?}: one error line expected: {err}");
        assert!(lines[0].starts_with(&want), "{args:?}: {err}");
        assert_eq!(lines[1], "For more information, try '--help'.", "{err}");
    }
}

/// `--tenant` takes an existing unprivileged user with subordinate ids: a bad one is a clap
/// error (exit 2) that names it and says what a valid tenant is.
#[test]
fn a_bad_tenant_is_refused_naming_it_and_what_would_be_valid() {
    for (user, why) in [
        ("nosuchuser", "no user \"nosuchuser\" on this system"),
        ("root", "user \"root\" is uid 0 (root)"),
    ] {
        let out = bench(&["--tenant", user, "--topologies", "vpnrelay"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{user}: {err}");
        assert!(err.contains(why), "{user}: {err}");
        assert!(
            err.contains("unprivileged user with ranges in /etc/subuid and /etc/subgid"),
            "{user}: {err}"
        );
    }
}

/// The files a run that made a user or gave it subordinate ids would change.
const USER_FILES: [&str; 5] = [
    "/etc/passwd",
    "/etc/group",
    "/etc/shadow",
    "/etc/subuid",
    "/etc/subgid",
];

fn user_files() -> Vec<Option<Vec<u8>>> {
    USER_FILES.map(|f| std::fs::read(f).ok()).to_vec()
}

/// The files of [`USER_FILES`] whose bytes differ between two [`user_files`] readings.
fn changed(before: &[Option<Vec<u8>>], after: &[Option<Vec<u8>>]) -> Vec<&'static str> {
    USER_FILES
        .iter()
        .zip(before.iter().zip(after))
        .filter(|(_, (b, a))| b != a)
        .map(|(f, _)| *f)
        .collect()
}

/// Without `--tenant` the vpnrelay topology is skipped with the reason, in the table and the
/// JSON document, and the run creates no user: the account and subordinate-id files are
/// byte-identical before and after.
#[test]
fn vpnrelay_without_a_tenant_is_skipped_and_no_user_is_made() {
    require_root();
    let dir = std::env::temp_dir().join(nsfast_lab::name::unique("cli"));
    let json = dir.join("run.json");
    let before = user_files();
    let out = bench(&[
        "--topologies",
        "host,vpnrelay",
        "--workloads",
        "rr",
        "--rounds",
        "1",
        "--duration",
        "0.1",
        "--warmup",
        "0",
        "--no-progress",
        "--no-charts",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        changed(&before, &user_files()),
        Vec::<&str>::new(),
        "the run changed these files"
    );
    // The reason names the option (its full text: `rootless_hook::NO_TENANT`).
    let reason = "needs --tenant USER, an existing unprivileged user";
    assert!(
        stdout.contains(&format!("skipped vpnrelay: {reason}")),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!("skipping topology vpnrelay: {reason}")),
        "{stderr}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let skipped = v["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 1, "{v}");
    assert_eq!(skipped[0]["topology"], "vpnrelay", "{v}");
    assert!(
        skipped[0]["reason"].as_str().unwrap().starts_with(reason),
        "{v}"
    );
    assert_eq!(v["topologies"], serde_json::json!(["host"]), "{v}");
    assert!(v["config"]["tenant"].is_null(), "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tiny_run_writes_json_and_svgs() {
    require_root();
    let dir = std::env::temp_dir().join(nsfast_lab::name::unique("cli"));
    let json = dir.join("run.json");
    let out = bench(&[
        "--topologies",
        "host,veth,sockmap,netkit",
        "--workloads",
        "rr,udp-stream",
        "--rounds",
        "2",
        "--duration",
        "0.2",
        "--warmup",
        "0",
        "--no-progress",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // netkit runs exactly where the kernel config has it (the harness's word, not the probe's).
    let netkit = nsfast_lab::kernel::expect(nsfast_lab::kernel::Feature::Netkit);
    assert_eq!(
        stderr.contains("skipping topology netkit"),
        !netkit,
        "{stderr}"
    );
    assert!(stdout.contains("placement same-cpu"), "{stdout}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let samples = v["samples"].as_array().unwrap();
    let topologies = 3 + usize::from(netkit);
    assert_eq!(
        samples.len(),
        2 * 2 * topologies,
        "rounds × workloads × topologies"
    );
    assert!(samples.iter().all(|s| s["error"].is_null()), "{samples:?}");
    // The sockmap figures are the shortcut's: its redirected bytes moved in every TCP sample
    // (UDP is outside its scope); the plain topologies claim no fast path.
    for s in samples {
        let fp = &s["fast_path"];
        if s["topology"] == "sockmap" && s["workload"] == "rr" {
            assert!(
                fp["carried"]["redirected_bytes"].as_u64().unwrap() > 0,
                "{s}"
            );
            assert!(fp["source"].as_str().unwrap().contains("sockmap"), "{s}");
        } else if s["topology"] == "netkit" {
            assert!(fp["carried"]["A.pod_to_pod"].as_u64().unwrap() > 0, "{s}");
        } else {
            assert!(fp.is_null(), "{s}");
        }
    }
    for w in ["rr", "udp-stream"] {
        let svg = std::fs::read_to_string(dir.join(format!("run-{w}-same-cpu.svg"))).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("class=\"bar\"").count(), topologies);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigint_mid_run_leaves_nothing_behind() {
    require_root();
    let mut child = Command::new(EXE)
        .args([
            "bench",
            "--topologies",
            "host,veth,routed",
            "--workloads",
            "stream,crr",
            "--rounds",
            "20",
            "--duration",
            "0.5",
            "--warmup",
            "0",
            "--no-progress",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Wait until the run has built its topologies, then interrupt it mid-measurement.
    let start = Instant::now();
    while leftovers(pid).len() < 4 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!leftovers(pid).is_empty(), "the run never built anything");
    std::thread::sleep(Duration::from_millis(1200));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = nsfast_lab::wait_or_kill(&mut child, Duration::from_secs(15))
        .expect("nsfast bench did not stop after SIGINT");
    let mut err = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted by SIGINT"), "{err}");
    assert_eq!(leftovers(pid), Vec::<String>::new());
    // Its cgroups are gone, and a cgroup with a live process cannot be removed: so no worker
    // of that run is still alive.
}

fn procs_in(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(t) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(t.lines().map(|l| l.to_string()));
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.path().is_dir() {
                out.extend(procs_in(&e.path()));
            }
        }
    }
    out
}

#[test]
fn sigkill_leaves_no_process_and_cleanup_removes_the_rest() {
    require_root();
    let mut child = Command::new(EXE)
        .args([
            "bench",
            "--topologies",
            "host,veth",
            "--workloads",
            "stream,udp-stream",
            "--rounds",
            "20",
            "--duration",
            "0.5",
            "--warmup",
            "0",
            "--no-progress",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let start = Instant::now();
    while leftovers(pid).len() < 3 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(800));
    child.kill().unwrap();
    child.wait().unwrap();
    let cg = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .iter()
        .map(|m| Path::new(m).join(nsfast_lab::name::run_prefix_of(pid)))
        .find(|p| p.exists())
        .expect("a SIGKILLed run leaves its cgroup behind");
    // Its workers die with it (PR_SET_PDEATHSIG).
    let end = Instant::now() + Duration::from_secs(5);
    while !procs_in(&cg).is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(procs_in(&cg), Vec::<String>::new());
    let out = Command::new(EXE)
        .args(["bench", "--cleanup"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(leftovers(pid), Vec::<String>::new());
}

/// Outside a VM guest (no NSFAST_VM_GUEST=1) the vsock topologies are skipped with the reason
/// before any AF_VSOCK socket exists; the run goes on with the others.
#[test]
fn vsock_topologies_are_skipped_outside_a_guest() {
    require_root();
    let out = Command::new(EXE)
        .env_remove("NSFAST_VM_GUEST")
        .args([
            "bench",
            "--topologies",
            "host,vsock,vsock-relay,vsock-socat",
            "--workloads",
            "rr",
            "--rounds",
            "1",
            "--duration",
            "0.2",
            "--warmup",
            "0",
            "--no-progress",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for t in ["vsock", "vsock-relay", "vsock-socat"] {
        assert!(
            stderr.contains(&format!(
                "skipping topology {t}: vsock topologies run only inside a VM guest"
            )),
            "{stderr}"
        );
    }
    // `--list` shows them too (with the same reason).
    let list = Command::new(EXE)
        .env_remove("NSFAST_VM_GUEST")
        .args(["bench", "--list"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(text.contains("vsock-relay"), "{text}");
}

/// `--output -`: the JSON document alone on stdout (the table on stderr), with the table's
/// spreads; `--csv`, `--hgrm-dir` and `--svg-dir` write where they are told.
#[test]
fn output_to_stdout_with_csv_hgrm_and_svg_dir() {
    require_root();
    let dir = std::env::temp_dir().join(nsfast_lab::name::unique("out"));
    let csv = dir.join("run.csv");
    let (hgrm, svgs) = (dir.join("hgrm"), dir.join("svg"));
    let out = bench(&[
        "--topologies",
        "host,veth",
        "--workloads",
        "ping,stream",
        "--rounds",
        "3",
        "--duration",
        "0.2",
        "--warmup",
        "0",
        "--no-progress",
        "--output",
        "-",
        "--csv",
        csv.to_str().unwrap(),
        "--hgrm-dir",
        hgrm.to_str().unwrap(),
        "--svg-dir",
        svgs.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("stdout is one JSON document");
    assert!(stderr.contains("placement same-cpu"), "{stderr}");
    // The histograms go to the .hgrm files; the JSON keeps their percentiles only.
    for s in v["samples"].as_array().unwrap() {
        assert!(s["client"]["latency_ns_recorded"].is_null(), "{s}");
    }
    let rows = v["summary"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "{v}");
    // The table's spread column is the JSON's spread_pct.
    let mut workload = String::new();
    let mut seen = 0;
    for line in stderr.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let topology = match cols.as_slice() {
            [w @ ("ping" | "stream"), t @ ("host" | "veth"), ..] => {
                workload = w.to_string();
                *t
            }
            [t @ ("host" | "veth"), ..] if line.starts_with(' ') => *t,
            _ => continue,
        };
        let r = rows
            .iter()
            .find(|r| r["topology"] == topology && r["workload"] == workload.as_str())
            .unwrap();
        let spread = format!("±{:.1}%", r["spread_pct"].as_f64().unwrap());
        assert!(cols.contains(&spread.as_str()), "{spread} not in {line:?}");
        seen += 1;
    }
    assert_eq!(seen, 4, "{stderr}");
    let csv = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(csv.lines().count(), 1 + 3 * 2 * 2 + 4, "{csv}");
    for t in ["host", "veth"] {
        let h = std::fs::read_to_string(hgrm.join(format!("{t}-ping-same-cpu.hgrm"))).unwrap();
        assert!(h.starts_with("       Value     Percentile TotalCount 1/(1-Percentile)"));
        assert!(h.contains("#[Buckets ="), "{h}");
    }
    // stream has no latency distribution.
    assert!(!hgrm.join("host-stream-same-cpu.hgrm").exists());
    for w in ["ping", "stream"] {
        assert!(svgs.join(format!("bench-{w}-same-cpu.svg")).exists());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
