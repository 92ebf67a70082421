//! Drives `nsfast-cni` exactly as a container runtime does: `CNI_*` environment, network
//! configuration on stdin, run inside a throwaway "host" namespace, with IPAM delegated to the
//! real `host-local` plugin (Debian's containernetworking-plugins, /usr/lib/cni), and compares
//! its result with the reference `ptp` plugin's. Needs root and containernetworking-plugins.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use nsfast_lab::require_root;
use nsfast_lab::topology::Topology as _;
use nsfast_lab::world::unique;
use nsfast_sys::netns::NetNs;
use serde_json::{json, Value};

fn cni_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_nsfast-cni"))
}

fn cni_path() -> String {
    let p = std::env::var("NSFAST_CNI_PATH").unwrap_or_else(|_| "/usr/lib/cni".into());
    let ptp = nsfast_lab::ptp::PtpSpec {
        pods_per_host: 1,
        cni_path: &p,
    };
    if let Err(why) = ptp.probe() {
        panic!("{why} (make deps)");
    }
    p
}

struct Out {
    ok: bool,
    json: Value,
    raw: String,
}

/// A host namespace, a host-local data directory and a network; removes every pod on the
/// host and the data directory on drop (also on panic), before the host namespace goes.
struct Rig {
    host: NetNs,
    data_dir: PathBuf,
    network: String,
    subnet_octet: u8,
    containers: Vec<NetNs>,
}

impl Rig {
    fn new() -> Self {
        require_root();
        let tag = unique("cni");
        let host = NetNs::create(&format!("{tag}-h")).expect("host netns");
        let data_dir = std::env::temp_dir().join(&tag);
        std::fs::create_dir_all(&data_dir).unwrap();
        // Each rig has its own host namespace and host-local store: subnets may repeat.
        let subnet_octet = 7;
        Self {
            host,
            data_dir,
            network: tag,
            subnet_octet,
            containers: Vec::new(),
        }
    }

    fn container(&mut self) -> String {
        let ns = NetNs::create(&unique("ctr")).expect("container netns");
        let p = ns.path().display().to_string();
        self.containers.push(ns);
        p
    }

    fn ipam(&self, sub: u8) -> Value {
        json!({
            "type": "host-local",
            "ranges": [[{"subnet": format!("10.{}.{}.0/24", 200 + sub, self.subnet_octet)}]],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": self.data_dir.display().to_string(),
        })
    }

    fn conf(&self, version: &str) -> Value {
        json!({
            "cniVersion": version,
            "name": self.network,
            "type": "nsfast-cni",
            "mode": "auto",
            "ipam": self.ipam(0),
        })
    }

    fn invoke(&self, bin: &PathBuf, cmd: &str, env: &[(&str, &str)], stdin: &[u8]) -> Out {
        let mut c = Command::new(bin);
        c.env("CNI_COMMAND", cmd)
            .env("CNI_PATH", cni_path())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        self.host.configure_command(&mut c, None);
        let mut child = c.spawn().expect("spawn plugin");
        {
            use std::io::Write;
            let mut i = child.stdin.take().unwrap();
            i.write_all(stdin).unwrap();
        }
        let o = child.wait_with_output().unwrap();
        let raw = String::from_utf8_lossy(&o.stdout).to_string();
        let json = serde_json::from_str(raw.trim()).unwrap_or(Value::Null);
        Out {
            ok: o.status.success(),
            json,
            raw: format!("{raw} / stderr: {}", String::from_utf8_lossy(&o.stderr)),
        }
    }

    fn run(&self, cmd: &str, ctr: &str, netns: &str, conf: &Value) -> Out {
        self.invoke(
            &cni_bin(),
            cmd,
            &[
                ("CNI_CONTAINERID", ctr),
                ("CNI_NETNS", netns),
                ("CNI_IFNAME", "eth0"),
            ],
            conf.to_string().as_bytes(),
        )
    }

    fn with_prev(conf: &Value, prev: &Value) -> Value {
        let mut c = conf.clone();
        c["prevResult"] = prev.clone();
        c
    }

    fn host_pods(&self) -> Vec<nsfast_pod::PodRecord> {
        nsfast_pod::Host::open(Some(self.host.name()))
            .unwrap()
            .records()
            .unwrap()
    }

    /// host-local's reservation files (one per address) for our network.
    fn reservations(&self) -> Vec<String> {
        std::fs::read_dir(self.data_dir.join(&self.network))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with("10."))
            .collect()
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Ok(h) = nsfast_pod::Host::open(Some(self.host.name())) {
            let _ = nsfast_pod::pod::remove_where(&h, |_| false);
        }
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

#[test]
fn add_check_add_twice_del_twice() {
    let mut rig = Rig::new();
    let netns = rig.container();
    let conf = rig.conf("1.1.0");
    let add = rig.run("ADD", "ctr-a", &netns, &conf);
    assert!(add.ok, "ADD failed: {}", add.raw);
    let r = &add.json;
    assert_eq!(r["cniVersion"], "1.1.0");
    let ifs = r["interfaces"].as_array().unwrap();
    assert_eq!(ifs.len(), 2);
    assert_eq!(ifs[1]["name"], "eth0");
    assert_eq!(ifs[1]["sandbox"], netns.as_str());
    let addr = r["ips"][0]["address"].as_str().unwrap().to_string();
    assert!(
        addr.starts_with(&format!("10.200.{}.", rig.subnet_octet)),
        "{addr}"
    );
    assert_eq!(r["ips"][0]["interface"], 1);
    assert_eq!(rig.reservations().len(), 1);
    // The pod is real: its address is on eth0 in the container's namespace.
    let ctr = NetNs::open(&netns).unwrap();
    let ctr_nl = ctr.netlink().unwrap();
    let have = ctr_nl.link_ipv4_addresses("eth0").unwrap();
    assert_eq!(format!("{}/{}", have[0].0, have[0].1), addr);

    let chk = rig.run("CHECK", "ctr-a", &netns, &Rig::with_prev(&conf, r));
    assert!(chk.ok, "CHECK failed: {}", chk.raw);

    // ADD twice: an error, and the first attachment is untouched (address still reserved).
    let again = rig.run("ADD", "ctr-a", &netns, &conf);
    assert!(!again.ok);
    assert_eq!(again.json["code"], 100, "{}", again.raw);
    assert!(again.json["msg"]
        .as_str()
        .unwrap()
        .contains("already has interface eth0"));
    assert_eq!(rig.reservations().len(), 1);
    assert!(
        rig.run("CHECK", "ctr-a", &netns, &Rig::with_prev(&conf, r))
            .ok
    );

    // DEL twice: both succeed; nothing left.
    for i in 0..2 {
        let del = rig.run("DEL", "ctr-a", &netns, &conf);
        assert!(del.ok, "DEL #{i}: {}", del.raw);
        assert!(
            del.raw.trim_start().starts_with('/'),
            "DEL prints nothing: {}",
            del.raw
        );
    }
    assert!(rig.host_pods().is_empty());
    assert!(rig.reservations().is_empty());
    let h = nsfast_pod::Host::open(Some(rig.host.name())).unwrap();
    assert!(!h.pin_dir().exists() && !h.state_dir().exists());
    assert!(!ctr_nl.link_exists("eth0").unwrap());
    // CHECK after DEL: unknown container.
    let chk = rig.run("CHECK", "ctr-a", &netns, &Rig::with_prev(&conf, r));
    assert!(!chk.ok);
    assert_eq!(chk.json["code"], 3, "{}", chk.raw);
}

#[test]
fn check_fails_after_manual_damage_and_del_still_cleans_up() {
    let mut rig = Rig::new();
    let netns = rig.container();
    let conf = rig.conf("1.0.0");
    let add = rig.run("ADD", "ctr-d", &netns, &conf);
    assert!(add.ok, "{}", add.raw);
    let pods = rig.host_pods();
    assert_eq!(pods.len(), 1);
    // Damage: someone deletes the host-side device (and with it the pair).
    rig.host
        .netlink()
        .unwrap()
        .delete_link(&pods[0].host_if)
        .unwrap();
    let chk = rig.run("CHECK", "ctr-d", &netns, &Rig::with_prev(&conf, &add.json));
    assert!(!chk.ok, "CHECK passed on a damaged attachment");
    assert_eq!(chk.json["code"], 101, "{}", chk.raw);
    assert!(
        chk.json["details"]
            .as_str()
            .unwrap()
            .contains(&pods[0].host_if),
        "{}",
        chk.raw
    );
    let del = rig.run("DEL", "ctr-d", &netns, &conf);
    assert!(del.ok, "{}", del.raw);
    assert!(rig.host_pods().is_empty());
    assert!(rig.reservations().is_empty());
}

#[test]
fn gc_removes_only_attachments_not_listed_as_valid() {
    let mut rig = Rig::new();
    let n1 = rig.container();
    let n2 = rig.container();
    let conf = rig.conf("1.1.0");
    assert!(rig.run("ADD", "ctr-keep", &n1, &conf).ok);
    let gone = rig.run("ADD", "ctr-gone", &n2, &conf);
    assert!(gone.ok, "{}", gone.raw);
    assert_eq!(rig.reservations().len(), 2);
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "ctr-keep", "ifname": "eth0"}]);
    let out = rig.invoke(&cni_bin(), "GC", &[], gc.to_string().as_bytes());
    assert!(out.ok, "GC: {}", out.raw);
    let pods = rig.host_pods();
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0].cni.as_ref().unwrap().container_id, "ctr-keep");
    assert_eq!(
        rig.reservations().len(),
        1,
        "the collected address was released"
    );
    let ctr2 = NetNs::open(&n2).unwrap();
    assert!(!ctr2.netlink().unwrap().link_exists("eth0").unwrap());
    assert!(rig.run("DEL", "ctr-keep", &n1, &conf).ok);
}

/// (stdin, environment, expected code, text the error must contain).
type Case<'a> = (Vec<u8>, Vec<(&'a str, &'a str)>, u64, &'a str);

#[test]
fn malformed_input_gets_cni_error_objects_and_changes_nothing() {
    let mut rig = Rig::new();
    let netns = rig.container();
    let conf = rig.conf("1.1.0");
    let bin = cni_bin();
    let env = [
        ("CNI_CONTAINERID", "ctr-m"),
        ("CNI_NETNS", netns.as_str()),
        ("CNI_IFNAME", "eth0"),
    ];
    let cases: Vec<Case> = vec![
        (b"{not json".to_vec(), env.to_vec(), 6, "decode"),
        (
            json!({"cniVersion": "1.1.0", "type": "nsfast-cni"})
                .to_string()
                .into_bytes(),
            env.to_vec(),
            7,
            "name",
        ),
        (
            json!({"cniVersion": "9.9.9", "name": "n", "type": "nsfast-cni", "ipam": rig.ipam(0)})
                .to_string()
                .into_bytes(),
            env.to_vec(),
            1,
            "9.9.9",
        ),
        (
            json!({"cniVersion": "1.1.0", "name": "n", "type": "nsfast-cni"})
                .to_string()
                .into_bytes(),
            env.to_vec(),
            7,
            "ipam",
        ),
        (
            {
                let mut c = conf.clone();
                c["mode"] = json!("tap");
                c.to_string().into_bytes()
            },
            env.to_vec(),
            7,
            "tap",
        ),
        (
            conf.to_string().into_bytes(),
            vec![("CNI_NETNS", netns.as_str()), ("CNI_IFNAME", "eth0")],
            4,
            "CNI_CONTAINERID",
        ),
        (
            conf.to_string().into_bytes(),
            vec![("CNI_CONTAINERID", "ctr-m"), ("CNI_NETNS", netns.as_str())],
            4,
            "CNI_IFNAME",
        ),
        (
            conf.to_string().into_bytes(),
            vec![
                ("CNI_CONTAINERID", "ctr-m"),
                ("CNI_NETNS", "/run/netns/nsft-no-such-ns"),
                ("CNI_IFNAME", "eth0"),
            ],
            4,
            "nsft-no-such-ns",
        ),
    ];
    for (stdin, env, code, needle) in cases {
        let out = rig.invoke(&bin, "ADD", &env, &stdin);
        assert!(!out.ok, "accepted: {}", out.raw);
        assert_eq!(out.json["code"], code, "{}", out.raw);
        let text = format!("{} {}", out.json["msg"], out.json["details"]);
        assert!(
            text.contains(needle),
            "error does not mention {needle}: {text}"
        );
        assert!(out.json["cniVersion"].is_string());
        assert!(rig.host_pods().is_empty());
        assert!(rig.reservations().is_empty());
    }
    // Unknown command.
    let out = rig.invoke(&bin, "FROB", &env, conf.to_string().as_bytes());
    assert_eq!(out.json["code"], 4, "{}", out.raw);
    // VERSION and STATUS.
    let out = rig.invoke(&bin, "VERSION", &[], br#"{"cniVersion":"1.1.0"}"#);
    assert!(out.ok);
    assert!(out.json["supportedVersions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|v| v == "1.1.0"));
    let out = rig.invoke(&bin, "STATUS", &[], conf.to_string().as_bytes());
    assert!(out.ok, "STATUS: {}", out.raw);
    let mut bad = conf.clone();
    bad["ipam"]["type"] = json!("no-such-ipam");
    let out = rig.invoke(&bin, "STATUS", &[], bad.to_string().as_bytes());
    assert_eq!(out.json["code"], 50, "{}", out.raw);
    // ADD with a missing IPAM plugin: a clear error, nothing made.
    let out = rig.invoke(&bin, "ADD", &env, bad.to_string().as_bytes());
    assert!(
        !out.ok && out.json["msg"].as_str().unwrap().contains("no-such-ipam"),
        "{}",
        out.raw
    );
    assert!(rig.host_pods().is_empty());
}

/// Same network, same IPAM: our result has the shape of the reference ptp plugin's.
#[test]
fn result_matches_the_reference_ptp_plugin() {
    let mut rig = Rig::new();
    let n_ours = rig.container();
    let n_ptp = rig.container();
    let ours = rig.conf("1.0.0");
    let mut ptp = json!({
        "cniVersion": "1.0.0",
        "name": rig.network,
        "type": "ptp",
        "ipam": rig.ipam(1),
    });
    let a = rig.run("ADD", "ctr-ours", &n_ours, &ours);
    assert!(a.ok, "{}", a.raw);
    let ptp_bin = PathBuf::from(cni_path()).join("ptp");
    let env = [
        ("CNI_CONTAINERID", "ctr-ptp"),
        ("CNI_NETNS", n_ptp.as_str()),
        ("CNI_IFNAME", "eth0"),
    ];
    let p = rig.invoke(&ptp_bin, "ADD", &env, ptp.to_string().as_bytes());
    assert!(p.ok, "ptp ADD: {}", p.raw);
    let keys = |v: &Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.retain(|k| k != "dns"); // ptp omits an empty dns
        k.sort();
        k
    };
    assert_eq!(
        keys(&a.json),
        keys(&p.json),
        "ours {} / ptp {}",
        a.json,
        p.json
    );
    assert_eq!(a.json["cniVersion"], p.json["cniVersion"]);
    let (ai, pi) = (
        a.json["interfaces"].as_array().unwrap(),
        p.json["interfaces"].as_array().unwrap(),
    );
    assert_eq!(ai.len(), pi.len());
    for (x, y) in ai.iter().zip(pi) {
        let mut kx: Vec<_> = x.as_object().unwrap().keys().collect();
        let mut ky: Vec<_> = y.as_object().unwrap().keys().collect();
        kx.sort();
        ky.sort();
        assert_eq!(kx, ky, "interface fields: ours {x} / ptp {y}");
    }
    assert_eq!(ai[1]["name"], pi[1]["name"]);
    assert_eq!(a.json["ips"][0]["interface"], p.json["ips"][0]["interface"]);
    for r in [&a.json, &p.json] {
        assert!(r["ips"][0]["address"].as_str().unwrap().ends_with("/24"));
        assert!(r["ips"][0]["gateway"].is_string());
    }
    ptp["prevResult"] = p.json.clone();
    assert!(
        rig.invoke(&ptp_bin, "DEL", &env, ptp.to_string().as_bytes())
            .ok
    );
    assert!(rig.run("DEL", "ctr-ours", &n_ours, &ours).ok);
}

/// Pods made by the plugin talk over the BPF path (pod -> pod counter grows).
#[test]
fn cni_pods_talk_over_the_bpf_path() {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    let mut rig = Rig::new();
    let (n1, n2) = (rig.container(), rig.container());
    let conf = rig.conf("1.1.0");
    let a = rig.run("ADD", "ctr-1", &n1, &conf);
    let b = rig.run("ADD", "ctr-2", &n2, &conf);
    assert!(a.ok && b.ok, "{} {}", a.raw, b.raw);
    let ip_b: std::net::Ipv4Addr = b.json["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let addr = SocketAddr::from((ip_b, 7100));
    let (ns1, ns2) = (NetNs::open(&n1).unwrap(), NetNs::open(&n2).unwrap());
    let l = ns2.run(|| TcpListener::bind(addr)).unwrap().unwrap();
    let srv = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).unwrap();
        s.write_all(&buf).unwrap();
    });
    let mut c = ns1
        .run(|| TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5)))
        .unwrap()
        .expect("connect pod to pod");
    c.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    c.write_all(b"hello").unwrap();
    let mut buf = [0u8; 5];
    c.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hello");
    srv.join().unwrap();
    let l = nsfast_pod::list(Some(rig.host.name())).unwrap();
    assert!(l.counters["pod_to_pod"] >= 6, "{:?}", l.counters);
    assert!(rig.run("DEL", "ctr-1", &n1, &conf).ok);
    assert!(rig.run("DEL", "ctr-2", &n2, &conf).ok);
}

/// The example conflist's plugin entry is a configuration the plugin accepts.
#[test]
fn example_conflist_is_accepted() {
    let rig = Rig::new();
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/cni/10-nsfast.conflist");
    let list: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    // CNI 1.1 version negotiation: `cniVersion` for older runtimes, `cniVersions` for newer
    // ones (they pick the highest they support); the plugin speaks every one of them.
    assert_eq!(list["cniVersion"], "1.0.0");
    assert_eq!(list["cniVersions"], json!(["1.0.0", "1.1.0"]));
    let version = rig.invoke(&cni_bin(), "VERSION", &[], br#"{"cniVersion":"1.1.0"}"#);
    for v in list["cniVersions"].as_array().unwrap() {
        assert!(
            version.json["supportedVersions"]
                .as_array()
                .unwrap()
                .contains(v),
            "{v} not in {}",
            version.raw
        );
    }
    for v in list["cniVersions"].as_array().unwrap() {
        let mut conf = list["plugins"][0].clone();
        conf["cniVersion"] = v.clone();
        conf["name"] = list["name"].clone();
        assert_eq!(conf["type"], "nsfast-cni");
        // The example logs to /var/log: this test's log goes to its own directory.
        assert_eq!(conf["logFile"], "/var/log/nsfast-cni.log");
        let log = rig.data_dir.join("example.log");
        conf["logFile"] = json!(log.display().to_string());
        let out = rig.invoke(&cni_bin(), "STATUS", &[], conf.to_string().as_bytes());
        assert!(out.ok, "STATUS with {} at {v}: {}", p.display(), out.raw);
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            text.lines().last().is_some_and(
                |l| l.contains(" INFO STATUS network \"nsfast\"") && l.ends_with(": ok")
            ),
            "{text}"
        );
    }
}

/// The `cni-ptp` bench baseline: ptp pods on two hosts reach each other over the wire, and
/// everything is gone after drop.
#[test]
fn ptp_reference_topology_connects_and_cleans_up() {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    require_root();
    let prefix = unique("rp");
    let names;
    {
        let t = nsfast_lab::ptp::PtpSpec {
            pods_per_host: 1,
            cni_path: &cni_path(),
        }
        .expect_built(&prefix);
        let (a, b) = (t.pod(0, 0), t.pod(1, 0));
        let addr = SocketAddr::from((b.ip, 7200));
        let l = b.netns.run(|| TcpListener::bind(addr)).unwrap().unwrap();
        let srv = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).unwrap();
            s.write_all(&buf).unwrap();
        });
        let mut c = a
            .netns
            .run(|| TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5)))
            .unwrap()
            .expect("ptp pod to remote ptp pod");
        c.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        c.write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        c.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");
        srv.join().unwrap();
        names = [t.hosts[0].name().to_string(), a.netns.name().to_string()];
    }
    let left = nsfast_sys::netns::list_named();
    for n in names {
        assert!(!left.contains(&n), "{n} left behind");
    }
    assert!(!std::env::temp_dir().join(format!("{prefix}-ipam")).exists());
}

/// `logFile` / `logLevel` (runtimes swallow stderr): the real plugin appends one line per
/// command outcome to the file, at the configured level; a bad level is refused naming it,
/// before anything is changed.
#[test]
fn log_file_gets_each_commands_lines_at_its_level() {
    use std::os::unix::fs::PermissionsExt;
    let mut rig = Rig::new();
    let n = rig.container();
    let log = rig.data_dir.join("nsfast-cni.log");
    let mut conf = rig.conf("1.0.0");
    conf["logFile"] = json!(log.display().to_string());
    conf["logLevel"] = json!("info");
    let add = rig.run("ADD", "ctr-log", &n, &conf);
    assert!(add.ok, "{}", add.raw);
    assert_eq!(add.json["cniVersion"], "1.0.0", "{}", add.raw);
    let mut bad_mode = conf.clone();
    bad_mode["mode"] = json!("bogus");
    let out = rig.run("ADD", "ctr-log2", &n, &bad_mode);
    assert!(!out.ok && out.json["code"] == 7, "{}", out.raw);
    let del = rig.run("DEL", "ctr-log", &n, &conf);
    assert!(del.ok, "{}", del.raw);

    let mode = std::fs::metadata(&log)
        .expect("log file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o600);
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let net = format!("network {:?}", rig.network);
    let find = |level: &str, what: &str| {
        lines
            .iter()
            .position(|l| l.contains(level) && l.contains(what) && l.contains(&net))
            .unwrap_or_else(|| {
                panic!(
                    "no {level} line with {what:?} in {}:\n{text}",
                    log.display()
                )
            })
    };
    let a = find(" INFO ", "ADD container ctr-log ifname eth0");
    let e = find(" ERROR ", "ADD container ctr-log2 ifname eth0");
    let d = find(" INFO ", "DEL container ctr-log ifname eth0");
    assert!(a < e && e < d, "out of order:\n{text}");
    assert!(lines[a].ends_with(": ok"), "{}", lines[a]);
    assert!(
        lines[e].contains("error 7: invalid \"mode\" \"bogus\""),
        "{}",
        lines[e]
    );
    assert!(
        !text.contains("DEBUG"),
        "debug lines at logLevel info:\n{text}"
    );
    assert!(
        !text.contains('\x1b'),
        "colour codes in the log file:\n{text}"
    );

    // logLevel error: successes leave no line, errors do.
    conf["logLevel"] = json!("error");
    bad_mode["logLevel"] = json!("error");
    let before = lines.len();
    let status = rig.invoke(&cni_bin(), "STATUS", &[], conf.to_string().as_bytes());
    assert!(status.ok, "{}", status.raw);
    assert!(!rig.run("ADD", "ctr-log3", &n, &bad_mode).ok);
    let text = std::fs::read_to_string(&log).unwrap();
    let new: Vec<&str> = text.lines().skip(before).collect();
    assert_eq!(new.len(), 1, "{new:?}");
    assert!(
        new[0].contains(" ERROR ") && new[0].contains("ADD container ctr-log3"),
        "{new:?}"
    );

    // A bad level or a relative path: error 7 naming it, nothing made, no file written.
    let other = rig.data_dir.join("other.log");
    for (key, value, named) in [
        ("logLevel", json!("verbose"), "\"verbose\""),
        ("logFile", json!("relative.log"), "\"relative.log\""),
    ] {
        let mut c = conf.clone();
        c["logFile"] = json!(other.display().to_string());
        c[key] = value;
        let out = rig.run("ADD", "ctr-log4", &n, &c);
        assert!(!out.ok && out.json["code"] == 7, "{}", out.raw);
        let msg = out.json["msg"].as_str().unwrap_or_default();
        assert!(msg.contains(key) && msg.contains(named), "{}", out.raw);
        assert!(!other.exists(), "{key}: a log file was written");
    }
    assert!(rig.host_pods().is_empty(), "{:?}", rig.host_pods());
}
