//! The CNI commands on top of `nsfast_pod`. The plugin runs in the host network namespace;
//! the pod is `cni-<hash of network/container/ifname>` on that host, in the runtime's
//! namespace (`CNI_NETNS`, never deleted by us).

use nsfast_pod::pod::{self, AddOptions, ModeRequest, PodIp};
use nsfast_pod::state::CniAttachment;
use nsfast_pod::{Host, PodError};
use serde_json::{json, Value};

use crate::ipam::Delegate;
use crate::spec::{self, code, CniError, CniResult, Env, Interface, IpConfig, NetConf};

/// Pod name of an attachment.
pub fn pod_name(network: &str, container_id: &str, ifname: &str) -> String {
    let h = format!("{network}/{container_id}/{ifname}")
        .bytes()
        .fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
        });
    format!("cni-{h:016x}")
}

fn pod_err(code: u32, what: &str) -> impl FnOnce(PodError) -> CniError + '_ {
    move |e| {
        let mut chain = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            chain.push_str(": ");
            chain.push_str(&s.to_string());
            src = s.source();
        }
        CniError::new(code, format!("{what}: {e}"), chain)
    }
}

fn valid_container_id(id: &str) -> bool {
    let mut c = id.chars();
    c.next().is_some_and(|f| f.is_ascii_alphanumeric())
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '.' || ch == '-')
}

/// Runs the command in `env` with `stdin`; `Ok(Some(json))` is printed to stdout.
pub fn run(env: &Env, stdin: &[u8]) -> Result<Option<String>, CniError> {
    let command = env.need("CNI_COMMAND", &env.command)?.to_string();
    if command == "VERSION" {
        let asked = serde_json::from_slice::<Value>(stdin)
            .ok()
            .and_then(|v| v["cniVersion"].as_str().map(str::to_string))
            .unwrap_or_else(|| "1.1.0".into());
        return Ok(Some(
            json!({"cniVersion": asked, "supportedVersions": spec::SUPPORTED}).to_string(),
        ));
    }
    let (conf, raw) = spec::parse_conf(stdin)?;
    let r = match command.as_str() {
        "ADD" => add(env, &conf, &raw).map(Some),
        "DEL" => del(env, &conf, &raw).map(|()| None),
        "CHECK" => check(env, &conf, &raw).map(|()| None),
        "STATUS" => status(env, &conf).map(|()| None),
        "GC" => gc(env, &conf, &raw).map(|()| None),
        other => Err(CniError::new(
            code::INVALID_ENV,
            format!("unknown CNI_COMMAND {other:?}"),
            "expected ADD, DEL, CHECK, STATUS, GC or VERSION",
        )),
    };
    r.map_err(|mut e| {
        e.cni_version = conf.cni_version.clone();
        e
    })
}

/// Every check [`run`] makes on its input before ADD, DEL, CHECK, STATUS or GC changes
/// anything: the configuration on stdin, the container ID and interface name, `mode`, the
/// IPAM type and a `prevResult`'s address. Touches nothing. For the fuzzers.
#[doc(hidden)]
pub fn check_input(env: &Env, stdin: &[u8]) -> Result<(), CniError> {
    let (conf, _) = spec::parse_conf(stdin)?;
    ids(env)?;
    mode(&conf)?;
    conf.ipam_type()?;
    if let Some(prev) = &conf.prev_result {
        let _ = ipam_ipv4(prev);
    }
    Ok(())
}

struct Ids<'a> {
    container: &'a str,
    ifname: &'a str,
}

fn ids<'a>(env: &'a Env) -> Result<Ids<'a>, CniError> {
    let container = env.need("CNI_CONTAINERID", &env.container_id)?;
    if !valid_container_id(container) {
        return Err(CniError::new(
            code::INVALID_ENV,
            format!("invalid CNI_CONTAINERID {container:?}"),
            "expected [A-Za-z0-9][A-Za-z0-9_.-]*",
        ));
    }
    let ifname = env.need("CNI_IFNAME", &env.ifname)?;
    if ifname.is_empty() || ifname.len() > 15 || ifname.contains('/') || ifname.contains(' ') {
        return Err(CniError::new(
            code::INVALID_ENV,
            format!("invalid CNI_IFNAME {ifname:?}"),
            "expected 1-15 characters without '/' or spaces",
        ));
    }
    Ok(Ids { container, ifname })
}

fn host() -> Result<Host, CniError> {
    Host::open(None).map_err(pod_err(code::IO_FAILURE, "open the host namespace"))
}

fn mode(conf: &NetConf) -> Result<ModeRequest, CniError> {
    let m = conf.mode.as_deref().unwrap_or("auto");
    m.parse().map_err(|_: PodError| {
        CniError::new(
            code::INVALID_CONFIG,
            format!("invalid \"mode\" {m:?} in network {:?}", conf.name),
            "expected veth, netkit, netkit-l2 or auto",
        )
    })
}

/// The first IPv4 address of an IPAM result.
fn ipam_ipv4(result: &Value) -> Result<PodIp, CniError> {
    let ips = result["ips"].as_array().cloned().unwrap_or_default();
    for ip in ips {
        if let Some(a) = ip["address"].as_str() {
            if let Ok(p) = a.parse::<PodIp>() {
                return Ok(p);
            }
        }
    }
    Err(CniError::new(
        code::INVALID_CONFIG,
        "IPAM returned no IPv4 address",
        format!("IPAM result: {result}"),
    ))
}

fn add(env: &Env, conf: &NetConf, raw: &Value) -> Result<String, CniError> {
    let id = ids(env)?;
    let netns = env.need("CNI_NETNS", &env.netns)?;
    let mode = mode(conf)?;
    let ipam = Delegate::new(conf.ipam_type()?, &conf.cni_version, env)?;
    let host = host()?;
    let name = pod_name(&conf.name, id.container, id.ifname);
    if host
        .record(&name)
        .map_err(pod_err(code::IO_FAILURE, "read pod state"))?
        .is_some()
    {
        // Not an error to undo: the first ADD stays as it is.
        return Err(CniError::new(
            code::ALREADY_EXISTS,
            format!(
                "container {} already has interface {} on network {:?}",
                id.container, id.ifname, conf.name
            ),
            format!("pod {name}; DEL it first"),
        ));
    }
    if nsfast_sys::netns::NetNs::open(netns).is_err() {
        return Err(CniError::new(
            code::INVALID_ENV,
            format!("CNI_NETNS {netns:?} does not exist"),
            "expected a network namespace path such as /var/run/netns/NAME",
        ));
    }
    let ipam_result = ipam
        .exec("ADD", env, id.container, id.ifname, raw)?
        .unwrap_or(Value::Null);
    let undo_ipam = || {
        if let Err(e) = ipam.exec("DEL", env, id.container, id.ifname, raw) {
            tracing::warn!("undo IPAM after a failed ADD: {e}");
        }
    };
    let ip = match ipam_ipv4(&ipam_result) {
        Ok(ip) => ip,
        Err(e) => {
            undo_ipam();
            return Err(e);
        }
    };
    let mut o = AddOptions::new(&name, ip);
    o.mode = mode;
    o.uplinks = conf.uplinks.clone();
    o.host_firewall = conf.host_firewall;
    o.netns = Some(netns.to_string());
    o.pod_if = id.ifname.to_string();
    o.cni = Some(CniAttachment {
        container_id: id.container.to_string(),
        network: conf.name.clone(),
        ifname: id.ifname.to_string(),
    });
    let added = match pod::add(&o) {
        Ok(a) => a,
        Err(e) => {
            // nsfast_pod::add has undone its own steps; release the address too.
            undo_ipam();
            let c = match e {
                PodError::NoNetkit(_) | PodError::BadMode(_) => code::INVALID_CONFIG,
                _ => code::IO_FAILURE,
            };
            return Err(pod_err(c, "create the pod")(e));
        }
    };
    let r = &added.record;
    let result = CniResult {
        cni_version: conf.cni_version.clone(),
        interfaces: vec![
            Interface {
                name: r.host_if.clone(),
                mac: r.host_mac.clone(),
                sandbox: None,
            },
            Interface {
                name: r.pod_if.clone(),
                mac: if r.pod_mac == "00:00:00:00:00:00" {
                    String::new()
                } else {
                    r.pod_mac.clone()
                },
                sandbox: Some(netns.to_string()),
            },
        ],
        ips: vec![IpConfig {
            address: format!("{}/{}", r.ip, r.prefix),
            gateway: Some(r.gateway.to_string()),
            interface: Some(1),
        }],
        routes: vec![json!({"dst": "0.0.0.0/0", "gw": r.gateway.to_string()})],
        dns: ipam_result.get("dns").cloned().unwrap_or_else(|| json!({})),
    };
    Ok(serde_json::to_string(&result).expect("serialise result"))
}

fn del(env: &Env, conf: &NetConf, raw: &Value) -> Result<(), CniError> {
    let id = ids(env)?;
    let name = pod_name(&conf.name, id.container, id.ifname);
    // Best effort and idempotent: a missing pod is fine, IPAM is always asked to release.
    let mut first_err = None;
    if let Err(e) = pod::del(&name, None) {
        first_err = Some(pod_err(code::IO_FAILURE, "delete the pod")(e));
    }
    let ipam = Delegate::new(conf.ipam_type()?, &conf.cni_version, env)?;
    ipam.exec("DEL", env, id.container, id.ifname, raw)?;
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn check(env: &Env, conf: &NetConf, raw: &Value) -> Result<(), CniError> {
    let id = ids(env)?;
    let prev = conf.prev_result.as_ref().ok_or_else(|| {
        CniError::new(
            code::INVALID_CONFIG,
            "CHECK needs prevResult",
            "the runtime passes the ADD result as prevResult",
        )
    })?;
    let host = host()?;
    let name = pod_name(&conf.name, id.container, id.ifname);
    let rec = host
        .record(&name)
        .map_err(pod_err(code::IO_FAILURE, "read pod state"))?
        .ok_or_else(|| {
            CniError::new(
                code::UNKNOWN_CONTAINER,
                format!(
                    "container {} has no interface {} on network {:?}",
                    id.container, id.ifname, conf.name
                ),
                format!("no pod {name}"),
            )
        })?;
    let mut problems = pod::check(&host, &rec);
    let want = format!("{}/{}", rec.ip, rec.prefix);
    let in_prev = prev["ips"]
        .as_array()
        .is_some_and(|a| a.iter().any(|i| i["address"] == want.as_str()));
    if !in_prev {
        problems.push(format!("prevResult does not list {want}"));
    }
    if !problems.is_empty() {
        return Err(CniError::new(
            code::CHECK_FAILED,
            format!("attachment of container {} is damaged", id.container),
            problems.join("; "),
        ));
    }
    let ipam = Delegate::new(conf.ipam_type()?, &conf.cni_version, env)?;
    ipam.exec("CHECK", env, id.container, id.ifname, raw)?;
    Ok(())
}

fn status(env: &Env, conf: &NetConf) -> Result<(), CniError> {
    let to_50 = |e: CniError| CniError::new(code::PLUGIN_NOT_AVAILABLE, e.msg, e.details);
    let ipam =
        Delegate::new(conf.ipam_type().map_err(to_50)?, &conf.cni_version, env).map_err(to_50)?;
    nsfast_pod::state::ensure_bpffs().map_err(|e| {
        CniError::new(
            code::PLUGIN_NOT_AVAILABLE,
            "no bpffs for pins",
            e.to_string(),
        )
    })?;
    if ipam.speaks_1_1() {
        ipam.exec("STATUS", env, "", "", &json!({"cniVersion": conf.cni_version, "name": conf.name, "type": conf.plugin_type, "ipam": conf.ipam}))?;
    }
    Ok(())
}

fn gc(env: &Env, conf: &NetConf, raw: &Value) -> Result<(), CniError> {
    let valid = conf.valid_attachments.clone().unwrap_or_default();
    let host = host()?;
    let network = conf.name.clone();
    let gone = pod::remove_where(&host, |r| match &r.cni {
        Some(a) if a.network == network => valid
            .iter()
            .any(|v| v.container_id == a.container_id && v.ifname == a.ifname),
        _ => true, // not ours to collect
    })
    .map_err(pod_err(code::IO_FAILURE, "garbage-collect pods"))?;
    let ipam = Delegate::new(conf.ipam_type()?, &conf.cni_version, env)?;
    if ipam.speaks_1_1() {
        ipam.exec("GC", env, "", "", raw)?;
    } else {
        // A pre-1.1 IPAM has no GC: release what we just collected one by one.
        for r in &gone {
            if let Some(a) = &r.cni {
                ipam.exec("DEL", env, &a.container_id, &a.ifname, raw)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_names_are_stable_valid_and_distinct() {
        let a = pod_name("net", "c1", "eth0");
        assert_eq!(a, pod_name("net", "c1", "eth0"));
        assert_ne!(a, pod_name("net", "c1", "eth1"));
        assert_ne!(a, pod_name("net2", "c1", "eth0"));
        assert!(nsfast_pod::pod::valid_pod_name(&a), "{a}");
    }

    #[test]
    fn container_ids() {
        assert!(valid_container_id("abc-123_x.y"));
        assert!(!valid_container_id("-a"));
        assert!(!valid_container_id("a/b"));
        assert!(!valid_container_id(""));
    }

    #[test]
    fn version_needs_no_config() {
        let env = Env {
            command: Some("VERSION".into()),
            ..Default::default()
        };
        let out = run(&env, br#"{"cniVersion":"1.0.0"}"#).unwrap().unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["cniVersion"], "1.0.0");
        assert!(v["supportedVersions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == "1.1.0"));
    }
}
