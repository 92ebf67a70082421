//! Reading NetworkPolicy objects: YAML (one or more `---` documents) or JSON (one or more
//! values, or an array), each a `networking.k8s.io/v1` `NetworkPolicy` or a `List` /
//! `NetworkPolicyList` of them, in the API's own field names ([`crate::schema`]).
//!
//! Every object is checked as the API server checks it (see [`validate`]) and also strictly:
//! a field the schema does not have is an error, not ignored, because an ignored
//! misspelling (`podSelecter`) would leave a policy that selects every pod. An error names
//! the document, the field's path (`spec.ingress[0].ports[1].protocol`) and the bad value.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::model::{
    Cidr, Expression, Operator, Peer, Policy, PortMatch, PortRule, Protocol, Rule, Selector,
};
use crate::schema::{self, IntOrString, LabelSelector};

/// The `apiVersion` and `kind` every object must have.
pub use crate::schema::{API_VERSION, KIND};
/// The namespace of an object that names none (as `kubectl apply` without `-n`).
pub const DEFAULT_NAMESPACE: &str = "default";
/// Largest input read (a policy file is kilobytes; this bounds what a typo'd path costs).
pub const MAX_INPUT: usize = 16 << 20;

/// A bad input: which document, which field, what is wrong with which value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}{message}", doc_prefix(*.doc), field_prefix(.path))]
pub struct ParseError {
    /// 1-based document number (0: the input as a whole).
    pub doc: usize,
    /// The field's path inside the document, empty for the document itself.
    pub path: String,
    pub message: String,
}

fn doc_prefix(doc: usize) -> String {
    if doc == 0 {
        String::new()
    } else {
        format!("document {doc}: ")
    }
}

fn field_prefix(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("{path}: ")
    }
}

/// One object as read: the schema's object (what `policy list -j` shows, with its namespace
/// filled in) and its checked form.
#[derive(Clone, Debug, PartialEq)]
pub struct Parsed {
    pub object: schema::NetworkPolicy,
    pub policy: Policy,
}

/// Parses every NetworkPolicy in `input` (YAML or JSON). All or nothing: the first bad object
/// fails the whole input. Two objects of the same namespace and name are an error too, since
/// applying them would keep only one of them without saying which.
pub fn parse(input: &str) -> Result<Vec<Parsed>, ParseError> {
    let whole = |message: String| ParseError {
        doc: 0,
        path: String::new(),
        message,
    };
    if input.len() > MAX_INPUT {
        return Err(whole(format!(
            "input is {} bytes, more than the {MAX_INPUT} a policy file may have",
            input.len()
        )));
    }
    let mut docs = Vec::new();
    let t = input.trim_start();
    if t.starts_with('{') || t.starts_with('[') {
        for (i, v) in serde_json::Deserializer::from_str(input)
            .into_iter::<Value>()
            .enumerate()
        {
            let v = v.map_err(|e| ParseError {
                doc: i + 1,
                path: String::new(),
                message: format!("not JSON: {e}"),
            })?;
            match v {
                Value::Array(items) => docs.extend(items),
                v => docs.push(v),
            }
        }
    } else {
        let all = crate::yaml::documents(input).map_err(|e| ParseError {
            doc: e.doc,
            path: String::new(),
            message: format!("not YAML: {}", e.message),
        })?;
        docs.extend(all.into_iter().filter(|v| !v.is_null()));
    }
    let mut out = Vec::new();
    for (i, v) in docs.into_iter().enumerate() {
        let doc = i + 1;
        for (path, obj) in unlist(v).map_err(|(path, message)| ParseError { doc, path, message })? {
            let p = parse_object(obj).map_err(|(p, message)| ParseError {
                doc,
                path: join(&path, &p),
                message,
            })?;
            if let Some(prev) = out
                .iter()
                .position(|q: &Parsed| same_object(&q.policy, &p.policy))
            {
                return Err(ParseError {
                    doc,
                    path: join(&path, "metadata.name"),
                    message: format!(
                        "{:?} in namespace {:?} appears twice (also object {})",
                        p.policy.name,
                        p.policy.namespace,
                        prev + 1
                    ),
                });
            }
            out.push(p);
        }
    }
    Ok(out)
}

fn same_object(a: &Policy, b: &Policy) -> bool {
    a.namespace == b.namespace && a.name == b.name
}

fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ if b.starts_with('[') => format!("{a}{b}"),
        _ => format!("{a}.{b}"),
    }
}

type FieldError = (String, String);

fn err<T>(path: impl Into<String>, message: impl Into<String>) -> Result<T, FieldError> {
    Err((path.into(), message.into()))
}

/// A document's objects: itself, or the `items` of a `List` / `NetworkPolicyList`.
fn unlist(v: Value) -> Result<Vec<(String, Value)>, FieldError> {
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default();
    if kind != "List" && kind != "NetworkPolicyList" {
        return Ok(vec![(String::new(), v)]);
    }
    let Some(Value::Array(items)) = v.get("items").cloned() else {
        return err("items", format!("a {kind} needs an items array"));
    };
    Ok(items
        .into_iter()
        .enumerate()
        .map(|(i, o)| (format!("items[{i}]"), o))
        .collect())
}

/// One object: schema, strictness, then the API server's checks.
fn parse_object(v: Value) -> Result<Parsed, FieldError> {
    let Value::Object(m) = &v else {
        return err(
            "",
            format!("expected a NetworkPolicy object, got {}", kind_of(&v)),
        );
    };
    for (field, want) in [("apiVersion", API_VERSION), ("kind", KIND)] {
        match m.get(field) {
            None => return err(field, format!("missing; must be {want:?}")),
            Some(Value::String(s)) if s == want => {}
            Some(other) => {
                return err(field, format!("{other} is not supported; must be {want:?}"))
            }
        }
    }
    let object: schema::NetworkPolicy = serde_path_to_error::deserialize(&v).map_err(|e| {
        let path = e.path().to_string();
        (
            if path == "." { String::new() } else { path },
            e.inner().to_string(),
        )
    })?;
    let back = serde_json::to_value(&object).map_err(|e| (String::new(), e.to_string()))?;
    unknown_fields(&v, &back, "")?;
    let policy = validate(&object)?;
    // As the API server does: the object names its namespace once it is stored.
    let mut object = object;
    object.metadata.namespace = Some(policy.namespace.clone());
    Ok(Parsed { object, policy })
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The first field of `input` that the schema dropped on the way to `back` (a field the
/// schema does not have). `null` values are absent fields, as the API server reads them.
fn unknown_fields(input: &Value, back: &Value, path: &str) -> Result<(), FieldError> {
    match (input, back) {
        (Value::Object(i), Value::Object(b)) => {
            for (k, v) in i {
                let p = join(path, k);
                match b.get(k) {
                    None if v.is_null() => {}
                    None => return err(p, "unknown field (not in the NetworkPolicy schema)"),
                    Some(bv) => unknown_fields(v, bv, &p)?,
                }
            }
        }
        (Value::Array(i), Value::Array(b)) => {
            for (n, (iv, bv)) in i.iter().zip(b).enumerate() {
                unknown_fields(iv, bv, &format!("{path}[{n}]"))?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Checks `np` as the API server's validation does and applies its defaults.
pub fn validate(np: &schema::NetworkPolicy) -> Result<Policy, FieldError> {
    let name = np.metadata.name.clone().unwrap_or_default();
    if name.is_empty() {
        return err("metadata.name", "missing; every policy needs a name");
    }
    if !dns_subdomain(&name) {
        return err(
            "metadata.name",
            format!("{name:?} is not a DNS subdomain (lowercase a-z 0-9 '-' '.', at most 253, starting and ending with a letter or digit)"),
        );
    }
    let namespace = np
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string());
    if !dns_label(&namespace) {
        return err("metadata.namespace", bad_label_msg("namespace", &namespace));
    }
    if let Some(labels) = &np.metadata.labels {
        check_labels(labels, "metadata.labels")?;
    }
    let spec = np.spec.clone().unwrap_or_default();
    let pod_selector = selector(spec.pod_selector.as_ref(), "spec.podSelector")?;
    let ingress = spec
        .ingress
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, r)| {
            rule(
                r.from.as_deref(),
                r.ports.as_deref(),
                &format!("spec.ingress[{i}]"),
                "from",
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let egress = spec
        .egress
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, r)| {
            rule(
                r.to.as_deref(),
                r.ports.as_deref(),
                &format!("spec.egress[{i}]"),
                "to",
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (ingress_isolates, egress_isolates) = match &spec.policy_types {
        // The API server's default: Ingress always, Egress when there are egress rules.
        None => (true, !egress.is_empty()),
        Some(types) if types.is_empty() => (true, !egress.is_empty()),
        Some(types) => {
            let (mut i, mut e) = (false, false);
            for (n, t) in types.iter().enumerate() {
                let seen = match t.as_str() {
                    "Ingress" => std::mem::replace(&mut i, true),
                    "Egress" => std::mem::replace(&mut e, true),
                    _ => {
                        return err(
                            format!("spec.policyTypes[{n}]"),
                            format!(
                                "{t:?} is not a policy type; must be \"Ingress\" or \"Egress\""
                            ),
                        )
                    }
                };
                if seen {
                    return err(
                        format!("spec.policyTypes[{n}]"),
                        format!("{t:?} is listed twice"),
                    );
                }
            }
            (i, e)
        }
    };
    Ok(Policy {
        namespace,
        name,
        pod_selector,
        ingress_isolates,
        egress_isolates,
        ingress,
        egress,
    })
}

fn rule(
    peers: Option<&[schema::NetworkPolicyPeer]>,
    ports: Option<&[schema::NetworkPolicyPort]>,
    path: &str,
    peers_field: &str,
) -> Result<Rule, FieldError> {
    let peers = match peers {
        None | Some([]) => None,
        Some(ps) => Some(
            ps.iter()
                .enumerate()
                .map(|(i, p)| peer(p, &format!("{path}.{peers_field}[{i}]")))
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    let ports = match ports {
        None | Some([]) => None,
        Some(ps) => Some(
            ps.iter()
                .enumerate()
                .map(|(i, p)| port(p, &format!("{path}.ports[{i}]")))
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    Ok(Rule { peers, ports })
}

fn peer(p: &schema::NetworkPolicyPeer, path: &str) -> Result<Peer, FieldError> {
    match (&p.ip_block, &p.pod_selector, &p.namespace_selector) {
        (None, None, None) => err(
            path,
            "an empty peer; set podSelector, namespaceSelector or ipBlock",
        ),
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => err(
            path,
            "ipBlock cannot be combined with podSelector or namespaceSelector in one peer",
        ),
        (Some(b), None, None) => {
            let cp = format!("{path}.ipBlock.cidr");
            let cidr = Cidr::parse(&b.cidr).ok_or_else(|| {
                (
                    cp.clone(),
                    format!("{:?} is not a CIDR (e.g. 10.0.0.0/16 or fd00::/64)", b.cidr),
                )
            })?;
            let mut except = Vec::new();
            for (i, e) in b.except.iter().flatten().enumerate() {
                let ep = format!("{path}.ipBlock.except[{i}]");
                let c = Cidr::parse(e).ok_or_else(|| {
                    (
                        ep.clone(),
                        format!("{e:?} is not a CIDR (e.g. 10.0.1.0/24)"),
                    )
                })?;
                if !(cidr.covers(&c) && c.prefix > cidr.prefix) {
                    return err(
                        ep,
                        format!("{e:?} must be a strict subset of cidr {:?}", b.cidr),
                    );
                }
                except.push(c);
            }
            Ok(Peer::IpBlock { cidr, except })
        }
        (None, pods, namespaces) => Ok(Peer::Pods {
            pods: pods
                .as_ref()
                .map(|s| selector(Some(s), &format!("{path}.podSelector")))
                .transpose()?,
            namespaces: namespaces
                .as_ref()
                .map(|s| selector(Some(s), &format!("{path}.namespaceSelector")))
                .transpose()?,
        }),
    }
}

fn port(p: &schema::NetworkPolicyPort, path: &str) -> Result<PortRule, FieldError> {
    let protocol = match p.protocol.as_deref() {
        None => Protocol::Tcp,
        Some(s) => Protocol::parse(s).ok_or_else(|| {
            (
                format!("{path}.protocol"),
                format!("{s:?} is not a protocol; must be \"TCP\", \"UDP\" or \"SCTP\""),
            )
        })?,
    };
    let number = |n: i32, field: &str| -> Result<u16, FieldError> {
        match u16::try_from(n) {
            Ok(v) if v >= 1 => Ok(v),
            _ => err(
                format!("{path}.{field}"),
                format!("{n} is not a port; must be 1-65535"),
            ),
        }
    };
    let port = match (&p.port, p.end_port) {
        (None, None) => PortMatch::Any,
        (None, Some(_)) => {
            return err(
                format!("{path}.endPort"),
                "endPort needs a numeric port to start the range",
            )
        }
        (Some(IntOrString::Int(n)), end) => {
            let lo = number(*n, "port")?;
            let hi = match end {
                None => lo,
                Some(e) => {
                    let hi = number(e, "endPort")?;
                    if hi < lo {
                        return err(
                            format!("{path}.endPort"),
                            format!("{e} is below port {lo}; endPort must be >= port"),
                        );
                    }
                    hi
                }
            };
            PortMatch::Range { lo, hi }
        }
        (Some(IntOrString::String(s)), end) => {
            if end.is_some() {
                return err(
                    format!("{path}.endPort"),
                    format!("endPort cannot follow the named port {s:?}; it needs a numeric port"),
                );
            }
            if !port_name(s) {
                return err(
                    format!("{path}.port"),
                    format!("{s:?} is not a port name (IANA_SVC_NAME: 1-15 of a-z 0-9 '-', at least one letter, no leading, trailing or double '-')"),
                );
            }
            PortMatch::Named(s.clone())
        }
    };
    Ok(PortRule { protocol, port })
}

fn selector(s: Option<&LabelSelector>, path: &str) -> Result<Selector, FieldError> {
    let Some(s) = s else {
        return Ok(Selector::default());
    };
    let mut match_labels = BTreeMap::new();
    if let Some(ml) = &s.match_labels {
        check_labels(ml, &format!("{path}.matchLabels"))?;
        match_labels = ml.clone();
    }
    let mut expressions = Vec::new();
    for (i, e) in s.match_expressions.iter().flatten().enumerate() {
        let ep = format!("{path}.matchExpressions[{i}]");
        if !label_key(&e.key) {
            return err(format!("{ep}.key"), bad_key_msg(&e.key));
        }
        let op = match e.operator.as_str() {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            o => {
                return err(
                    format!("{ep}.operator"),
                    format!("{o:?} is not an operator; must be In, NotIn, Exists or DoesNotExist"),
                )
            }
        };
        let values = e.values.clone().unwrap_or_default();
        match op {
            Operator::In | Operator::NotIn if values.is_empty() => {
                return err(
                    format!("{ep}.values"),
                    format!("{} needs at least one value", e.operator),
                )
            }
            Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                return err(
                    format!("{ep}.values"),
                    format!("{} takes no values", e.operator),
                )
            }
            _ => {}
        }
        for (j, v) in values.iter().enumerate() {
            if !label_value(v) {
                return err(format!("{ep}.values[{j}]"), bad_value_msg(v));
            }
        }
        expressions.push(Expression {
            key: e.key.clone(),
            op,
            values,
        });
    }
    Ok(Selector {
        match_labels,
        expressions,
    })
}

fn check_labels(labels: &BTreeMap<String, String>, path: &str) -> Result<(), FieldError> {
    for (k, v) in labels {
        if !label_key(k) {
            return err(path, bad_key_msg(k));
        }
        if !label_value(v) {
            return err(format!("{path}.{k}"), bad_value_msg(v));
        }
    }
    Ok(())
}

/// Checks one `key=value` label as given on a command line (`--label`): the same rules as a
/// selector's labels. Returns the pair.
pub fn parse_label(s: &str) -> Result<(String, String), String> {
    let Some((k, v)) = s.split_once('=') else {
        return Err(format!(
            "invalid label {s:?}: expected KEY=VALUE, e.g. app=web"
        ));
    };
    if !label_key(k) {
        return Err(format!("invalid label {s:?}: {}", bad_key_msg(k)));
    }
    if !label_value(v) {
        return Err(format!("invalid label {s:?}: {}", bad_value_msg(v)));
    }
    Ok((k.to_string(), v.to_string()))
}

/// Checks a namespace name (a DNS label, as Kubernetes namespaces are).
pub fn check_namespace(s: &str) -> Result<(), String> {
    if dns_label(s) {
        Ok(())
    } else {
        Err(bad_label_msg("namespace", s))
    }
}

/// Checks a policy name (a DNS subdomain).
pub fn check_policy_name(s: &str) -> Result<(), String> {
    if dns_subdomain(s) {
        Ok(())
    } else {
        Err(format!("invalid policy name {s:?}: a DNS subdomain (lowercase a-z 0-9 '-' '.', at most 253, starting and ending with a letter or digit)"))
    }
}

fn bad_label_msg(what: &str, s: &str) -> String {
    format!("invalid {what} {s:?}: a DNS label (1-63 of lowercase a-z 0-9 '-', starting and ending with a letter or digit)")
}

fn bad_key_msg(k: &str) -> String {
    format!("{k:?} is not a label key ([prefix/]name: name 1-63 of A-Z a-z 0-9 '-' '_' '.', starting and ending alphanumeric; prefix a DNS subdomain)")
}

fn bad_value_msg(v: &str) -> String {
    format!("{v:?} is not a label value (at most 63 of A-Z a-z 0-9 '-' '_' '.', starting and ending alphanumeric, or empty)")
}

fn dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

fn dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(dns_label)
}

fn label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

fn label_key(s: &str) -> bool {
    match s.rsplit_once('/') {
        Some((prefix, name)) => !prefix.is_empty() && dns_subdomain(prefix) && label_name(name),
        None => label_name(s),
    }
}

fn label_value(s: &str) -> bool {
    s.is_empty() || label_name(s)
}

/// IANA_SVC_NAME, as a named container port must be.
pub fn port_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 15
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.iter().any(|c| c.is_ascii_lowercase())
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
        && !s.contains("--")
}
