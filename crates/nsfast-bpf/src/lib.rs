//! nsfast's BPF objects, compiled from `bpf/` by this crate's build script and embedded.
//!
//! Each constant holds one ELF object, 8-byte aligned as aya requires.

/// sockops + sk_msg programs and their maps (`bpf/sockmap.bpf.c`).
pub static SOCKMAP: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sockmap.bpf.o"));

/// BPF_PROG_TEST_RUN harness for the sockmap key helpers (`bpf/tests/sockmap_keys.bpf.c`).
pub static TEST_SOCKMAP_KEYS: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sockmap_keys.bpf.o"));

/// Pod datapath: TCX (veth, wire) and netkit programs, endpoint table, counters
/// (`bpf/pod.bpf.c`).
pub static POD: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/pod.bpf.o"));

/// SHA-256 over every object this crate embeds (name, length and bytes, in name order).
pub const OBJECTS_SHA256: &str = env!("NSFAST_BPF_SHA256");
