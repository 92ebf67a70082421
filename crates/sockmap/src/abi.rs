//! The BPF ABI of `bpf/sockmap.bpf.c` lives with the object in nsfast-bpf
//! ([`nsfast_bpf::sockmap_abi`]), since the pod shortcut (crate nsfast-pod) loads the same
//! programs; re-exported here under its old path.

pub use nsfast_bpf::sockmap_abi::*;
