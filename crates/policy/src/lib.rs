//! nsfast policy: Kubernetes `networking.k8s.io/v1` NetworkPolicy for nsfast pods.
//!
//! Pure: no system calls, no state. The pod crate stores policies and feeds the compiled
//! tables to the datapath; this crate says what a policy means.
//!
//! Module map:
//! - [`schema`]  — the `networking.k8s.io/v1` NetworkPolicy object model in the API's field
//!   names: the part of the Kubernetes API nsfast reads.
//! - [`parse`](mod@parse)   — YAML/JSON documents into [`schema::NetworkPolicy`] objects, checked
//!   strictly and as the API server validates them, errors naming the field and value.
//! - [`model`]   — the validated form ([`Policy`]): defaults applied, selectors, peers, ports.
//! - [`eval`]    — the reference evaluator, written from the Kubernetes spec.
//! - [`compile`](mod@compile) — policies into per-pod tables (isolation flags, peers, prefixes, port
//!   ranges): the form the BPF maps hold, checked against [`eval`].
//! - [`cases`]   — the upstream netpol e2e world (namespaces x, y, z; pods a, b, c) and its
//!   named cases as policy documents with expected reachability, shared by the unit tests
//!   and the datapath's root test.

pub mod cases;
pub mod compile;
pub mod eval;
pub mod model;
pub mod parse;
pub mod schema;
pub mod yaml;

#[cfg(test)]
mod schema_tests;
#[cfg(test)]
mod tests;

pub use compile::{compile, Compiled};
pub use eval::{allowed, Cluster, Endpoint, NamedPort, PodInfo, Probe};
pub use model::{Labels, Policy, Protocol};
pub use parse::{parse, ParseError, Parsed};
