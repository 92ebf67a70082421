//! The sibling bridge: a host-side relay that lets VMs in one group reach each other over vsock.
//!
//! A guest cannot reach a sibling VM by itself: vsock only connects a guest with its host. The
//! bridge runs on the host, accepts what the guests of a group send to the host, decides which
//! sibling the connection is for, connects to that sibling on the same port and relays both
//! ways (the relay's splice loop with half-close, [`crate::relay::relay`]).
//!
//! Members are reached in one of two ways:
//!
//! - **AF_VSOCK** (the default; a host with vhost-vsock). The bridge listens on every port of the
//!   list at `VMADDR_CID_ANY`. The source of an accepted connection is the peer's CID; the
//!   accepted socket's local CID (getsockname) is the CID the guest dialled: `2`
//!   (`VMADDR_CID_HOST`) when it dialled the host, or the sibling's CID for a
//!   `VMADDR_FLAG_TO_HOST` dial, on hosts that deliver those (a listener at `VMADDR_CID_ANY`
//!   matches any destination). vhost-vsock does not: since Linux 5.5 it drops guest packets
//!   whose destination is not CID 2, so there every connection is a host dial.
//! - **Hybrid vsock** (Firecracker, Cloud Hypervisor, vhost-device-vsock `--uds-path PATH`).
//!   A guest's connection to the host's port P arrives as a UNIX connection to `PATH_P`, where
//!   the bridge listens; the bridge reaches the guest with `CONNECT P` on `PATH`. Such a guest
//!   can only dial the host.
//!
//! Routing ([`Config::route`]): a guest that dials a sibling's CID reaches it when the two share
//! a group; a guest that dials the host reaches the one other member of its groups (with more
//! than one candidate the bridge refuses: use one bridge per pair). Anything else is denied:
//! the connection is closed and reported.
//!
//! Module map (after Firecracker's vsock muxer: one concern per file):
//! - `args`   — `--ports`, `--group`, `--vm` values; a member's [`Transport`].
//! - `policy` — the validated [`Config`] and its routing ([`Config::route`], [`Deny`]).
//! - `events` — [`Event`]: what happened to a connection, as a log line or JSON.
//! - `server` — [`Bridge`]: listeners, accept threads, connection limits, relaying.

mod args;
mod events;
mod policy;
mod server;

pub use args::{parse_group, parse_vm, ArgError, Transport, MAX_PORTS, MAX_VALUE, MIN_GUEST_CID};
pub use events::Event;
pub use policy::{Config, ConfigError, Deny};
pub use server::{hybrid_listen_path, Bridge, BridgeError, Options};
