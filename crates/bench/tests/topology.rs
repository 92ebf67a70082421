//! Topology build/teardown leaves no namespace, link or cgroup behind, also when the code
//! using a topology panics; every topology carries traffic between worker processes in its
//! namespaces and cgroups, and a fast-path topology on its fast path (the fast path's own
//! counters moved). Needs root; fails, rather than passing, without it.

use std::path::Path;
use std::time::Duration;

use std::collections::BTreeMap;

use nsfast_bench::proc::Launcher;
use nsfast_bench::runner::{Runner, Sample};
use nsfast_bench::spec::{Config, Placement, Sizes, Workload};
use nsfast_bench::topology::{registry, BuildCtx, Built, ProbeCtx, RunCgroup};
use nsfast_lab::require_root;

/// Topologies built from the vpnrelay test world (tested on their own: they start tenant
/// processes, and the relay binary has to be built first).
const ROOTLESS: [&str; 3] = ["slirp4netns", "pasta", "vpnrelay"];

/// Serialises the tests that build pod topologies or run `cleanup_stale`: a cleanup removes
/// every dead-pid run's leftovers (also another test's fake ones mid-build), and pod state
/// made meanwhile would count as pins left behind.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A pid of `candidates` that no process has: what a SIGKILLed run would have been.
fn dead_pid(mut candidates: impl Iterator<Item = u32>) -> u32 {
    candidates
        .find(|p| !Path::new(&format!("/proc/{p}")).exists())
        .expect("a free pid")
}

fn leftovers(prefix: &str) -> Vec<String> {
    let mut left: Vec<String> = nsfast_sys::netns::list_named()
        .into_iter()
        .filter(|n| n.starts_with(prefix))
        .collect();
    let cg = nsfast_sys::cgroup::cgroup2_mount().unwrap().join(prefix);
    if cg.exists() {
        left.push(cg.display().to_string());
    }
    // Links are made inside the run's namespaces; none may appear in (or leak to) ours.
    for e in std::fs::read_dir("/sys/class/net").unwrap().flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with("nsfb-") || n.starts_with("veth-a") || n.starts_with("veth-b") {
            left.push(format!("link {n}"));
        }
    }
    left
}

/// Entries under nsfast pod's bpffs directory (one per host namespace with pods). The pod
/// topologies (bpf, netkit) pin there; a host's directory goes with its last pod. Compared
/// with what was there before the test, as other runs may pin too.
fn pod_pins() -> Vec<String> {
    let dir = std::env::var_os("NSFAST_BPFFS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/sys/fs/bpf".into())
        .join("nsfast-pod");
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Topologies that claim a fast path: every sample on them must carry that path's evidence.
const FAST_PATHS: [&str; 8] = [
    "sockmap",
    "bpf",
    "bpf-policy-10",
    "bpf-policy-1000",
    "bpf-tc",
    "bpf-shortcut",
    "bpf-remote",
    "netkit",
];

/// The bench worker (this package's `nsfast-bench-worker`; in a VM guest /bin's copy, named
/// by NSFAST_BENCH_WORKER_BIN, as the build path does not exist there).
fn worker_launcher() -> Launcher {
    let program = std::env::var_os("NSFAST_BENCH_WORKER_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_nsfast-bench-worker").into());
    Launcher {
        program,
        args: vec![],
    }
}

/// Where a test builds topologies: named `prefix`, under `run_cg`, workers from
/// [`worker_launcher`].
fn worker_ctx(prefix: &str, run_cg: &RunCgroup) -> BuildCtx {
    BuildCtx {
        prefix: prefix.to_string(),
        cgroup_root: run_cg.path().to_path_buf(),
        launcher: Some(worker_launcher()),
        tenant: None,
    }
}

fn runner() -> Runner {
    let config = Config {
        topologies: vec![],
        workloads: vec![Workload::Rr],
        placements: vec![Placement::Unpinned],
        rounds: 1,
        duration: Duration::from_millis(200),
        warmup: Duration::ZERO,
        sizes: Sizes::default(),
        json: None,
        cross_check: false,
        quick: false,
        tenant: None,
        bpf_stats: false,
    };
    let mut r = Runner::new(config, worker_launcher());
    r.progress = false;
    r
}

/// One short measurement of `w` on `b`, as `nsfast bench` makes it: server and client worker
/// processes started in the topology's namespaces AND cgroups (the sockmap shortcut sees only
/// sockets of its cgroup), both sides' counts compared, the fast path's counters read around it.
fn measure(b: &Built, w: Workload) -> Sample {
    runner()
        .measure_with(
            b,
            w,
            Sizes::default(),
            Placement::Unpinned,
            None,
            None,
            Duration::from_millis(200),
            1,
        )
        .unwrap_or_else(|e| panic!("{}: {e}", b.name))
}

/// Checks the topology carries traffic, and a fast-path topology carries it on its fast path:
/// a short rr between its two ends.
fn exercise(b: &Built) -> Sample {
    let s = measure(b, Workload::Rr);
    assert_eq!(s.error, None, "{}: {s:?}", b.name);
    assert!(s.value.is_some_and(|v| v > 0.0), "{}: {s:?}", b.name);
    let (c, v) = (s.client.as_ref().unwrap(), s.server.as_ref().unwrap());
    assert!(c.transactions > 0, "{}: {s:?}", b.name);
    assert_eq!(c.transactions, v.transactions, "{}", b.name);
    if FAST_PATHS.contains(&b.name) {
        assert!(b.fast_path.is_some(), "{} declares no fast path", b.name);
        let e = s
            .fast_path
            .as_ref()
            .unwrap_or_else(|| panic!("{}: no fast-path evidence: {s:?}", b.name));
        assert!(e.carried_all(), "{}: {e:?}", b.name);
    } else {
        assert!(s.fast_path.is_none(), "{}: {s:?}", b.name);
    }
    s
}

/// The topologies `build_and_teardown_leave_nothing_behind` must find skipped here, and why,
/// from the harness (kernel config, NSFAST_EXPECT_*, NSFAST_VM_GUEST), not from the bench's
/// probes: netkit without CONFIG_NETKIT; the vsock ones outside a VM guest or without
/// vsock_loopback (vsock-socat also without socat); the CNI ones in a VM guest (no
/// containernetworking-plugins there; `make test` installs them on the host).
fn expected_skips() -> BTreeMap<&'static str, String> {
    use nsfast_lab::kernel::{expect, Feature};
    let guest = std::env::var("NSFAST_VM_GUEST").as_deref() == Ok("1");
    let mut skip = BTreeMap::new();
    if !expect(Feature::Netkit) {
        skip.insert(
            "netkit",
            "the kernel config has no CONFIG_NETKIT".to_string(),
        );
    }
    let vsock = guest && expect(Feature::VsockLoopback);
    if !vsock {
        let why = if guest {
            "the kernel config has no CONFIG_VSOCKETS_LOOPBACK"
        } else {
            "not a VM guest (NSFAST_VM_GUEST unset)"
        };
        for t in ["vsock", "vsock-relay", "vsock-relay-kernel", "vsock-socat"] {
            skip.insert(t, why.to_string());
        }
    } else if std::env::var(nsfast_bench::vsock_hook::EXPERIMENTAL_ENV).as_deref() != Ok("1") {
        skip.insert(
            "vsock-relay-kernel",
            "experimental (NSFAST_BENCH_EXPERIMENTAL unset)".to_string(),
        );
    }
    if vsock
        && !std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .any(|d| d.join("socat").is_file())
    {
        skip.insert("vsock-socat", "no socat on PATH".to_string());
    }
    if guest {
        for t in ["cni-ptp", "cni-ptp-remote"] {
            skip.insert(t, "VM guests have no CNI plugins".to_string());
        }
    }
    skip
}

#[test]
fn build_and_teardown_leave_nothing_behind() {
    require_root();
    let _serial = serial();
    let prefix = nsfast_lab::name::unique("tb");
    let cpus_before = nsfast_sys::sched::allowed_cpus().unwrap();
    let pins_before = pod_pins();
    let expected = expected_skips();
    let mut names = Vec::new();
    let mut skipped = BTreeMap::new();
    {
        let run_cg = RunCgroup::create(&prefix).unwrap();
        let ctx = worker_ctx(&prefix, &run_cg);
        let mut built = Vec::new();
        for d in registry() {
            // The rootless worlds have their own test below.
            if ROOTLESS.contains(&d.name) {
                continue;
            }
            if let Err(why) = (d.probe)(&ProbeCtx::default()) {
                skipped.insert(d.name, why);
                continue;
            }
            let b = (d.build)(&ctx).unwrap_or_else(|e| panic!("build {}: {e}", d.name));
            assert!(b.client.cgroup.path().exists());
            assert!(Path::new("/run/netns").join(b.client_ns().name()).exists());
            exercise(&b);
            names.push(d.name);
            built.push(b);
        }
        // Exactly the expected ones were skipped: a probe that fails where the kernel has the
        // feature (or passes where it lacks it) fails here.
        assert_eq!(
            skipped.keys().collect::<Vec<_>>(),
            expected.keys().collect::<Vec<_>>(),
            "skipped (probe says): {skipped:#?}\nexpected (harness says): {expected:#?}"
        );
        for t in [
            "host",
            "veth",
            "routed",
            "sockmap",
            "bpf",
            "bpf-policy-10",
            "bpf-policy-1000",
            "bpf-tc",
            "bpf-shortcut",
            "bpf-remote",
        ] {
            assert!(names.contains(&t), "topology {t} was not built: {names:?}");
        }
        assert!(!leftovers(&prefix).is_empty());
    }
    eprintln!("built and exercised: {names:?}; skipped as expected: {skipped:#?}");
    assert_eq!(leftovers(&prefix), Vec::<String>::new());
    let new_pins: Vec<String> = pod_pins()
        .into_iter()
        .filter(|p| !pins_before.contains(p))
        .collect();
    assert_eq!(new_pins, Vec::<String>::new(), "bpffs pins left behind");
    // Pinning happens only in the workers: the caller's CPU mask is untouched.
    assert_eq!(nsfast_sys::sched::allowed_cpus().unwrap(), cpus_before);
}

/// A sockmap figure is the shortcut's only when the shortcut carried it: the same topology
/// with the shortcut attached to a cgroup the workers are not in (the programs not attached
/// where the traffic is) measures fine over plain veth TCP, and that sample is marked failed
/// "fast path idle", its figure withheld. The real topology, measured the same way, is the
/// positive control.
#[test]
fn a_sockmap_sample_the_shortcut_did_not_carry_is_marked_failed() {
    require_root();
    let _serial = serial();
    let prefix = nsfast_lab::name::unique("ti");
    {
        let run_cg = RunCgroup::create(&prefix).unwrap();
        let ctx = BuildCtx {
            prefix: prefix.clone(),
            cgroup_root: run_cg.path().to_path_buf(),
            launcher: None,
            tenant: None,
        };
        let sockmap = nsfast_bench::topology::find("sockmap").unwrap();
        let real = (sockmap.build)(&ctx).unwrap();
        for w in [Workload::Rr, Workload::Stream] {
            let s = measure(&real, w);
            assert_eq!(s.error, None, "{s:?}");
            let e = s.fast_path.as_ref().expect("evidence");
            assert!(e.carried["redirected_bytes"] > 0, "{e:?}");
        }
        drop(real);

        // veth with the shortcut attached beside the workers' cgroups, not above them.
        let veth = nsfast_bench::topology::find("veth").unwrap();
        let mut b = (veth.build)(&ctx).unwrap();
        let elsewhere = b.cgroup_dir.join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let (guard, _) = nsfast_bench::sockmap_hook::attach(&elsewhere).unwrap();
        b.extras.push(guard);
        b.fast_path = Some(nsfast_bench::evidence::FastPath::Sockmap);
        for w in [Workload::Rr, Workload::Stream] {
            let s = measure(&b, w);
            let err = s.error.clone().unwrap_or_default();
            assert!(err.starts_with("fast path idle: redirected_bytes"), "{s:?}");
            assert_eq!(s.value, None, "an idle fast path's figure is not reported");
            let (c, v) = (s.client.as_ref().unwrap(), s.server.as_ref().unwrap());
            assert!(c.transactions > 0 || v.bytes > 0, "traffic flowed: {s:?}");
            assert_eq!(s.fast_path.unwrap().carried["redirected_bytes"], 0);
        }
        b.extras.clear();
        std::fs::remove_dir(&elsewhere).unwrap();
    }
    assert_eq!(leftovers(&prefix), Vec::<String>::new());
}

/// A pod topology's evidence is the redirect it is named for, on TCP and UDP: `bpf` host A's
/// pod_to_pod (bpf_redirect_peer), `bpf-remote` host A's fib redirect out and host B's
/// wire_to_pod in; each moved during the sample.
#[test]
fn pod_topologies_name_the_redirect_they_take() {
    require_root();
    let _serial = serial();
    let prefix = nsfast_lab::name::unique("tq");
    {
        let run_cg = RunCgroup::create(&prefix).unwrap();
        let ctx = BuildCtx {
            prefix: prefix.clone(),
            cgroup_root: run_cg.path().to_path_buf(),
            launcher: None,
            tenant: None,
        };
        for (t, want) in [
            ("bpf", vec!["A.pod_to_pod"]),
            (
                "bpf-remote",
                vec!["A.fib_redirect+A.fib_redirect_neigh", "B.wire_to_pod"],
            ),
        ] {
            let b = (nsfast_bench::topology::find(t).unwrap().build)(&ctx).unwrap();
            for w in [Workload::Rr, Workload::UdpStream] {
                let s = measure(&b, w);
                assert_eq!(s.error, None, "{t} {w}: {s:?}");
                let e = s.fast_path.unwrap();
                assert_eq!(e.carried.keys().collect::<Vec<_>>(), want, "{t}: {e:?}");
                assert!(e.carried_all(), "{t} {w}: {e:?}");
            }
        }
    }
    assert_eq!(leftovers(&prefix), Vec::<String>::new());
}

#[test]
fn teardown_happens_when_the_user_panics() {
    require_root();
    let prefix = nsfast_lab::name::unique("tp");
    let p2 = prefix.clone();
    let r = std::panic::catch_unwind(move || {
        let run_cg = RunCgroup::create(&p2).unwrap();
        let ctx = BuildCtx {
            prefix: p2.clone(),
            cgroup_root: run_cg.path().to_path_buf(),
            launcher: None,
            tenant: None,
        };
        let _routed = (registry()[2].build)(&ctx).unwrap();
        panic!("boom while the routed topology exists");
    });
    assert!(r.is_err());
    assert_eq!(leftovers(&prefix), Vec::<String>::new());
}

#[test]
fn unknown_topology_is_one_clear_error() {
    let e = nsfast_bench::topology::find("vxlan")
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("\"vxlan\"") && e.contains("host, veth, routed, sockmap"),
        "{e}"
    );
}

#[test]
fn cleanup_removes_what_a_killed_run_left() {
    require_root();
    let _serial = serial();
    // A pid that is not running: what a SIGKILLed run would have left.
    let dead = dead_pid(3_000_000..4_000_000u32);
    let prefix = format!("nsfb-{dead}");
    let ns = nsfast_sys::netns::NetNs::create(&format!("{prefix}-host"))
        .unwrap()
        .persist();
    drop(ns);
    let cg = nsfast_sys::cgroup::cgroup2_mount().unwrap().join(&prefix);
    std::fs::create_dir_all(cg.join("host/client")).unwrap();
    let mine = nsfast_lab::name::unique("tc");
    let live = nsfast_sys::netns::NetNs::create(&mine).unwrap();
    let removed = nsfast_bench::topology::cleanup_stale();
    assert!(
        removed
            .iter()
            .any(|r| r.contains(&format!("{prefix}-host"))),
        "{removed:?}"
    );
    assert!(leftovers(&prefix).is_empty(), "{:?}", leftovers(&prefix));
    // A live run's namespace is left alone.
    assert!(Path::new("/run/netns").join(&mine).exists());
    drop(live);
}

/// A killed test's objects (names of `nsfast_lab::name::unique`, here with a dead pid in place
/// of ours) are found and removed by the cleanup: namespace, cgroup, temporary folder. A live
/// test's objects are left alone.
#[test]
fn cleanup_removes_what_a_killed_test_left_and_keeps_a_live_ones() {
    use nsfast_lab::name::{unique, TEST};
    require_root();
    let _serial = serial();
    let dead = dead_pid(3_000_000..4_000_000u32);
    let me = std::process::id();
    let theirs =
        |tag: &str| unique(tag).replacen(&format!("{TEST}{me}x"), &format!("{TEST}{dead}x"), 1);
    let (ns, cg, dir) = (theirs("ctr"), theirs("cg"), theirs("data"));
    assert!(ns.starts_with(&format!("{TEST}{dead}x")), "{ns}");
    drop(nsfast_sys::netns::NetNs::create(&ns).unwrap().persist());
    let cg = nsfast_sys::cgroup::cgroup2_mount().unwrap().join(cg);
    std::fs::create_dir_all(&cg).unwrap();
    let dir = std::env::temp_dir().join(dir);
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let live_ns = nsfast_sys::netns::NetNs::create(&unique("live")).unwrap();
    let live_dir = std::env::temp_dir().join(unique("live"));
    std::fs::create_dir_all(&live_dir).unwrap();

    let found = nsfast_bench::topology::stale_leftovers();
    let removed = nsfast_bench::topology::cleanup_stale();
    let live_left = Path::new("/run/netns").join(live_ns.name()).exists() && live_dir.exists();
    let _ = std::fs::remove_dir_all(&live_dir);
    assert!(found.namespaces.contains(&ns), "{found:?}");
    assert!(found.cgroups.contains(&cg), "{found:?}");
    assert!(found.dirs.contains(&dir), "{found:?}");
    assert!(
        !found.namespaces.iter().any(|n| n == live_ns.name()),
        "{found:?}"
    );
    assert!(!found.dirs.contains(&live_dir), "{found:?}");
    assert!(!Path::new("/run/netns").join(&ns).exists(), "{removed:?}");
    assert!(!cg.exists() && !dir.exists(), "{removed:?}");
    assert!(live_left, "a live test's objects were removed: {removed:?}");
}

#[test]
fn cleanup_removes_a_killed_runs_vpnrelay_world() {
    require_root();
    let _serial = serial();
    let dead = dead_pid((3_000_000..4_000_000u32).rev());
    let prefix = format!("nsfv{dead}x0");
    for suffix in ["host", "srv"] {
        drop(
            nsfast_sys::netns::NetNs::create(&format!("{prefix}-{suffix}"))
                .unwrap()
                .persist(),
        );
    }
    let xdg = std::env::temp_dir().join(format!("{prefix}-xdg"));
    std::fs::create_dir_all(xdg.join("dockerd-rootless")).unwrap();
    // A stand-in for the world's RootlessKit/slirp4netns: a process carrying its runtime dir.
    let mut orphan = std::process::Command::new("sleep")
        .arg("600")
        .env("XDG_RUNTIME_DIR", &xdg)
        .spawn()
        .unwrap();
    let mut bystander = std::process::Command::new("sleep")
        .arg("600")
        .env("XDG_RUNTIME_DIR", "/tmp/nsfv1x0-xdg")
        .spawn()
        .unwrap();
    let removed = nsfast_bench::topology::cleanup_stale();
    let status = nsfast_lab::wait_or_kill(&mut orphan, std::time::Duration::from_secs(5));
    assert!(
        status.is_some_and(|s| !s.success()),
        "the world's process was ended: {status:?}, cleanup said {removed:?}"
    );
    assert!(
        removed
            .iter()
            .any(|r| r.contains(&format!("{prefix}-host"))),
        "{removed:?}"
    );
    assert!(
        removed.iter().any(|r| r.contains("process(es)")),
        "{removed:?}"
    );
    for suffix in ["host", "srv"] {
        assert!(!Path::new("/run/netns")
            .join(format!("{prefix}-{suffix}"))
            .exists());
    }
    assert!(!xdg.exists());
    assert!(
        bystander.try_wait().unwrap().is_none(),
        "a live world's process is left alone (pid 1 is alive)"
    );
    bystander.kill().unwrap();
    bystander.wait().unwrap();
}

/// What a SIGKILLed run of the `bpf` topology leaves: a host namespace whose pods were made
/// (pinned links and maps, records, pod namespaces, a tc-attached uplink) and never deleted;
/// and pod state whose host namespace is already gone. `cleanup_stale` removes both.
#[test]
fn cleanup_removes_the_pod_state_a_killed_run_left() {
    require_root();
    let _serial = serial();
    let dead = dead_pid(4_000_000..5_000_000u32);
    let prefix = format!("nsfb-{dead}");
    let make_host = |tag: &str, attach: nsfast_pod::AttachRequest, net: u8| {
        let host = format!("{prefix}-{tag}-ha");
        drop(nsfast_sys::netns::NetNs::create(&host).unwrap().persist());
        let h = nsfast_sys::netns::NetNs::open(&host).unwrap();
        let n = h.netlink().unwrap();
        n.create_veth("wire0", &n, "wire1").unwrap();
        drop((n, h));
        for i in 0..2u8 {
            let mut o = nsfast_pod::AddOptions::new(
                &format!("{prefix}-{tag}-a{i}"),
                nsfast_pod::PodIp {
                    ip: std::net::Ipv4Addr::new(10, 253, net, 10 + i),
                    prefix: 24,
                },
            );
            o.mode = nsfast_pod::ModeRequest::Veth;
            o.attach = attach;
            o.host = Some(host.clone());
            o.uplinks = vec!["wire0".into()];
            nsfast_pod::add(&o).unwrap();
        }
        // The state's directories, found by the host namespace's key.
        let h = nsfast_pod::Host::open(Some(&host)).unwrap();
        let dirs = [h.state_dir(), h.pin_dir()];
        assert!(dirs.iter().all(|d| d.exists()));
        (host, dirs)
    };
    // Killed with its pods in place (no destructor ran).
    let (_, kept) = make_host("k", nsfast_pod::AttachRequest::Tc, 1);
    // Its host namespace already deleted by hand (or by an older cleanup): orphaned state.
    let (gone_host, orphan) = make_host("o", nsfast_pod::AttachRequest::Auto, 2);
    nsfast_sys::netns::delete_named(&gone_host).unwrap();
    let removed = nsfast_bench::topology::cleanup_stale();
    let all = removed.join("\n");
    assert!(all.contains("nsfast pod state of host namespace"), "{all}");
    assert!(
        all.contains("nsfast pod state of a deleted namespace"),
        "{all}"
    );
    for d in kept.iter().chain(orphan.iter()) {
        assert!(!d.exists(), "{} left; cleanup said:\n{all}", d.display());
    }
    let left: Vec<String> = nsfast_sys::netns::list_named()
        .into_iter()
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Builds the `vpnrelay` binary of this profile (as crates/vpnrelay/tests/rootless.rs does)
/// and hands it to the topology.
fn use_vpnrelay_bin() {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|p| p.parent()).unwrap().to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.args(["build", "-q", "-p", "nsfast", "--bin", "vpnrelay"]);
    if profile_dir.ends_with("release") {
        cmd.arg("--release");
    }
    assert!(
        cmd.status().unwrap().success(),
        "cargo build --bin vpnrelay"
    );
    nsfast_bench::rootless_hook::set_vpnrelay_bin(profile_dir.join("vpnrelay"));
}

/// PIDs of processes owned by `uid`.
fn processes_of(uid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let real = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u32>().ok());
        if real == Some(uid) {
            out.push(pid);
        }
    }
    out
}

fn run_text(argv: &[&str]) -> String {
    let o = std::process::Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// What the rootless worlds could leave behind in the initial namespace and on disk.
fn rootless_leftovers(world_prefix: &str) -> Vec<String> {
    let mut left: Vec<String> = nsfast_sys::netns::list_named()
        .into_iter()
        .filter(|n| n.starts_with(world_prefix))
        .collect();
    for e in std::fs::read_dir(std::env::temp_dir()).unwrap().flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with(world_prefix) {
            left.push(e.path().display().to_string());
        }
    }
    left
}

/// slirp4netns, pasta and vpnrelay build (relay running, its rule in place), carry UDP to the VPN
/// port and TCP, and tear down leaving no namespace, cgroup, tenant process, runtime
/// directory, rule or nft change behind.
#[test]
fn rootless_topologies_build_and_leave_nothing_behind() {
    require_root();
    // Always (re)built: a stale vpnrelay binary next to the test would be measured instead.
    use_vpnrelay_bin();
    // The lab makes its tenant (nsfast bench only takes an existing one).
    let tenant = nsfast_lab::test_user::ensure().unwrap();
    // pasta's world runs Debian unstable's RootlessKit 2 and pasta, unpacked into build/.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for script in ["fetch-rootlesskit2.sh", "fetch-pasta.sh"] {
        let st = std::process::Command::new(root.join("scripts").join(script))
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("running scripts/{script}: {e}"));
        assert!(
            st.success(),
            "scripts/{script} failed: the pasta topology needs its packages"
        );
    }
    let probe = ProbeCtx {
        tenant: Some(tenant.clone()),
    };
    for t in ROOTLESS {
        let d = nsfast_bench::topology::find(t).unwrap();
        (d.probe)(&probe).unwrap_or_else(|e| panic!("{t} cannot run here: {e}"));
    }
    let tenant_before = processes_of(tenant.uid);
    let rules_before = run_text(&["ip", "-4", "rule"]);
    let nft_before = run_text(&["nft", "list", "ruleset"]);
    let prefix = nsfast_lab::name::unique("tr");
    let world_prefix = format!("nsfv{}x", std::process::id());
    {
        let run_cg = RunCgroup::create(&prefix).unwrap();
        let ctx = BuildCtx {
            prefix: prefix.clone(),
            cgroup_root: run_cg.path().to_path_buf(),
            launcher: None,
            tenant: Some(tenant.clone()),
        };
        for t in ROOTLESS {
            let d = nsfast_bench::topology::find(t).unwrap();
            let b = (d.build)(&ctx).unwrap_or_else(|e| panic!("build {t}: {e}"));
            assert_eq!(b.server_port, nsfast_lab::rootless::VPN_PORT);
            let w = b
                .extras
                .iter()
                .find_map(|e| e.downcast_ref::<nsfast_lab::rootless::World>())
                .expect("the world is kept in the extras");
            let relay_rule = w.rules().unwrap().contains("lookup 4820");
            assert_eq!(relay_rule, t == "vpnrelay", "{t}: {}", w.rules().unwrap());
            assert!(!processes_of(tenant.uid).is_empty());
            exercise(&b);
            // The udp-stream workload to the VPN port reaches the server; on vpnrelay through
            // the relay: its own up_bytes counter moved during the sample.
            let s = measure(&b, Workload::UdpStream);
            assert_eq!(s.error, None, "{t}: {s:?}");
            assert!(
                s.client.as_ref().unwrap().datagrams > 0,
                "{t}: nothing sent"
            );
            assert!(
                s.server.as_ref().unwrap().datagrams > 0,
                "{t}: nothing arrived"
            );
            if t == "vpnrelay" {
                let e = s.fast_path.as_ref().expect("vpnrelay evidence");
                assert!(e.carried["up_bytes"] > 0, "{e:?}");
            } else {
                assert!(s.fast_path.is_none(), "{t}: {s:?}");
            }
            drop(b);
            assert_eq!(rootless_leftovers(&world_prefix), Vec::<String>::new());
        }
    }
    assert_eq!(leftovers(&prefix), Vec::<String>::new());
    assert_eq!(rootless_leftovers(&world_prefix), Vec::<String>::new());
    let mut left = processes_of(tenant.uid);
    left.retain(|p| !tenant_before.contains(p));
    assert_eq!(left, Vec::<u32>::new(), "tenant processes left");
    assert_eq!(run_text(&["ip", "-4", "rule"]), rules_before);
    assert_eq!(run_text(&["nft", "list", "ruleset"]), nft_before);
}

/// TCP sockets in TIME_WAIT (state 06 in /proc/net/tcp{,6}) in the calling thread's namespace.
fn time_wait_sockets() -> usize {
    ["tcp", "tcp6"]
        .iter()
        .map(|f| {
            std::fs::read_to_string(format!("/proc/thread-self/net/{f}"))
                .unwrap_or_default()
                .lines()
                .skip(1)
                .filter(|l| l.split_whitespace().nth(3) == Some("06"))
                .count()
        })
        .sum()
}

/// crr's client closes first, so each connection would leave a TIME_WAIT socket holding its
/// 4-tuple, and once the ephemeral range is used up every connect(2) searches it: crr would
/// measure the port search, the same ~32,000 tx/s cap for every topology. The client's
/// namespace keeps none.
#[test]
fn crr_leaves_no_time_wait_socket_in_the_client_namespace() {
    require_root();
    let prefix = nsfast_lab::name::unique("tw");
    let run_cg = RunCgroup::create(&prefix).unwrap();
    let ctx = worker_ctx(&prefix, &run_cg);
    for name in ["host", "veth"] {
        let d = registry().into_iter().find(|d| d.name == name).unwrap();
        let b = (d.build)(&ctx).unwrap_or_else(|e| panic!("build {name}: {e}"));
        let s = measure(&b, Workload::Crr);
        assert_eq!(s.error, None, "{name}: {s:?}");
        let connections = s.client.as_ref().unwrap().transactions;
        assert!(connections > 100, "{name}: {s:?}");
        let left = b.client_ns().run(time_wait_sockets).unwrap();
        assert_eq!(
            left, 0,
            "{name}: {connections} crr connections left {left} TIME_WAIT sockets in the client's namespace"
        );
    }
    drop(run_cg);
    assert_eq!(leftovers(&prefix), Vec::<String>::new());
}
