//! nsfast sockmap: a same-host TCP shortcut between sockets, across network namespaces.
//!
//! A sockops program attached to a cgroup puts each established TCP socket of that cgroup into
//! a SOCKHASH keyed by its socket cookie and pairs the two ends of a local connection (by their
//! 4-tuple and both initial sequence numbers); an sk_msg program redirects each send straight
//! into the peer socket's receive queue. The BPF side is `bpf/sockmap.bpf.c`.
//!
//! Module map:
//! - [`abi`]     — `#[repr(C)]` mirrors of the BPF maps' keys and values, counter indices.
//! - [`shortcut`] — load, configure and attach the programs ([`Shortcut`]); detach on drop.
//! - [`status`]  — find running (and draining) instances from the kernel's program/map lists.
//! - [`error`]   — [`SockmapError`].

pub mod abi;
pub mod error;
pub mod shortcut;
pub mod status;

pub use error::SockmapError;
pub use nsfast_bpf::sockmap_entries::MapEntries;
pub use shortcut::{slice_cgroup, Options, Shortcut};
pub use status::{instances, Instance, Settings, Stats};

/// Whether FIONREAD on a socket in the sockmap counts bytes queued by redirects. Measured in the
/// VM matrix: yes on 6.12, 6.18 and 7.2; no on 6.1 (FIONREAD is 0 while redirected bytes wait).
pub fn fionread_counts_redirects() -> bool {
    nsfast_sys::kernel::KernelVersion::current().at_least(6, 12)
}
