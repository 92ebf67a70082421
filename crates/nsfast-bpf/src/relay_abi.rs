//! `#[repr(C)]` mirrors of `bpf/lib/relay_maps.h` (the object [`crate::RELAY`]), used by the
//! vsock relay's kernel path (crate nsfast-vsock). Keep both sides in sync; the tests below
//! check the sizes and offsets, and aya refuses a map whose value size differs at load.

/// Program and map names in `bpf/relay.bpf.c`.
pub const PROG_VERDICT: &str = "nsr_verdict";
pub const PROG_VSOCK: &str = "nsr_vsock_alloc";
/// The tracepoint [`PROG_VSOCK`] attaches to.
pub const TP_VSOCK: &str = "virtio_transport_alloc_pkt";
pub const MAP_SOCKHASH: &str = "nsr_sockhash";
pub const MAP_TARGETS: &str = "nsr_targets";
pub const MAP_PEERS: &str = "nsr_peers";
pub const MAP_COUNTERS: &str = "nsr_counters";
pub const MAP_VSOCK_SENT: &str = "nsr_vsock_sent";

/// `nsr_counters.flags`: passed one skb to itself, never redirected again (ordering).
pub const FLAG_TAINTED: u32 = 1;
/// Set by the relay at the join: a TCP leg (its skbs carry TCP's sequence numbers).
pub const FLAG_TCP: u32 = 2;
/// `next_seq` holds the sequence number after the last byte handled.
pub const FLAG_SEQ: u32 = 4;
/// A resent skb could not be trimmed and was dropped: the relay resets the connection.
pub const FLAG_BROKEN: u32 = 8;

/// struct nsr_counters: one leg's counters (the value of `nsr_counters`, keyed by the leg's
/// socket cookie).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Bytes redirected to the peer's egress.
    pub bytes: u64,
    /// skbs redirected.
    pub skbs: u64,
    /// Redirects refused although a peer entry existed.
    pub fails: u64,
    /// Bytes kept on this socket (read by the relay in user space).
    pub passed: u64,
    /// Verdict runs started ...
    pub begin: u64,
    /// ... and finished: equal when no verdict is in flight.
    pub end: u64,
    /// `FLAG_*`.
    pub flags: u32,
    /// TCP: the sequence number after the last byte handled (with [`FLAG_SEQ`]).
    pub next_seq: u32,
    /// TCP: bytes cut from the head of resent skbs (they had been handled already).
    pub trimmed: u64,
}

impl Counters {
    /// A leg's counters at the join: zero, with [`FLAG_TCP`] for a TCP leg.
    pub fn for_leg(tcp: bool) -> Self {
        Counters {
            flags: if tcp { FLAG_TCP } else { 0 },
            ..Default::default()
        }
    }
}

// SAFETY: Counters is repr(C), Copy, 64 bytes without implicit padding (six u64, two u32, one
// u64; checked below), and any bit pattern is valid.
unsafe impl aya::Pod for Counters {}

/// struct nsr_vsock_key: an AF_VSOCK socket's own port, its peer's CID and port (the key of
/// `nsr_vsock_sent`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct VsockKey {
    pub src_port: u32,
    pub dst_cid: u32,
    pub dst_port: u32,
    pub pad: u32,
}

// SAFETY: VsockKey is repr(C), Copy, four u32 without padding; any bit pattern is valid.
unsafe impl aya::Pod for VsockKey {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_the_c_structs() {
        assert_eq!(size_of::<Counters>(), 64);
        assert_eq!(offset_of!(Counters, flags), 48);
        assert_eq!(offset_of!(Counters, next_seq), 52);
        assert_eq!(offset_of!(Counters, trimmed), 56);
        assert_eq!(size_of::<VsockKey>(), 16);
    }

    #[test]
    fn a_tcp_leg_starts_with_its_flag_only() {
        assert_eq!(Counters::for_leg(true).flags, FLAG_TCP);
        assert_eq!(Counters::for_leg(false), Counters::default());
    }
}
