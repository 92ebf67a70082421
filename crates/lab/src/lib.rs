//! nsfast lab: the one place that builds throwaway worlds, for bench and the root
//! integration tests (never for product crates: they take it as a dev-dependency only;
//! `nsfast-bench` uses it by design, as a benchmark builds throwaway worlds).
//!
//! Module map:
//! - [`bins`]  — finding workspace binaries (the traffic peer) that tests run as processes.
//! - [`world`] — throwaway network namespaces joined by veth, cgroups, unique per-run names,
//!   all removed on drop (also when a test panics).
//! - [`peer`]  — the `nsfast-testpeer` traffic program (bulk with hashes, echo, many
//!   connections, ping-pong, half-close, FIONREAD, tagged servers) and helpers to run it.
//! - [`stream`] — a deterministic byte stream for byte-exact checks.
//! - [`kernel`] — kernel features a test expects, from the harness (env or kernel config).

pub mod bins;
pub mod kernel;
pub mod peer;
pub mod stream;
pub mod world;

/// Panics with a clear message unless running as root (root tests must never pass silently).
pub fn require_root() {
    if !nix::unistd::Uid::effective().is_root() {
        panic!("this test needs root (network namespaces, cgroups, BPF); run `make test` as root");
    }
}
