//! CNI protocol types (spec 1.1): environment, network configuration, result, errors.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Versions this plugin speaks. Results have the same format in all of them.
pub const SUPPORTED: &[&str] = &["0.4.0", "1.0.0", "1.1.0"];

pub use crate::error::{code, CniError};

/// The `CNI_*` environment.
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub command: Option<String>,
    pub container_id: Option<String>,
    pub netns: Option<String>,
    pub ifname: Option<String>,
    pub args: Option<String>,
    pub path: Option<String>,
}

impl Env {
    pub fn from_process() -> Self {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// The environment as `lookup` reports it (unset and empty are the same); the entry point
    /// for tests and fuzzing.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let v = |k: &str| lookup(k).filter(|s| !s.is_empty());
        Self {
            command: v("CNI_COMMAND"),
            container_id: v("CNI_CONTAINERID"),
            netns: v("CNI_NETNS"),
            ifname: v("CNI_IFNAME"),
            args: v("CNI_ARGS"),
            path: v("CNI_PATH"),
        }
    }

    /// A required variable, or error 4 naming it.
    pub fn need<'a>(&self, name: &str, v: &'a Option<String>) -> Result<&'a str, CniError> {
        v.as_deref().ok_or_else(|| {
            CniError::new(
                code::INVALID_ENV,
                format!("{name} is not set"),
                format!(
                    "CNI_COMMAND {} needs {name} (see the CNI 1.1 spec, section \"Parameters\")",
                    self.command.as_deref().unwrap_or("?")
                ),
            )
        })
    }
}

/// The part of a network configuration this plugin reads; the rest is passed on to IPAM.
#[derive(Debug, Clone, Deserialize)]
pub struct NetConf {
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    pub name: String,
    #[serde(rename = "type")]
    pub plugin_type: String,
    #[serde(default)]
    pub ipam: Option<Value>,
    /// nsfast: `veth`, `netkit`, `netkit-l2` or `auto` (default).
    #[serde(default)]
    pub mode: Option<String>,
    /// nsfast: uplink devices to attach the wire program to.
    #[serde(default)]
    pub uplinks: Vec<String>,
    /// nsfast: the pods' traffic goes through the host stack (netfilter) instead of being
    /// redirected past it.
    #[serde(rename = "hostFirewall", default)]
    pub host_firewall: bool,
    /// nsfast: the first ADD enables the pod shortcut on the host (`nsfast pod shortcut
    /// enable`, cgroup2 root); a pod opts out with CNI_ARGS `NSFAST_SHORTCUT=false` or
    /// runtimeConfig `{"shortcut": false}`.
    #[serde(default)]
    pub shortcut: bool,
    /// nsfast: with `shortcut`, enable it even where the splice guard cannot attach
    /// (`nsfast pod shortcut enable --allow-splice-hole`): else that ADD fails there.
    #[serde(rename = "allowSpliceHole", default)]
    pub allow_splice_hole: bool,
    #[serde(rename = "runtimeConfig", default)]
    pub runtime_config: Option<Value>,
    #[serde(rename = "prevResult", default)]
    pub prev_result: Option<Value>,
    #[serde(rename = "cni.dev/valid-attachments", default)]
    pub valid_attachments: Option<Vec<Attachment>>,
}

/// Whether this pod opts out of the pod shortcut: CNI_ARGS `NSFAST_SHORTCUT=false` (or
/// `true`), else runtimeConfig `{"shortcut": false}`; default: no. A bad value is refused.
pub fn shortcut_opt_out(cni_args: Option<&str>, conf: &NetConf) -> Result<bool, CniError> {
    for kv in cni_args.unwrap_or("").split(';') {
        if let Some(v) = kv.strip_prefix("NSFAST_SHORTCUT=") {
            return match v {
                "true" => Ok(false),
                "false" => Ok(true),
                _ => Err(CniError::new(
                    code::INVALID_ENV,
                    format!("invalid CNI_ARGS NSFAST_SHORTCUT={v:?}: expected true or false"),
                    "NSFAST_SHORTCUT=false keeps this pod off the pod shortcut",
                )),
            };
        }
    }
    match conf.runtime_config.as_ref().and_then(|r| r.get("shortcut")) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(!b),
        Some(v) => Err(CniError::new(
            code::INVALID_CONFIG,
            format!("invalid runtimeConfig shortcut {v}: expected a boolean"),
            "runtimeConfig {\"shortcut\": false} keeps this pod off the pod shortcut",
        )),
    }
}

/// What NetworkPolicies select the pod by: its Kubernetes namespace and name from CNI_ARGS
/// `K8S_POD_NAMESPACE` / `K8S_POD_NAME` (as kubelet's runtimes set them; namespace `default`
/// without one), its labels from runtimeConfig `labels` (the `"labels"` capability: an object
/// `{"app": "web"}`, or a list `[{"key": "app", "value": "web"}]`). All of it comes from the
/// runtime, none from the pod. A bad value is refused, naming it.
pub fn pod_identity(
    cni_args: Option<&str>,
    conf: &NetConf,
) -> Result<nsfast_pod::state::PodIdentity, CniError> {
    let mut id = nsfast_pod::state::PodIdentity::default();
    for kv in cni_args.unwrap_or("").split(';') {
        if let Some(v) = kv.strip_prefix("K8S_POD_NAMESPACE=") {
            nsfast_policy::parse::check_namespace(v).map_err(|e| {
                CniError::new(
                    code::INVALID_ENV,
                    format!("invalid CNI_ARGS K8S_POD_NAMESPACE={v:?}"),
                    e,
                )
            })?;
            id.namespace = v.to_string();
        } else if let Some(v) = kv.strip_prefix("K8S_POD_NAME=") {
            if !v.is_empty() {
                id.k8s_name = Some(v.to_string());
            }
        }
    }
    let bad = |what: String| {
        CniError::new(
            code::INVALID_CONFIG,
            format!("invalid runtimeConfig labels: {what}"),
            "expected {\"labels\": {\"KEY\": \"VALUE\"}} or [{\"key\": KEY, \"value\": VALUE}]",
        )
    };
    let pairs: Vec<(String, String)> =
        match conf.runtime_config.as_ref().and_then(|r| r.get("labels")) {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => Ok((k.clone(), s.clone())),
                    other => Err(bad(format!("the value of {k:?} is {other}, not a string"))),
                })
                .collect::<Result<_, _>>()?,
            Some(Value::Array(a)) => a
                .iter()
                .map(|e| match (e.get("key"), e.get("value")) {
                    (Some(Value::String(k)), Some(Value::String(v))) => Ok((k.clone(), v.clone())),
                    _ => Err(bad(format!("{e} has no string key and value"))),
                })
                .collect::<Result<_, _>>()?,
            Some(other) => return Err(bad(format!("{other} is neither an object nor a list"))),
        };
    for (k, v) in pairs {
        let (k, v) = nsfast_policy::parse::parse_label(&format!("{k}={v}")).map_err(bad)?;
        id.labels.insert(k, v);
    }
    Ok(id)
}

/// One entry of `cni.dev/valid-attachments`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

impl NetConf {
    /// The IPAM plugin's `type`, or error 7.
    pub fn ipam_type(&self) -> Result<&str, CniError> {
        self.ipam
            .as_ref()
            .and_then(|i| i.get("type"))
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty() && !t.contains('/'))
            .ok_or_else(|| {
                CniError::new(
                    code::INVALID_CONFIG,
                    "missing or invalid \"ipam\": expected an object with a \"type\" (e.g. host-local)",
                    format!("network {:?}", self.name),
                )
            })
    }
}

/// Largest network configuration accepted on stdin (1 MiB; real ones are a few KiB).
pub const MAX_STDIN: u64 = 1 << 20;

/// Reads the network configuration from `r`: at most [`MAX_STDIN`] bytes (one more is read
/// to tell a larger input, which is refused, naming the limit).
pub fn read_bounded(r: impl std::io::Read) -> Result<Vec<u8>, CniError> {
    use std::io::Read;
    let mut buf = Vec::new();
    r.take(MAX_STDIN + 1).read_to_end(&mut buf).map_err(|e| {
        CniError::new(
            code::IO_FAILURE,
            "cannot read the network configuration on stdin",
            e.to_string(),
        )
    })?;
    if buf.len() as u64 > MAX_STDIN {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            format!("network configuration on stdin is larger than the limit of {MAX_STDIN} bytes (1 MiB)"),
            "nothing was changed; a network configuration is a few KiB",
        ));
    }
    Ok(buf)
}

/// What the plugin prints when run without `CNI_COMMAND` (as the reference plugins do).
pub fn about() -> String {
    format!(
        "CNI nsfast plugin v{}\nCNI protocol versions supported: {}",
        env!("CARGO_PKG_VERSION"),
        SUPPORTED.join(", ")
    )
}

/// Parses stdin as a network configuration and checks its version.
pub fn parse_conf(stdin: &[u8]) -> Result<(NetConf, Value), CniError> {
    let raw: Value = serde_json::from_slice(stdin).map_err(|e| {
        CniError::new(
            code::DECODE_FAILURE,
            "cannot decode the network configuration on stdin",
            e.to_string(),
        )
    })?;
    let conf: NetConf = serde_json::from_value(raw.clone()).map_err(|e| {
        CniError::new(
            code::INVALID_CONFIG,
            format!("invalid network configuration: {e}"),
            "required: cniVersion, name, type; ipam for ADD/DEL/CHECK".to_string(),
        )
    })?;
    check_version(&conf.cni_version)?;
    // logFile / logLevel were applied before the command ran; checked here as well, so that
    // every input check is in one place.
    crate::log::Settings::from_conf(&raw)?;
    Ok((conf, raw))
}

/// Error 1 unless `v` is a supported version.
pub fn check_version(v: &str) -> Result<(), CniError> {
    if SUPPORTED.contains(&v) {
        Ok(())
    } else {
        Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!("incompatible CNI version {v:?}"),
            format!("supported versions: {}", SUPPORTED.join(", ")),
        ))
    }
}

/// `interfaces[]` entry of a result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
}

/// `ips[]` entry of a result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IpConfig {
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

/// A success result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CniResult {
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    #[serde(default)]
    pub ips: Vec<IpConfig>,
    #[serde(default)]
    pub routes: Vec<Value>,
    #[serde(default)]
    pub dns: Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pod_identity_comes_from_cni_args_and_runtime_config() {
        let base =
            r#"{"cniVersion":"1.1.0","name":"n","type":"nsfast-cni","ipam":{"type":"host-local"}"#;
        let conf = |rc: &str| parse_conf(format!("{base}{rc}}}").as_bytes()).unwrap().0;
        let plain = conf("");
        let id = pod_identity(None, &plain).unwrap();
        assert_eq!(id.namespace, "default");
        assert!(id.labels.is_empty() && id.k8s_name.is_none());
        let args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc";
        let id = pod_identity(
            Some(args),
            &conf(r#","runtimeConfig":{"labels":{"app":"web","tier":"front"}}"#),
        )
        .unwrap();
        assert_eq!(id.namespace, "shop");
        assert_eq!(id.k8s_name.as_deref(), Some("web-0"));
        assert_eq!(id.labels.get("app").map(String::as_str), Some("web"));
        assert_eq!(id.labels.len(), 2);
        let id = pod_identity(
            None,
            &conf(r#","runtimeConfig":{"labels":[{"key":"app","value":"db"}]}"#),
        )
        .unwrap();
        assert_eq!(id.labels.get("app").map(String::as_str), Some("db"));
        let e = pod_identity(Some("K8S_POD_NAMESPACE=Shop"), &plain).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENV);
        assert!(e.msg.contains("\"Shop\""), "{}", e.msg);
        for bad in [
            r#","runtimeConfig":{"labels":{"app":7}}"#,
            r#","runtimeConfig":{"labels":{"a b":"c"}}"#,
            r#","runtimeConfig":{"labels":"app=web"}"#,
        ] {
            let e = pod_identity(None, &conf(bad)).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{bad}");
        }
    }

    #[test]
    fn errors_are_spec_objects() {
        let e = CniError::new(code::INVALID_CONFIG, "bad", "more");
        let v: Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(v["code"], 7);
        assert_eq!(v["msg"], "bad");
        assert_eq!(v["details"], "more");
        assert_eq!(v["cniVersion"], "1.1.0");
    }

    #[test]
    fn parses_and_rejects_configs() {
        let ok = br#"{"cniVersion":"1.1.0","name":"n","type":"nsfast-cni","ipam":{"type":"host-local"}}"#;
        let (c, _) = parse_conf(ok).unwrap();
        assert_eq!(c.ipam_type().unwrap(), "host-local");
        assert_eq!(parse_conf(b"{").unwrap_err().code, code::DECODE_FAILURE);
        assert_eq!(
            parse_conf(br#"{"cniVersion":"1.1.0","type":"x"}"#)
                .unwrap_err()
                .code,
            code::INVALID_CONFIG
        );
        let e = parse_conf(br#"{"cniVersion":"9.9.9","name":"n","type":"x"}"#).unwrap_err();
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);
        assert!(e.msg.contains("9.9.9") && e.details.contains("1.1.0"));
        let (c, _) =
            parse_conf(br#"{"cniVersion":"1.0.0","name":"n","type":"x","ipam":{}}"#).unwrap();
        assert_eq!(c.ipam_type().unwrap_err().code, code::INVALID_CONFIG);
    }

    /// stdin is read up to the limit and one byte more, never further.
    #[test]
    fn stdin_is_bounded() {
        let limit = MAX_STDIN as usize;
        assert_eq!(read_bounded(&vec![b' '; limit][..]).unwrap().len(), limit);
        let e = read_bounded(std::io::repeat(b' ')).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains(&MAX_STDIN.to_string()), "{}", e.msg);
        assert!(about().starts_with("CNI nsfast plugin v"));
        assert!(about().contains("CNI protocol versions supported: 0.4.0, 1.0.0, 1.1.0"));
    }

    #[test]
    fn shortcut_key_and_opt_out_arg() {
        let base = r#"{"cniVersion":"1.1.0","name":"n","type":"nsfast-cni""#;
        let off = parse_conf(format!("{base}}}").as_bytes()).unwrap().0;
        assert!(!off.shortcut);
        let on = parse_conf(format!(r#"{base},"shortcut":true}}"#).as_bytes())
            .unwrap()
            .0;
        assert!(on.shortcut);
        assert!(!shortcut_opt_out(None, &on).unwrap());
        assert!(!shortcut_opt_out(Some("IgnoreUnknown=1;K8S_POD_NAME=x"), &on).unwrap());
        assert!(shortcut_opt_out(Some("IgnoreUnknown=1;NSFAST_SHORTCUT=false"), &on).unwrap());
        assert!(!shortcut_opt_out(Some("NSFAST_SHORTCUT=true"), &on).unwrap());
        let e = shortcut_opt_out(Some("NSFAST_SHORTCUT=no"), &on).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENV);
        assert!(
            e.msg.contains("\"no\"") && e.msg.contains("true or false"),
            "{e:?}"
        );
        let rc = parse_conf(
            format!(r#"{base},"shortcut":true,"runtimeConfig":{{"shortcut":false}}}}"#).as_bytes(),
        )
        .unwrap()
        .0;
        assert!(shortcut_opt_out(None, &rc).unwrap());
        let bad =
            parse_conf(format!(r#"{base},"runtimeConfig":{{"shortcut":"off"}}}}"#).as_bytes())
                .unwrap()
                .0;
        assert_eq!(
            shortcut_opt_out(None, &bad).unwrap_err().code,
            code::INVALID_CONFIG
        );
        let e = parse_conf(format!(r#"{base},"shortcut":"yes"}}"#).as_bytes()).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
    }

    #[test]
    fn host_firewall_key_defaults_off_and_must_be_a_bool() {
        let base = r#"{"cniVersion":"1.1.0","name":"n","type":"nsfast-cni""#;
        assert!(
            !parse_conf(format!("{base}}}").as_bytes())
                .unwrap()
                .0
                .host_firewall
        );
        let on = format!(r#"{base},"hostFirewall":true}}"#);
        assert!(parse_conf(on.as_bytes()).unwrap().0.host_firewall);
        let bad = format!(r#"{base},"hostFirewall":"yes"}}"#);
        let e = parse_conf(bad.as_bytes()).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("expected a boolean"), "{e:?}");
    }
}
