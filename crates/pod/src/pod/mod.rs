//! `pod add / del / list`: the pod's namespace, its device pair, addresses and routes, the
//! BPF attachments and the endpoint entry, each undone if a later step fails.
//!
//! - [`options`] — what `add` is asked for (mode, attach method, addresses, names) and how it
//!   resolves against the kernel;
//! - [`add`](mod@add) — the checked plan and the add under the host's lock;
//! - `build` — the steps that make devices, addresses, programs and the endpoint entry,
//!   with their undo;
//! - [`remove`] — `del`, undoing a pending record, the host's garbage collection;
//! - [`list`](mod@list) — `list` and `check`.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::abi;

pub mod add;
mod build;
pub mod list;
pub mod options;
pub mod remove;

pub use add::*;
pub use build::intent;
pub use list::*;
pub use options::*;
pub use remove::*;

/// The link-local gateway every pod routes through (answered by the BPF ARP responder on
/// veth and netkit L2; netkit L3 needs no ARP).
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// The pods' IPv6 gateway (link-local, answered by the BPF NDP responder on veth and netkit
/// L2; netkit L3 needs no NDP).
pub const GATEWAY6: Ipv6Addr = abi::GATEWAY6;
/// Default name of the pod's device.
pub const POD_IF: &str = "eth0";
