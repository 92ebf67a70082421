//! Policies compiled into per-pod tables, the form the datapath's maps hold.
//!
//! For every pod and direction: whether it is isolated, and what it allows, as three tables
//! a packet is looked up in (an allow in any of them passes):
//! - `any`: port ranges allowed from/to every peer (rules without peers);
//! - `peers`: per peer pod, port ranges (pod selectors, resolved to the pods they choose;
//!   named ports of egress rules, resolved against each destination pod);
//! - `cidrs`: per address prefix, port ranges, made for longest-prefix matching: `except`s are
//!   subtracted into disjoint prefixes, and each prefix carries the union of the ranges of
//!   every prefix that covers it, so the longest prefix that contains an address holds
//!   everything any prefix containing it allows.
//!
//! Selectors and named ports are resolved here, against the pods of the [`Cluster`], so the
//! datapath never evaluates a label: it looks up identities, prefixes and port ranges.
//! [`Compiled::allowed`] evaluates the tables as the datapath does; the tests compare it with
//! the reference evaluator ([`crate::eval`]) on generated clusters and policies.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::eval::{Cluster, Endpoint, Probe};
use crate::model::{Cidr, Peer, Policy, PortMatch, PortRule, Protocol};

/// Ranges of (protocol, ports) allowed; `all` allows every protocol and port (a rule without
/// ports, which also lets ICMP and other protocols through).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortSet {
    pub all: bool,
    /// Sorted, merged: no two ranges of one protocol overlap or touch.
    pub ranges: Vec<(Protocol, u16, u16)>,
}

impl PortSet {
    pub fn everything() -> Self {
        Self {
            all: true,
            ranges: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        !self.all && self.ranges.is_empty()
    }

    pub fn matches(&self, protocol: Protocol, port: u16) -> bool {
        self.all
            || self
                .ranges
                .iter()
                .any(|&(p, lo, hi)| p == protocol && (lo..=hi).contains(&port))
    }

    pub fn add(&mut self, protocol: Protocol, lo: u16, hi: u16) {
        if self.all {
            return;
        }
        self.ranges.push((protocol, lo, hi));
        self.ranges.sort();
        let mut merged: Vec<(Protocol, u16, u16)> = Vec::new();
        for r in self.ranges.drain(..) {
            match merged.last_mut() {
                Some(last) if last.0 == r.0 && u32::from(r.1) <= u32::from(last.2) + 1 => {
                    last.2 = last.2.max(r.2)
                }
                _ => merged.push(r),
            }
        }
        self.ranges = merged;
    }

    pub fn union(&mut self, other: &PortSet) {
        if other.all {
            *self = Self::everything();
            return;
        }
        for &(p, lo, hi) in &other.ranges {
            self.add(p, lo, hi);
        }
    }
}

/// What one direction of one pod allows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Direction {
    pub isolated: bool,
    pub any: PortSet,
    /// By peer pod (index into [`Cluster::pods`]).
    pub peers: BTreeMap<usize, PortSet>,
    /// Longest-prefix-match table (see the module doc).
    pub cidrs: BTreeMap<Cidr, PortSet>,
}

impl Direction {
    /// Whether this direction lets `(protocol, port)` through with `peer` (its pod index, if
    /// it is a pod) at address `addr`.
    pub fn allows(
        &self,
        peer: Option<usize>,
        addr: Option<IpAddr>,
        protocol: Protocol,
        port: u16,
    ) -> bool {
        !self.isolated
            || self.any.matches(protocol, port)
            || peer
                .and_then(|j| self.peers.get(&j))
                .is_some_and(|s| s.matches(protocol, port))
            || addr
                .and_then(|a| self.longest(a))
                .is_some_and(|s| s.matches(protocol, port))
    }

    /// The entry of the longest prefix containing `addr`.
    pub fn longest(&self, addr: IpAddr) -> Option<&PortSet> {
        self.cidrs
            .iter()
            .filter(|(c, _)| c.contains(addr))
            .max_by_key(|(c, _)| c.prefix)
            .map(|(_, s)| s)
    }
}

/// Both directions of one pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodRules {
    pub ingress: Direction,
    pub egress: Direction,
}

/// Every pod's tables, indexed like [`Cluster::pods`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Compiled {
    pub pods: Vec<PodRules>,
}

impl Compiled {
    /// Whether the tables allow `probe` (egress of the source pod, ingress of the destination
    /// pod), looked up as the datapath does.
    pub fn allowed(&self, cluster: &Cluster, probe: &Probe) -> bool {
        let (src_addr, dst_addr) = (
            cluster.address(probe.from, probe.v6),
            cluster.address(probe.to, probe.v6),
        );
        let pod = |e: Endpoint| match e {
            Endpoint::Pod(i) => Some(i),
            Endpoint::External(_) => None,
        };
        let egress_ok = pod(probe.from).is_none_or(|s| {
            self.pods[s]
                .egress
                .allows(pod(probe.to), dst_addr, probe.protocol, probe.port)
        });
        let ingress_ok = pod(probe.to).is_none_or(|d| {
            self.pods[d]
                .ingress
                .allows(pod(probe.from), src_addr, probe.protocol, probe.port)
        });
        egress_ok && ingress_ok
    }
}

/// Compiles `policies` over `cluster`.
pub fn compile(cluster: &Cluster, policies: &[Policy]) -> Compiled {
    let mut out = Compiled {
        pods: vec![PodRules::default(); cluster.pods.len()],
    };
    for (i, pod) in cluster.pods.iter().enumerate() {
        let mut raw_in: Vec<(Cidr, PortSet)> = Vec::new();
        let mut raw_out: Vec<(Cidr, PortSet)> = Vec::new();
        for p in policies.iter().filter(|p| crate::eval::selects(p, pod)) {
            if p.ingress_isolates {
                let d = &mut out.pods[i].ingress;
                d.isolated = true;
                for r in &p.ingress {
                    // Ingress ports are the selected pod's own: named ports resolve here.
                    let mut ports = PortSet::default();
                    for pr in r.ports.as_deref().map_or(&[][..], |v| v) {
                        add_port(&mut ports, pr, &cluster.pods[i].ports);
                    }
                    if r.ports.is_none() {
                        ports = PortSet::everything();
                    }
                    if ports.is_empty() {
                        continue;
                    }
                    match &r.peers {
                        None => d.any.union(&ports),
                        Some(peers) => {
                            for q in peers {
                                add_peer(cluster, p, q, &ports, &mut d.peers, &mut raw_in);
                            }
                        }
                    }
                }
            }
            if p.egress_isolates {
                let d = &mut out.pods[i].egress;
                d.isolated = true;
                for r in &p.egress {
                    // Egress ports are the destination's: numbered ones apply to every
                    // peer, named ones resolve per destination pod.
                    let (numbered, named) = split_ports(r.ports.as_deref());
                    if !numbered.is_empty() {
                        match &r.peers {
                            None => d.any.union(&numbered),
                            Some(peers) => {
                                for q in peers {
                                    add_peer(cluster, p, q, &numbered, &mut d.peers, &mut raw_out);
                                }
                            }
                        }
                    }
                    for pr in &named {
                        let PortMatch::Named(name) = &pr.port else {
                            continue;
                        };
                        for (j, dst) in cluster.pods.iter().enumerate() {
                            let Some(np) = dst
                                .ports
                                .iter()
                                .find(|np| &np.name == name && np.protocol == pr.protocol)
                            else {
                                continue;
                            };
                            let mut one = PortSet::default();
                            one.add(np.protocol, np.port, np.port);
                            match &r.peers {
                                None => d.peers.entry(j).or_default().union(&one),
                                Some(peers) => {
                                    for q in peers {
                                        named_egress_peer(cluster, p, q, j, &one, d, &mut raw_out);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        out.pods[i].ingress.cidrs = lpm_table(raw_in);
        out.pods[i].egress.cidrs = lpm_table(raw_out);
    }
    out
}

/// The numbered ports of a rule (everything, for a rule without ports) and its named ones.
fn split_ports(ports: Option<&[PortRule]>) -> (PortSet, Vec<PortRule>) {
    let Some(ports) = ports else {
        return (PortSet::everything(), Vec::new());
    };
    let mut numbered = PortSet::default();
    let mut named = Vec::new();
    for pr in ports {
        match &pr.port {
            PortMatch::Named(_) => named.push(pr.clone()),
            _ => add_port(&mut numbered, pr, &[]),
        }
    }
    (numbered, named)
}

/// Adds a port rule to `set`, a named port resolved against `own` (the pod's named ports).
fn add_port(set: &mut PortSet, pr: &PortRule, own: &[crate::eval::NamedPort]) {
    match &pr.port {
        PortMatch::Any => set.add(pr.protocol, 0, u16::MAX),
        PortMatch::Range { lo, hi } => set.add(pr.protocol, *lo, *hi),
        PortMatch::Named(name) => {
            if let Some(np) = own
                .iter()
                .find(|np| &np.name == name && np.protocol == pr.protocol)
            {
                set.add(np.protocol, np.port, np.port);
            }
        }
    }
}

/// Adds what peer `q` of policy `p` allows with `ports`: its pods to `peers`, its prefixes
/// (excepts subtracted) to `raw`.
fn add_peer(
    cluster: &Cluster,
    p: &Policy,
    q: &Peer,
    ports: &PortSet,
    peers: &mut BTreeMap<usize, PortSet>,
    raw: &mut Vec<(Cidr, PortSet)>,
) {
    match q {
        Peer::IpBlock { cidr, except } => {
            for c in subtract(*cidr, except) {
                raw.push((c, ports.clone()));
            }
        }
        Peer::Pods { .. } => {
            for j in 0..cluster.pods.len() {
                if peer_selects_pod(cluster, p, q, j) {
                    peers.entry(j).or_default().union(ports);
                }
            }
        }
    }
}

/// A named egress port towards pod `j` through peer `q`: a pod peer adds `j`, an `ipBlock`
/// adds `j`'s addresses that lie in the block (as host prefixes).
fn named_egress_peer(
    cluster: &Cluster,
    p: &Policy,
    q: &Peer,
    j: usize,
    one: &PortSet,
    d: &mut Direction,
    raw: &mut Vec<(Cidr, PortSet)>,
) {
    match q {
        Peer::IpBlock { cidr, except } => {
            for &ip in &cluster.pods[j].ips {
                if cidr.contains(ip) && !except.iter().any(|x| x.contains(ip)) {
                    let host = if ip.is_ipv4() { 32 } else { 128 };
                    raw.push((Cidr::new(ip, host), one.clone()));
                }
            }
        }
        Peer::Pods { .. } => {
            if peer_selects_pod(cluster, p, q, j) {
                d.peers.entry(j).or_default().union(one);
            }
        }
    }
}

fn peer_selects_pod(cluster: &Cluster, p: &Policy, q: &Peer, j: usize) -> bool {
    let Peer::Pods { pods, namespaces } = q else {
        return false;
    };
    let pod = &cluster.pods[j];
    let ns_ok = match namespaces {
        None => pod.namespace == p.namespace,
        Some(sel) => sel.matches(&cluster.namespace_labels(&pod.namespace)),
    };
    ns_ok && pods.as_ref().is_none_or(|s| s.matches(&pod.labels))
}

/// `cidr` minus `except`, as disjoint prefixes.
pub fn subtract(cidr: Cidr, except: &[Cidr]) -> Vec<Cidr> {
    let mut out = Vec::new();
    split(cidr, except, &mut out);
    out
}

fn split(c: Cidr, except: &[Cidr], out: &mut Vec<Cidr>) {
    if except.iter().any(|e| e.covers(&c)) {
        return;
    }
    if !except.iter().any(|e| c.covers(e)) {
        out.push(c);
        return;
    }
    // Some except lies strictly inside: halve and recurse.
    let width = if c.addr.is_ipv4() { 32 } else { 128 };
    let p = c.prefix + 1;
    let low = Cidr::new(c.addr, p);
    let high = match c.addr {
        IpAddr::V4(a) => Cidr::new(IpAddr::V4((u32::from(a) | (1u32 << (width - p))).into()), p),
        IpAddr::V6(a) => Cidr::new(
            IpAddr::V6((u128::from(a) | (1u128 << (width - p))).into()),
            p,
        ),
    };
    split(low, except, out);
    split(high, except, out);
}

/// The longest-prefix table of `raw`: each prefix carries the union of every prefix covering
/// it (itself included).
fn lpm_table(raw: Vec<(Cidr, PortSet)>) -> BTreeMap<Cidr, PortSet> {
    let mut merged: BTreeMap<Cidr, PortSet> = BTreeMap::new();
    for (c, s) in &raw {
        merged.entry(*c).or_default().union(s);
    }
    let keys: Vec<Cidr> = merged.keys().copied().collect();
    let mut out = BTreeMap::new();
    for k in &keys {
        let mut s = PortSet::default();
        for (c, cs) in &merged {
            if c.covers(k) {
                s.union(cs);
            }
        }
        out.insert(*k, s);
    }
    out
}
