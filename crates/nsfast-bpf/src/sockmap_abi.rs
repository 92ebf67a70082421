//! `#[repr(C)]` mirrors of `bpf/lib/sockmap_maps.h` and `bpf/lib/sockmap_key.h` (the object
//! [`crate::SOCKMAP`]).
//! Keep both sides in sync; the unit tests below check sizes, and the BPF_PROG_TEST_RUN tests
//! check the key layout against the C helpers.

/// Program names (as the kernel shows them).
pub const PROG_SOCKOPS: &str = "nsf_sockops";
pub const PROG_SK_MSG: &str = "nsf_sk_msg";

/// The programs that watch how receivers read (`bpf/sockmap.bpf.c`, "Readers").
pub const PROG_RX_READ_TP: &str = "nsf_rx_read_tp";
pub const PROG_RX_READ_FEXIT: &str = "nsf_rx_read_fexit";
pub const PROG_SPLICE_ENTER: &str = "nsf_splice_enter";
pub const PROG_SPLICE_EXIT: &str = "nsf_splice_exit";
pub const PROG_SENDFILE_ENTER: &str = "nsf_sendfile_enter";
pub const PROG_SENDFILE_EXIT: &str = "nsf_sendfile_exit";
pub const PROG_SPLICE_SEEN: &str = "nsf_splice_seen";
pub const PROG_SPLICE_GUARD: &str = "nsf_splice_guard";
pub const PROG_SETSOCKOPT: &str = "nsf_setsockopt";
/// The read-only global with the per-connection queue limit (bytes).
pub const GLOBAL_QUEUE_LIMIT: &str = "nsf_queue_limit";
/// Its default: 16 MiB.
pub const DEFAULT_QUEUE_LIMIT: u64 = 16 << 20;
/// The read-only global with the admission streak (`bpf/lib/sockmap_admit.h`): after this many
/// connections in a row between the same endpoints that gained nothing, new ones keep TCP
/// without joining (0: every connection joins).
pub const GLOBAL_ADMIT_AFTER: &str = "nsf_admit_after";
/// Its default.
pub const DEFAULT_ADMIT_AFTER: u32 = 4;
/// Fewer sends carried than this (both directions) and a connection gained nothing
/// (`NSF_ADMIT_MIN_REDIRECTS`).
pub const ADMIT_MIN_REDIRECTS: u32 = 8;
/// The read-only global with the probe interval (ns): while connections between the same
/// endpoints keep TCP by admission, one joins anyway at most this often.
pub const GLOBAL_ADMIT_PROBE_NS: &str = "nsf_admit_probe_ns";
/// Its default: 10 ms.
pub const DEFAULT_ADMIT_PROBE_NS: u64 = 10_000_000;
/// Short connections further apart than this (ns) are no streak (`NSF_ADMIT_WINDOW_NS`).
pub const ADMIT_WINDOW_NS: u64 = 1_000_000_000;

/// Which connections join (`bpf/lib/sockmap_admit.h`): after `after` connections in a row
/// between the same endpoints that gained nothing, new ones keep TCP without joining (0:
/// every connection joins), but for one probe per `probe_ns` nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub after: u32,
    pub probe_ns: u64,
}

impl Admission {
    /// The settings asked for, the defaults where none is.
    pub fn or_default(after: Option<u32>, probe_ns: Option<u64>) -> Self {
        let d = Admission::default();
        Admission {
            after: after.unwrap_or(d.after),
            probe_ns: probe_ns.unwrap_or(d.probe_ns),
        }
    }

    /// Sets the object's admission globals in `loader` (before the load).
    pub fn set_globals<'a>(&'a self, loader: &mut aya::EbpfLoader<'a>) {
        loader.override_global(GLOBAL_ADMIT_AFTER, &self.after, true);
        loader.override_global(GLOBAL_ADMIT_PROBE_NS, &self.probe_ns, true);
    }
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            after: DEFAULT_ADMIT_AFTER,
            probe_ns: DEFAULT_ADMIT_PROBE_NS,
        }
    }
}

/// Map names.
pub const MAP_SOCKHASH: &str = "nsf_sockhash";
pub const MAP_STATS: &str = "nsf_stats";
pub const MAP_CONFIG: &str = "nsf_config";
pub const MAP_PORTS: &str = "nsf_ports";

/// `nsf_config.port_mode` bit: only ports marked include take the shortcut.
pub const PORTS_INCLUDE: u32 = 1;
/// `nsf_config.port_mode` bit: pod mode (`nsfast pod shortcut`): only sockets of registered pods
/// (`nsf_pods`) take part; the pod's host id is in the pair key.
pub const MODE_PODS: u32 = 0x10000;

/// Pod-mode maps.
pub const MAP_PODS: &str = "nsf_pods";
pub const MAP_POD_STATS: &str = "nsf_pod_stats";
/// `nsf_pods` capacity (and `nsf_pod_stats` slots).
pub const MAX_PODS: u32 = 4096;
/// `nsf_pod.flags`: the pod opted out (`--no-shortcut`).
pub const POD_NO_SHORTCUT: u32 = 1;

/// struct nsf_pod: the value of `nsf_pods` (key: the pod's netns cookie).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodEntry {
    pub host_id: u32,
    pub flags: u32,
    pub slot: u32,
    /// User space's own word (the BPF programs never read it): the inode of the pod's network
    /// namespace, so a deleted pod's counter slot is not reused while that namespace lives.
    pub netns_ino: u32,
}

// SAFETY: PodEntry is repr(C), Copy, four u32 without padding; any bit pattern is valid.
unsafe impl aya::Pod for PodEntry {}

/// Counter indices of `nsf_pod_stats` (enum nsf_pod_stat).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum PodStat {
    Paired = 0,
    RedirectMsgs,
    RedirectBytes,
    Fallbacks,
    PassBytes,
    OptedOut,
}

pub const POD_STAT_COUNT: u32 = 6;

/// struct nsf_pod_counters: one per-CPU value per pod slot.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodCounters {
    pub v: [u64; POD_STAT_COUNT as usize],
}

// SAFETY: PodCounters is repr(C), Copy, an array of u64 without padding; any bit pattern is valid.
unsafe impl aya::Pod for PodCounters {}
/// `nsf_ports` value bits.
pub const PORT_INCLUDE: u8 = 1;
pub const PORT_EXCLUDE: u8 = 2;

/// Counter indices of `nsf_stats` (enum nsf_stat).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Stat {
    SockAdded = 0,
    SockAddFailed,
    Paired,
    PairConflict,
    RedirectMsgs,
    RedirectBytes,
    PassMsgs,
    PassBytes,
    Tainted,
    RedirectFailed,
    SkippedPort,
    Closed,
    SpliceReaders,
    SplicePass,
    SpliceRefused,
    QueueLimit,
    RxMissing,
    GatedMsgs,
    GatedBytes,
    KeptTcp,
    PolicyDenied,
    SkippedShort,
}

pub const STAT_COUNT: u32 = 22;

/// struct nsf_counters: the one per-CPU value of `nsf_stats`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub v: [u64; STAT_COUNT as usize],
}

// SAFETY: Counters is repr(C), Copy, an array of u64 without padding; any bit pattern is valid.
unsafe impl aya::Pod for Counters {}

/// struct nsf_config
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Config {
    pub cgroup_id: u64,
    pub loader_pid: u32,
    pub port_mode: u32,
    pub started_unix: u64,
    /// What the read-only globals were loaded with (for `status`; the programs read the
    /// globals).
    pub queue_limit: u64,
    pub admit_probe_ns: u64,
    pub admit_after: u32,
    pub pad: u32,
}

// SAFETY: Config is repr(C), Copy, has no padding (8+4+4+8+8+8+4+4 bytes) and every bit
// pattern is a valid value, as aya::Pod requires.
unsafe impl aya::Pod for Config {}

impl Config {
    /// What this process, loading the object for `cgroup_id` with `queue_limit` and
    /// `admission`, records.
    pub fn of_loader(
        cgroup_id: u64,
        port_mode: u32,
        started_unix: u64,
        queue_limit: u64,
        admission: Admission,
    ) -> Self {
        Config {
            cgroup_id,
            loader_pid: std::process::id(),
            port_mode,
            started_unix,
            queue_limit,
            admit_probe_ns: admission.probe_ns,
            admit_after: admission.after,
            pad: 0,
        }
    }
}

/// struct nsf_pair_key
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PairKey {
    pub client_ip: [u32; 4],
    pub server_ip: [u32; 4],
    pub client_isn: u32,
    pub server_isn: u32,
    pub client_port: u16,
    pub server_port: u16,
    /// 0; in pod mode the pods' host id.
    pub pad: u32,
}

// SAFETY: PairKey is repr(C), Copy, 48 bytes with no implicit padding (checked below), and any
// bit pattern is valid.
unsafe impl aya::Pod for PairKey {}

/// struct nsf_pending
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pending {
    pub cookie: u64,
    pub role: u32,
    /// Pod mode: the first end's pod slot + 1 (0: none).
    pub pad: u32,
}

// SAFETY: Pending is repr(C), Copy, 16 bytes without implicit padding; any bit pattern is valid.
unsafe impl aya::Pod for Pending {}

/// `nsf_kept`: the last [`KEPT_SLOTS`] connection ends that kept TCP (struct nsf_kept_event),
/// and `nsf_kept_head`, the number of events written so far.
pub const MAP_KEPT: &str = "nsf_kept";
pub const MAP_KEPT_HEAD: &str = "nsf_kept_head";
pub const KEPT_SLOTS: u32 = 64;

/// struct nsf_kept_event
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeptEvent {
    /// The event's number + 1 once it is complete; 0 while it is written (or never was).
    pub seq: u64,
    /// The socket that keeps TCP.
    pub cookie: u64,
    pub key: PairKey,
    /// The process (tgid) that set the option or made the read.
    pub pid: u32,
    /// enum nsf_kept_reason ([`KeptReason`]).
    pub reason: u32,
    pub comm: [u8; 16],
}

// SAFETY: KeptEvent is repr(C), Copy, 88 bytes without implicit padding (8+8+48+4+4+16, checked
// below); any bit pattern is valid.
unsafe impl aya::Pod for KeptEvent {}

/// enum nsf_kept_reason: why a connection keeps TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeptReason {
    RcvLowat,
    ZeroCopy,
    Ulp,
    WaitAll,
    Oob,
    Splice,
}

impl KeptReason {
    pub fn from_raw(r: u32) -> Option<Self> {
        Some(match r {
            1 => Self::RcvLowat,
            2 => Self::ZeroCopy,
            3 => Self::Ulp,
            4 => Self::WaitAll,
            5 => Self::Oob,
            6 => Self::Splice,
            _ => return None,
        })
    }

    /// What the application did, as a user would write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RcvLowat => "SO_RCVLOWAT",
            Self::ZeroCopy => "SO_ZEROCOPY",
            Self::Ulp => "TCP_ULP",
            Self::WaitAll => "MSG_WAITALL",
            Self::Oob => "MSG_OOB",
            Self::Splice => "splice",
        }
    }
}

impl KeptEvent {
    /// The process name (up to its first NUL).
    pub fn comm_str(&self) -> String {
        let end = self
            .comm
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.comm.len());
        String::from_utf8_lossy(&self.comm[..end]).into_owned()
    }

    /// The connection's client and server address.
    pub fn endpoints(&self) -> (std::net::SocketAddr, std::net::SocketAddr) {
        (
            words_to_addr(self.key.client_ip, self.key.client_port),
            words_to_addr(self.key.server_ip, self.key.server_port),
        )
    }
}

/// An address stored as four network-order words (IPv4 as ::ffff:a.b.c.d), shown as IPv4 when
/// it is one.
pub fn words_to_addr(w: [u32; 4], port: u16) -> std::net::SocketAddr {
    let mut o = [0u8; 16];
    for (i, x) in w.iter().enumerate() {
        o[4 * i..4 * i + 4].copy_from_slice(&x.to_ne_bytes());
    }
    let v6 = std::net::Ipv6Addr::from(o);
    let ip = match v6.to_ipv4_mapped() {
        Some(v4) => std::net::IpAddr::V4(v4),
        None => std::net::IpAddr::V6(v6),
    };
    std::net::SocketAddr::new(ip, port)
}

/// Roles in `nsf_pending` and the poison cookie (sockmap_maps.h).
pub const ROLE_ACTIVE: u32 = 1;
pub const ROLE_PASSIVE: u32 = 2;
pub const POISON: u64 = u64::MAX;
pub const MAP_PENDING: &str = "nsf_pending";
pub const MAP_PEERS: &str = "nsf_peers";
/// `nsf_rx`: receiving socket cookie -> struct nsf_rx (32 bytes).
pub const MAP_RX: &str = "nsf_rx";

/// struct nsf_conn_view (input of the key builder; used by the BPF unit tests).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ConnView {
    pub family: u32,
    pub active: u32,
    pub local_ip4: u32,
    pub remote_ip4: u32,
    pub local_ip6: [u32; 4],
    pub remote_ip6: [u32; 4],
    pub local_port: u32,
    pub remote_port: u32,
    pub snd_nxt: u32,
    pub rcv_nxt: u32,
}

impl ConnView {
    /// The bytes of the view as the C struct lays them out.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(64);
        for w in [self.family, self.active, self.local_ip4, self.remote_ip4] {
            v.extend_from_slice(&w.to_ne_bytes());
        }
        for w in self.local_ip6.iter().chain(self.remote_ip6.iter()) {
            v.extend_from_slice(&w.to_ne_bytes());
        }
        for w in [
            self.local_port,
            self.remote_port,
            self.snd_nxt,
            self.rcv_nxt,
        ] {
            v.extend_from_slice(&w.to_ne_bytes());
        }
        v
    }
}

/// An IPv4 address as the BPF side stores it (network-order u32 read natively).
pub fn ip4_word(ip: std::net::Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

/// An IPv6 address as four network-order words read natively.
pub fn ip6_words(ip: std::net::Ipv6Addr) -> [u32; 4] {
    let o = ip.octets();
    let mut w = [0u32; 4];
    for (i, c) in o.chunks_exact(4).enumerate() {
        w[i] = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
    }
    w
}

/// The key the BPF side must build for a client/server pair (the Rust reference model).
pub fn expected_key(
    client: std::net::SocketAddr,
    server: std::net::SocketAddr,
    client_isn: u32,
    server_isn: u32,
) -> PairKey {
    fn canon(ip: std::net::IpAddr) -> [u32; 4] {
        match ip {
            std::net::IpAddr::V4(v4) => ip6_words(v4.to_ipv6_mapped()),
            std::net::IpAddr::V6(v6) => ip6_words(v6),
        }
    }
    PairKey {
        client_ip: canon(client.ip()),
        server_ip: canon(server.ip()),
        client_isn,
        server_isn,
        client_port: client.port(),
        server_port: server.port(),
        pad: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_event_decodes_addresses_and_names() {
        let client: std::net::SocketAddr = "10.1.2.3:40000".parse().unwrap();
        let server: std::net::SocketAddr = "[fd00::2]:80".parse().unwrap();
        let mut e = KeptEvent {
            key: expected_key(client, server, 1, 2),
            reason: 4,
            ..Default::default()
        };
        e.comm[..4].copy_from_slice(b"curl");
        assert_eq!(e.endpoints(), (client, server));
        assert_eq!(e.comm_str(), "curl");
        assert_eq!(KeptReason::from_raw(e.reason), Some(KeptReason::WaitAll));
        assert_eq!(KeptReason::from_raw(0), None);
        assert_eq!(KeptReason::from_raw(7), None);
    }

    #[test]
    fn layouts_match_the_c_structs() {
        assert_eq!(std::mem::size_of::<KeptEvent>(), 88);
        assert_eq!(std::mem::size_of::<Config>(), 48);
        assert_eq!(std::mem::size_of::<PairKey>(), 48);
        assert_eq!(std::mem::size_of::<ConnView>(), 64);
        assert_eq!(std::mem::size_of::<Pending>(), 16);
        assert_eq!(ConnView::default().to_bytes().len(), 64);
        assert_eq!(Stat::SkippedShort as u32 + 1, STAT_COUNT);
        assert_eq!(std::mem::size_of::<PodEntry>(), 16);
        assert_eq!(PodStat::OptedOut as u32 + 1, POD_STAT_COUNT);
    }

    #[test]
    fn v4_and_v4_mapped_v6_give_the_same_key() {
        let c4: std::net::SocketAddr = "10.1.0.1:40000".parse().unwrap();
        let s4: std::net::SocketAddr = "10.1.0.2:5201".parse().unwrap();
        let c6: std::net::SocketAddr = "[::ffff:10.1.0.1]:40000".parse().unwrap();
        let s6: std::net::SocketAddr = "[::ffff:10.1.0.2]:5201".parse().unwrap();
        assert_eq!(expected_key(c4, s4, 1, 2), expected_key(c6, s6, 1, 2));
        assert_ne!(expected_key(c4, s4, 1, 2), expected_key(c4, s4, 1, 3));
    }
}
