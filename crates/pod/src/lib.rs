//! nsfast pod: pods on veth or netkit pairs with BPF host routing.
//!
//! Module map:
//! - [`pod`]       — `add` / `del` / `list` / `check`: namespaces, device pairs, addresses,
//!   routes, attachments and endpoint entries, each undone on failure; split into
//!   `options` (the request), `add` (plan, add under the lock), `build` (the steps and their
//!   undo), `remove` (`del`, garbage collection) and `list` (`list`, `check`).
//! - [`datapath`]  — load `bpf/pod.bpf.c` against a host's pinned maps; TCX and netkit
//!   attachment and pinning, classic tc (clsact + cls_bpf) where TCX is missing; endpoint
//!   table and counters.
//! - [`shortcut`]  — the sockmap shortcut between pods of one host (`nsfast pod shortcut`),
//!   `bpf/sockmap.bpf.c` in pod mode, pinned under the host's pin directory.
//! - [`policy`]    — a host's NetworkPolicies and namespace labels (`nsfast policy`): one
//!   generation file, replaced atomically.
//! - [`fault`]     — the crash tests' fault-injection hook.
//! - [`state`]     — per-host state: bpffs pins and JSON records under /run/nsfast/pod.
//! - [`abi`]       — mirrors of the BPF types and names.
//! - [`error`]     — [`PodError`].

pub mod abi;
pub mod datapath;
pub mod error;
pub mod fault;
pub mod pod;
pub mod policy;
pub mod shortcut;
pub mod state;

pub use error::PodError;
pub use pod::{
    add, del, list, AddOptions, Added, AttachRequest, Listing, ModeRequest, PodAddrs, PodIp,
    PodIp6, PodState,
};
pub use state::{AttachMethod, Datapath, Host, PodRecord, TcFilter};
