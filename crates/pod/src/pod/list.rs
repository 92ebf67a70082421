//! `pod list` and `check`: a host's pods with their counters, and what of a pod's record
//! the system no longer matches.

use nsfast_sys::netns::NetNs;
use serde::Serialize;
use tracing::warn;

use crate::abi;
use crate::datapath;
use crate::error::PodError;
use crate::state::{AttachMethod, Datapath, Host, PodRecord};

/// What `pod list` sees of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PodState {
    /// Its namespace and host-side device exist.
    Ok,
    /// An `add` or a `del` of it did not finish (killed?): `pod del` removes what is left,
    /// `pod add` again undoes it and makes the pod anew.
    Pending,
    /// Its namespace or its host-side device is gone (deleted behind nsfast's back): `pod
    /// del` removes its record, pins and endpoint.
    Dead,
}

impl PodState {
    pub fn as_str(self) -> &'static str {
        match self {
            PodState::Ok => "ok",
            PodState::Pending => "pending",
            PodState::Dead => "dead",
        }
    }
}

/// The state of pod `r` of `host` ([`PodState`]).
pub fn state(host: &Host, r: &PodRecord) -> PodState {
    if r.pending {
        return PodState::Pending;
    }
    let device = host
        .netlink()
        .ok()
        .and_then(|nl| nl.link_index(&r.host_if).ok());
    if device != Some(r.host_ifindex) || NetNs::open(&r.netns).is_err() {
        return PodState::Dead;
    }
    PodState::Ok
}

/// `pod list` output for one host.
#[derive(Debug, Clone, Serialize)]
pub struct Listing {
    pub host: String,
    #[serde(skip)]
    pub pods: Vec<PodRecord>,
    /// Each pod's [`PodState`], in the order of `pods`.
    #[serde(skip)]
    pub states: Vec<PodState>,
    /// `pods` as the JSON shows them: each record with its `state`.
    #[serde(rename = "pods")]
    pub listed: Vec<serde_json::Value>,
    pub uplinks: Vec<datapath::Uplink>,
    /// Datapath counters of the host (all its pods), by name.
    pub counters: std::collections::BTreeMap<String, u64>,
    /// Whether the pod shortcut is on for this host, and its per-pod counters (by pod name).
    pub shortcut_enabled: bool,
    pub shortcut: std::collections::BTreeMap<String, crate::shortcut::PodShortcutStats>,
    /// Packets NetworkPolicies dropped, per pod name (pods with none left out).
    pub policy_drops: std::collections::BTreeMap<String, u64>,
}

/// Lists the pods of `host` with the host's datapath counters.
pub fn list(host: Option<&str>) -> Result<Listing, PodError> {
    let host = Host::open(host)?;
    let pods = host.records()?;
    let drops = datapath::policy_drops(&host).unwrap_or_else(|e| {
        warn!(
            "host {}: policy drop counters unreadable: {e}",
            host.display
        );
        Default::default()
    });
    let policy_drops = pods
        .iter()
        .filter_map(|r| {
            let n: u64 = r.addrs().iter().filter_map(|a| drops.get(a)).sum();
            (n > 0).then(|| (r.name.clone(), n))
        })
        .collect();
    let counters = abi::COUNTERS
        .iter()
        .map(|s| s.to_string())
        .zip(datapath::counters(&host)?)
        .collect();
    let states: Vec<PodState> = pods.iter().map(|r| state(&host, r)).collect();
    let listed = pods
        .iter()
        .zip(&states)
        .map(|(r, st)| {
            let mut v = r.output_json();
            if let Some(o) = v.as_object_mut() {
                o.insert("state".into(), serde_json::json!(st));
            }
            v
        })
        .collect();
    Ok(Listing {
        host: host.display.clone(),
        uplinks: datapath::uplinks(&host),
        pods,
        states,
        listed,
        counters,
        policy_drops,
        shortcut_enabled: crate::shortcut::is_enabled(&host),
        shortcut: crate::shortcut::pod_stats(&host).unwrap_or_else(|e| {
            warn!("host {}: shortcut counters unreadable: {e}", host.display);
            Default::default()
        }),
    })
}

/// Problems found by [`check`].
pub fn check(host: &Host, r: &PodRecord) -> Vec<String> {
    let mut bad = Vec::new();
    match host
        .netlink()
        .map_err(|e| e.to_string())
        .and_then(|nl| nl.link_index(&r.host_if).map_err(|e| e.to_string()))
    {
        Ok(i) if i == r.host_ifindex => {}
        Ok(i) => bad.push(format!(
            "host device {} has ifindex {i}, expected {}",
            r.host_if, r.host_ifindex
        )),
        Err(e) => bad.push(format!("host device {}: {e}", r.host_if)),
    }
    for p in &r.link_pins {
        if !p.exists() {
            bad.push(format!("BPF link pin {} missing", p.display()));
        }
    }
    for f in &r.tc_filters {
        match datapath::tc_present(host, f) {
            Ok(true) => {}
            Ok(false) => bad.push(format!(
                "tc filter {} prio {} handle {:#x} missing from {} {}",
                f.program,
                f.priority,
                f.handle,
                f.ifname,
                if f.egress { "egress" } else { "ingress" }
            )),
            Err(e) => bad.push(format!("query tc filters of {}: {e}", f.ifname)),
        }
    }
    if r.datapath == Datapath::Veth && r.attach == AttachMethod::Tcx {
        let want = [
            (true, "ingress", abi::PROG_FROM_CONTAINER),
            (false, "egress", abi::PROG_TO_CONTAINER),
        ];
        // A pod made before the egress program existed has no egress link pin.
        for (ingress, hook, prog) in want {
            if !ingress
                && !r
                    .link_pins
                    .contains(&datapath::egress_link_pin(host, &r.host_if))
            {
                continue;
            }
            match datapath::tcx_programs(&host.ns, &r.host_if, ingress) {
                Ok(v) if v.iter().any(|n| n == abi::kernel_name(prog)) => {}
                Ok(v) => bad.push(format!(
                    "{} has tcx {hook} programs {v:?}, expected {prog}",
                    r.host_if
                )),
                Err(e) => bad.push(format!("query {}: {e}", r.host_if)),
            }
        }
    }
    for ip in r.addrs() {
        match datapath::endpoint_get(host, ip) {
            Ok(Some(ep)) if ep.ifindex == r.host_ifindex => {}
            Ok(_) => bad.push(format!("endpoint {ip} missing from the BPF map")),
            Err(e) => bad.push(format!("endpoint map: {e}")),
        }
    }
    match NetNs::open(&r.netns) {
        Ok(ns) => match ns.netlink() {
            Ok(nl) => {
                if !r.ip.is_unspecified() {
                    match nl.link_ipv4_addresses(&r.pod_if) {
                        Ok(a) if a.contains(&(r.ip, r.prefix)) => {}
                        Ok(a) => bad.push(format!(
                            "pod device {} has addresses {a:?}, expected {}/{}",
                            r.pod_if, r.ip, r.prefix
                        )),
                        Err(e) => bad.push(format!("pod device {}: {e}", r.pod_if)),
                    }
                }
                if let (Some(ip6), Some(p6)) = (r.ip6, r.prefix6) {
                    match nl.link_ipv6_addresses(&r.pod_if) {
                        Ok(a) if a.contains(&(ip6, p6)) => {}
                        Ok(a) => bad.push(format!(
                            "pod device {} has IPv6 addresses {a:?}, expected {ip6}/{p6}",
                            r.pod_if
                        )),
                        Err(e) => bad.push(format!("pod device {}: {e}", r.pod_if)),
                    }
                }
            }
            Err(e) => bad.push(format!("pod device {}: {e}", r.pod_if)),
        },
        Err(e) => bad.push(format!("pod namespace {}: {e}", r.netns)),
    }
    bad
}
