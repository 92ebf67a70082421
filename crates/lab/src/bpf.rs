//! BPF test objects, compiled from `bpf/tests/` by this crate's build script (8-byte aligned
//! as aya requires). They exist only here, never in nsfast-bpf or a shipped binary.

/// BPF_PROG_TEST_RUN harness for the sockmap key helpers (`bpf/tests/sockmap_keys.bpf.c`).
pub static TEST_SOCKMAP_KEYS: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sockmap_keys.bpf.o"));
