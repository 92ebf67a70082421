//! vpnrelay: moves VPN tunnels (WireGuard, OpenVPN over UDP) of containers under rootless
//! Docker off the user-space network stack (slirp4netns, pasta, ...) onto host sockets, with
//! batched UDP (recvmmsg/sendmmsg, GRO/GSO). See docs/vpnrelay.md.
//!
//! Module map:
//! - [`config`]  — settings from the command line and `VPNRELAY_*`, validated up front.
//! - [`state`]   — find RootlessKit's child (plain and `--detach-netns` layouts), lock files.
//! - [`host`]    — the parent: never enters the user namespace; opens host sockets per flow
//!   and hands them to the child over SCM_RIGHTS; `transparent` and `cleanup`.
//! - [`child`]   — runs inside the rootless namespaces: ip rule, transparent listeners, flow
//!   table, conntrack hand-over, cleanup on exit.
//! - [`flow`]    — one flow: two threads forwarding batches (GRO in, GSO out).
//! - [`supervise`] — single-instance supervisor with cleanup and backoff.
//! - [`testbed`] — builds and tears down a real rootless world (RootlessKit + slirp4netns in a
//!   throwaway "host" namespace) for tests and benchmarks. Needs root.
//! - [`bench`]   — `vpnrelay bench`: slirp4netns vs relay vs direct, interleaved, medians.
//! - [`cli`]     — the `vpnrelay` command line.

pub mod bench;
pub mod child;
pub mod cli;
pub mod config;
pub mod flow;
pub mod host;
pub mod state;
pub mod supervise;
pub mod testbed;
