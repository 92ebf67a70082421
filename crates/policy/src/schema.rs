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
