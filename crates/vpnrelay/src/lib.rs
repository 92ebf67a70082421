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
//! - [`metrics`] — the relay's counters for `supervise --metrics-listen`.
//! - [`cli`]     — the `vpnrelay` command line.
//!
//! The test/bench world (RootlessKit + slirp4netns, the `nsfvpn` tenant) lives in crate
//! `nsfast-lab` (`nsfast_lab::rootless`), never in this crate or the shipped binary.

pub mod child;
pub mod cli;
pub mod client;
pub mod config;
pub mod flow;
pub mod host;
pub mod metrics;
pub mod state;
pub mod supervise;
