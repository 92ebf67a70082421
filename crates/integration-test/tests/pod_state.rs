//! Root tests of `nsfast pod`'s state: a host given as a file that is not a network
//! namespace, SIGKILL after each `pod add` step, and host namespaces whose inode the kernel
//! handed out again (state keyed by netns cookie; stale records never block an add, and
//! cleanup never touches the new namespace's devices). Run as root. `NSFAST_BIN` runs another
//! build (e.g. an older one, to see these fail).

mod common;
use common::{nsfast, nsfast_env, text};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

use nsfast_lab::require_root;
use nsfast_lab::world::{link_names as links, unique};
use nsfast_pod::state::{bpffs_root, PIN_SUBDIR, STATE_ROOT};
use nsfast_sys::netns::{self, NetNs};

/// Pod state directories (under /run/nsfast/pod) holding a record of pod `pod`.
fn state_dirs_with(pod: &str) -> Vec<PathBuf> {
    std::fs::read_dir(STATE_ROOT)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|d| d.join(format!("{pod}.json")).exists())
        .collect()
}

/// Deletes the named namespaces (and every pod of `hosts`) on drop, also on panic.
struct Cleanup {
    hosts: Vec<String>,
    names: Vec<String>,
    dirs: Vec<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for h in &self.hosts {
            let _ = nsfast(&["pod", "del", "--all", "--host", h]);
        }
        for n in self.hosts.iter().chain(&self.names) {
            let _ = netns::delete_named(n);
        }
        for d in &self.dirs {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// A throwaway host namespace `<unique>-h` with names `<unique>-<suffix>` for its pods, all
/// removed on drop (also on panic); the namespace is made after its cleanup is armed.
fn throwaway_host(tag: &str, pods: &[&str]) -> (String, Vec<String>, Cleanup) {
    let p = unique(tag);
    let host = format!("{p}-h");
    let names: Vec<String> = pods.iter().map(|s| format!("{p}-{s}")).collect();
    let c = Cleanup {
        hosts: vec![host.clone()],
        names: names.clone(),
        dirs: vec![],
    };
    NetNs::create(&host).unwrap().persist();
    (host, names, c)
}

#[test]
fn pod_list_refuses_a_host_that_is_not_a_network_namespace() {
    require_root();
    // /etc/passwd where there is one (the VM guests have none); always a regular file of
    // procfs and a namespace of another type.
    let mut files = vec!["/proc/self/status", "/proc/self/ns/mnt"];
    if Path::new("/etc/passwd").exists() {
        files.push("/etc/passwd");
    }
    for f in files {
        for args in [
            &["pod", "list", "--host", f][..],
            &["pod", "del", "--all", "--host", f][..],
            &["pod", "add", "x", "--ip", "10.79.0.1/24", "--host", f][..],
        ] {
            let o = nsfast(args);
            assert!(!o.status.success(), "{args:?} accepted: {}", text(&o));
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                err.contains(&format!("{f:?}")) && err.contains("not a network namespace"),
                "{args:?}: {}",
                text(&o)
            );
        }
    }
}

/// The datapath of the crash test: veth here; the VM matrix sets NSFAST_TEST_POD_MODE=netkit
/// (or netkit-l2) on kernels with netkit.
fn pod_mode() -> String {
    std::env::var("NSFAST_TEST_POD_MODE").unwrap_or_else(|_| "veth".into())
}

/// Nothing of pod `pod` on host `host` is left: devices, its namespace, records, pins.
fn assert_clean(host: &str, pod: &str, when: &str) {
    assert_eq!(links(host), ["lo"], "{when}: host devices");
    assert!(
        !netns::list_named().contains(&pod.to_string()),
        "{when}: pod namespace {pod} left"
    );
    let h = nsfast_pod::Host::open(Some(host)).unwrap();
    assert!(
        !h.state_dir().exists(),
        "{when}: {} left",
        h.state_dir().display()
    );
    assert!(
        !h.pin_dir().exists(),
        "{when}: {} left",
        h.pin_dir().display()
    );
}

/// SIGKILL right after each `pod add` step: `pod del` then removes everything; killed again,
/// `pod add` of the same pod works (after the last step the pod is complete, so it is refused
/// as existing and `pod del` + `pod add` works), and its `pod del` leaves nothing.
#[test]
fn pod_add_killed_after_each_step_then_del_and_add_work_and_nothing_is_left() {
    require_root();
    let (host, pods, _c) = throwaway_host("pk", &["k"]);
    let pod = pods[0].clone();
    let mode = pod_mode();
    let add = [
        "pod",
        "add",
        &pod,
        "--ip",
        "10.78.0.5/24",
        "--host",
        &host,
        "--mode",
        &mode,
    ];
    let del = ["pod", "del", &pod, "--host", &host];
    let steps = [
        "planned",
        "netns",
        "devices",
        "addresses",
        "attach",
        "endpoint",
        "record",
    ];
    for s in steps {
        assert!(nsfast_pod::pod::ADD_STEPS.contains(&s), "{s}");
    }
    for step in steps {
        let crash = [(nsfast_pod::pod::CRASH_ENV, step)];
        let o = nsfast_env(&add, &crash);
        assert_eq!(
            o.status.signal(),
            Some(9),
            "not killed at {step}: {}",
            text(&o)
        );
        let o = nsfast(&del);
        assert!(
            o.status.success(),
            "del after a kill at {step}: {}",
            text(&o)
        );
        assert_clean(&host, &pod, &format!("del after a kill at {step}"));

        let o = nsfast_env(&add, &crash);
        assert_eq!(
            o.status.signal(),
            Some(9),
            "second kill at {step}: {}",
            text(&o)
        );
        let mut o = nsfast(&add);
        if step == "record" {
            assert!(
                String::from_utf8_lossy(&o.stderr).contains("already exists"),
                "{}",
                text(&o)
            );
            assert!(nsfast(&del).status.success());
            o = nsfast(&add);
        }
        assert!(
            o.status.success(),
            "add after a kill at {step}: {}",
            text(&o)
        );
        let h = nsfast_pod::Host::open(Some(&host)).unwrap();
        let r = h.record(&pod).unwrap().expect("record");
        assert!(!r.pending, "{step}");
        let pns = NetNs::open(&pod).unwrap();
        assert_eq!(
            pns.netlink().unwrap().link_ipv4_addresses("eth0").unwrap(),
            [("10.78.0.5".parse().unwrap(), 24)],
            "{step}"
        );
        assert_eq!(links(&host).len(), 2, "{step}: lo and the pod's device");
        drop((h, pns));
        let o = nsfast(&del);
        assert!(o.status.success(), "del #2 at {step}: {}", text(&o));
        assert_clean(&host, &pod, &format!("add+del after a kill at {step}"));
    }
}

/// The `state` `pod list --json` gives pod `pod` of `host`.
fn listed_state(host: &str, pod: &str) -> String {
    let o = nsfast(&["pod", "list", "--json", "--host", host]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let p = v["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == pod)
        .unwrap_or_else(|| panic!("{pod} not listed: {v}"));
    p["state"].as_str().unwrap_or_default().to_string()
}

/// SIGKILL right after each `pod del` step: `pod list` shows the pod pending (never as a
/// working pod), and the next `pod del` removes everything.
#[test]
fn pod_del_killed_after_each_step_leaves_a_pending_pod_that_del_removes() {
    require_root();
    let (host, pods, _c) = throwaway_host("pd", &["k"]);
    let pod = pods[0].clone();
    let mode = pod_mode();
    let add = [
        "pod",
        "add",
        &pod,
        "--ip",
        "10.78.1.5/24",
        "--host",
        &host,
        "--mode",
        &mode,
    ];
    let del = ["pod", "del", &pod, "--host", &host];
    for step in nsfast_pod::pod::DEL_STEPS {
        let o = nsfast(&add);
        assert!(o.status.success(), "add before {step}: {}", text(&o));
        assert_eq!(listed_state(&host, &pod), "ok", "{step}");
        let o = nsfast_env(&del, &[(nsfast_pod::pod::CRASH_ENV, step)]);
        assert_eq!(
            o.status.signal(),
            Some(9),
            "del not killed at {step}: {}",
            text(&o)
        );
        assert_eq!(listed_state(&host, &pod), "pending", "killed at {step}");
        let o = nsfast(&del);
        assert!(
            o.status.success(),
            "del after a kill at {step}: {}",
            text(&o)
        );
        assert_clean(&host, &pod, &format!("del after a kill at {step}"));
    }
}

/// A temporary record a killed write left (`<pod>.json.tmp`, as a SIGKILLed `pod add` can
/// leave) is removed by the next operation that locks the host, here `pod add` of another
/// pod; the host's records are untouched.
#[test]
fn temporary_files_a_killed_write_left_go_with_the_next_operation() {
    require_root();
    let (host, pods, _c) = throwaway_host("pt", &["a", "b"]);
    let (a, b) = (pods[0].clone(), pods[1].clone());
    let add = |pod: &str, ip: &str| {
        let o = nsfast(&[
            "pod", "add", pod, "--ip", ip, "--host", &host, "--mode", "veth",
        ]);
        assert!(o.status.success(), "{}", text(&o));
    };
    add(&a, "10.78.3.5/24");
    let dir = nsfast_pod::Host::open(Some(&host)).unwrap().state_dir();
    let stale = [
        dir.join("gone.json.tmp"),
        dir.join("uplinks/wire9.json.tmp"),
    ];
    for f in &stale {
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, b"{").unwrap();
    }
    add(&b, "10.78.3.6/24");
    for f in &stale {
        assert!(!f.exists(), "{} left", f.display());
    }
    assert_eq!(listed_state(&host, &a), "ok");
    assert_eq!(listed_state(&host, &b), "ok");
}

/// A pod whose namespace was deleted behind nsfast's back is listed `dead`; `pod del`
/// removes what nsfast still holds for it.
#[test]
fn a_pod_whose_namespace_is_gone_is_listed_dead_and_del_removes_it() {
    require_root();
    let (host, pods, _c) = throwaway_host("pz", &["z"]);
    let pod = pods[0].clone();
    let o = nsfast(&[
        "pod",
        "add",
        &pod,
        "--ip",
        "10.78.2.5/24",
        "--host",
        &host,
        "--mode",
        "veth",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(listed_state(&host, &pod), "ok");
    // The pod's namespace goes, and with its last reference the veth pair.
    netns::delete_named(&pod).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while links(&host).len() > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the pod's device outlived its namespace: {:?}",
            links(&host)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(listed_state(&host, &pod), "dead");
    let o = nsfast(&["pod", "list", "--host", &host]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&format!("note: pod {pod}: its namespace")),
        "{}",
        text(&o)
    );
    let o = nsfast(&["pod", "del", &pod, "--host", &host]);
    assert!(o.status.success(), "{}", text(&o));
    assert_clean(&host, &pod, "del of a dead pod");
}

/// The scenario, for real: a host namespace with a pod is deleted without `pod del`;
/// namespaces are made until one gets its inode (if the kernel does not hand it out within
/// the bound, the dead host's state is renamed to that inode, which is what reuse looks like
/// on disk). There, `pod add` with the dead pod's address works, and `pod del --all` deletes
/// only the new pod: a device named like the dead pod's and the dead pod's namespace stay, and
/// the dead host's state is gone.
#[test]
fn host_inode_reuse_never_blocks_add_and_del_all_touches_only_the_new_host() {
    require_root();
    let p = unique("pr");
    let (old_h, old_pod, new_pod) = (format!("{p}-old"), format!("{p}-a"), format!("{p}-b"));
    let mut c = Cleanup {
        hosts: vec![],
        names: vec![old_pod.clone(), old_h.clone()],
        dirs: vec![],
    };
    let old_ino = {
        let ns = NetNs::create(&old_h).unwrap().persist();
        ns.inode()
    };
    let o = nsfast(&[
        "pod",
        "add",
        &old_pod,
        "--ip",
        "10.77.0.1/24",
        "--host",
        &old_h,
        "--mode",
        "veth",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let old_state = state_dirs_with(&old_pod);
    assert_eq!(old_state.len(), 1, "{old_state:?}");
    let old_state = old_state[0].clone();
    let old_key = old_state.file_name().unwrap().to_str().unwrap().to_string();
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(old_state.join(format!("{old_pod}.json"))).unwrap())
            .unwrap();
    let old_if = rec["host_if"].as_str().unwrap().to_string();
    netns::delete_named(&old_h).unwrap();

    // Churn: keep every namespace made (so the allocator moves past other free numbers) until
    // one has the dead host's inode.
    let mut churn = Vec::new();
    let mut new_h = None;
    for i in 0..200 {
        let ns = NetNs::create(&format!("{p}-n{i}")).unwrap();
        if ns.inode() == old_ino {
            new_h = Some(ns);
            break;
        }
        churn.push(ns);
    }
    let reused = new_h.is_some();
    let new_h = new_h.unwrap_or_else(|| churn.pop().unwrap()).persist();
    drop(churn);
    let new_name = new_h.name().to_string();
    c.hosts.push(new_name.clone());
    let new_ino = new_h.inode();
    let stale_key = if reused {
        old_key.clone()
    } else {
        eprintln!("inode {old_ino} not reused within 200 namespaces: planting the reuse");
        let k = match old_key.rsplit_once("-ino-") {
            Some((c, _)) => format!("{c}-ino-{new_ino}"),
            None => format!("netns-{new_ino}"),
        };
        for root in [PathBuf::from(STATE_ROOT), bpffs_root().join(PIN_SUBDIR)] {
            if root.join(&old_key).exists() {
                std::fs::rename(root.join(&old_key), root.join(&k)).unwrap();
            }
        }
        k
    };
    c.dirs.push(Path::new(STATE_ROOT).join(&stale_key));
    c.dirs.push(bpffs_root().join(PIN_SUBDIR).join(&stale_key));
    // A device of the new host that happens to have the dead pod's device name.
    let new_nl = new_h.netlink().unwrap();
    new_nl.create_veth(&old_if, &new_nl, "nsftdecoy1").unwrap();

    let o = nsfast(&[
        "pod",
        "add",
        &new_pod,
        "--ip",
        "10.77.0.1/24",
        "--host",
        &new_name,
        "--mode",
        "veth",
    ]);
    c.names.push(new_pod.clone());
    assert!(o.status.success(), "add on the reused inode: {}", text(&o));
    let o = nsfast(&["pod", "del", "--all", "--host", &new_name]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&format!("deleted pod {new_pod}")) && !out.contains(&old_pod),
        "{out}"
    );
    assert!(
        new_nl.link_exists(&old_if).unwrap(),
        "del --all deleted the new host's device {old_if}"
    );
    assert!(
        netns::list_named().contains(&old_pod),
        "del --all deleted the dead host's pod namespace {old_pod}"
    );
    assert!(!netns::list_named().contains(&new_pod));
    for root in [PathBuf::from(STATE_ROOT), bpffs_root().join(PIN_SUBDIR)] {
        assert!(
            !root.join(&stale_key).exists(),
            "stale state {} left",
            root.join(&stale_key).display()
        );
    }
}

fn plant(dir: &Path, name: &str, ip: &str, host_if: &str, ifindex: u32, netns: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(".lock"), b"").unwrap();
    let r = serde_json::json!({
        "name": name, "ip": ip, "prefix": 24, "gateway": "169.254.1.1",
        "datapath": "veth", "host": "old-h", "netns": netns, "netns_owned": true,
        "host_if": host_if, "host_ifindex": ifindex, "pod_if": "eth0",
        "pod_mac": "02:00:00:00:00:02", "host_mac": "02:00:00:00:00:01",
        "attach": "tcx", "link_pins": [],
    });
    std::fs::write(dir.join(format!("{name}.json")), r.to_string()).unwrap();
}

/// Records of dead namespaces planted on the inode of a live one, under the inode-only key and
/// under a cookie key with another cookie, naming the live host's devices and a live
/// namespace: they block no add, and `pod del --all` removes them without touching either.
#[test]
fn planted_stale_records_never_block_and_cleanup_touches_nothing_live() {
    require_root();
    let p = unique("ps");
    let host = format!("{p}-h");
    let victim = format!("{p}-v");
    let mut c = Cleanup {
        hosts: vec![host.clone()],
        names: vec![victim.clone(), format!("{p}-x"), format!("{p}-y")],
        dirs: vec![],
    };
    let h = NetNs::create(&host).unwrap().persist();
    NetNs::create(&victim).unwrap().persist();
    let ino = h.inode();
    let h_nl = h.netlink().unwrap();
    h_nl.create_veth("nsftold0", &h_nl, "nsftold1").unwrap();
    let idx0 = h_nl.link_index("nsftold0").unwrap();
    let legacy = Path::new(STATE_ROOT).join(format!("netns-{ino}"));
    let other = Path::new(STATE_ROOT).join(format!("cookie-1-ino-{ino}"));
    let other_pins = bpffs_root()
        .join(PIN_SUBDIR)
        .join(format!("cookie-1-ino-{ino}"));
    c.dirs
        .extend([legacy.clone(), other.clone(), other_pins.clone()]);
    plant(
        &legacy,
        "old-a",
        "10.77.0.1",
        "nsftold0",
        idx0 + 100,
        &victim,
    );
    plant(&other, "old-b", "10.77.0.2", "nsftold1", idx0 + 1, &victim);
    nsfast_pod::state::ensure_bpffs().unwrap();
    std::fs::create_dir_all(&other_pins).unwrap();

    for (n, ip) in [("x", "10.77.0.1/24"), ("y", "10.77.0.2/24")] {
        let o = nsfast(&[
            "pod",
            "add",
            &format!("{p}-{n}"),
            "--ip",
            ip,
            "--host",
            &host,
            "--mode",
            "veth",
        ]);
        assert!(o.status.success(), "add {ip}: {}", text(&o));
    }
    let o = nsfast(&["pod", "list", "--host", &host]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!out.contains("old-a") && !out.contains("old-b"), "{out}");
    let o = nsfast(&["pod", "del", "--all", "--host", &host]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("2 pod(s) deleted"), "{out}");
    for d in ["nsftold0", "nsftold1"] {
        assert!(h_nl.link_exists(d).unwrap(), "{d} deleted");
    }
    assert!(netns::list_named().contains(&victim), "{victim} deleted");
    for d in [&legacy, &other, &other_pins] {
        assert!(!d.exists(), "stale state {} left", d.display());
    }
}

/// State an older nsfast wrote under the inode key for a host that is still alive (its
/// records' devices are there) is adopted: listed, and deleted with `pod del`.
#[test]
fn legacy_state_of_a_live_host_is_adopted() {
    require_root();
    let p = unique("pl");
    let host = format!("{p}-h");
    let pod_ns = format!("{p}-m");
    let mut c = Cleanup {
        hosts: vec![host.clone()],
        names: vec![pod_ns.clone()],
        dirs: vec![],
    };
    let h = NetNs::create(&host).unwrap().persist();
    let pns = NetNs::create(&pod_ns).unwrap().persist();
    let h_nl = h.netlink().unwrap();
    h_nl.create_veth_into("nsftmig0", "nsftmigp", &pns.netlink().unwrap(), "eth0")
        .unwrap();
    let idx = h_nl.link_index("nsftmig0").unwrap();
    let mac = h_nl.link_mac("nsftmig0").unwrap();
    let mac = mac
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    let legacy = Path::new(STATE_ROOT).join(format!("netns-{}", h.inode()));
    c.dirs.push(legacy.clone());
    plant(&legacy, "mig", "10.77.1.1", "nsftmig0", idx, &pod_ns);
    let rec = legacy.join("mig.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&rec).unwrap()).unwrap();
    v["host_mac"] = serde_json::json!(mac);
    std::fs::write(&rec, v.to_string()).unwrap();

    let o = nsfast(&["pod", "list", "--host", &host]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("mig"),
        "{}",
        text(&o)
    );
    assert!(!legacy.exists(), "legacy state not moved");
    let o = nsfast(&["pod", "del", "mig", "--host", &host]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!h_nl.link_exists("nsftmig0").unwrap());
    assert!(
        !netns::list_named().contains(&pod_ns),
        "owned pod namespace kept"
    );
}

/// A new host namespace `<unique tag>-h` and a pod name `<...>-a` (its `-b` sibling too),
/// both removed (with every pod of the host) by the returned guard.
fn host_with_names(tag: &str) -> (Cleanup, String, String) {
    let p = unique(tag);
    let host = format!("{p}-h");
    let pod = format!("{p}-a");
    let c = Cleanup {
        hosts: vec![host.clone()],
        names: vec![pod.clone(), format!("{pod}-b")],
        dirs: vec![],
    };
    NetNs::create(&host).unwrap().persist();
    (c, host, pod)
}

/// The host's state directory of pod `pod` (exactly one).
fn state_dir_of(pod: &str) -> PathBuf {
    let d = state_dirs_with(pod);
    assert_eq!(d.len(), 1, "{d:?}");
    d.into_iter().next().unwrap()
}

/// Pod state is root's alone: directories 0700, the lock and records 0600, so another user
/// can neither read the records (addresses, namespaces, container IDs) nor take the lock and
/// stall every `pod add`, `pod del` and CNI ADD.
#[test]
fn pod_state_is_private_and_another_user_cannot_take_the_lock() {
    use std::os::unix::fs::PermissionsExt;
    require_root();
    let (_c, host, pod) = host_with_names("pp");
    // A state root made by someone else's `mkdir -p` (0755) is made private too.
    std::fs::create_dir_all(STATE_ROOT).unwrap();
    std::fs::set_permissions(STATE_ROOT, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = nsfast(&["pod", "add", &pod, "--ip", "10.78.1.5/24", "--host", &host]);
    assert!(o.status.success(), "{}", text(&o));
    let dir = state_dir_of(&pod);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    for d in [Path::new(STATE_ROOT), &dir] {
        assert_eq!(mode(d), 0o700, "{}", d.display());
    }
    let lock = dir.join(".lock");
    for f in [lock.clone(), dir.join(format!("{pod}.json"))] {
        assert_eq!(mode(&f), 0o600, "{}", f.display());
    }
    // User nobody tries to open the lock and a record (opening is what flock needs).
    use std::os::unix::process::CommandExt;
    for f in [lock.clone(), dir.join(format!("{pod}.json"))] {
        let o = std::process::Command::new("cat")
            .arg(&f)
            .uid(65534)
            .gid(65534)
            .output()
            .expect("run cat as nobody");
        assert!(
            !o.status.success(),
            "user nobody opened {}: {}",
            f.display(),
            text(&o)
        );
    }
}

/// A `pod add` waiting for a host lock that another process holds gives up at the bound
/// (NSFAST_LOCK_TIMEOUT_SECS) and at SIGTERM, naming the holder, and changes nothing.
#[test]
fn a_held_host_lock_is_waited_for_boundedly_and_sigterm_ends_the_wait() {
    use std::time::Duration;
    require_root();
    let (_c, host, pod) = host_with_names("pw");
    let second = format!("{pod}-b");
    let o = nsfast(&["pod", "add", &pod, "--ip", "10.78.2.5/24", "--host", &host]);
    assert!(o.status.success(), "{}", text(&o));
    let lock = state_dir_of(&pod).join(".lock");
    // The holder: this test process.
    let held = nsfast_sys::lockfile::lock_exclusive(
        nsfast_sys::lockfile::open_private(&lock).unwrap(),
        &lock,
        Duration::from_secs(5),
    )
    .expect("take the host lock");
    let holder_pid = std::process::id();
    let add = [
        "pod",
        "add",
        &second,
        "--ip",
        "10.78.2.6/24",
        "--host",
        &host,
    ];
    let spawn = |env: &[(&str, &str)]| {
        let mut c = std::process::Command::new(common::nsfast_bin());
        c.args(add)
            .env("RUST_LOG", "warn")
            .env_remove(nsfast_pod::pod::CRASH_ENV)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        c.spawn().unwrap()
    };
    // Waits up to `limit` for `child`, killing it then; whether it ended by itself.
    let finish = |mut child: std::process::Child, limit: Duration| {
        let ended = nsfast_lab::wait_or_kill(&mut child, limit).is_some();
        (ended, child.wait_with_output().unwrap())
    };
    // The bound.
    let (ended, o) = finish(
        spawn(&[("NSFAST_LOCK_TIMEOUT_SECS", "1")]),
        Duration::from_secs(10),
    );
    assert!(
        ended,
        "pod add with a 1 s lock bound still waiting after 10 s: {}",
        text(&o)
    );
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("held by pid {holder_pid} (")),
        "{}",
        text(&o)
    );
    // SIGTERM while waiting (default bound, 120 s).
    let child = spawn(&[]);
    std::thread::sleep(Duration::from_millis(700));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let (ended, o) = finish(child, Duration::from_secs(5));
    assert!(
        ended,
        "pod add still waiting 5 s after SIGTERM: {}",
        text(&o)
    );
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("SIGTERM") && err.contains("held by pid"),
        "{}",
        text(&o)
    );
    drop(held);
    // Nothing of the second pod was made.
    assert!(state_dirs_with(&second).is_empty());
    assert!(!netns::list_named().contains(&second));
}

/// `ip netns exec H nsfast pod add ...` runs nsfast in a mount namespace of its own, where the
/// pod's namespace bind mount and bpffs pins would vanish with the command: it is refused at
/// once, naming `--host` and `nsenter --net`, and nothing is left (no pod namespace, record,
/// device). Where iproute2's `ip` is missing (the VM guests' busybox), `unshare -m` makes the
/// same private mount namespace.
#[test]
fn pod_add_in_a_private_mount_namespace_is_refused_and_leaves_nothing() {
    require_root();
    let (_c, host, pod) = host_with_names("pm");
    let iproute2 = std::process::Command::new("ip")
        .arg("-V")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("iproute2"));
    let bin = common::nsfast_bin();
    let bin = bin.to_str().unwrap();
    let add = ["pod", "add", &pod, "--ip", "10.78.3.5/24"];
    let (runner, o) = if iproute2 {
        let mut a = vec!["netns", "exec", &host, bin];
        a.extend(add);
        (
            "ip netns exec",
            std::process::Command::new("ip").args(&a).output(),
        )
    } else {
        let mut a = vec!["-m", bin];
        a.extend(add);
        a.extend(["--host", &host]);
        (
            "unshare -m",
            std::process::Command::new("unshare").args(&a).output(),
        )
    };
    let o = o.unwrap_or_else(|e| panic!("run {runner}: {e}"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{runner} nsfast pod add: {}", text(&o));
    assert!(
        err.contains("--host") && err.contains("nsenter --net") && err.contains("mount namespace"),
        "{runner}: {}",
        text(&o)
    );
    assert!(!netns::list_named().contains(&pod), "pod namespace left");
    assert!(state_dirs_with(&pod).is_empty(), "record left");
    let devs = links(&host);
    assert!(devs.iter().all(|l| l == "lo"), "devices left: {devs:?}");
    let list = nsfast(&["pod", "list", "--host", &host, "--json"]);
    assert!(list.status.success(), "{}", text(&list));
    assert!(!String::from_utf8_lossy(&list.stdout).contains(&pod));
}
