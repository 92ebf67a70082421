//! The upstream netpol e2e world and its named cases (Kubernetes `test/e2e/network/netpol`):
//! namespaces `x`, `y`, `z` (labels `ns=<name>` and `kubernetes.io/metadata.name=<name>`), in
//! each the pods `a`, `b`, `c` (label `pod=<name>`), every pod serving TCP and UDP on ports 80
//! and 81 under the names `serve-80-tcp`, `serve-80-udp`, `serve-81-tcp`, `serve-81-udp`; and
//! `ext`, an address on the wire that is no pod.
//!
//! Each [`Case`] is a policy document (addresses written `{x/a}`, filled in by [`render`])
//! and its expected reachability, written by hand from the case's meaning, not computed: the
//! unit tests hold the reference evaluator to it, and the datapath's root test holds the
//! kernel to the evaluator.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::eval::{Cluster, Endpoint, NamedPort, PodInfo, Probe};
use crate::model::Protocol;

pub const NAMESPACES: [&str; 3] = ["x", "y", "z"];
pub const PODS: [&str; 3] = ["a", "b", "c"];
/// The probed ports (every pod serves both on TCP and UDP).
pub const PORTS: [u16; 2] = [80, 81];
pub const PROTOCOLS: [Protocol; 2] = [Protocol::Tcp, Protocol::Udp];
/// The name of the endpoint on the wire.
pub const EXT: &str = "ext";

/// Every endpoint name: `x/a` .. `z/c`, then `ext`.
pub fn endpoints() -> Vec<String> {
    let mut v: Vec<String> = NAMESPACES
        .iter()
        .flat_map(|n| PODS.iter().map(move |p| format!("{n}/{p}")))
        .collect();
    v.push(EXT.to_string());
    v
}

/// The named ports every pod of the world has.
pub fn named_ports() -> Vec<NamedPort> {
    let mut v = Vec::new();
    for port in PORTS {
        for protocol in PROTOCOLS {
            v.push(NamedPort {
                name: format!("serve-{port}-{}", protocol.to_string().to_lowercase()),
                protocol,
                port,
            });
        }
    }
    v
}

/// The world with addresses from `addr` (given an endpoint name: `x/a` .. `z/c`, `ext`).
/// Pods are in [`endpoints`] order.
pub fn world(addr: &dyn Fn(&str) -> IpAddr) -> Cluster {
    let mut c = Cluster::default();
    for n in NAMESPACES {
        c.namespaces.insert(
            n.to_string(),
            BTreeMap::from([
                ("ns".to_string(), n.to_string()),
                ("kubernetes.io/metadata.name".to_string(), n.to_string()),
            ]),
        );
        for p in PODS {
            c.pods.push(PodInfo {
                namespace: n.to_string(),
                name: p.to_string(),
                labels: BTreeMap::from([("pod".to_string(), p.to_string())]),
                ips: vec![addr(&format!("{n}/{p}"))],
                ports: named_ports(),
            });
        }
    }
    c
}

/// The endpoint named `name` in a [`world`].
pub fn endpoint(cluster: &Cluster, name: &str, addr: &dyn Fn(&str) -> IpAddr) -> Endpoint {
    match name.split_once('/') {
        Some((n, p)) => Endpoint::Pod(
            cluster
                .pods
                .iter()
                .position(|q| q.namespace == n && q.name == p)
                .expect("a pod of the world"),
        ),
        None => Endpoint::External(addr(name)),
    }
}

/// Every probe between two different endpoints of the world, TCP and UDP, ports 80 and 81,
/// as (source name, destination name, probe).
pub fn probes(cluster: &Cluster, addr: &dyn Fn(&str) -> IpAddr) -> Vec<(String, String, Probe)> {
    let names = endpoints();
    let mut v = Vec::new();
    for s in &names {
        for d in &names {
            if s == d || (s == EXT && d == EXT) {
                continue;
            }
            for protocol in PROTOCOLS {
                for port in PORTS {
                    let probe = Probe {
                        from: endpoint(cluster, s, addr),
                        to: endpoint(cluster, d, addr),
                        protocol,
                        port,
                        v6: addr(s).is_ipv6(),
                    };
                    v.push((s.clone(), d.clone(), probe));
                }
            }
        }
    }
    v
}

/// Fills `{x/a}`-style placeholders with the endpoint's address; with IPv6 addresses, the
/// cases' `0.0.0.0/0` becomes `::/0`.
pub fn render(template: &str, addr: &dyn Fn(&str) -> IpAddr) -> String {
    let mut s = template.to_string();
    let mut v6 = false;
    for e in endpoints() {
        let a = addr(&e);
        v6 |= a.is_ipv6();
        let host = if a.is_ipv4() { 32 } else { 128 };
        s = s.replace(&format!("{{{e}/net}}"), &format!("{a}/{host}"));
    }
    if v6 {
        s = s.replace("0.0.0.0/0", "::/0");
    }
    s
}

/// What a case expects of a probe: (source, destination, protocol, port) → allowed.
pub type Expect = fn(&str, &str, Protocol, u16) -> bool;

/// One named case.
pub struct Case {
    pub name: &'static str,
    /// Policy documents; `{x/b/net}` stands for x/b's address as a host prefix.
    pub yaml: &'static str,
    pub expect: Expect,
}

fn ns(e: &str) -> &str {
    e.split_once('/').map_or(e, |(n, _)| n)
}

fn pod(e: &str) -> &str {
    e.split_once('/').map_or("", |(_, p)| p)
}

/// The cases, after the upstream suite's names.
pub fn cases() -> Vec<Case> {
    use Protocol::{Tcp, Udp};
    vec![
        Case {
            name: "no policy: everything is allowed",
            yaml: "",
            expect: |_, _, _, _| true,
        },
        Case {
            name: "should support a 'default-deny-ingress' policy",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-ingress, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress]
"#,
            expect: |_, d, _, _| ns(d) != "x",
        },
        Case {
            name: "should support a 'default-deny-all' policy",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
"#,
            expect: |s, d, _, _| ns(s) != "x" && ns(d) != "x",
        },
        Case {
            name: "should support allow-all policy",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-all, namespace: x}
spec:
  podSelector: {}
  ingress: [{}]
  egress: [{}]
"#,
            expect: |_, _, _, _| true,
        },
        Case {
            name: "should enforce policy to allow traffic from pods within server namespace based on PodSelector",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-from-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - podSelector: {matchLabels: {pod: b}}
"#,
            expect: |s, d, _, _| d != "x/a" || s == "x/b",
        },
        Case {
            name: "should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-from-other-ns, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - namespaceSelector:
        matchExpressions: [{key: ns, operator: NotIn, values: [x]}]
"#,
            expect: |s, d, _, _| d != "x/a" || (s != "ext" && ns(s) != "x"),
        },
        Case {
            name: "should enforce policy based on PodSelector and NamespaceSelector",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-from-y-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {ns: y}}
      podSelector: {matchLabels: {pod: b}}
"#,
            expect: |s, d, _, _| d != "x/a" || s == "y/b",
        },
        Case {
            name: "should enforce policy based on PodSelector or NamespaceSelector",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-from-y-or-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {ns: y}}
    - podSelector: {matchLabels: {pod: b}}
"#,
            expect: |s, d, _, _| d != "x/a" || ns(s) == "y" || s == "x/b",
        },
        Case {
            name: "should enforce policy based on Multiple PodSelectors and NamespaceSelectors",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-from-yz-ac, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - namespaceSelector:
        matchExpressions: [{key: ns, operator: In, values: [y, z]}]
      podSelector:
        matchExpressions: [{key: pod, operator: In, values: [a, c]}]
"#,
            expect: |s, d, _, _| {
                d != "x/a" || (matches!(ns(s), "y" | "z") && matches!(pod(s), "a" | "c"))
            },
        },
        Case {
            name: "should enforce policy to allow traffic based on NamespaceSelector with MatchLabels using default ns label",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-from-y, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}
"#,
            expect: |s, d, _, _| d != "x/a" || ns(s) == "y",
        },
        Case {
            name: "a namespaceSelector {} with a podSelector chooses that pod in every namespace",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-from-any-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - namespaceSelector: {}
      podSelector: {matchLabels: {pod: b}}
"#,
            expect: |s, d, _, _| d != "x/a" || pod(s) == "b",
        },
        Case {
            name: "Exists and DoesNotExist: a namespace label no namespace has matches nothing",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-from-own-pods, namespace: x}
spec:
  podSelector:
    matchExpressions: [{key: pod, operator: Exists}]
  ingress:
  - from:
    - podSelector:
        matchExpressions: [{key: role, operator: DoesNotExist}]
  - from:
    - namespaceSelector:
        matchExpressions: [{key: env, operator: Exists}]
"#,
            expect: |s, d, _, _| ns(d) != "x" || ns(s) == "x",
        },
        Case {
            name: "should enforce policy based on PodSelector with MatchExpressions (NotIn holds where the key is absent)",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-from-not-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - podSelector:
        matchExpressions:
        - {key: pod, operator: NotIn, values: [b]}
        - {key: role, operator: NotIn, values: [db]}
"#,
            expect: |s, d, _, _| d != "x/a" || (ns(s) == "x" && pod(s) != "b"),
        },
        Case {
            name: "should enforce policy based on Ports",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-from-y-tcp-81, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {ns: y}}
    ports:
    - {port: 81, protocol: TCP}
"#,
            expect: |s, d, p, port| d != "x/a" || (ns(s) == "y" && p == Tcp && port == 81),
        },
        Case {
            name: "should not allow access by TCP when a policy specifies only UDP",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-udp-only, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - ports:
    - {port: 80, protocol: UDP}
    - {port: 81, protocol: UDP}
"#,
            expect: |_, d, p, _| d != "x/a" || p == Udp,
        },
        Case {
            name: "should enforce ingress policy allowing any port traffic to a server on a specific protocol",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-any-tcp, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - ports: [{protocol: TCP}]
"#,
            expect: |_, d, p, _| d != "x/a" || p == Tcp,
        },
        Case {
            name: "should allow ingress access on one named port",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-named-81, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - ports:
    - {port: serve-81-tcp}
    - {port: serve-80-udp, protocol: UDP}
"#,
            expect: |_, d, p, port| d != "x/a" || (p == Tcp && port == 81) || (p == Udp && port == 80),
        },
        Case {
            name: "a named port under another protocol than its own matches nothing",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-named-wrong-proto, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - ports: [{port: serve-80-tcp, protocol: UDP}]
"#,
            expect: |_, d, _, _| d != "x/a",
        },
        Case {
            name: "should allow ingress access from namespace on one named port",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-from-y-named-80, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: y}}}]
    ports: [{port: serve-80-tcp}]
"#,
            expect: |s, d, p, port| ns(d) != "x" || (ns(s) == "y" && p == Tcp && port == 80),
        },
        Case {
            name: "should support a port range (endPort)",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-range, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - ports: [{protocol: TCP, port: 75, endPort: 80}, {protocol: UDP, port: 81, endPort: 9000}]
"#,
            expect: |_, d, p, port| d != "x/a" || (p == Tcp && port == 80) || (p == Udp && port == 81),
        },
        Case {
            name: "should enforce multiple, stacked policies with overlapping podSelectors",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-from-b-80, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{podSelector: {matchLabels: {pod: b}}}]
    ports: [{port: 80, protocol: TCP}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-all-from-c-81, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from: [{podSelector: {matchLabels: {pod: c}}}]
    ports: [{port: 81, protocol: TCP}, {port: 81, protocol: UDP}]
"#,
            expect: |s, d, p, port| {
                ns(d) != "x"
                    || (s == "x/c" && port == 81)
                    || (d == "x/a" && s == "x/b" && p == Tcp && port == 80)
            },
        },
        Case {
            name: "should support denying of egress traffic on the client side",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-no-egress, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: y-allow-all, namespace: y}
spec:
  podSelector: {}
  ingress: [{}]
"#,
            expect: |s, _, _, _| s != "x/a",
        },
        Case {
            name: "should enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-to-y-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  egress:
  - to:
    - namespaceSelector: {matchLabels: {ns: y}}
      podSelector: {matchLabels: {pod: b}}
"#,
            // No policyTypes: egress rules make it an egress policy, and it is an ingress
            // policy too (without ingress rules: x/a accepts nothing).
            expect: |s, d, _, _| d != "x/a" && (s != "x/a" || d == "y/b"),
        },
        Case {
            name: "an egress list that is present but empty does not make an egress policy",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-empty-egress, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  egress: []
"#,
            expect: |_, d, _, _| d != "x/a",
        },
        Case {
            name: "should allow egress access on one named port",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-egress-named, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - ports: [{port: serve-80-udp, protocol: UDP}]
"#,
            // The wire endpoint is no pod and has no named ports.
            expect: |s, d, p, port| s != "x/a" || (d != "ext" && p == Udp && port == 80),
        },
        Case {
            name: "should allow egress access to server in CIDR block",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-to-y-b-cidr, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: "{y/b/net}"}}]
"#,
            expect: |s, d, _, _| s != "x/a" || d == "y/b",
        },
        Case {
            name: "should enforce except clause while egress access to server in CIDR block",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-to-all-but-x-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to:
    - ipBlock: {cidr: 0.0.0.0/0, except: ["{x/b/net}"]}
"#,
            expect: |s, d, _, _| s != "x/a" || d != "x/b",
        },
        Case {
            name: "should ensure an IP overlapping both IPBlock.CIDR and IPBlock.Except is allowed",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-all-but-x-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to:
    - ipBlock: {cidr: 0.0.0.0/0, except: ["{x/b/net}"]}
    ports: [{port: 80, protocol: TCP}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-to-x-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: "{x/b/net}"}}]
"#,
            expect: |s, d, p, port| s != "x/a" || d == "x/b" || (p == Tcp && port == 80),
        },
        Case {
            name: "ingress from an ipBlock admits the wire and nothing else",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-from-ext, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{ipBlock: {cidr: "{ext/net}"}}, {ipBlock: {cidr: "{z/c/net}"}}]
    ports: [{port: 81, protocol: UDP}, {port: 80, protocol: TCP}]
"#,
            expect: |s, d, p, port| {
                d != "x/a" || ((s == "ext" || s == "z/c") && ((p == Udp && port == 81) || (p == Tcp && port == 80)))
            },
        },
        Case {
            name: "should work with Ingress, Egress specified together",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-both, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Ingress, Egress]
  ingress:
  - from: [{podSelector: {matchLabels: {pod: b}}}]
  egress:
  - to: [{namespaceSelector: {matchLabels: {ns: y}}}]
    ports: [{port: 80, protocol: TCP}]
"#,
            expect: |s, d, p, port| {
                (d != "x/a" || s == "x/b") && (s != "x/a" || (ns(d) == "y" && p == Tcp && port == 80))
            },
        },
        Case {
            name: "should enforce policies to check ingress and egress policies can be controlled independently based on PodSelector",
            yaml: r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-a-egress-to-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {pod: b}}}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: x-b-deny-ingress, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  policyTypes: [Ingress]
"#,
            // x/a may only send to x/b, which accepts nothing: x/a reaches no one.
            expect: |s, d, _, _| d != "x/b" && s != "x/a",
        },
    ]
}

/// Policy documents generated from `seed` for the world above, `n` cases of one to three
/// policies each, mixing every rule kind: pod and namespace selectors (`matchLabels`,
/// `matchExpressions` with `In`, `NotIn`, `Exists`), both together, `ipBlock` with and without
/// `except`, numeric, named and ranged ports on TCP and UDP, ingress, egress, and
/// `policyTypes` given or left to the default. Addresses are `{x/a/net}` placeholders for
/// [`render`]. Their expected reachability is the reference evaluator's (no hand-written
/// table). The generator is splitmix64, written here so that a seed names the same documents
/// on every platform and version (a general-purpose generator crate does not promise that).
pub fn generated(seed: u64, n: usize) -> Vec<String> {
    let mut g = SplitMix(seed);
    (0..n)
        .map(|i| {
            (0..1 + g.below(3))
                .map(|j| generated_policy(&mut g, &format!("gen-{i}-{j}")))
                .collect::<Vec<_>>()
                .join("---\n")
        })
        .collect()
}

struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len())]
    }
}

fn generated_selector(g: &mut SplitMix, key: &str, values: &[&str]) -> String {
    match g.below(4) {
        0 => "{}".to_string(),
        1 => format!("{{matchLabels: {{{key}: {}}}}}", g.pick(values)),
        2 => format!(
            "{{matchExpressions: [{{key: {key}, operator: {}, values: [{}, {}]}}]}}",
            g.pick(&["In", "NotIn"]),
            g.pick(values),
            g.pick(values)
        ),
        _ => format!("{{matchExpressions: [{{key: {key}, operator: Exists}}]}}"),
    }
}

fn generated_peer(g: &mut SplitMix) -> String {
    let ends = endpoints();
    let e = &ends[g.below(ends.len())];
    match g.below(5) {
        0 => format!("{{podSelector: {}}}", generated_selector(g, "pod", &PODS)),
        1 => format!(
            "{{namespaceSelector: {}}}",
            generated_selector(g, "ns", &NAMESPACES)
        ),
        2 => format!(
            "{{namespaceSelector: {}, podSelector: {}}}",
            generated_selector(g, "ns", &NAMESPACES),
            generated_selector(g, "pod", &PODS)
        ),
        3 => format!("{{ipBlock: {{cidr: \"{{{e}/net}}\"}}}}"),
        _ => format!("{{ipBlock: {{cidr: 0.0.0.0/0, except: [\"{{{e}/net}}\"]}}}}"),
    }
}

fn generated_port(g: &mut SplitMix) -> String {
    let proto = g.pick(&["TCP", "UDP"]);
    match g.below(3) {
        0 => format!("{{port: {}, protocol: {proto}}}", g.pick(&["80", "81"])),
        1 => {
            let ports = named_ports();
            format!(
                "{{port: {}, protocol: {proto}}}",
                ports[g.below(ports.len())].name
            )
        }
        _ => format!("{{port: 80, endPort: 81, protocol: {proto}}}"),
    }
}

fn generated_rules(g: &mut SplitMix, peers_key: &str) -> String {
    let mut rules = Vec::new();
    for _ in 0..g.below(3) {
        let mut fields = Vec::new();
        if g.below(4) != 0 {
            let peers: Vec<String> = (0..1 + g.below(2)).map(|_| generated_peer(g)).collect();
            fields.push(format!("{peers_key}: [{}]", peers.join(", ")));
        }
        if g.below(2) == 0 {
            let ports: Vec<String> = (0..1 + g.below(2)).map(|_| generated_port(g)).collect();
            fields.push(format!("ports: [{}]", ports.join(", ")));
        }
        rules.push(format!("{{{}}}", fields.join(", ")));
    }
    format!("[{}]", rules.join(", "))
}

fn generated_policy(g: &mut SplitMix, name: &str) -> String {
    let namespace = g.pick(&NAMESPACES);
    let selector = generated_selector(g, "pod", &PODS);
    let mut spec = vec![format!("podSelector: {selector}")];
    match g.below(4) {
        0 => spec.push("policyTypes: [Ingress]".into()),
        1 => spec.push("policyTypes: [Egress]".into()),
        2 => spec.push("policyTypes: [Ingress, Egress]".into()),
        _ => {}
    }
    if g.below(3) != 0 {
        spec.push(format!("ingress: {}", generated_rules(g, "from")));
    }
    if g.below(2) == 0 {
        spec.push(format!("egress: {}", generated_rules(g, "to")));
    }
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
         metadata: {{name: {name}, namespace: {namespace}}}\n\
         spec: {{{}}}\n",
        spec.join(", ")
    )
}
