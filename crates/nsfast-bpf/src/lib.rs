//! nsfast's BPF objects, compiled from `bpf/` by this crate's build script and embedded.
//!
//! Each constant holds one ELF object, 8-byte aligned as aya requires. Test objects
//! (`bpf/tests/`) are not here: crate nsfast-lab builds them (`nsfast_lab::bpf`).
//!
//! [`sockmap_abi`] mirrors the maps of [`SOCKMAP`]: both `nsfast sockmap` (crate
//! nsfast-sockmap) and the pod shortcut (crate nsfast-pod) load that object.

pub mod pod_abi;
pub mod relay_abi;
pub mod sockmap_abi;
pub mod sockmap_kept;
pub mod sockmap_readers;

/// sockops + sk_msg programs and their maps (`bpf/sockmap.bpf.c`).
pub static SOCKMAP: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sockmap.bpf.o"));

/// Pod datapath: TCX (veth, wire) and netkit programs, endpoint table, counters
/// (`bpf/pod.bpf.c`).
pub static POD: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/pod.bpf.o"));

/// The vsock relay's kernel path: an sk_skb stream-verdict program that redirects each leg's
/// received data to the other leg's egress, its SOCKHASH, peer map and per-socket counters
/// (`bpf/relay.bpf.c`).
pub static RELAY: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/relay.bpf.o"));

/// SHA-256 over every object this crate embeds (name, length and bytes, in name order).
pub const OBJECTS_SHA256: &str = env!("NSFAST_BPF_SHA256");
