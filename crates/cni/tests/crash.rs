//! Fault injection and races on `nsfast-cni`, driven as a runtime drives it (`CNI_*`
//! environment, configuration on stdin, inside a throwaway host namespace, real `host-local`
//! IPAM with a per-test data directory): SIGKILL after every ADD step then DEL / ADD with the
//! same IDs, concurrent ADDs, ADD racing DEL, DEL and GC that must leave pods alone, bounded
//! stdin, and the about text without CNI_COMMAND. Needs root and containernetworking-plugins.
//! `NSFAST_CNI_BIN` runs another build of the plugin (e.g. an older one, to see these fail).

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nsfast_lab::require_root;
use nsfast_lab::world::unique;
use nsfast_sys::netns::NetNs;
use serde_json::{json, Value};

fn cni_bin() -> PathBuf {
    std::env::var_os("NSFAST_CNI_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_nsfast-cni")))
}

fn cni_path() -> String {
    let p = std::env::var("NSFAST_CNI_PATH").unwrap_or_else(|_| "/usr/lib/cni".into());
    assert!(
        PathBuf::from(&p).join("host-local").is_file(),
        "host-local not found in {p}: apt-get install containernetworking-plugins (make deps)"
    );
    p
}

#[derive(Debug)]
struct Out {
    ok: bool,
    signal: Option<i32>,
    json: Value,
    raw: String,
}

fn out_of(o: std::process::Output) -> Out {
    let raw = String::from_utf8_lossy(&o.stdout).to_string();
    Out {
        ok: o.status.success(),
        signal: o.status.signal(),
        json: serde_json::from_str(raw.trim()).unwrap_or(Value::Null),
        raw: format!("{raw} / stderr: {}", String::from_utf8_lossy(&o.stderr)),
    }
}

/// A host namespace, a host-local data directory, a network, container namespaces; on drop
/// (also on panic) every pod of the host, the data directory and the namespaces go.
struct Rig {
    host: NetNs,
    data_dir: PathBuf,
    network: String,
    containers: Vec<NetNs>,
}

impl Rig {
    fn new() -> Self {
        require_root();
        let tag = unique("cc");
        let host = NetNs::create(&format!("{tag}-h")).expect("host netns");
        let data_dir = std::env::temp_dir().join(&tag);
        std::fs::create_dir_all(&data_dir).unwrap();
        Self {
            host,
            data_dir,
            network: tag,
            containers: Vec::new(),
        }
    }

    fn container(&mut self) -> String {
        let ns = NetNs::create(&unique("cctr")).expect("container netns");
        let p = ns.path().display().to_string();
        self.containers.push(ns);
        p
    }

    fn conf(&self) -> Value {
        json!({
            "cniVersion": "1.1.0",
            "name": self.network,
            "type": "nsfast-cni",
            "mode": "auto",
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": "10.203.7.0/24"}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": self.data_dir.display().to_string(),
            },
        })
    }

    fn command(&self, cmd: &str, env: &[(&str, &str)]) -> Command {
        let mut c = Command::new(cni_bin());
        c.env("CNI_PATH", cni_path())
            .env("RUST_LOG", "warn")
            .env_remove("CNI_COMMAND")
            .env_remove(nsfast_pod::pod::CRASH_ENV)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if !cmd.is_empty() {
            c.env("CNI_COMMAND", cmd);
        }
        for (k, v) in env {
            c.env(k, v);
        }
        self.host.configure_command(&mut c, None);
        c
    }

    fn spawn(&self, cmd: &str, env: &[(&str, &str)], stdin: &[u8]) -> Child {
        let mut child = self.command(cmd, env).spawn().expect("spawn plugin");
        let mut i = child.stdin.take().unwrap();
        let _ = i.write_all(stdin);
        child
    }

    fn invoke(&self, cmd: &str, env: &[(&str, &str)], stdin: &[u8]) -> Out {
        out_of(self.spawn(cmd, env, stdin).wait_with_output().unwrap())
    }

    fn ids<'a>(ctr: &'a str, netns: &'a str) -> [(&'a str, &'a str); 3] {
        [
            ("CNI_CONTAINERID", ctr),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", "eth0"),
        ]
    }

    fn run(&self, cmd: &str, ctr: &str, netns: &str) -> Out {
        self.invoke(
            cmd,
            &Self::ids(ctr, netns),
            self.conf().to_string().as_bytes(),
        )
    }

    /// The host's state and pin directories, found on disk by the host's inode (whatever key
    /// format wrote them; opening a `Host` here could move state an older build wrote).
    fn state_dirs(&self) -> Vec<PathBuf> {
        let ino = self.host.inode();
        let mut v = Vec::new();
        for root in [
            PathBuf::from(nsfast_pod::state::STATE_ROOT),
            nsfast_pod::state::bpffs_root().join(nsfast_pod::state::PIN_SUBDIR),
        ] {
            for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if nsfast_pod::state::parse_key(&n).is_some_and(|(_, i)| i == ino) {
                    v.push(e.path());
                }
            }
        }
        v
    }

    /// Pod records of the host, with their paths.
    fn records(&self) -> Vec<(PathBuf, nsfast_pod::PodRecord)> {
        let mut v = Vec::new();
        for d in self.state_dirs() {
            for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "json") {
                    let r = nsfast_pod::state::parse_record(&std::fs::read(&p).unwrap()).unwrap();
                    v.push((p, r));
                }
            }
        }
        v
    }

    fn pods(&self) -> Vec<nsfast_pod::PodRecord> {
        self.records().into_iter().map(|(_, r)| r).collect()
    }

    /// host-local's reservation files (one per address) for our network.
    fn reservations(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.data_dir.join(&self.network))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with("10."))
            .collect();
        v.sort();
        v
    }

    /// Nothing of any pod is left: records, state and pin directories (and with them the
    /// endpoint map and link pins), devices on the host and in `ctr_netns`, leases.
    fn assert_clean(&self, ctr_netns: &str, when: &str) {
        assert!(
            self.pods().is_empty(),
            "{when}: records left: {:?}",
            self.pods()
        );
        assert!(
            self.state_dirs().is_empty(),
            "{when}: state or pins left: {:?}",
            self.state_dirs()
        );
        assert_eq!(
            nsfast_lab::world::link_names(self.host.name()),
            ["lo"],
            "{when}: host devices"
        );
        let ctr = NetNs::open(ctr_netns).unwrap();
        assert!(
            !ctr.netlink().unwrap().link_exists("eth0").unwrap(),
            "{when}: eth0 left in the container"
        );
        assert!(
            self.reservations().is_empty(),
            "{when}: leases left: {:?}",
            self.reservations()
        );
    }

    fn assert_one_pod(&self, ctr: &str, ctr_netns: &str, add: &Out, when: &str) {
        let pods = self.pods();
        assert_eq!(pods.len(), 1, "{when}: {pods:?}");
        let p = &pods[0];
        assert!(!p.pending, "{when}: pod still pending");
        assert_eq!(p.cni.as_ref().unwrap().container_id, ctr);
        let addr = add.json["ips"][0]["address"].as_str().unwrap();
        assert_eq!(format!("{}/{}", p.ip, p.prefix), addr, "{when}");
        assert_eq!(
            self.reservations(),
            [p.ip.to_string()],
            "{when}: the pod's lease"
        );
        let ctr_ns = NetNs::open(ctr_netns).unwrap();
        let have = ctr_ns
            .netlink()
            .unwrap()
            .link_ipv4_addresses("eth0")
            .unwrap();
        assert_eq!(have, [(p.ip, p.prefix)], "{when}");
        let mut conf = self.conf();
        conf["prevResult"] = add.json.clone();
        let chk = self.invoke(
            "CHECK",
            &Self::ids(ctr, ctr_netns),
            conf.to_string().as_bytes(),
        );
        assert!(chk.ok, "{when}: CHECK {}", chk.raw);
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Ok(h) = nsfast_pod::Host::open(Some(self.host.name())) {
            let _ = nsfast_pod::pod::remove_where(&h, |_| false);
        }
        // What an older build left under its own key: this host is ours, so is its state.
        for d in self.state_dirs() {
            let _ = std::fs::remove_dir_all(d);
        }
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// SIGKILL right after each step of ADD (the plugin's test hook), then: DEL with the same IDs
/// succeeds and nothing is left; killed again, a retried ADD succeeds and makes a whole pod
/// (after the last step the pod is complete: the retry is refused as any second ADD is, and
/// DEL + ADD works); its DEL leaves nothing.
#[test]
fn sigkill_after_each_add_step_then_del_and_add_succeed_and_nothing_is_left() {
    let mut rig = Rig::new();
    let netns = rig.container();
    let conf = rig.conf().to_string();
    let steps: Vec<&str> = nsfast_pod::pod::ADD_STEPS
        .iter()
        .copied()
        .filter(|s| *s != "netns") // CNI pods live in the runtime's namespace
        .collect();
    assert!(steps.len() >= 8, "{steps:?}");
    for (i, step) in steps.iter().enumerate() {
        let ctr = format!("ctr-kill-{i}");
        let ids = Rig::ids(&ctr, &netns);
        let mut env = ids.to_vec();
        env.push((nsfast_pod::pod::CRASH_ENV, step));
        let killed = rig.invoke("ADD", &env, conf.as_bytes());
        assert_eq!(
            killed.signal,
            Some(9),
            "ADD not killed after {step}: {}",
            killed.raw
        );
        let del = rig.invoke("DEL", &ids, conf.as_bytes());
        assert!(del.ok, "DEL after a kill at {step}: {}", del.raw);
        rig.assert_clean(&netns, &format!("DEL after a kill at {step}"));

        let killed = rig.invoke("ADD", &env, conf.as_bytes());
        assert_eq!(
            killed.signal,
            Some(9),
            "second kill at {step}: {}",
            killed.raw
        );
        let mut add = rig.invoke("ADD", &ids, conf.as_bytes());
        if *step == "record" {
            // The pod was complete, only the result was lost: a second ADD is refused as
            // ever (the spec forbids it), the pod is intact, and DEL + ADD works.
            assert_eq!(add.json["code"], 100, "{}", add.raw);
            assert!(rig.pods().iter().all(|p| !p.pending));
            assert_eq!(rig.reservations().len(), 1);
            assert!(rig.invoke("DEL", &ids, conf.as_bytes()).ok);
            rig.assert_clean(&netns, "DEL of a complete pod whose ADD was killed");
            add = rig.invoke("ADD", &ids, conf.as_bytes());
        }
        assert!(add.ok, "ADD after a kill at {step}: {}", add.raw);
        rig.assert_one_pod(&ctr, &netns, &add, &format!("ADD after a kill at {step}"));
        let del = rig.invoke("DEL", &ids, conf.as_bytes());
        assert!(del.ok, "DEL #2 at {step}: {}", del.raw);
        rig.assert_clean(&netns, &format!("ADD+DEL after a kill at {step}"));
    }
}

/// A killed ADD's leftovers are collected by GC when the attachment is not listed as valid.
#[test]
fn gc_undoes_a_killed_add() {
    let mut rig = Rig::new();
    let netns = rig.container();
    let mut env = Rig::ids("ctr-gc", &netns).to_vec();
    env.push((nsfast_pod::pod::CRASH_ENV, "endpoint"));
    let killed = rig.invoke("ADD", &env, rig.conf().to_string().as_bytes());
    assert_eq!(killed.signal, Some(9), "{}", killed.raw);
    assert_eq!(rig.pods().len(), 1, "the intent record is there");
    let mut gc = rig.conf();
    gc["cni.dev/valid-attachments"] = json!([]);
    let out = rig.invoke("GC", &[], gc.to_string().as_bytes());
    assert!(out.ok, "GC: {}", out.raw);
    rig.assert_clean(&netns, "GC after a kill");
}

/// Concurrent ADDs of different containers all succeed with distinct addresses.
#[test]
fn concurrent_adds_for_different_containers_get_distinct_addresses() {
    let mut rig = Rig::new();
    let nss: Vec<String> = (0..4).map(|_| rig.container()).collect();
    let conf = rig.conf().to_string();
    let children: Vec<Child> = nss
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let ctr = format!("ctr-par-{i}");
            rig.spawn("ADD", &Rig::ids(&ctr, n), conf.as_bytes())
        })
        .collect();
    let outs: Vec<Out> = children
        .into_iter()
        .map(|c| out_of(c.wait_with_output().unwrap()))
        .collect();
    let mut ips = Vec::new();
    for o in &outs {
        assert!(o.ok, "concurrent ADD: {}", o.raw);
        ips.push(o.json["ips"][0]["address"].as_str().unwrap().to_string());
    }
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 4, "{ips:?}");
    assert_eq!(rig.reservations().len(), 4);
    assert!(rig.pods().iter().all(|p| !p.pending));
    for (i, n) in nss.iter().enumerate() {
        assert!(rig.run("DEL", &format!("ctr-par-{i}"), n).ok);
    }
    assert!(rig.reservations().is_empty());
}

/// Concurrent ADDs of the same attachment: one wins, the others are refused (already exists),
/// and the winner keeps its lease (a loser must not release it).
#[test]
fn concurrent_adds_of_one_attachment_keep_the_winners_lease() {
    let mut rig = Rig::new();
    let netns = rig.container();
    let conf = rig.conf().to_string();
    for round in 0..3 {
        let ids = Rig::ids("ctr-same", &netns);
        let children: Vec<Child> = (0..3)
            .map(|_| rig.spawn("ADD", &ids, conf.as_bytes()))
            .collect();
        let outs: Vec<Out> = children
            .into_iter()
            .map(|c| out_of(c.wait_with_output().unwrap()))
            .collect();
        let wins: Vec<&Out> = outs.iter().filter(|o| o.ok).collect();
        assert_eq!(wins.len(), 1, "round {round}: {outs:#?}");
        for o in outs.iter().filter(|o| !o.ok) {
            assert_eq!(o.json["code"], 100, "round {round}: {}", o.raw);
        }
        rig.assert_one_pod("ctr-same", &netns, wins[0], &format!("round {round}"));
        assert!(rig.run("DEL", "ctr-same", &netns).ok);
        rig.assert_clean(&netns, &format!("round {round}"));
    }
}

/// ADD racing DEL of the same attachment ends consistent: a whole pod with its lease, or
/// nothing at all; a final DEL leaves nothing.
#[test]
fn add_racing_del_ends_consistent() {
    let mut rig = Rig::new();
    let netns = rig.container();
    let conf = rig.conf().to_string();
    for round in 0..6 {
        let ids = Rig::ids("ctr-race", &netns);
        let (first, second) = if round % 2 == 0 {
            ("ADD", "DEL")
        } else {
            ("DEL", "ADD")
        };
        let a = rig.spawn(first, &ids, conf.as_bytes());
        let b = rig.spawn(second, &ids, conf.as_bytes());
        let (oa, ob) = (
            out_of(a.wait_with_output().unwrap()),
            out_of(b.wait_with_output().unwrap()),
        );
        let (add, del) = if first == "ADD" { (oa, ob) } else { (ob, oa) };
        assert!(del.ok, "round {round}: DEL {}", del.raw);
        assert!(add.ok, "round {round}: ADD {}", add.raw);
        let when = format!("round {round} ({first} first)");
        if rig.pods().is_empty() {
            rig.assert_clean(&netns, &when);
        } else {
            rig.assert_one_pod("ctr-race", &netns, &add, &when);
        }
        assert!(rig.run("DEL", "ctr-race", &netns).ok);
        rig.assert_clean(&netns, &when);
    }
}

/// DEL of another attachment leaves a pod alone: a DEL with another container ID, and a DEL
/// whose derived pod name is taken by a pod of another identity (a record of another
/// container, and a pod made with `nsfast pod add` under that name).
#[test]
fn del_with_another_attachments_ids_leaves_the_pod() {
    let mut rig = Rig::new();
    let netns = rig.container();
    let add = rig.run("ADD", "ctr-a", &netns);
    assert!(add.ok, "{}", add.raw);
    let del = rig.run("DEL", "ctr-b", &netns);
    assert!(del.ok, "{}", del.raw);
    rig.assert_one_pod("ctr-a", &netns, &add, "DEL of ctr-b");

    // The record says another container owns this pod name.
    let (path, mut r) = rig.records().remove(0);
    r.cni.as_mut().unwrap().container_id = "ctr-other".into();
    std::fs::write(&path, serde_json::to_vec(&r).unwrap()).unwrap();
    let del = rig.run("DEL", "ctr-a", &netns);
    assert!(del.ok, "{}", del.raw);
    let pods = rig.pods();
    assert_eq!(pods.len(), 1, "DEL removed another container's pod");
    assert!(rig
        .host
        .netlink()
        .unwrap()
        .link_exists(&pods[0].host_if)
        .unwrap());
    r.cni.as_mut().unwrap().container_id = "ctr-a".into();
    std::fs::write(&path, serde_json::to_vec(&r).unwrap()).unwrap();
    assert!(rig.run("DEL", "ctr-a", &netns).ok);
    assert!(rig.pods().is_empty());

    // A pod made by `nsfast pod add` with the name a CNI attachment would get.
    let name = nsfast_cni::plugin::pod_name(&rig.network, "ctr-x", "eth0");
    let mut o = nsfast_pod::AddOptions::new(&name, "10.203.9.9/24".parse().unwrap());
    o.host = Some(rig.host.name().to_string());
    nsfast_pod::add(&o).expect("pod add");
    let del = rig.run("DEL", "ctr-x", &netns);
    assert!(del.ok, "{}", del.raw);
    let pods = rig.pods();
    assert_eq!(pods.len(), 1, "CNI DEL removed a pod it did not make");
    assert_eq!(pods[0].name, name);
    assert!(nsfast_pod::del(&name, Some(rig.host.name()))
        .unwrap()
        .is_some());
}

/// GC without `cni.dev/valid-attachments` collects nothing (and says so).
#[test]
fn gc_without_valid_attachments_collects_nothing() {
    let mut rig = Rig::new();
    let (n1, n2) = (rig.container(), rig.container());
    assert!(rig.run("ADD", "ctr-1", &n1).ok);
    assert!(rig.run("ADD", "ctr-2", &n2).ok);
    let out = rig.invoke("GC", &[], rig.conf().to_string().as_bytes());
    assert!(out.ok, "GC: {}", out.raw);
    assert_eq!(rig.pods().len(), 2, "GC without a list removed pods");
    assert_eq!(rig.reservations().len(), 2);
    assert!(out.raw.contains("nothing collected"), "{}", out.raw);
    assert!(rig.run("DEL", "ctr-1", &n1).ok);
    assert!(rig.run("DEL", "ctr-2", &n2).ok);
}

/// Waits for `child` to exit within `limit`; kills it (and fails) otherwise.
fn wait_bounded(mut child: Child, limit: Duration, what: &str) -> Out {
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return out_of(child.wait_with_output().unwrap());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "{what}: still running after {limit:?} (killed): {}",
                String::from_utf8_lossy(&o.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// More than 1 MiB on stdin: a CNI error naming the limit, nothing made, and the plugin stops
/// reading (it answers although the writer never closes stdin).
#[test]
fn stdin_over_one_mib_is_refused_and_changes_nothing() {
    let mut rig = Rig::new();
    let netns = rig.container();
    let mut conf = rig.conf();
    conf["pad"] = json!(" ".repeat(2 << 20));
    let body = conf.to_string();
    let mut child = rig
        .command("ADD", &Rig::ids("ctr-big", &netns))
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let _ = stdin.write_all(body.as_bytes()); // EPIPE once the plugin stops reading
    let out = wait_bounded(child, Duration::from_secs(20), "ADD with 2 MiB on stdin");
    drop(stdin);
    assert!(!out.ok, "{}", out.raw);
    assert_eq!(out.json["code"], 7, "{}", out.raw);
    assert!(
        out.json["msg"].as_str().unwrap().contains("1048576"),
        "{}",
        out.raw
    );
    assert!(rig.pods().is_empty());
    assert!(rig.reservations().is_empty());
}

/// Without CNI_COMMAND: the about text and exit 0, without reading stdin (an open pipe that
/// never closes).
#[test]
fn no_cni_command_prints_about_without_reading_stdin() {
    let rig = Rig::new();
    let mut child = rig.command("", &[]).spawn().unwrap();
    let stdin = child.stdin.take().unwrap(); // held open, never written
    let out = wait_bounded(
        child,
        Duration::from_secs(10),
        "nsfast-cni without CNI_COMMAND",
    );
    drop(stdin);
    assert!(out.ok, "{}", out.raw);
    let text = out.raw.split(" / stderr:").next().unwrap();
    assert!(text.starts_with("CNI nsfast plugin v"), "{text}");
    assert!(
        text.contains("CNI protocol versions supported: 0.4.0, 1.0.0, 1.1.0"),
        "{text}"
    );
}

/// VERSION with a closed stdout ends quietly (no panic, exit code not 101).
#[test]
fn version_with_a_closed_stdout_does_not_panic() {
    let rig = Rig::new();
    let (rd, wr) = nix::unistd::pipe().unwrap();
    drop(rd);
    let mut c = rig.command("VERSION", &[]);
    c.stdout(Stdio::from(wr));
    let mut child = c.spawn().unwrap();
    drop(child.stdin.take());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(101), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// CNI_NETNS naming a file that is not a network namespace is refused, naming it.
#[test]
fn cni_netns_that_is_not_a_namespace_is_refused() {
    let rig = Rig::new();
    let out = rig.run("ADD", "ctr-p", "/etc/passwd");
    assert!(!out.ok);
    assert_eq!(out.json["code"], 4, "{}", out.raw);
    let text = format!("{} {}", out.json["msg"], out.json["details"]);
    assert!(
        text.contains("/etc/passwd") && text.contains("not a network namespace"),
        "{text}"
    );
    assert!(rig.pods().is_empty());
    assert!(rig.reservations().is_empty());
}

/// CNI_NETNS naming a FIFO (a path another user may have planted) is refused at once: the
/// plugin never opens it for reading, which would block until a writer came.
#[test]
fn cni_netns_that_is_a_fifo_is_refused_without_blocking() {
    use std::time::Duration;
    let rig = Rig::new();
    let dir = std::env::temp_dir().join(format!("nsfast-cni-fifo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("netns");
    let _ = std::fs::remove_file(&fifo);
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    let f = fifo.display().to_string();
    let mut child = rig.spawn(
        "ADD",
        &Rig::ids("ctr-fifo", &f),
        rig.conf().to_string().as_bytes(),
    );
    let ended = nsfast_lab::wait_or_kill(&mut child, Duration::from_secs(10)).is_some();
    let out = out_of(child.wait_with_output().unwrap());
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ended, "ADD with CNI_NETNS={f} still running after 10 s");
    assert!(!out.ok);
    assert_eq!(out.json["code"], 4, "{}", out.raw);
    let text = format!("{} {}", out.json["msg"], out.json["details"]);
    assert!(
        text.contains(&f) && text.contains("not a network namespace"),
        "{text}"
    );
    assert!(rig.pods().is_empty());
    assert!(rig.reservations().is_empty());
}

/// GC also removes the state a dead host namespace with this host's inode left (the kernel
/// reuses inodes), without touching this host's device of the same name.
#[test]
fn gc_removes_stale_state_of_a_dead_host_with_this_inode() {
    let rig = Rig::new();
    let host_nl = rig.host.netlink().unwrap();
    host_nl
        .create_veth("nsftold0", &host_nl, "nsftold1")
        .unwrap();
    let key = format!("cookie-1-ino-{}", rig.host.inode());
    let dir = PathBuf::from(nsfast_pod::state::STATE_ROOT).join(&key);
    std::fs::create_dir_all(&dir).unwrap();
    let r = json!({
        "name": "old-a", "ip": "10.203.7.9", "prefix": 24, "gateway": "169.254.1.1",
        "datapath": "veth", "host": "current", "netns": "/run/netns/gone", "netns_owned": false,
        "host_if": "nsftold0", "host_ifindex": 2, "pod_if": "eth0", "pod_mac": "",
        "host_mac": "", "attach": "tcx", "link_pins": [],
        "cni": {"container_id": "ctr-old", "network": rig.network, "ifname": "eth0"},
    });
    std::fs::write(dir.join("old-a.json"), r.to_string()).unwrap();
    let mut gc = rig.conf();
    gc["cni.dev/valid-attachments"] = json!([]);
    let out = rig.invoke("GC", &[], gc.to_string().as_bytes());
    let left = dir.exists();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.ok, "GC: {}", out.raw);
    assert!(!left, "stale state {} left", dir.display());
    assert!(host_nl.link_exists("nsftold0").unwrap());
}
