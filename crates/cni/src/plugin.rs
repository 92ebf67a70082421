//! The CNI commands on top of `nsfast_pod`. The plugin runs in the host network namespace;
//! the pod is `cni-<hash of network/container/ifname>` on that host, in the runtime's
//! namespace (`CNI_NETNS`, never deleted by us).

use nsfast_pod::pod::{self, AddOptions, ModeRequest, PodAddrs, PodIp, PodIp6};
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
        CniError::new(
            code,
            format!("{what}: {e}"),
            nsfast_sys::report::error_chain(&e),
        )
    }
}

fn valid_container_id(id: &str) -> bool {
    let mut c = id.chars();
    c.next().is_some_and(|f| f.is_ascii_alphanumeric())
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '.' || ch == '-')
}

/// A checked request: the command and, except for VERSION, the configuration (typed and raw).
#[derive(Debug, Clone)]
pub struct Request {
    pub command: String,
    pub conf: Option<(NetConf, Value)>,
}

/// Parses and checks a request (the `CNI_*` environment and stdin) without touching the
/// system: the command, the configuration and, per command, the variables and fields it
/// needs. The entry point for fuzzing the plugin's input handling; [`run`] starts with it.
pub fn parse(env: &Env, stdin: &[u8]) -> Result<Request, CniError> {
    let command = env.need("CNI_COMMAND", &env.command)?.to_string();
    if command == "VERSION" {
        return Ok(Request {
            command,
            conf: None,
        });
    }
    let (conf, raw) = spec::parse_conf(stdin)?;
    let checked = match command.as_str() {
        "ADD" => ids(env)
            .and_then(|_| env.need("CNI_NETNS", &env.netns).map(|_| ()))
            .and_then(|()| mode(&conf).map(|_| ()))
            .and_then(|()| conf.ipam_type().map(|_| ())),
        "DEL" | "CHECK" => ids(env).map(|_| ()),
        "STATUS" | "GC" => Ok(()),
        other => Err(CniError::new(
            code::INVALID_ENV,
            format!("unknown CNI_COMMAND {other:?}"),
            "expected ADD, DEL, CHECK, STATUS, GC or VERSION",
        )),
    };
    checked.map_err(|mut e| {
        e.cni_version = conf.cni_version.clone();
        e
    })?;
    Ok(Request {
        command,
        conf: Some((conf, raw)),
    })
}

/// Runs the command in `env` with `stdin`; `Ok(Some(json))` is printed to stdout.
pub fn run(env: &Env, stdin: &[u8]) -> Result<Option<String>, CniError> {
    let req = parse(env, stdin)?;
    let Some((conf, raw)) = req.conf else {
        let asked = serde_json::from_slice::<Value>(stdin)
            .ok()
            .and_then(|v| v["cniVersion"].as_str().map(str::to_string))
            .unwrap_or_else(|| "1.1.0".into());
        return Ok(Some(
            json!({"cniVersion": asked, "supportedVersions": spec::SUPPORTED}).to_string(),
        ));
    };
    let r = match req.command.as_str() {
        "ADD" => add(env, &conf, &raw).map(Some),
        "DEL" => del(env, &conf, &raw).map(|()| None),
        "CHECK" => check(env, &conf, &raw).map(|()| None),
        "STATUS" => status(env, &conf).map(|()| None),
        _ => gc(env, &conf, &raw).map(|()| None),
    };
    r.map_err(|mut e| {
        e.cni_version = conf.cni_version.clone();
        e
    })
}

/// Every check [`run`] makes on its input before ADD, DEL, CHECK, STATUS or GC changes
/// anything ([`parse`]), plus the decoding of a `prevResult`'s address and ADD's shortcut
/// opt-out. Touches nothing. For
/// the fuzzers.
#[doc(hidden)]
pub fn check_input(env: &Env, stdin: &[u8]) -> Result<(), CniError> {
    let req = parse(env, stdin)?;
    if let Some((conf, _)) = req.conf.as_ref() {
        if let Some(prev) = conf.prev_result.as_ref() {
            let _ = ipam_addrs(prev);
        }
        // ADD's opt-out: CNI_ARGS `NSFAST_SHORTCUT=` and runtimeConfig (runtime-controlled).
        let _ = crate::spec::shortcut_opt_out(env.args.as_deref(), conf);
        let _ = crate::spec::pod_identity(env.args.as_deref(), conf);
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
    if let Err(e) = nsfast_sys::args::ifname::check("CNI_IFNAME", ifname) {
        return Err(CniError::new(
            code::INVALID_ENV,
            format!("invalid CNI_IFNAME {ifname:?}"),
            e.reason,
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

/// The addresses of an IPAM result: at most one IPv4 and one IPv6 (host-local with one range
/// per family, e.g. `"ranges": [[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00::/64"}]]`).
/// Another address of a family already seen, or none at all, is an error naming them.
fn ipam_addrs(result: &Value) -> Result<PodAddrs, CniError> {
    let ips = result["ips"].as_array().cloned().unwrap_or_default();
    let mut out = PodAddrs::default();
    for ip in &ips {
        let Some(a) = ip["address"].as_str() else {
            continue;
        };
        let second = |first: String| {
            CniError::new(
                code::INVALID_CONFIG,
                format!(
                    "IPAM returned a second address of one family, {a:?} (the first is {first})"
                ),
                "an nsfast pod has one IPv4 and/or one IPv6 address: give host-local one \
                 range set per family",
            )
        };
        if let Ok(p) = a.parse::<PodIp>() {
            if let Some(f) = out.v4 {
                return Err(second(format!("{}/{}", f.ip, f.prefix)));
            }
            out.v4 = Some(p);
        } else if let Ok(p) = a.parse::<PodIp6>() {
            if let Some(f) = out.v6 {
                return Err(second(format!("{}/{}", f.ip, f.prefix)));
            }
            out.v6 = Some(p);
        } else {
            return Err(CniError::new(
                code::INVALID_CONFIG,
                format!("IPAM returned an address nsfast cannot give a pod: {a:?}"),
                format!("IPAM result: {result}"),
            ));
        }
    }
    if out.v4.is_none() && out.v6.is_none() {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            "IPAM returned no IPv4 or IPv6 address",
            format!("IPAM result: {result}"),
        ));
    }
    Ok(out)
}

/// Whether the record's CNI identity is the request's.
fn same_attachment(r: &nsfast_pod::PodRecord, id: &Ids, network: &str) -> bool {
    r.cni.as_ref().is_some_and(|a| {
        a.container_id == id.container && a.ifname == id.ifname && a.network == network
    })
}

fn state_err(what: &'static str) -> impl FnOnce(PodError) -> CniError {
    pod_err(code::IO_FAILURE, what)
}

fn add_err(e: PodError) -> CniError {
    let c = match e {
        PodError::NoNetkit(_) | PodError::BadMode(_) | PodError::NoUplink { .. } => {
            code::INVALID_CONFIG
        }
        PodError::BadIfName(_) => code::INVALID_ENV,
        _ => code::IO_FAILURE,
    };
    pod_err(c, "create the pod")(e)
}

/// ADD. Crash-safe and serialised per host: the host's lock is taken before IPAM and held
/// until the pod is complete or undone; an intent record is written before the first change
/// (the IPAM lease); a pending record left by a killed ADD of the same attachment is undone
/// (devices, pins, endpoint, lease) before this one starts.
fn add(env: &Env, conf: &NetConf, raw: &Value) -> Result<String, CniError> {
    let id = ids(env)?;
    let netns = env.need("CNI_NETNS", &env.netns)?;
    let mode = mode(conf)?;
    let ipam = Delegate::new(conf.ipam_type()?, &conf.cni_version, env)?;
    if let Err(e) = nsfast_sys::netns::NetNs::open(netns) {
        return Err(CniError::new(
            code::INVALID_ENV,
            format!("CNI_NETNS {netns:?} is not a network namespace"),
            format!("{e}; expected a network namespace path such as /var/run/netns/NAME"),
        ));
    }
    let name = pod_name(&conf.name, id.container, id.ifname);
    let mut o = AddOptions::new(
        &name,
        PodIp {
            ip: std::net::Ipv4Addr::UNSPECIFIED,
            prefix: 32,
        },
    );
    o.mode = mode;
    o.uplinks = conf.uplinks.clone();
    o.host_firewall = conf.host_firewall;
    o.no_shortcut = crate::spec::shortcut_opt_out(env.args.as_deref(), conf)?;
    o.identity = crate::spec::pod_identity(env.args.as_deref(), conf)?;
    o.netns = Some(netns.to_string());
    o.pod_if = id.ifname.to_string();
    o.cni = Some(CniAttachment {
        container_id: id.container.to_string(),
        network: conf.name.clone(),
        ifname: id.ifname.to_string(),
    });
    let plan = pod::plan(&o).map_err(add_err)?;
    let host = &plan.host;
    let lock = host.lock().map_err(state_err("lock the host"))?;
    let release = |what: &str| -> Result<(), CniError> {
        ipam.exec("DEL", env, id.container, id.ifname, raw)
            .map(|_| ())
            .map_err(|e| {
                tracing::warn!("{what}: IPAM DEL: {e}");
                e
            })
    };
    if let Some(r) = host.record(&name).map_err(state_err("read pod state"))? {
        if !r.pending || !same_attachment(&r, &id, &conf.name) {
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
        tracing::warn!("pod {name}: undoing an ADD that did not finish");
        pod::undo_pending(host, &r).map_err(state_err("undo an unfinished ADD"))?;
        release("undo an unfinished ADD")?;
        host.remove_record(&name)
            .map_err(state_err("remove pod state"))?;
    }
    // The intent, before the first change: the lease to come and what the pod will be.
    let intent = pod::intent(host, &o, plan.datapath, plan.attach);
    host.write_record(&intent)
        .map_err(state_err("write pod state"))?;
    pod::crash_point("intent");
    // Undoes a failed ADD: what was made is gone already; the lease goes, then the intent
    // (kept if the lease could not be released: the next ADD or DEL retries).
    // A failed ADD leaves the shortcut as it found it: disabled again if this ADD enabled it
    // (the host's state goes with its last pod), enabled if it was on before.
    let shortcut_was_on = nsfast_pod::shortcut::is_enabled(host);
    let fail = |e: CniError| -> CniError {
        if release("undo a failed ADD").is_ok() {
            if let Err(f) = pod::forget_failed_add(host, &name, shortcut_was_on) {
                tracing::warn!("undo a failed ADD: {f}");
            }
        }
        e
    };
    let ipam_result = match ipam.exec("ADD", env, id.container, id.ifname, raw) {
        Ok(v) => v.unwrap_or(Value::Null),
        Err(e) => return Err(fail(e)),
    };
    pod::crash_point("ipam");
    let addrs = match ipam_addrs(&ipam_result) {
        Ok(a) => a,
        Err(e) => return Err(fail(e)),
    };
    if let Some(v4) = addrs.v4 {
        o.ip = v4;
    }
    o.ip6 = addrs.v6;
    // `"shortcut": true`: the first ADD enables it (the pod joins it in add_locked).
    if conf.shortcut && !nsfast_pod::shortcut::is_enabled(host) {
        let enabled = nsfast_sys::cgroup::cgroup2_mount()
            .map_err(|e| e.to_string())
            .and_then(|root| nsfast_sys::cgroup::Cgroup::open(root).map_err(|e| e.to_string()))
            .map_err(|e| CniError::new(code::IO_FAILURE, "enable the pod shortcut", e))
            .and_then(|cg| {
                let request = nsfast_pod::shortcut::EnableRequest {
                    allow_splice_hole: conf.allow_splice_hole,
                    ..Default::default()
                };
                nsfast_pod::shortcut::enable_locked(host, &lock, &cg, request)
                    .map_err(state_err("enable the pod shortcut"))
            });
        if let Err(e) = enabled {
            return Err(fail(e));
        }
    }
    let added = match pod::add_locked(&plan, &lock, &o) {
        Ok(a) => a,
        Err(e) => return Err(fail(add_err(e))),
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
        ips: result_ips(r),
        routes: result_routes(r),
        dns: ipam_result.get("dns").cloned().unwrap_or_else(|| json!({})),
    };
    Ok(serde_json::to_string(&result).expect("serialise result"))
}

/// The result's `ips`: IPv4 first, then IPv6, each with its (link-local) gateway, on the
/// container interface (index 1).
fn result_ips(r: &nsfast_pod::PodRecord) -> Vec<IpConfig> {
    let mut v = Vec::new();
    if !r.ip.is_unspecified() {
        v.push(IpConfig {
            address: format!("{}/{}", r.ip, r.prefix),
            gateway: Some(r.gateway.to_string()),
            interface: Some(1),
        });
    }
    if let (Some(ip6), Some(p6)) = (r.ip6, r.prefix6) {
        v.push(IpConfig {
            address: format!("{ip6}/{p6}"),
            gateway: Some(r.gateway6.unwrap_or(pod::GATEWAY6).to_string()),
            interface: Some(1),
        });
    }
    v
}

/// The result's `routes`: a default route per family, via that family's gateway.
fn result_routes(r: &nsfast_pod::PodRecord) -> Vec<Value> {
    let mut v = Vec::new();
    if !r.ip.is_unspecified() {
        v.push(json!({"dst": "0.0.0.0/0", "gw": r.gateway.to_string()}));
    }
    if r.ip6.is_some() {
        let gw = r.gateway6.unwrap_or(pod::GATEWAY6);
        v.push(json!({"dst": "::/0", "gw": gw.to_string()}));
    }
    v
}

/// DEL. Best effort and idempotent, under the host's lock (so it cannot interleave with an
/// ADD of the same attachment): the pod goes only if its record is this attachment (same
/// container ID, ifname and network; a record of another attachment is left alone), pending
/// or complete; IPAM is always asked to release the request's lease.
fn del(env: &Env, conf: &NetConf, raw: &Value) -> Result<(), CniError> {
    let id = ids(env)?;
    let name = pod_name(&conf.name, id.container, id.ifname);
    let host = host()?;
    let lock = host.lock().map_err(state_err("lock the host"))?;
    let mut first_err = None;
    match host.record(&name) {
        Ok(Some(r)) if same_attachment(&r, &id, &conf.name) => {
            if let Err(e) = pod::del_locked(&host, &lock, &name) {
                first_err = Some(state_err("delete the pod")(e));
            }
        }
        Ok(Some(r)) => tracing::warn!(
            "DEL container {} ifname {}: pod {name} is {}, not this attachment: left alone",
            id.container,
            id.ifname,
            match &r.cni {
                Some(a) => format!(
                    "container {} ifname {} network {:?}",
                    a.container_id, a.ifname, a.network
                ),
                None => "not a CNI pod".to_string(),
            }
        ),
        Ok(None) => {}
        Err(e) => first_err = Some(state_err("read pod state")(e)),
    }
    let ipam = Delegate::new(conf.ipam_type()?, &conf.cni_version, env)?;
    ipam.exec("DEL", env, id.container, id.ifname, raw)?;
    let _ = pod::gc_host(&host);
    drop(lock);
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
    if rec.pending || !same_attachment(&rec, &id, &conf.name) {
        return Err(CniError::new(
            code::UNKNOWN_CONTAINER,
            format!(
                "container {} has no complete interface {} on network {:?}",
                id.container, id.ifname, conf.name
            ),
            if rec.pending {
                format!("pod {name}: its ADD did not finish; DEL or ADD again")
            } else {
                format!("pod {name} belongs to another attachment")
            },
        ));
    }
    let mut problems = pod::check(&host, &rec);
    for want in rec.cidrs() {
        let in_prev = prev["ips"]
            .as_array()
            .is_some_and(|a| a.iter().any(|i| i["address"] == want.as_str()));
        if !in_prev {
            problems.push(format!("prevResult does not list {want}"));
        }
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

/// GC. Without `cni.dev/valid-attachments` nothing is collected (an absent list is not an
/// empty one). Pods of this network not in the list go, pending ones (killed ADDs) with them.
fn gc(env: &Env, conf: &NetConf, raw: &Value) -> Result<(), CniError> {
    let Some(valid) = conf.valid_attachments.clone() else {
        tracing::warn!(
            "GC of network {:?} without \"cni.dev/valid-attachments\": nothing collected",
            conf.name
        );
        return Ok(());
    };
    let host = host()?;
    let network = conf.name.clone();
    let gone = pod::remove_where(&host, |r| match &r.cni {
        Some(a) if a.network == network => valid
            .iter()
            .any(|v| v.container_id == a.container_id && v.ifname == a.ifname),
        _ => true, // not ours to collect
    })
    .map_err(pod_err(code::IO_FAILURE, "garbage-collect pods"))?;
    // State of dead host namespaces that had this one's inode: pins and records only.
    pod::remove_stale_of(&host).map_err(pod_err(code::IO_FAILURE, "remove stale pod state"))?;
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
    fn ifnames_follow_the_shared_rule() {
        let env = |ifname: &str| Env {
            command: Some("DEL".into()),
            container_id: Some("c1".into()),
            ifname: Some(ifname.into()),
            ..Default::default()
        };
        for ok in ["eth0", "net1", "eth0.100"] {
            assert!(ids(&env(ok)).is_ok(), "{ok}");
        }
        // The kernel refuses ':' and a tab in an interface name, so the check does too.
        for bad in ["eth:0", "a\tb", "a b", "a/b", "..", "sixteen-chars-xx"] {
            let e = ids(&env(bad))
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert_eq!(e.code, code::INVALID_ENV, "{bad:?}");
            assert!(e.msg.contains(&format!("{bad:?}")), "{}", e.msg);
        }
    }

    #[test]
    fn ipam_results_give_one_address_per_family() {
        let r = |ips: &[&str]| {
            let ips: Vec<Value> = ips.iter().map(|a| json!({"address": a})).collect();
            ipam_addrs(&json!({ "ips": ips }))
        };
        let a = r(&["10.1.2.3/24", "fd00::3/64"]).unwrap();
        assert_eq!(a.v4.unwrap().prefix, 24);
        assert_eq!(
            a.v6.unwrap().ip,
            "fd00::3".parse::<std::net::Ipv6Addr>().unwrap()
        );
        let a = r(&["fd00::3/64"]).unwrap();
        assert!(a.v4.is_none() && a.v6.is_some());
        for (bad, needle) in [
            (&["10.1.2.3/24", "10.1.3.3/24"][..], "\"10.1.3.3/24\""),
            (&["fd00::3/64", "fd01::3/64"][..], "\"fd01::3/64\""),
            (&["fe80::3/64"][..], "\"fe80::3/64\""),
            (&[][..], "no IPv4 or IPv6"),
        ] {
            let e = r(bad).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG);
            assert!(e.msg.contains(needle), "{bad:?}: {}", e.msg);
        }
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
