//! nsfast vsock: socat-style relays between vsock, TCP, UNIX sockets and Firecracker / Cloud
//! Hypervisor hybrid vsock.
//!
//! Module map:
//! - [`addr`]   — the address syntax (`vsock-listen:PORT[,cid=CID]`, `hybrid:PATH:PORT`, ...).
//! - [`bridge`] — the sibling bridge: VMs of one group reach each other through the host.
//! - [`bench`](mod@bench)  — iperf-vsock-like throughput client and server on any stream address.
//! - [`nsmode`] — Linux 7.0 vsock namespace modes: show, create the safe way.
//! - [`hybrid`] — the host side of the hybrid vsock handshake (`CONNECT PORT\n` / `OK n\n`).
//! - [`conn`]   — opening addresses: listeners, connections, stdio, as owned file descriptors.
//! - [`kernel`] — the relay's kernel path: both legs in a SOCKHASH, an sk_skb verdict program
//!   redirecting each leg's data to the other's egress; EOF and errors handled here.
//! - `idle`     — the relay's idle timeout (shared by `relay` and `zerocopy`).
//! - [`relay`]  — moving bytes both ways with half-close, splice where the kernel allows it.
//! - [`zerocopy`] — MSG_ZEROCOPY on the relay's AF_VSOCK sends: buffer pool, error-queue
//!   completions (`--zerocopy`, Linux 6.7+).
//! - [`unixsock`] — UNIX listeners: stale socket files replaced, live ones refused, removal
//!   on exit (relay and bridge).

#![forbid(unsafe_code)]

pub mod addr;
pub mod bench;
pub mod bridge;
pub mod conn;
pub mod hybrid;
mod idle;
pub mod kernel;
pub mod nsmode;
pub mod relay;
pub mod unixsock;
pub mod zerocopy;

pub use addr::{Address, AddressError};
