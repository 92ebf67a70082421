//! The reference evaluator: NetworkPolicy semantics written straight from the Kubernetes
//! API reference (`networking.k8s.io/v1`, "Network Policies" concept page), with no
//! precomputation, so that the compiled form ([`crate::compile()`]) and the datapath can be
//! tested against it.
//!
//! - A pod is isolated for ingress when some policy of its namespace selects it and has
//!   `Ingress` among its types (likewise egress); a pod that no such policy selects accepts
//!   (sends) everything in that direction.
//! - Traffic into an isolated pod is allowed when it matches at least one ingress rule of at
//!   least one policy that selects the pod (the union); a rule matches when a peer of it
//!   matches the source (no peers: any source) and a port of it matches the destination port
//!   (no ports: any).
//! - A connection from pod S to pod D needs both S's egress and D's ingress to allow it.
//!   Endpoints that are not pods (addresses on the wire) have no policies of their own.
//! - Replies of an allowed connection pass: a [`Probe`] is a connection, judged by its first
//!   packet's direction.
//! - A peer's `podSelector` alone chooses pods of the policy's namespace; a
//!   `namespaceSelector` alone every pod of the namespaces it chooses; both in one peer, pods
//!   of those namespaces that the pod selector chooses. `{}` chooses all.
//! - `ipBlock` matches the address (`cidr` minus `except`), pod addresses included, as the
//!   upstream e2e suite expects ("should allow egress access to server in CIDR block").
//! - A named port matches when the destination pod has a port of that name and protocol with
//!   the probe's number; a destination that is not a pod has no named ports.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::model::{Labels, Peer, Policy, PortMatch, PortRule, Protocol, Rule};

/// A named port of a pod (a container port's `name`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedPort {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
}

/// A pod as policies see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub labels: Labels,
    /// Its addresses (one per family).
    pub ips: Vec<IpAddr>,
    /// Its named ports; a name appears once (Kubernetes requires port names to be unique
    /// within a pod).
    pub ports: Vec<NamedPort>,
}

/// The pods and namespaces policies are evaluated over.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cluster {
    /// Namespace labels. A namespace missing here has no labels.
    pub namespaces: BTreeMap<String, Labels>,
    pub pods: Vec<PodInfo>,
}

/// One end of a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `Cluster::pods[i]`.
    Pod(usize),
    /// An address that is no pod's (the wire, another host).
    External(IpAddr),
}

/// A connection attempt: from `from` to `to`'s `port` over `protocol`, in the address family
/// of `v6`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    pub from: Endpoint,
    pub to: Endpoint,
    pub protocol: Protocol,
    pub port: u16,
    pub v6: bool,
}

impl Cluster {
    pub fn namespace_labels(&self, ns: &str) -> Labels {
        self.namespaces.get(ns).cloned().unwrap_or_default()
    }

    /// The address of `e` in the family of `v6` (`None`: a pod without one).
    pub fn address(&self, e: Endpoint, v6: bool) -> Option<IpAddr> {
        match e {
            Endpoint::External(ip) => Some(ip),
            Endpoint::Pod(i) => self.pods[i].ips.iter().copied().find(|a| a.is_ipv6() == v6),
        }
    }
}

/// Whether `policies` allow `probe` in `cluster`.
pub fn allowed(cluster: &Cluster, policies: &[Policy], probe: &Probe) -> bool {
    egress_allows(cluster, policies, probe) && ingress_allows(cluster, policies, probe)
}

/// Whether the source's egress policies allow `probe` (true for a source that is no pod).
pub fn egress_allows(cluster: &Cluster, policies: &[Policy], probe: &Probe) -> bool {
    let Endpoint::Pod(s) = probe.from else {
        return true;
    };
    let src = &cluster.pods[s];
    let selecting: Vec<&Policy> = policies
        .iter()
        .filter(|p| p.egress_isolates && selects(p, src))
        .collect();
    if selecting.is_empty() {
        return true;
    }
    selecting.iter().any(|p| {
        p.egress
            .iter()
            .any(|r| rule_matches(cluster, p, r, probe.to, probe.to, probe))
    })
}

/// Whether the destination's ingress policies allow `probe` (true for a destination that is
/// no pod).
pub fn ingress_allows(cluster: &Cluster, policies: &[Policy], probe: &Probe) -> bool {
    let Endpoint::Pod(d) = probe.to else {
        return true;
    };
    let dst = &cluster.pods[d];
    let selecting: Vec<&Policy> = policies
        .iter()
        .filter(|p| p.ingress_isolates && selects(p, dst))
        .collect();
    if selecting.is_empty() {
        return true;
    }
    selecting.iter().any(|p| {
        p.ingress
            .iter()
            .any(|r| rule_matches(cluster, p, r, probe.from, probe.to, probe))
    })
}

/// Whether policy `p` selects `pod` (same namespace, pod selector matches).
pub fn selects(p: &Policy, pod: &PodInfo) -> bool {
    p.namespace == pod.namespace && p.pod_selector.matches(&pod.labels)
}

/// Whether rule `r` of policy `p` matches: its peers against `peer`, its ports against the
/// destination `dst` of the probe.
fn rule_matches(
    cluster: &Cluster,
    p: &Policy,
    r: &Rule,
    peer: Endpoint,
    dst: Endpoint,
    probe: &Probe,
) -> bool {
    let peer_ok = match &r.peers {
        None => true,
        Some(peers) => peers
            .iter()
            .any(|q| peer_matches(cluster, p, q, peer, probe.v6)),
    };
    let port_ok = match &r.ports {
        None => true,
        Some(ports) => ports.iter().any(|pr| port_matches(cluster, pr, dst, probe)),
    };
    peer_ok && port_ok
}

fn peer_matches(cluster: &Cluster, p: &Policy, q: &Peer, e: Endpoint, v6: bool) -> bool {
    match q {
        Peer::IpBlock { cidr, except } => cluster
            .address(e, v6)
            .is_some_and(|ip| cidr.contains(ip) && !except.iter().any(|x| x.contains(ip))),
        Peer::Pods { pods, namespaces } => {
            let Endpoint::Pod(i) = e else {
                return false;
            };
            let pod = &cluster.pods[i];
            let ns_ok = match namespaces {
                None => pod.namespace == p.namespace,
                Some(sel) => sel.matches(&cluster.namespace_labels(&pod.namespace)),
            };
            let pod_ok = pods.as_ref().is_none_or(|sel| sel.matches(&pod.labels));
            ns_ok && pod_ok
        }
    }
}

fn port_matches(cluster: &Cluster, pr: &PortRule, dst: Endpoint, probe: &Probe) -> bool {
    if pr.protocol != probe.protocol {
        return false;
    }
    match &pr.port {
        PortMatch::Any => true,
        PortMatch::Range { lo, hi } => (*lo..=*hi).contains(&probe.port),
        PortMatch::Named(name) => match dst {
            Endpoint::External(_) => false,
            Endpoint::Pod(i) => cluster.pods[i].ports.iter().any(|np| {
                &np.name == name && np.protocol == probe.protocol && np.port == probe.port
            }),
        },
    }
}
