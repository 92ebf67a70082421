//! Topology build/teardown leaves no namespace, link or cgroup behind, also when the code
//! using a topology panics. Needs root; fails, rather than passing, without it.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nsfast_bench::load::{run_client, serve, Listener};
use nsfast_bench::spec::{Sizes, Workload};
use nsfast_bench::topology::{registry, BuildCtx, Built, RunCgroup};

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests create network namespaces and cgroups: run them as root"
    );
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

/// Checks the topology carries traffic: a short rr between its two ends.
fn exercise(b: &Built) {
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let s2 = stop.clone();
    let ip = b.server_ip;
    let h = b
        .server_ns()
        .spawn(move || {
            let l = Listener::bind(Workload::Rr, SocketAddr::new(ip, 0)).unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            serve(Workload::Rr, &l, Sizes::default(), &s2).unwrap()
        })
        .unwrap();
    let addr = rx.recv().unwrap();
    let c = b
        .client_ns()
        .run(move || {
            run_client(
                Workload::Rr,
                addr,
                Sizes::default(),
                Duration::from_millis(200),
            )
        })
        .unwrap()
        .unwrap_or_else(|e| panic!("{}: {e}", b.name));
    stop.store(true, Ordering::Relaxed);
    let s = h.join().unwrap();
    assert!(c.transactions > 0);
    assert_eq!(c.transactions, s.transactions);
}

#[test]
fn build_and_teardown_leave_nothing_behind() {
    require_root();
    let prefix = format!("nsfb-{}-tb", std::process::id());
    let cpus_before = nsfast_sys::sched::allowed_cpus().unwrap();
    let pins_before = pod_pins();
    let mut names = Vec::new();
    {
        let run_cg = RunCgroup::create(&prefix).unwrap();
        let ctx = BuildCtx {
            prefix: prefix.clone(),
            cgroup_root: run_cg.path().to_path_buf(),
        };
        let mut built = Vec::new();
        for d in registry() {
            if (d.probe)().is_err() {
                continue;
            }
            let b = (d.build)(&ctx).unwrap_or_else(|e| panic!("build {}: {e}", d.name));
            assert!(b.client.cgroup.path().exists());
            assert!(Path::new("/run/netns").join(b.client_ns().name()).exists());
            exercise(&b);
            names.push(d.name);
            built.push(b);
        }
        assert!(
            built.len() >= 3,
            "host, veth and routed are always available"
        );
        // The pod topologies are always available here (cni-ptp needs
        // containernetworking-plugins, which `make test` installs).
        for t in ["bpf", "cni-ptp"] {
            assert!(names.contains(&t), "topology {t} was skipped: {names:?}");
        }
        assert!(!leftovers(&prefix).is_empty());
    }
    assert_eq!(leftovers(&prefix), Vec::<String>::new());
    let new_pins: Vec<String> = pod_pins()
        .into_iter()
        .filter(|p| !pins_before.contains(p))
        .collect();
    assert_eq!(new_pins, Vec::<String>::new(), "bpffs pins left behind");
    // Pinning happens only in the workers: the caller's CPU mask is untouched.
    assert_eq!(nsfast_sys::sched::allowed_cpus().unwrap(), cpus_before);
}

#[test]
fn teardown_happens_when_the_user_panics() {
    require_root();
    let prefix = format!("nsfb-{}-tp", std::process::id());
    let p2 = prefix.clone();
    let r = std::panic::catch_unwind(move || {
        let run_cg = RunCgroup::create(&p2).unwrap();
        let ctx = BuildCtx {
            prefix: p2.clone(),
            cgroup_root: run_cg.path().to_path_buf(),
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
    // A pid that is not running: what a SIGKILLed run would have left.
    let dead = (3_000_000..4_000_000u32)
        .find(|p| !Path::new(&format!("/proc/{p}")).exists())
        .unwrap();
    let prefix = format!("nsfb-{dead}");
    let ns = nsfast_sys::netns::NetNs::create(&format!("{prefix}-host"))
        .unwrap()
        .persist();
    drop(ns);
    let cg = nsfast_sys::cgroup::cgroup2_mount().unwrap().join(&prefix);
    std::fs::create_dir_all(cg.join("host/client")).unwrap();
    let mine = format!("nsfb-{}-tc", std::process::id());
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
