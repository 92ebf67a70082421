//! The `networking.k8s.io/v1` NetworkPolicy object model, in the API's own field names: the
//! subset of the Kubernetes API nsfast reads (the policy, its spec, rules, peers, ports,
//! label selectors and the object metadata), written here rather than taken from a crate
//! generated from the whole API, of which nsfast would use a few types out of thousands.
//!
//! The JSON shapes are the API's: `camelCase` field names, absent optional fields left out
//! when written, `port` an integer or a name, `apiVersion` and `kind` written on every
//! object and, when read, required to be this schema's. A field the schema does not have is
//! ignored here; [`parse`](mod@crate::parse) rejects it by comparing what was read with what
//! is written back. Fields the API marks required (`IPBlock.cidr`, a requirement's `key` and
//! `operator`) read as empty when absent or `null`, so that [`crate::parse::validate`] names
//! them with the API server's own message rather than serde's.
//!
//! [`ObjectMeta`] has every standard metadata field so that an object exported with
//! `kubectl get -o yaml` reads; the fields nsfast does not interpret (timestamps, managed
//! fields, owner references) are kept as written.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{self, Deserializer, MapAccess, Unexpected, Visitor};
use serde::ser::{SerializeStruct, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The `apiVersion` of a NetworkPolicy.
pub const API_VERSION: &str = "networking.k8s.io/v1";
/// The `kind` of a NetworkPolicy.
pub const KIND: &str = "NetworkPolicy";

/// A NetworkPolicy: which pods it selects and what traffic it allows them.
///
/// Written with `apiVersion` and `kind` first; read, each must be [`API_VERSION`] and
/// [`KIND`] if present.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetworkPolicy {
    /// The standard object metadata (written always, `{}` when empty).
    pub metadata: ObjectMeta,
    /// The policy itself.
    pub spec: Option<NetworkPolicySpec>,
}

/// A [`NetworkPolicy`] as read: with its type fields checked.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NetworkPolicyFields {
    #[serde(rename = "apiVersion", default, deserialize_with = "api_version")]
    _api_version: (),
    #[serde(rename = "kind", default, deserialize_with = "kind")]
    _kind: (),
    #[serde(default, deserialize_with = "null_as_default")]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<NetworkPolicySpec>,
}

impl<'de> Deserialize<'de> for NetworkPolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let f: NetworkPolicyFields = from_map(d, KIND)?;
        Ok(NetworkPolicy {
            metadata: f.metadata,
            spec: f.spec,
        })
    }
}

/// Reads a `T` from a map only. serde's derived `Deserialize` also reads a struct from a
/// sequence of its fields in order, which the API does not: `spec: [{}, ...]` is an error,
/// not a spec whose `egress` is `{}`.
fn from_map<'de, D, T>(d: D, name: &'static str) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct V<T>(&'static str, PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::deserialize(MapAccessDeserializer::new(map))
        }
    }
    d.deserialize_map(V(name, PhantomData))
}

/// The `Serialize` and `Deserialize` impls of a struct whose derives are `remote = "Self"`
/// (inherent functions): written as derived, read from a map only ([`from_map`]).
macro_rules! map_only {
    ($($t:ident),* $(,)?) => {$(
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                $t::serialize(self, s)
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct Derived($t);
                impl<'de> Deserialize<'de> for Derived {
                    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                        $t::deserialize(d).map(Derived)
                    }
                }
                from_map::<D, Derived>(d, stringify!($t)).map(|x| x.0)
            }
        }
    )*};
}

map_only!(
    ObjectMeta,
    NetworkPolicySpec,
    NetworkPolicyIngressRule,
    NetworkPolicyEgressRule,
    NetworkPolicyPeer,
    IPBlock,
    NetworkPolicyPort,
    LabelSelector,
    LabelSelectorRequirement,
);

fn constant<'de, D: Deserializer<'de>>(d: D, want: &'static str) -> Result<(), D::Error> {
    let s = String::deserialize(d)?;
    if s == want {
        Ok(())
    } else {
        Err(de::Error::invalid_value(Unexpected::Str(&s), &want))
    }
}

fn api_version<'de, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    constant(d, API_VERSION)
}

fn kind<'de, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    constant(d, KIND)
}

/// A field the API requires, read as its empty value when absent (with `#[serde(default)]`)
/// or `null`.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

impl Serialize for NetworkPolicy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct(KIND, 3 + usize::from(self.spec.is_some()))?;
        st.serialize_field("apiVersion", API_VERSION)?;
        st.serialize_field("kind", KIND)?;
        st.serialize_field("metadata", &self.metadata)?;
        if let Some(spec) = &self.spec {
            st.serialize_field("spec", spec)?;
        }
        st.end()
    }
}

/// The standard object metadata (`io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
pub struct ObjectMeta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// An RFC 3339 time, kept as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_grace_period_seconds: Option<i64>,
    /// An RFC 3339 time, kept as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finalizers: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// The server-side apply records, kept as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_fields: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The objects this one belongs to, kept as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_references: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_link: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// What a policy selects and allows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<NetworkPolicyEgressRule>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<Vec<NetworkPolicyIngressRule>>,
    /// The pods the policy applies to, in its namespace; empty or absent: all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// `Ingress`, `Egress` or both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_types: Option<Vec<String>>,
}

/// Traffic allowed to the selected pods: from any of `from`, to any of `ports`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
pub struct NetworkPolicyIngressRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Vec<NetworkPolicyPeer>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<NetworkPolicyPort>>,
}

/// Traffic allowed from the selected pods: to any of `to`, on any of `ports`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
pub struct NetworkPolicyEgressRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<NetworkPolicyPort>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Vec<NetworkPolicyPeer>>,
}

/// The other end of a rule: an address block, or pods by pod and namespace labels.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
pub struct NetworkPolicyPeer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_block: Option<IPBlock>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
}

/// An address prefix, less the prefixes in `except`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
pub struct IPBlock {
    /// Required by the API; empty when absent.
    #[serde(default, deserialize_with = "null_as_default")]
    pub cidr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub except: Option<Vec<String>>,
}

/// A protocol and a port, a named port or a range `port`..=`endPort`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
pub struct NetworkPolicyPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_port: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<IntOrString>,
    /// `TCP` (the default), `UDP` or `SCTP`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}

/// Labels to match: every one of `matchLabels` and every requirement of `matchExpressions`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_expressions: Option<Vec<LabelSelectorRequirement>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_labels: Option<BTreeMap<String, String>>,
}

/// One requirement on a label: `key` `operator` (`In`, `NotIn`, `Exists`, `DoesNotExist`)
/// `values`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self", rename_all = "camelCase")]
pub struct LabelSelectorRequirement {
    /// Required by the API; empty when absent.
    #[serde(default, deserialize_with = "null_as_default")]
    pub key: String,
    /// Required by the API; empty when absent.
    #[serde(default, deserialize_with = "null_as_default")]
    pub operator: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<String>>,
}

/// A 32-bit integer or a string, written and read as the bare JSON value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IntOrString {
    Int(i32),
    String(String),
}

impl Serialize for IntOrString {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            IntOrString::Int(n) => s.serialize_i32(*n),
            IntOrString::String(v) => s.serialize_str(v),
        }
    }
}

impl<'de> Deserialize<'de> for IntOrString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = IntOrString;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("IntOrString")
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<IntOrString, E> {
                i32::try_from(v)
                    .map(IntOrString::Int)
                    .map_err(|_| E::invalid_value(Unexpected::Signed(v), &"a 32-bit integer"))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<IntOrString, E> {
                i32::try_from(v)
                    .map(IntOrString::Int)
                    .map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &"a 32-bit integer"))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<IntOrString, E> {
                Ok(IntOrString::String(v.to_string()))
            }

            fn visit_string<E: de::Error>(self, v: String) -> Result<IntOrString, E> {
                Ok(IntOrString::String(v))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse;

    fn one(input: &str) -> NetworkPolicy {
        let mut v = parse(input).unwrap_or_else(|e| panic!("{e}\n{input}"));
        assert_eq!(v.len(), 1);
        v.remove(0).object
    }

    const HEAD: &str =
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: x}\n";

    /// An object as `kubectl get networkpolicy -o yaml` prints it, server-set fields and all.
    const KUBECTL: &str = r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: |
      {"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"annotations":{},"name":"web-allow","namespace":"prod"},"spec":{"podSelector":{"matchLabels":{"app":"web"}}}}
  creationTimestamp: "2024-05-01T10:00:00Z"
  generation: 3
  labels:
    app: web
  managedFields:
  - apiVersion: networking.k8s.io/v1
    fieldsType: FieldsV1
    fieldsV1:
      f:metadata:
        f:annotations:
          .: {}
          f:kubectl.kubernetes.io/last-applied-configuration: {}
      f:spec:
        f:ingress: {}
        f:podSelector: {}
        f:policyTypes: {}
    manager: kubectl-client-side-apply
    operation: Update
    time: "2024-05-01T10:00:00Z"
  name: web-allow
  namespace: prod
  resourceVersion: "123456"
  uid: 6f1c2d3e-4a5b-4c6d-8e7f-9a0b1c2d3e4f
spec:
  ingress:
  - from:
    - podSelector:
        matchLabels:
          app: client
    ports:
    - port: 8080
      protocol: TCP
  podSelector:
    matchLabels:
      app: web
  policyTypes:
  - Ingress
"#;

    #[test]
    fn a_kubectl_export_reads_with_its_server_fields() {
        let parsed = parse(KUBECTL).unwrap();
        assert_eq!(parsed.len(), 1);
        let (o, p) = (&parsed[0].object, &parsed[0].policy);
        assert_eq!(
            (p.namespace.as_str(), p.name.as_str()),
            ("prod", "web-allow")
        );
        let m = &o.metadata;
        assert_eq!(
            m.uid.as_deref(),
            Some("6f1c2d3e-4a5b-4c6d-8e7f-9a0b1c2d3e4f")
        );
        assert_eq!(m.resource_version.as_deref(), Some("123456"));
        assert_eq!(
            m.creation_timestamp.as_deref(),
            Some("2024-05-01T10:00:00Z")
        );
        assert_eq!(m.generation, Some(3));
        assert!(m
            .annotations
            .as_ref()
            .unwrap()
            .contains_key("kubectl.kubernetes.io/last-applied-configuration"));
        assert_eq!(
            m.managed_fields.as_ref().unwrap()[0]["manager"],
            "kubectl-client-side-apply"
        );
        // Written back, it is the input.
        let input = crate::yaml::documents(KUBECTL).unwrap().remove(0);
        assert_eq!(serde_json::to_value(o).unwrap(), input);
    }

    /// What k8s-openapi 0.29 (`latest`) wrote for, or how [`parse`] failed on, each input:
    /// the upstream cases, the field shapes, `null`s, absent required fields and unknown
    /// fields. Written back, the objects must be the same bytes.
    const K8S_OPENAPI: &str = include_str!("../tests/data/k8s-openapi-0.29.json");

    #[test]
    fn objects_are_written_as_k8s_openapi_wrote_them() {
        let entries: Vec<Value> = serde_json::from_str(K8S_OPENAPI).unwrap();
        assert!(entries.len() > 40);
        for e in &entries {
            let (name, input) = (e["name"].as_str().unwrap(), e["input"].as_str().unwrap());
            match (&e["objects"], &e["error"]) {
                (Value::Array(want), _) => {
                    let got = parse(input).unwrap_or_else(|err| panic!("{name}: {err}"));
                    assert_eq!(got.len(), want.len(), "{name}");
                    for (g, w) in got.iter().zip(want) {
                        let w = w.as_str().unwrap();
                        assert_eq!(serde_json::to_string(&g.object).unwrap(), w, "{name}");
                        assert_eq!(
                            serde_json::to_value(&g.object).unwrap(),
                            serde_json::from_str::<Value>(w).unwrap(),
                            "{name}"
                        );
                    }
                }
                (_, Value::String(want)) => {
                    let got = match parse(input) {
                        Ok(_) => panic!("{name}: parsed, want {want}"),
                        Err(err) => err.to_string(),
                    };
                    assert_eq!(&got, want, "{name}");
                }
                _ => panic!("{name}: neither objects nor error"),
            }
        }
    }

    #[test]
    fn a_port_is_a_number_a_name_or_a_range() {
        let o = one(&format!(
            "{HEAD}spec:\n  ingress:\n  - ports: [{{port: 80}}, {{port: http}}, {{port: 8000, endPort: 8080, protocol: UDP}}]\n"
        ));
        let ports = o.spec.unwrap().ingress.unwrap()[0].ports.clone().unwrap();
        assert_eq!(ports[0].port, Some(IntOrString::Int(80)));
        assert_eq!(ports[1].port, Some(IntOrString::String("http".into())));
        assert_eq!(
            ports[2],
            NetworkPolicyPort {
                end_port: Some(8080),
                port: Some(IntOrString::Int(8000)),
                protocol: Some("UDP".into()),
            }
        );
        assert_eq!(
            serde_json::to_string(&ports).unwrap(),
            r#"[{"port":80},{"port":"http"},{"endPort":8080,"port":8000,"protocol":"UDP"}]"#
        );
    }

    #[test]
    fn an_unknown_field_fails_with_its_path() {
        for (spec, path) in [
            (
                "spec:\n  ingress:\n  - ports: [{port: 80, end_port: 81}]\n",
                "spec.ingress[0].ports[0].end_port",
            ),
            (
                "spec:\n  egress:\n  - to: [{ipBlock: {cidr: 10.0.0.0/8, excepts: []}}]\n",
                "spec.egress[0].to[0].ipBlock.excepts",
            ),
            ("status: {}\n", "status"),
        ] {
            let e = parse(&format!("{HEAD}{spec}")).unwrap_err();
            assert_eq!(e.path, path, "{spec}");
            assert!(e.message.starts_with("unknown field"), "{e}");
        }
        let e = parse(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, nmae: q}\n",
        )
        .unwrap_err();
        assert_eq!(e.path, "metadata.nmae");
    }

    #[test]
    fn a_struct_is_read_from_a_map_never_from_its_fields_in_order() {
        let e = parse(&format!(
            "{HEAD}spec:\n  egress:\n  - to: [[{{cidr: 10.0.0.0/8}}]]\n"
        ))
        .unwrap_err();
        assert_eq!(e.path, "spec.egress[0].to[0]");
        assert_eq!(
            e.message,
            "invalid type: sequence, expected NetworkPolicyPeer"
        );
        let e = parse(&format!("{HEAD}spec: [null, null, {{}}]\n")).unwrap_err();
        assert_eq!(e.path, "spec");
    }

    #[test]
    fn the_type_fields_are_checked_when_read_and_always_written() {
        let e = serde_json::from_str::<NetworkPolicy>(r#"{"apiVersion":"v1","metadata":{}}"#)
            .unwrap_err();
        assert!(
            e.to_string().contains("expected networking.k8s.io/v1"),
            "{e}"
        );
        let e = serde_json::from_str::<NetworkPolicy>(r#"{"kind":"Pod"}"#).unwrap_err();
        assert!(e.to_string().contains("expected NetworkPolicy"), "{e}");
        let o: NetworkPolicy = serde_json::from_str(r#"{"metadata":null}"#).unwrap();
        assert_eq!(o, NetworkPolicy::default());
        assert_eq!(
            serde_json::to_string(&o).unwrap(),
            r#"{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{}}"#
        );
    }
}
