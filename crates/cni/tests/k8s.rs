//! dist/k8s/nsfast-cni-daemonset.yaml: valid YAML (parsed with serde_yaml) of the objects it
//! claims, mounting the node's CNI directories; its conflist template is the example
//! conflist; and its install script, run with sh against a scratch "node", installs the real
//! plugin binary and a conflist the plugin accepts, or refuses a node it has no subnet for.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value as Json;
use serde_yaml::Value as Yaml;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn documents() -> Vec<Yaml> {
    let text = std::fs::read_to_string(repo().join("dist/k8s/nsfast-cni-daemonset.yaml")).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).expect("valid YAML document"))
        .collect()
}

fn object<'a>(docs: &'a [Yaml], kind: &str) -> &'a Yaml {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind))
        .unwrap_or_else(|| panic!("no {kind} in the manifest"))
}

fn s(v: &Yaml) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v:?}"))
}

#[test]
fn manifest_is_a_configmap_and_a_daemonset_mounting_the_cni_directories() {
    let docs = documents();
    assert_eq!(docs.len(), 2);
    let cm = object(&docs, "ConfigMap");
    assert_eq!(s(&cm["apiVersion"]), "v1");
    let ds = object(&docs, "DaemonSet");
    assert_eq!(s(&ds["apiVersion"]), "apps/v1");
    assert_eq!(ds["metadata"]["namespace"], cm["metadata"]["namespace"]);
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        ds["spec"]["template"]["metadata"]["labels"]
    );
    assert_eq!(spec["hostNetwork"].as_bool(), Some(true));
    let volumes = spec["volumes"].as_sequence().unwrap();
    let host_path = |name: &str| {
        volumes
            .iter()
            .find(|v| v["name"].as_str() == Some(name))
            .and_then(|v| v["hostPath"]["path"].as_str())
            .unwrap_or_else(|| panic!("no hostPath volume {name}"))
    };
    assert_eq!(host_path("cni-bin"), "/opt/cni/bin");
    assert_eq!(host_path("cni-conf"), "/etc/cni/net.d");
    let cm_volume = volumes
        .iter()
        .find(|v| v["name"].as_str() == Some("config"))
        .unwrap();
    assert_eq!(cm_volume["configMap"]["name"], cm["metadata"]["name"]);
    let init = &spec["initContainers"][0];
    let mounts: Vec<(&str, &str)> = init["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|m| (s(&m["name"]), s(&m["mountPath"])))
        .collect();
    for want in [
        ("cni-bin", "/host/opt/cni/bin"),
        ("cni-conf", "/host/etc/cni/net.d"),
        ("config", "/config"),
    ] {
        assert!(mounts.contains(&want), "{want:?} not in {mounts:?}");
    }
    let cmd: Vec<&str> = init["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(s)
        .collect();
    assert_eq!(cmd, ["/bin/sh", "/config/install.sh"]);
    assert!(cm["data"]["install.sh"].is_string());
    let env = &init["env"][0];
    assert_eq!(s(&env["name"]), "NODE_NAME");
    assert_eq!(
        s(&env["valueFrom"]["fieldRef"]["fieldPath"]),
        "spec.nodeName"
    );
}

/// The template with `cidr` and `uplink` put in.
fn conflist(cm: &Yaml, cidr: &str, uplink: &str) -> Json {
    let t = s(&cm["data"]["10-nsfast.conflist.in"])
        .replace("@POD_CIDR@", cidr)
        .replace("@UPLINK@", uplink);
    serde_json::from_str(&t).expect("the conflist template is JSON")
}

#[test]
fn conflist_template_is_the_example_conflist() {
    let docs = documents();
    let cm = object(&docs, "ConfigMap");
    let example: Json = serde_json::from_slice(
        &std::fs::read(repo().join("examples/cni/10-nsfast.conflist")).unwrap(),
    )
    .unwrap();
    assert_eq!(conflist(cm, "10.244.1.0/24", "eth0"), example);
}

/// A scratch node: the host's CNI directories, the ConfigMap's files and an image's
/// /usr/lib/cni (the real plugin binary; a stand-in host-local script, never run).
struct Node(PathBuf);

impl Node {
    fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("nsfast-k8s-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        for sub in ["host/opt/cni/bin", "host/etc/cni/net.d", "config", "image"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        let cm = object(&documents(), "ConfigMap").clone();
        for (k, v) in cm["data"].as_mapping().unwrap() {
            std::fs::write(d.join("config").join(s(k)), s(v)).unwrap();
        }
        std::fs::copy(env!("CARGO_BIN_EXE_nsfast-cni"), d.join("image/nsfast-cni")).unwrap();
        std::fs::write(d.join("image/host-local"), "#!/bin/sh\nexit 1\n").unwrap();
        Self(d)
    }

    fn install(&self, node: &str) -> std::process::Output {
        Command::new("sh")
            .arg(self.0.join("config/install.sh"))
            .env("NODE_NAME", node)
            .env("NSFAST_HOST_ROOT", self.0.join("host"))
            .env("NSFAST_CONFIG_DIR", self.0.join("config"))
            .env("NSFAST_CNI_SRC", self.0.join("image"))
            .output()
            .unwrap()
    }

    fn host(&self, p: &str) -> PathBuf {
        self.0.join("host").join(p)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn install_script_puts_the_plugin_and_the_nodes_conflist_in_place() {
    use std::os::unix::fs::PermissionsExt;
    let node = Node::new("ok");
    let out = node.install("node-b");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("installed on node-b: pod subnet 10.244.2.0/24, uplink eth0"),
        "{stdout}"
    );
    // Only the final names are left (no temporary files for the runtime to see).
    assert_eq!(
        names(&node.host("opt/cni/bin")),
        ["host-local", "nsfast-cni"]
    );
    assert_eq!(names(&node.host("etc/cni/net.d")), ["10-nsfast.conflist"]);
    let plugin = node.host("opt/cni/bin/nsfast-cni");
    assert_eq!(
        std::fs::metadata(&plugin).unwrap().permissions().mode() & 0o777,
        0o755
    );
    let about = Command::new(&plugin).output().unwrap();
    assert!(String::from_utf8_lossy(&about.stdout).starts_with("CNI nsfast plugin v"));
    let written: Json = serde_json::from_slice(
        &std::fs::read(node.host("etc/cni/net.d/10-nsfast.conflist")).unwrap(),
    )
    .unwrap();
    let cm = object(&documents(), "ConfigMap").clone();
    assert_eq!(written, conflist(&cm, "10.244.2.0/24", "eth0"));
    // The installed plugin accepts the conflist's entry (checked without touching anything:
    // a VERSION call at each listed version).
    for v in written["cniVersions"].as_array().unwrap() {
        let mut entry = written["plugins"][0].clone();
        entry["cniVersion"] = v.clone();
        entry["name"] = written["name"].clone();
        let conf = entry.to_string();
        let r = nsfast_cni::spec::parse_conf(conf.as_bytes());
        assert!(r.is_ok(), "{v}: {r:?}");
    }
    // An existing host-local is left alone; a second run replaces the plugin in place.
    std::fs::write(node.host("opt/cni/bin/host-local"), "mine").unwrap();
    assert!(node.install("node-b").status.success());
    assert_eq!(
        std::fs::read_to_string(node.host("opt/cni/bin/host-local")).unwrap(),
        "mine"
    );
    assert_eq!(names(&node.host("etc/cni/net.d")), ["10-nsfast.conflist"]);
}

#[test]
fn install_script_refuses_a_node_without_a_subnet_and_bad_values() {
    let node = Node::new("refuse");
    let out = node.install("node-z");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no pod subnet for node node-z"), "{err}");
    assert!(names(&node.host("etc/cni/net.d")).is_empty());
    std::fs::write(node.0.join("config/pod-cidrs"), "node-z 10.0.0.0/8\",\"x\n").unwrap();
    let out = node.install("node-z");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid pod subnet '10.0.0.0/8\",\"x'"),
        "{err}"
    );
    assert!(names(&node.host("etc/cni/net.d")).is_empty());
}
