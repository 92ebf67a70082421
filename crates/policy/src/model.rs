//! The validated form of a NetworkPolicy: what the evaluator and the compiler read.
//!
//! [`crate::parse()`] turns each `networking.k8s.io/v1` object into a [`Policy`], checking what
//! the Kubernetes API server checks (names, label keys and values, operators, protocols,
//! ports, CIDRs) and filling in its defaults (namespace `default`, protocol TCP, `policyTypes`
//! from the rules), so that nothing downstream has to decide what a missing field means.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// A NetworkPolicy, validated and with the API server's defaults applied.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Policy {
    pub namespace: String,
    pub name: String,
    /// The pods of `namespace` this policy selects (an empty selector selects them all).
    pub pod_selector: Selector,
    /// Whether the selected pods are isolated for ingress by this policy.
    pub ingress_isolates: bool,
    /// Whether the selected pods are isolated for egress by this policy.
    pub egress_isolates: bool,
    pub ingress: Vec<Rule>,
    pub egress: Vec<Rule>,
}

/// One ingress or egress rule: traffic matches when it matches one of the peers (or `peers`
/// is `None`: any peer) and one of the ports (or `ports` is `None`: any port).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rule {
    /// `None`: the `from`/`to` list was absent or empty, which matches every peer.
    pub peers: Option<Vec<Peer>>,
    /// `None`: the `ports` list was absent or empty, which matches every port and protocol.
    pub ports: Option<Vec<PortRule>>,
}

/// A peer of a rule.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Peer {
    /// Pods chosen by labels. `namespaces: None` means the policy's own namespace;
    /// `pods: None` means every pod of the chosen namespaces.
    Pods {
        pods: Option<Selector>,
        namespaces: Option<Selector>,
    },
    /// Addresses in `cidr` and in none of `except`.
    IpBlock { cidr: Cidr, except: Vec<Cidr> },
}

/// A port of a rule.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PortRule {
    pub protocol: Protocol,
    pub port: PortMatch,
}

/// Which destination ports a [`PortRule`] matches.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum PortMatch {
    /// No `port`: every port of the protocol.
    Any,
    /// `port` (and `endPort`): the ports `lo..=hi`.
    Range { lo: u16, hi: u16 },
    /// A named port: the destination pod's port of that name and protocol.
    Named(String),
}

/// A transport protocol a policy can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Protocol {
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
    #[serde(rename = "SCTP")]
    Sctp,
}

impl Protocol {
    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }

    /// `TCP`, `UDP` or `SCTP`, as the schema spells it.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        })
    }
}

/// A label selector: every `match_labels` pair and every expression must hold. An empty
/// selector matches every label set.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Selector {
    pub match_labels: BTreeMap<String, String>,
    pub expressions: Vec<Expression>,
}

/// One `matchExpressions` entry.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Expression {
    pub key: String,
    pub op: Operator,
    /// Non-empty for `In`/`NotIn`, empty for `Exists`/`DoesNotExist`.
    pub values: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// Labels of a pod or namespace.
pub type Labels = BTreeMap<String, String>;

impl Selector {
    /// Whether `labels` satisfy this selector (Kubernetes `labels.Selector.Matches`: `NotIn`
    /// and `DoesNotExist` hold when the key is absent).
    pub fn matches(&self, labels: &Labels) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.expressions.iter().all(|e| e.matches(labels))
    }

    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.expressions.is_empty()
    }
}

impl Expression {
    pub fn matches(&self, labels: &Labels) -> bool {
        let v = labels.get(&self.key);
        match self.op {
            Operator::In => v.is_some_and(|v| self.values.contains(v)),
            Operator::NotIn => v.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => v.is_some(),
            Operator::DoesNotExist => v.is_none(),
        }
    }
}

/// An address prefix, host bits cleared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Cidr {
    /// `a.b.c.d/n` or `x::y/n`; host bits are cleared (the API server accepts them too).
    pub fn parse(s: &str) -> Option<Self> {
        let (a, p) = s.split_once('/')?;
        let addr: IpAddr = a.parse().ok()?;
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let prefix: u8 = p.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return None;
        }
        Some(Self::new(addr, prefix))
    }

    /// The prefix of `addr` of length `prefix` (at most the family's width).
    pub fn new(addr: IpAddr, prefix: u8) -> Self {
        let addr = match addr {
            IpAddr::V4(a) => {
                let p = prefix.min(32);
                let mask = if p == 0 { 0 } else { u32::MAX << (32 - p) };
                IpAddr::V4((u32::from(a) & mask).into())
            }
            IpAddr::V6(a) => {
                let p = prefix.min(128);
                let mask = if p == 0 { 0 } else { u128::MAX << (128 - p) };
                IpAddr::V6((u128::from(a) & mask).into())
            }
        };
        Self { addr, prefix }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => {
                Cidr::new(ip, self.prefix).addr == self.addr
            }
            _ => false,
        }
    }

    /// Whether `other` lies inside this prefix.
    pub fn covers(&self, other: &Cidr) -> bool {
        other.prefix >= self.prefix && self.contains(other.addr)
    }
}

impl Peer {
    /// Whether this peer is an `ipBlock`.
    pub fn is_ip_block(&self) -> bool {
        matches!(self, Peer::IpBlock { .. })
    }
}
