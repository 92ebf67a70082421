//! Root tests of `nsfast policy`: apply (YAML, JSON, standard input), list, delete and
//! namespace labels on a throwaway host namespace; bad input exits 2 naming the value and
//! changes nothing; a `policy apply` SIGKILLed at each step leaves the old generation or
//! the new one, and the next command cleans up; `pod add --namespace/--label/--named-port`
//! shows in `pod list -j` and in the pods a policy selects. Run as root.

mod common;
use common::{nsfast, nsfast_env, nsfast_ok, nsfast_stdin, text};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;

use nsfast_lab::require_root;
use nsfast_lab::world::unique;
use nsfast_pod::policy::{POLICY_ROOT, POLICY_STEPS};
use nsfast_sys::netns::{self, NetNs};

/// A throwaway host namespace; its pods, policies and the namespace go on drop.
struct TestHost {
    name: String,
    dir: PathBuf,
    pods: Vec<String>,
}

impl TestHost {
    fn new() -> Self {
        let name = unique("ph");
        NetNs::create(&name).unwrap().persist();
        let key = nsfast_pod::Host::open(Some(&name)).unwrap().key;
        Self {
            name,
            dir: PathBuf::from(POLICY_ROOT).join(key),
            pods: Vec::new(),
        }
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        let _ = nsfast(&["pod", "del", "--all", "--host", &self.name]);
        for p in &self.pods {
            let _ = netns::delete_named(p);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir(POLICY_ROOT);
        let _ = std::fs::remove_dir("/run/nsfast");
        let _ = netns::delete_named(&self.name);
    }
}

fn list(host: &str) -> serde_json::Value {
    serde_json::from_str(&nsfast_ok(&["-j", "policy", "list", "--host", host])).unwrap()
}

fn names(v: &serde_json::Value) -> Vec<String> {
    v["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{}/{}",
                p["metadata"]["namespace"].as_str().unwrap(),
                p["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

const WEB: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {team: a}}}]
    ports: [{port: http}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
"#;

#[test]
fn apply_list_delete_and_namespace_labels() {
    require_root();
    let h = TestHost::new();
    let host = h.name.as_str();
    assert_eq!(list(host)["generation"], 0);
    let file = std::env::temp_dir().join(format!("{}.yaml", unique("pol")));
    std::fs::write(&file, WEB).unwrap();
    let out = nsfast_ok(&[
        "policy",
        "apply",
        "-f",
        file.to_str().unwrap(),
        "--host",
        host,
    ]);
    std::fs::remove_file(&file).unwrap();
    assert!(out.contains("networkpolicy shop/web created"), "{out}");
    assert!(
        out.contains("networkpolicy default/deny-all created"),
        "{out}"
    );
    let v = list(host);
    assert_eq!(v["generation"], 1, "{v}");
    assert_eq!(names(&v), ["default/deny-all", "shop/web"]);
    // The objects come back in the schema, as applied.
    assert_eq!(v["policies"][1]["kind"], "NetworkPolicy");
    assert_eq!(
        v["policies"][1]["spec"]["ingress"][0]["ports"][0]["port"],
        "http"
    );

    // The same again from stdin changes nothing; a changed object is configured.
    let o = nsfast_stdin(&["policy", "apply", "-f", "-", "--host", host], WEB);
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("shop/web unchanged"));
    assert_eq!(list(host)["generation"], 1);
    let json = serde_json::to_string(&v["policies"][1])
        .unwrap()
        .replace("\"http\"", "8080");
    let o = nsfast_stdin(&["-j", "policy", "apply", "-f", "-", "--host", host], &json);
    assert!(o.status.success(), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        r["objects"][0],
        serde_json::json!(["shop/web", "configured"]),
        "{r}"
    );
    assert_eq!(list(host)["generation"], 2);

    // Bad input: exit 2, the value named, nothing changed.
    for (bad, named) in [
        (
            WEB.replace("port: http", "port: 70000"),
            "70000 is not a port",
        ),
        (
            WEB.replace("policyTypes: [Ingress, Egress]", "policyTypes: [Both]"),
            "\"Both\"",
        ),
        (
            WEB.replace("podSelector: {}", "podSelecter: {}"),
            "spec.podSelecter: unknown field",
        ),
        ("{not json".to_string(), "not JSON"),
    ] {
        let o = nsfast_stdin(&["policy", "apply", "-f", "-", "--host", host], &bad);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(named),
            "{}",
            text(&o)
        );
    }
    let o = nsfast(&[
        "policy",
        "apply",
        "-f",
        "/nonexistent/p.yaml",
        "--host",
        host,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = nsfast(&[
        "pod",
        "add",
        "p",
        "--ip",
        "10.7.0.2/24",
        "--label",
        "a b=c",
        "--host",
        host,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("\"a b=c\""),
        "{}",
        text(&o)
    );
    assert_eq!(list(host)["generation"], 2);

    // Namespace labels; the name label is implicit and not settable.
    nsfast_ok(&[
        "policy",
        "namespace",
        "shop",
        "--label",
        "team=a",
        "--host",
        host,
    ]);
    assert_eq!(list(host)["namespaces"]["shop"]["team"], "a");
    let o = nsfast(&[
        "policy",
        "namespace",
        "shop",
        "--label",
        "kubernetes.io/metadata.name=x",
        "--host",
        host,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = nsfast_ok(&["policy", "list", "--host", host]);
    assert!(
        t.contains("namespace shop: kubernetes.io/metadata.name=shop team=a"),
        "{t}"
    );

    // Delete is namespaced.
    let o = nsfast(&["policy", "delete", "web", "--host", host]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no policy \"web\" in namespace \"default\"")
    );
    nsfast_ok(&["policy", "delete", "web", "-n", "shop", "--host", host]);
    nsfast_ok(&["policy", "delete", "deny-all", "--host", host]);
    nsfast_ok(&["policy", "namespace", "shop", "--host", host]);
    // Nothing left: neither is the host's policy directory.
    assert_eq!(list(host)["policies"], serde_json::json!([]));
    assert!(!h.dir.exists(), "{} left", h.dir.display());
}

#[test]
fn a_killed_apply_leaves_the_old_generation_or_the_new_one() {
    require_root();
    let h = TestHost::new();
    let host = h.name.as_str();
    let one = WEB.split("---").next().unwrap();
    let o = nsfast_stdin(&["policy", "apply", "-f", "-", "--host", host], one);
    assert!(o.status.success(), "{}", text(&o));
    let before = list(host);
    assert_eq!(names(&before), ["shop/web"]);

    let file = std::env::temp_dir().join(format!("{}.yaml", unique("pol")));
    std::fs::write(&file, WEB.replace("port: http", "port: 81")).unwrap();
    let apply = [
        "policy",
        "apply",
        "-f",
        file.to_str().unwrap(),
        "--host",
        host,
    ];
    // Killed after writing the new generation, before renaming it into place: the change did
    // not happen, and the next command removes what it left.
    let o = nsfast_env(&apply, &[(nsfast_pod::fault::CRASH_ENV, POLICY_STEPS[0])]);
    assert_eq!(o.status.signal(), Some(9), "{}", text(&o));
    assert!(
        h.dir.join("policies.json.tmp").exists(),
        "the kill left no temporary file"
    );
    assert_eq!(list(host), before);
    assert!(!h.dir.join("policies.json.tmp").exists());

    // Killed right after the rename: the change happened, whole.
    let o = nsfast_env(&apply, &[(nsfast_pod::fault::CRASH_ENV, POLICY_STEPS[1])]);
    assert_eq!(o.status.signal(), Some(9), "{}", text(&o));
    let after = list(host);
    std::fs::remove_file(&file).unwrap();
    assert_eq!(after["generation"], 2, "{after}");
    assert_eq!(names(&after), ["default/deny-all", "shop/web"]);
    assert_eq!(
        after["policies"][1]["spec"]["ingress"][0]["ports"][0]["port"],
        81
    );
    // The store is private.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: PathBuf| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(h.dir.clone()), 0o700);
    assert_eq!(mode(h.dir.join("policies.json")), 0o600);
}

#[test]
fn pods_carry_a_namespace_labels_and_named_ports() {
    require_root();
    let mut h = TestHost::new();
    let host = h.name.clone();
    let pod = unique("pp");
    h.pods.push(pod.clone());
    let o = nsfast(&[
        "-j",
        "pod",
        "add",
        &pod,
        "--ip",
        "10.77.0.5/24",
        "--host",
        &host,
        "--mode",
        &common::pod_mode_str(),
        "--namespace",
        "shop",
        "--label",
        "app=web",
        "--label",
        "tier=front",
        "--named-port",
        "http=8080",
        "--named-port",
        "dns=53/udp",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let l: serde_json::Value =
        serde_json::from_str(&nsfast_ok(&["-j", "pod", "list", "--host", &host])).unwrap();
    let p = &l["pods"][0];
    assert_eq!(p["namespace"], "shop", "{p}");
    assert_eq!(
        p["labels"],
        serde_json::json!({"app": "web", "tier": "front"})
    );
    assert_eq!(
        p["named_ports"],
        serde_json::json!([
            {"name": "http", "protocol": "TCP", "port": 8080},
            {"name": "dns", "protocol": "UDP", "port": 53}
        ])
    );
    let o = nsfast_stdin(&["policy", "apply", "-f", "-", "--host", &host], WEB);
    assert!(o.status.success(), "{}", text(&o));
    let t = nsfast_ok(&["policy", "list", "--host", &host]);
    let line = t.lines().find(|l| l.contains(" web ")).unwrap_or_default();
    assert!(line.ends_with(&pod), "{t}");
    let line = t
        .lines()
        .find(|l| l.contains("deny-all"))
        .unwrap_or_default();
    assert!(line.ends_with("(no pod)"), "{t}");
    let o = nsfast(&[
        "pod",
        "add",
        "q",
        "--ip",
        "10.77.0.6/24",
        "--host",
        &host,
        "--named-port",
        "a=1",
        "--named-port",
        "a=2",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

/// Whether a TCP connection from netns `src` to `to` is accepted within `wait`.
fn connects(src: &str, to: std::net::SocketAddr, wait: std::time::Duration) -> bool {
    NetNs::open(src)
        .unwrap()
        .run(move || std::net::TcpStream::connect_timeout(&to, wait).is_ok())
        .unwrap()
}

/// A pod is policed from its first packet: `pod add` writes its policies before its endpoint
/// (what lets its packets through the programs) exists. Killed right after the endpoint step,
/// the half-made pod is already isolated by a deny-all policy; a policy change made while it
/// is half-made (its record pending) keeps it isolated; the control, an allowing policy, lets
/// the connection through.
#[test]
fn a_pod_is_policed_from_its_first_packet() {
    require_root();
    let mut h = TestHost::new();
    let host = h.name.clone();
    let (a, b) = (unique("pa"), unique("pb"));
    h.pods.extend([a.clone(), b.clone()]);
    nsfast_ok(&[
        "pod",
        "add",
        &a,
        "--ip",
        "10.77.0.2/24",
        "--host",
        &host,
        "--mode",
        "veth",
    ]);
    let deny = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-in}
spec:
  podSelector: {}
  policyTypes: [Ingress]
";
    let o = nsfast_stdin(&["policy", "apply", "-f", "-", "--host", &host], deny);
    assert!(o.status.success(), "{}", text(&o));
    let o = nsfast_env(
        &[
            "pod",
            "add",
            &b,
            "--ip",
            "10.77.0.3/24",
            "--host",
            &host,
            "--mode",
            "veth",
        ],
        &[(nsfast_pod::fault::CRASH_ENV, "endpoint")],
    );
    assert_eq!(o.status.signal(), Some(9), "{}", text(&o));
    let to: std::net::SocketAddr = "10.77.0.3:8080".parse().unwrap();
    let listener = NetNs::open(&b)
        .unwrap()
        .run(move || std::net::TcpListener::bind(to).unwrap())
        .unwrap();
    let wait = std::time::Duration::from_millis(1500);
    assert!(
        !connects(&a, to, wait),
        "the half-made pod took a connection its policy denies"
    );
    // Another policy change while the pod is half-made: still isolated.
    let o = nsfast_stdin(
        &["policy", "apply", "-f", "-", "--host", &host],
        &deny.replace("deny-in", "deny-in-2"),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        !connects(&a, to, wait),
        "a policy change unpoliced the half-made pod"
    );
    // The control: allowed, the same connection goes through.
    let allow = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-in}
spec:
  podSelector: {}
  ingress: [{from: [{podSelector: {}}]}]
";
    let o = nsfast_stdin(&["policy", "apply", "-f", "-", "--host", &host], allow);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        connects(&a, to, std::time::Duration::from_secs(5)),
        "the allowed connection failed"
    );
    drop(listener);
}

/// A policy change reaches the datapath at once: killed after the new rules are written but
/// before the generation advanced (`policy-maps-written`), the datapath enforces the old rules
/// whole (the old peer allowed, the new one still denied; an entry-by-entry write would
/// already allow both); the next command finishes the change, whole.
#[test]
fn a_killed_policy_write_leaves_the_old_rules_whole_and_a_retry_the_new() {
    require_root();
    let mut h = TestHost::new();
    let host = h.name.clone();
    let pods = [
        (unique("pdb"), "10.77.1.2/24", "db"),
        (unique("pweb"), "10.77.1.3/24", "web"),
        (unique("papi"), "10.77.1.4/24", "api"),
    ];
    for (name, ip, app) in &pods {
        h.pods.push(name.clone());
        let label = format!("app={app}");
        nsfast_ok(&[
            "pod", "add", name, "--ip", ip, "--host", &host, "--mode", "veth", "--label", &label,
        ]);
    }
    let to: std::net::SocketAddr = "10.77.1.2:8080".parse().unwrap();
    let listener = NetNs::open(&pods[0].0)
        .unwrap()
        .run(move || std::net::TcpListener::bind(to).unwrap())
        .unwrap();
    let allow_from = |app: &str| {
        format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
             metadata: {{name: db}}\n\
             spec:\n  podSelector: {{matchLabels: {{app: db}}}}\n\
             \x20 ingress: [{{from: [{{podSelector: {{matchLabels: {{app: {app}}}}}}}]}}]\n"
        )
    };
    let (deny_wait, allow_wait) = (
        std::time::Duration::from_millis(1500),
        std::time::Duration::from_secs(5),
    );
    let verdicts = || {
        (
            connects(&pods[1].0, to, allow_wait),
            connects(&pods[2].0, to, deny_wait),
        )
    };
    let apply = ["policy", "apply", "-f", "-", "--host", host.as_str()];
    let o = nsfast_stdin(&apply, &allow_from("web"));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(verdicts(), (true, false), "web allowed, api denied");

    let o = common::nsfast_stdin_env(
        &apply,
        &allow_from("api"),
        &[(
            nsfast_pod::fault::CRASH_ENV,
            nsfast_pod::datapath::POLICY_MAPS_WRITTEN,
        )],
    );
    assert_eq!(o.status.signal(), Some(9), "{}", text(&o));
    assert_eq!(
        verdicts(),
        (true, false),
        "killed before the generation advanced: the old rules, whole"
    );
    // The retry: the stored change is there already ("unchanged"), and its write finishes.
    let o = nsfast_stdin(&apply, &allow_from("api"));
    assert!(o.status.success(), "{}", text(&o));
    let (web, _) = verdicts();
    let api = connects(&pods[2].0, to, allow_wait);
    assert_eq!((web, api), (false, true), "the new rules, whole");
    drop(listener);
}

/// Traffic that reaches a pod through the host stack meets the pod's ingress policy at the
/// pod's own device: from a namespace routed by the host (no wire program on its link) an
/// isolated pod is closed, the node's own connections stay allowed (Kubernetes: traffic
/// from the node is always allowed), and an ipBlock for the outside network opens it.
#[test]
fn what_the_host_stack_forwards_into_a_pod_meets_its_policy() {
    require_root();
    let mut h = TestHost::new();
    let host = h.name.clone();
    let pod = unique("pst");
    h.pods.push(pod.clone());
    nsfast_ok(&[
        "pod",
        "add",
        &pod,
        "--ip",
        "10.77.2.2/24",
        "--host",
        &host,
        "--mode",
        "veth",
    ]);
    // A neighbour namespace on a plain veth: the host routes between it and the pod.
    let out = unique("pso");
    h.pods.push(out.clone());
    NetNs::create(&out).unwrap().persist();
    let ip = |args: &[&str]| {
        let o = std::process::Command::new("ip")
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "ip {args:?}: {}", text(&o));
    };
    ip(&[
        "-n", &host, "link", "add", "o0", "type", "veth", "peer", "name", "eth0", "netns", &out,
    ]);
    ip(&["-n", &host, "addr", "add", "198.51.100.254/24", "dev", "o0"]);
    ip(&["-n", &host, "link", "set", "o0", "up"]);
    ip(&["-n", &out, "addr", "add", "198.51.100.1/24", "dev", "eth0"]);
    ip(&["-n", &out, "link", "set", "eth0", "up"]);
    ip(&[
        "-n",
        &out,
        "route",
        "add",
        "default",
        "via",
        "198.51.100.254",
    ]);
    let to: std::net::SocketAddr = "10.77.2.2:8080".parse().unwrap();
    let listener = NetNs::open(&pod)
        .unwrap()
        .run(move || std::net::TcpListener::bind(to).unwrap())
        .unwrap();
    let (deny_wait, allow_wait) = (
        std::time::Duration::from_millis(1500),
        std::time::Duration::from_secs(5),
    );
    assert!(connects(&out, to, allow_wait), "no policy: forwarded in");
    let apply = ["policy", "apply", "-f", "-", "--host", host.as_str()];
    let deny = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
                metadata: {name: deny-in}\nspec:\n  podSelector: {}\n  policyTypes: [Ingress]\n";
    let o = nsfast_stdin(&apply, deny);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        !connects(&out, to, deny_wait),
        "a connection forwarded by the host stack passed a deny-all ingress policy"
    );
    assert!(
        connects(&host, to, allow_wait),
        "the node's own connection was denied"
    );
    let allow = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
                 metadata: {name: from-outside}\nspec:\n  podSelector: {}\n\
                 \x20 ingress: [{from: [{ipBlock: {cidr: 198.51.100.0/24}}]}]\n";
    let o = nsfast_stdin(&apply, allow);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        connects(&out, to, allow_wait),
        "the ipBlock did not open it"
    );
    drop(listener);
}
