//! The crate's tests: the parser's errors, the upstream cases' truth tables against the
//! reference evaluator, and the compiled tables against the evaluator on generated worlds.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use crate::cases::{self, Case};
use crate::compile::{compile, subtract};
use crate::eval::{allowed, Cluster, Endpoint, NamedPort, PodInfo, Probe};
use crate::model::{
    Cidr, Expression, Operator, Peer, Policy, PortMatch, PortRule, Protocol, Rule, Selector,
};
use crate::parse::parse;

fn addr(e: &str) -> IpAddr {
    if e == cases::EXT {
        return "192.0.2.1".parse().unwrap();
    }
    let (n, p) = e.split_once('/').unwrap();
    let ni = cases::NAMESPACES.iter().position(|x| *x == n).unwrap() as u8;
    let pi = cases::PODS.iter().position(|x| *x == p).unwrap() as u8;
    IpAddr::V4(Ipv4Addr::new(10, 244, ni, 10 + pi))
}

/// The same world in IPv6.
fn addr6(e: &str) -> IpAddr {
    match addr(e) {
        IpAddr::V4(a) => {
            let [_, _, n, p] = a.octets();
            IpAddr::V6(Ipv6Addr::new(
                0xfd44,
                0,
                0,
                0,
                0,
                0,
                u16::from(n),
                u16::from(p),
            ))
        }
        v6 => v6,
    }
}

fn policies_in(yaml: &str, addr: &dyn Fn(&str) -> IpAddr) -> Vec<Policy> {
    parse(&cases::render(yaml, addr))
        .unwrap_or_else(|e| panic!("{e}\n{yaml}"))
        .into_iter()
        .map(|p| p.policy)
        .collect()
}

/// The case's truth table: every probe's expected and evaluated verdicts, mismatches listed
/// as the upstream suite prints them.
fn check_case(c: &Case, judge: &dyn Fn(&Cluster, &[Policy], &Probe) -> bool) -> Vec<String> {
    let mut wrong = check_case_in(c, judge, &addr);
    wrong.extend(check_case_in(c, judge, &addr6));
    wrong
}

/// [`check_case`] in the world whose addresses `addr` gives (IPv4 or IPv6).
fn check_case_in(
    c: &Case,
    judge: &dyn Fn(&Cluster, &[Policy], &Probe) -> bool,
    addr: &dyn Fn(&str) -> IpAddr,
) -> Vec<String> {
    let world = cases::world(addr);
    let pols = policies_in(c.yaml, addr);
    let mut wrong = Vec::new();
    for (s, d, probe) in cases::probes(&world, addr) {
        let want = (c.expect)(&s, &d, probe.protocol, probe.port);
        let got = judge(&world, &pols, &probe);
        if want != got {
            wrong.push(format!(
                "{s} -> {d} {}/{}: expected {}, got {}",
                probe.protocol,
                probe.port,
                verdict(want),
                verdict(got)
            ));
        }
    }
    wrong
}

fn verdict(b: bool) -> &'static str {
    if b {
        "allow"
    } else {
        "deny"
    }
}

#[test]
fn the_reference_evaluator_meets_every_upstream_case() {
    let mut failures = Vec::new();
    for c in cases::cases() {
        let wrong = check_case(&c, &|w, p, probe| allowed(w, p, probe));
        if !wrong.is_empty() {
            failures.push(format!("{}:\n    {}", c.name, wrong.join("\n    ")));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_compiled_tables_meet_every_upstream_case() {
    let mut failures = Vec::new();
    for c in cases::cases() {
        let wrong = check_case(&c, &|w, p, probe| compile(w, p).allowed(w, probe));
        if !wrong.is_empty() {
            failures.push(format!("{}:\n    {}", c.name, wrong.join("\n    ")));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every case has probes it allows and probes it denies (but the allow-everything ones), so a
/// table of all-allow or all-deny cannot pass the suite.
#[test]
fn the_cases_tell_allow_from_deny() {
    let world = cases::world(&addr);
    for c in cases::cases() {
        let verdicts: Vec<bool> = cases::probes(&world, &addr)
            .iter()
            .map(|(s, d, p)| (c.expect)(s, d, p.protocol, p.port))
            .collect();
        assert!(verdicts.contains(&true), "{}: allows nothing", c.name);
        if !c.name.contains("everything is allowed") && !c.name.contains("allow-all") {
            assert!(verdicts.contains(&false), "{}: denies nothing", c.name);
        }
    }
}

// --- the parser ---------------------------------------------------------------------------

fn parse_err(input: &str) -> String {
    match parse(input) {
        Ok(v) => panic!("parsed {} objects from a bad input:\n{input}", v.len()),
        Err(e) => e.to_string(),
    }
}

const HEAD: &str =
    "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: x}\n";

#[test]
fn errors_name_the_field_and_the_value() {
    let cases = [
        (
            "spec:\n  ingress:\n  - ports: [{protocol: ICMP, port: 80}]\n",
            "document 1: spec.ingress[0].ports[0].protocol: \"ICMP\" is not a protocol",
        ),
        (
            "spec:\n  ingress:\n  - ports: [{port: 70000}]\n",
            "spec.ingress[0].ports[0].port: 70000 is not a port; must be 1-65535",
        ),
        (
            "spec:\n  ingress:\n  - ports: [{port: 0}]\n",
            "spec.ingress[0].ports[0].port: 0 is not a port",
        ),
        (
            "spec:\n  egress:\n  - ports: [{port: 90, endPort: 80}]\n",
            "spec.egress[0].ports[0].endPort: 80 is below port 90",
        ),
        (
            "spec:\n  egress:\n  - ports: [{endPort: 80}]\n",
            "spec.egress[0].ports[0].endPort: endPort needs a numeric port",
        ),
        (
            "spec:\n  egress:\n  - ports: [{port: http, endPort: 80}]\n",
            "spec.egress[0].ports[0].endPort: endPort cannot follow the named port \"http\"",
        ),
        (
            "spec:\n  egress:\n  - ports: [{port: Not_A_Name}]\n",
            "spec.egress[0].ports[0].port: \"Not_A_Name\" is not a port name",
        ),
        (
            "spec:\n  podSelecter: {}\n",
            "spec.podSelecter: unknown field",
        ),
        (
            "spec:\n  ingress:\n  - from: [{podSelector: {matchLabel: {a: b}}}]\n",
            "spec.ingress[0].from[0].podSelector.matchLabel: unknown field",
        ),
        (
            "spec:\n  podSelector:\n    matchExpressions: [{key: a, operator: Equals, values: [b]}]\n",
            "spec.podSelector.matchExpressions[0].operator: \"Equals\" is not an operator",
        ),
        (
            "spec:\n  podSelector:\n    matchExpressions: [{key: a, operator: In}]\n",
            "spec.podSelector.matchExpressions[0].values: In needs at least one value",
        ),
        (
            "spec:\n  podSelector:\n    matchExpressions: [{key: a, operator: Exists, values: [b]}]\n",
            "spec.podSelector.matchExpressions[0].values: Exists takes no values",
        ),
        (
            "spec:\n  podSelector: {matchLabels: {\"a b\": c}}\n",
            "spec.podSelector.matchLabels: \"a b\" is not a label key",
        ),
        (
            "spec:\n  egress:\n  - to: [{ipBlock: {cidr: 10.0.0.0/33}}]\n",
            "spec.egress[0].to[0].ipBlock.cidr: \"10.0.0.0/33\" is not a CIDR",
        ),
        (
            "spec:\n  egress:\n  - to: [{ipBlock: {cidr: 10.0.0.0/16, except: [10.1.0.0/24]}}]\n",
            "spec.egress[0].to[0].ipBlock.except[0]: \"10.1.0.0/24\" must be a strict subset of cidr",
        ),
        (
            "spec:\n  egress:\n  - to: [{ipBlock: {cidr: 10.0.0.0/16}, podSelector: {}}]\n",
            "spec.egress[0].to[0]: ipBlock cannot be combined",
        ),
        (
            "spec:\n  egress:\n  - to: [{}]\n",
            "spec.egress[0].to[0]: an empty peer",
        ),
        (
            "spec:\n  policyTypes: [Ingress, Outgress]\n",
            "spec.policyTypes[1]: \"Outgress\" is not a policy type",
        ),
        (
            "spec:\n  ingress:\n  - ports: [{port: [80]}]\n",
            "spec.ingress[0].ports[0].port:",
        ),
    ];
    for (spec, want) in cases {
        let got = parse_err(&format!("{HEAD}{spec}"));
        assert!(got.contains(want), "{spec}\n  got:  {got}\n  want: {want}");
    }
}

#[test]
fn the_object_must_say_what_it_is() {
    let spec = "metadata: {name: p}\nspec: {}\n";
    assert!(parse_err(spec).contains("apiVersion: missing; must be \"networking.k8s.io/v1\""));
    let e = parse_err(&format!(
        "apiVersion: networking.k8s.io/v1beta1\nkind: NetworkPolicy\n{spec}"
    ));
    assert!(
        e.contains("apiVersion: \"networking.k8s.io/v1beta1\" is not supported"),
        "{e}"
    );
    let e = parse_err(&format!(
        "apiVersion: networking.k8s.io/v1\nkind: Pod\n{spec}"
    ));
    assert!(e.contains("kind: \"Pod\" is not supported"), "{e}");
    let e = parse_err("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nspec: {}\n");
    assert!(e.contains("metadata.name: missing"), "{e}");
    let e =
        parse_err("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: Web}\n");
    assert!(
        e.contains("metadata.name: \"Web\" is not a DNS subdomain"),
        "{e}"
    );
    let e = parse_err("- a\n- b\n");
    assert!(
        e.contains("expected a NetworkPolicy object, got an array"),
        "{e}"
    );
    let e = parse_err("{\"apiVersion\": ");
    assert!(e.starts_with("document 1: not JSON"), "{e}");
    let e = parse_err("a: [\n");
    assert!(e.starts_with("document 1: not YAML"), "{e}");
}

#[test]
fn later_documents_are_numbered_and_duplicates_refused() {
    let one = format!("{HEAD}spec: {{}}\n");
    let e = parse_err(&format!(
        "{one}---\n{HEAD}spec: {{policyTypes: [Sideways]}}\n"
    ));
    assert!(e.starts_with("document 2: spec.policyTypes[0]"), "{e}");
    let e = parse_err(&format!("{one}---\n{one}"));
    assert!(
        e.contains("document 2: metadata.name: \"p\" in namespace \"x\" appears twice"),
        "{e}"
    );
}

#[test]
fn yaml_json_and_lists_read_the_same() {
    let yaml = format!(
        "{HEAD}spec:\n  podSelector: {{matchLabels: {{app: web}}}}\n  ingress:\n  - ports: [{{port: 80}}]\n---\n"
    );
    let from_yaml = parse(&yaml).unwrap();
    let json = serde_json::to_string(&from_yaml[0].object).unwrap();
    let from_json = parse(&json).unwrap();
    assert_eq!(from_json, from_yaml);
    let two_json = parse(&format!("{json}\n{}", json.replace("\"p\"", "\"q\""))).unwrap();
    assert_eq!(two_json.len(), 2);
    let array = parse(&format!("[{json}, {}]", json.replace("\"p\"", "\"q\""))).unwrap();
    assert_eq!(array, two_json);
    let list = format!(
        "apiVersion: v1\nkind: List\nitems:\n- {json}\n- {}\n",
        json.replace("\"p\"", "\"q\"")
    );
    assert_eq!(parse(&list).unwrap(), two_json);
    // The defaults: namespace, protocol, policy types.
    let p = &parse(&yaml.replace("namespace: x", "")).unwrap()[0].policy;
    assert_eq!(p.namespace, "default");
    assert!(p.ingress_isolates && !p.egress_isolates);
    assert_eq!(
        p.ingress[0].ports.as_ref().unwrap()[0],
        PortRule {
            protocol: Protocol::Tcp,
            port: PortMatch::Range { lo: 80, hi: 80 }
        }
    );
    assert!(parse("").unwrap().is_empty());
    assert!(parse("---\n---\n").unwrap().is_empty());
}

#[test]
fn sctp_and_v6_blocks_parse() {
    let p = &parse(&format!(
        "{HEAD}spec:\n  egress:\n  - to: [{{ipBlock: {{cidr: 'fd00::/64', except: ['fd00::1/128']}}}}]\n    ports: [{{protocol: SCTP, port: 9}}]\n"
    ))
    .unwrap()[0]
        .policy;
    assert!(p.egress_isolates);
    let Some(peers) = &p.egress[0].peers else {
        panic!("peers")
    };
    assert_eq!(
        peers[0],
        Peer::IpBlock {
            cidr: Cidr::parse("fd00::/64").unwrap(),
            except: vec![Cidr::parse("fd00::1/128").unwrap()],
        }
    );
}

#[test]
fn subtracting_excepts_leaves_disjoint_prefixes_covering_the_rest() {
    let c = Cidr::parse("10.0.0.0/24").unwrap();
    let ex = [
        Cidr::parse("10.0.0.5/32").unwrap(),
        Cidr::parse("10.0.0.128/26").unwrap(),
    ];
    let parts = subtract(c, &ex);
    for i in 0..=255u8 {
        let ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, i));
        let want = !ex.iter().any(|e| e.contains(ip));
        let n = parts.iter().filter(|p| p.contains(ip)).count();
        assert_eq!(n, usize::from(want), "{ip}: in {n} parts");
    }
    assert!(subtract(c, &[Cidr::parse("10.0.0.0/16").unwrap()]).is_empty());
    assert_eq!(subtract(c, &[]), vec![c]);
}

// --- generated worlds ---------------------------------------------------------------------

const KEYS: [&str; 2] = ["app", "tier"];
const VALUES: [&str; 3] = ["a", "b", "c"];
const NSS: [&str; 3] = ["x", "y", "z"];
const NAMES: [&str; 2] = ["web", "db"];

fn labels_strategy() -> impl Strategy<Value = BTreeMap<String, String>> {
    proptest::collection::btree_map(
        proptest::sample::select(&KEYS[..]).prop_map(String::from),
        proptest::sample::select(&VALUES[..]).prop_map(String::from),
        0..=2,
    )
}

fn selector_strategy() -> impl Strategy<Value = Selector> {
    let expr = (
        proptest::sample::select(&KEYS[..]),
        prop_oneof![
            Just(Operator::In),
            Just(Operator::NotIn),
            Just(Operator::Exists),
            Just(Operator::DoesNotExist)
        ],
        proptest::collection::vec(proptest::sample::select(&VALUES[..]), 1..=2),
    )
        .prop_map(|(k, op, vals)| Expression {
            key: k.to_string(),
            op,
            values: match op {
                Operator::In | Operator::NotIn => vals.into_iter().map(String::from).collect(),
                _ => Vec::new(),
            },
        });
    (
        labels_strategy().prop_map(|l| l.into_iter().take(1).collect()),
        proptest::collection::vec(expr, 0..=1),
    )
        .prop_map(|(match_labels, expressions)| Selector {
            match_labels,
            expressions,
        })
}

fn cidr_strategy() -> impl Strategy<Value = Cidr> {
    // Inside 10.0.0.0/24, where the generated pods and the wire live.
    (0u8..=255, 24u8..=32)
        .prop_map(|(host, prefix)| Cidr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, host)), prefix))
}

fn peer_strategy() -> impl Strategy<Value = Peer> {
    prop_oneof![
        (
            proptest::option::of(selector_strategy()),
            proptest::option::of(selector_strategy())
        )
            .prop_filter("a peer names something", |(p, n)| p.is_some()
                || n.is_some())
            .prop_map(|(pods, namespaces)| Peer::Pods { pods, namespaces }),
        (
            cidr_strategy(),
            proptest::collection::vec(cidr_strategy(), 0..=2)
        )
            .prop_map(|(cidr, except)| Peer::IpBlock {
                cidr,
                except: except
                    .into_iter()
                    .filter(|e| cidr.covers(e) && e.prefix > cidr.prefix)
                    .collect(),
            }),
    ]
}

fn port_strategy() -> impl Strategy<Value = PortRule> {
    (
        prop_oneof![Just(Protocol::Tcp), Just(Protocol::Udp)],
        prop_oneof![
            Just(PortMatch::Any),
            (79u16..=82, 0u16..=2).prop_map(|(lo, n)| PortMatch::Range { lo, hi: lo + n }),
            proptest::sample::select(&NAMES[..]).prop_map(|n| PortMatch::Named(n.to_string())),
        ],
    )
        .prop_map(|(protocol, port)| PortRule { protocol, port })
}

fn rule_strategy() -> impl Strategy<Value = Rule> {
    (
        proptest::option::of(proptest::collection::vec(peer_strategy(), 1..=2)),
        proptest::option::of(proptest::collection::vec(port_strategy(), 1..=2)),
    )
        .prop_map(|(peers, ports)| Rule { peers, ports })
}

fn policy_strategy() -> impl Strategy<Value = Policy> {
    (
        proptest::sample::select(&NSS[..]),
        selector_strategy(),
        any::<bool>(),
        any::<bool>(),
        proptest::collection::vec(rule_strategy(), 0..=2),
        proptest::collection::vec(rule_strategy(), 0..=2),
    )
        .prop_map(|(ns, pod_selector, i, e, ingress, egress)| Policy {
            namespace: ns.to_string(),
            name: "p".to_string(),
            pod_selector,
            ingress_isolates: i || !e,
            egress_isolates: e,
            ingress,
            egress,
        })
}

fn world_strategy() -> impl Strategy<Value = Cluster> {
    let pod = (
        proptest::sample::select(&NSS[..]),
        labels_strategy(),
        proptest::collection::vec(
            (
                proptest::sample::select(&NAMES[..]),
                prop_oneof![Just(Protocol::Tcp), Just(Protocol::Udp)],
                79u16..=82,
            ),
            0..=2,
        ),
    );
    (
        proptest::collection::vec(labels_strategy(), 3),
        proptest::collection::vec(pod, 1..=5),
    )
        .prop_map(|(ns_labels, pods)| Cluster {
            namespaces: NSS.iter().map(|n| n.to_string()).zip(ns_labels).collect(),
            pods: pods
                .into_iter()
                .enumerate()
                .map(|(i, (ns, labels, ports))| PodInfo {
                    namespace: ns.to_string(),
                    name: format!("p{i}"),
                    labels,
                    ips: vec![IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1 + i as u8 * 37))],
                    // Port names are unique within a pod, as Kubernetes requires.
                    ports: ports
                        .into_iter()
                        .fold(Vec::<(&str, Protocol, u16)>::new(), |mut v, p| {
                            if !v.iter().any(|q| q.0 == p.0) {
                                v.push(p);
                            }
                            v
                        })
                        .into_iter()
                        .map(|(name, protocol, port)| NamedPort {
                            name: name.to_string(),
                            protocol,
                            port,
                        })
                        .collect(),
                })
                .collect(),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// The compiled tables (resolved selectors, named ports, subtracted excepts, longest
    /// prefix matching) decide every probe as the reference evaluator does.
    #[test]
    fn compiled_tables_agree_with_the_evaluator(
        world in world_strategy(),
        policies in proptest::collection::vec(policy_strategy(), 0..=3),
        ext_host in 0u8..=255,
    ) {
        let compiled = compile(&world, &policies);
        let ext = Endpoint::External(IpAddr::V4(Ipv4Addr::new(10, 0, 0, ext_host)));
        let mut ends: Vec<Endpoint> = (0..world.pods.len()).map(Endpoint::Pod).collect();
        if !world.pods.iter().any(|p| p.ips.contains(&IpAddr::V4(Ipv4Addr::new(10, 0, 0, ext_host)))) {
            ends.push(ext);
        }
        for &from in &ends {
            for &to in &ends {
                if from == to {
                    continue;
                }
                for protocol in [Protocol::Tcp, Protocol::Udp] {
                    for port in 78u16..=83 {
                        let probe = Probe { from, to, protocol, port, v6: false };
                        prop_assert_eq!(
                            compiled.allowed(&world, &probe),
                            allowed(&world, &policies, &probe),
                            "{:?}", probe
                        );
                    }
                }
            }
        }
    }
}

/// The generated cases parse in both families, are the same for the same seed, and as a set
/// both allow and deny probes.
#[test]
fn generated_cases_parse_and_tell_allow_from_deny() {
    let docs = cases::generated(7, 24);
    assert_eq!(docs, cases::generated(7, 24));
    assert_ne!(docs, cases::generated(8, 24));
    let (mut allowed_seen, mut denied_seen) = (0, 0);
    for yaml in &docs {
        for a in [&addr as &dyn Fn(&str) -> IpAddr, &addr6] {
            let pols = parse(&cases::render(yaml, a))
                .unwrap_or_else(|e| panic!("{e}\n{yaml}"))
                .into_iter()
                .map(|p| p.policy)
                .collect::<Vec<_>>();
            let world = cases::world(a);
            let tables = compile(&world, &pols);
            for (_, _, probe) in cases::probes(&world, a) {
                let want = allowed(&world, &pols, &probe);
                if want {
                    allowed_seen += 1;
                } else {
                    denied_seen += 1;
                }
                assert_eq!(want, tables.allowed(&world, &probe), "{yaml}");
            }
        }
    }
    assert!(
        allowed_seen > 0 && denied_seen > 0,
        "{allowed_seen} / {denied_seen}"
    );
}
