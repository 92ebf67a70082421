//! The relay's kernel path: both legs of a connection go into a SOCKHASH and an sk_skb
//! stream-verdict program (`bpf/relay.bpf.c`) redirects what each leg receives to the egress of
//! the other, so no data byte passes through this process. What the kernel does, and how the
//! relay keeps every byte in order around it (TCP <-> TCP checked on Linux 6.18; AF_VSOCK legs
//! are experimental: they still lose data / stall in the 6.12 guest, docs/vsock.md):
//!
//! - A redirect to egress is asynchronous: the skb is queued on the target's psock and a
//!   workqueue item writes it into the target socket later. A `shutdown(SHUT_WR)` right after
//!   the source's FIN could overtake queued data, and removing the TARGET from the map purges
//!   its psock queue (the bytes are lost). So at a source's EOF the relay (1) removes the
//!   source's peer entry (later skbs stay on the source, where it reads them), (2) waits until
//!   no verdict run is in flight (the program's begin/end counts), (3) waits until everything
//!   the program redirected was written into the target (below), (4) reads the source's
//!   remainder in user space, writes it, and only then (5) half-closes the target. Sockets
//!   leave the map only when both directions are done (or on an error).
//! - "Written into the target": for a TCP target the bytes its send queue ever took
//!   (`tcpi_bytes_acked` + SIOCOUTQ, against a baseline taken at the join) reach the program's
//!   byte count; for a TCP source (and an AF_VSOCK target) the source's receive memory
//!   (SO_MEMINFO) is back to 0: a redirected skb stays charged to the TCP socket it came from
//!   until the workqueue has sent and freed it. AF_VSOCK → AF_VSOCK has neither (vsock skbs
//!   are not charged to the socket, vsock exposes no byte count): there a raw tracepoint
//!   program on `virtio_transport_alloc_pkt` counts the data bytes each vsock target sent
//!   (loopback, virtio and vhost allocate every packet there); without it that pair is not
//!   joined.
//! - Both legs go into `nsr_targets` (a SOCKHASH without program, where redirects look up
//!   their target) before either goes into `nsr_sockhash` (the verdict program's map), so the
//!   first leg's verdict never finds the other leg missing.
//! - TCP queues a resent segment that starts before `rcv_nxt` whole (tcp_recvmsg skips the old
//!   bytes by copied_seq), and tcp_read_skb hands the program whole skbs: the program reads
//!   each TCP skb's sequence number, remembers where the stream stands, and cuts the old bytes
//!   off before it redirects or passes the skb (without the trim, 2 x 65,483 bytes arrive twice). An
//!   skb it cannot trim is dropped and flagged; the relay then resets the connection.
//! - Data that arrived before the join is not seen by the program until the socket's next
//!   data_ready. For TCP, SO_RCVLOWAT runs data_ready at once (tcp_set_rcvlowat; held at its
//!   maximum during the join, then 1). AF_VSOCK has no such kick: what a vsock leg holds at
//!   the join is forwarded in user space first (written before the join: it stays ahead); packets that slip in between
//!   lag (each later packet redirects the oldest: order holds), and a leg that stays readable
//!   while its skb count stands still hands its direction over to user space. So does a leg
//!   the program tainted during the join (a tainted socket is never redirected again, so what
//!   it kept cannot be overtaken).
//! - An AF_VSOCK source has no flow control while joined: vsock's read_skb returns the
//!   sender's credit as soon as the program takes a packet, and the skbs redirected to a slow
//!   target wait on its psock, charged to no socket (a vsock client could send 192 MiB to a
//!   target that read nothing, 6.12 and 7.2 guests). A target more than
//!   [`KERNEL_QUEUE_LIMIT`] behind hands the connection over, and a handed-over vsock source
//!   leaves the verdict's map (it stays in nsr_targets): its packets then wait in its own
//!   receive queue and its credit holds the sender back. A TCP source needs none of this:
//!   what it redirected stays charged to its receive memory, which closes its window.
//! - Taking a vsock source out of the verdict's map from user space races with a read_skb
//!   in the transport's receive path, which then drops the skb it took (no program is
//!   SK_DROP); the program cannot remove its own socket (sk_skb programs may not update a
//!   sockmap). The leg's drop count (SO_MEMINFO) against its count at the join turns such a
//!   loss into a failed connection (`check_drops`), never a silent hole.
//! - A vsock skb is never left partly read at the join (`forward_queued`): read_skb would
//!   send its already-read bytes again.
//! - The process ending (SIGTERM, SIGKILL) closes both legs: a closed socket leaves the map by
//!   itself (sock_map_close), and the program and maps go with the last descriptor.

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use aya::maps::{HashMap as BpfHashMap, MapData, SockHash};
use aya::programs::{RawTracePoint, SkSkb};
use aya::{Ebpf, EbpfLoader};
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nsfast_sys::report::error_chain;
use nsfast_sys::sockinfo;
use std::os::fd::AsRawFd;

use crate::conn::Conn;

use nsfast_bpf::relay_abi::{
    Counters, VsockKey, FLAG_BROKEN, FLAG_TAINTED, MAP_COUNTERS, MAP_PEERS, MAP_SOCKHASH,
    MAP_TARGETS, MAP_VSOCK_SENT, PROG_VERDICT as PROG, PROG_VSOCK, TP_VSOCK,
};

/// A leg the kernel path can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leg {
    Tcp,
    Vsock,
}

impl Leg {
    /// The kind of a connected socket, or why it cannot be joined.
    pub fn of(c: &Conn) -> Result<Leg, String> {
        if !c.is_socket() {
            return Err(format!("{} is not a socket", c.label));
        }
        match sockinfo::domain(c.reader()) {
            Ok(libc::AF_INET) | Ok(libc::AF_INET6) => Ok(Leg::Tcp),
            Ok(libc::AF_VSOCK) => Ok(Leg::Vsock),
            Ok(libc::AF_UNIX) => Err(format!(
                "{} is a UNIX socket (sockmap redirects only TCP and AF_VSOCK stream legs here)",
                c.label
            )),
            Ok(f) => Err(format!("{} has address family {f}", c.label)),
            Err(e) => Err(format!("{}: SO_DOMAIN: {e}", c.label)),
        }
    }
}

/// Whether a pair of legs can be joined (not AF_VSOCK ↔ AF_VSOCK: see the module doc).
pub fn pair_supported(a: Leg, b: Leg) -> Result<(), String> {
    if a == Leg::Vsock && b == Leg::Vsock {
        return Err(
            "AF_VSOCK to AF_VSOCK: no exact measure of what the kernel still has \
                    queued for the target, so half-close could lose bytes"
                .into(),
        );
    }
    Ok(())
}

/// Loading the program failed.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(
        "loading the relay's BPF program (needs CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN, or root)"
    )]
    Load(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("{0} missing from the relay's BPF object")]
    Missing(&'static str),
}

struct Maps {
    sockhash: SockHash<MapData, u64>,
    targets: SockHash<MapData, u64>,
    peers: BpfHashMap<MapData, u64, u64>,
    counters: BpfHashMap<MapData, u64, Counters>,
    vsock_sent: BpfHashMap<MapData, VsockKey, u64>,
}

/// The loaded program and its maps: one per relay process, shared by every connection.
pub struct KernelPath {
    maps: Mutex<Maps>,
    /// Why AF_VSOCK -> AF_VSOCK cannot be joined (the vsock byte counter did not attach).
    vsock_pair: Result<(), String>,
    _ebpf: Ebpf,
}

impl std::fmt::Debug for KernelPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KernelPath")
    }
}

/// Bytes that went through this process's own read/write calls (the kernel path's remainder
/// and hand-overs), for the whole process. Tests read it through `--json` (`user_bytes`).
pub static USER_BYTES: AtomicU64 = AtomicU64::new(0);

/// What one joined connection moved.
#[derive(Debug, Default, Clone)]
pub struct Joined {
    /// Bytes each way, kernel and user space together.
    pub a_to_b: u64,
    pub b_to_a: u64,
    /// Of those, bytes this process read and wrote itself.
    pub user_a_to_b: u64,
    pub user_b_to_a: u64,
    pub error: Option<String>,
}

impl KernelPath {
    /// Loads `bpf/relay.bpf.o` and attaches the verdict program to its SOCKHASH.
    pub fn load() -> Result<Self, KernelError> {
        let mut ebpf = EbpfLoader::new()
            .load(nsfast_bpf::RELAY)
            .map_err(|e| KernelError::Load(Box::new(e)))?;
        let take = |ebpf: &mut Ebpf, name: &'static str| {
            ebpf.take_map(name).ok_or(KernelError::Missing(name))
        };
        let sockhash: SockHash<MapData, u64> = take(&mut ebpf, MAP_SOCKHASH)?
            .try_into()
            .map_err(|e: aya::maps::MapError| KernelError::Load(Box::new(e)))?;
        let targets: SockHash<MapData, u64> = take(&mut ebpf, MAP_TARGETS)?
            .try_into()
            .map_err(|e: aya::maps::MapError| KernelError::Load(Box::new(e)))?;
        let peers: BpfHashMap<MapData, u64, u64> = take(&mut ebpf, MAP_PEERS)?
            .try_into()
            .map_err(|e: aya::maps::MapError| KernelError::Load(Box::new(e)))?;
        let counters: BpfHashMap<MapData, u64, Counters> = take(&mut ebpf, MAP_COUNTERS)?
            .try_into()
            .map_err(|e: aya::maps::MapError| KernelError::Load(Box::new(e)))?;
        let prog: &mut SkSkb = ebpf
            .program_mut(PROG)
            .ok_or(KernelError::Missing(PROG))?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| KernelError::Load(Box::new(e)))?;
        prog.load().map_err(|e| KernelError::Load(Box::new(e)))?;
        prog.attach(sockhash.fd())
            .map_err(|e| KernelError::Load(Box::new(e)))?;
        let vsock_sent: BpfHashMap<MapData, VsockKey, u64> = take(&mut ebpf, MAP_VSOCK_SENT)?
            .try_into()
            .map_err(|e: aya::maps::MapError| KernelError::Load(Box::new(e)))?;
        // The vsock byte counter: only AF_VSOCK -> AF_VSOCK needs it, so failing to attach it
        // (no virtio vsock transport loaded, no tracepoint) only rules that pair out.
        let vsock_pair = (|| -> Result<(), String> {
            let p: &mut RawTracePoint = ebpf
                .program_mut(PROG_VSOCK)
                .ok_or("no vsock counter program")?
                .try_into()
                .map_err(|e: aya::programs::ProgramError| e.to_string())?;
            p.load().map_err(|e| error_chain(&e))?;
            p.attach(TP_VSOCK).map_err(|e| error_chain(&e))?;
            Ok(())
        })()
        .map_err(|e| {
            format!(
                "AF_VSOCK to AF_VSOCK needs the vsock byte counter on tracepoint {TP_VSOCK}, \
                 which did not attach: {e}"
            )
        });
        Ok(Self {
            maps: Mutex::new(Maps {
                sockhash,
                targets,
                peers,
                counters,
                vsock_sent,
            }),
            vsock_pair,
            _ebpf: ebpf,
        })
    }

    /// Whether a pair of legs can be joined: any pair with a TCP leg; AF_VSOCK ↔ AF_VSOCK
    /// when the vsock byte counter is attached.
    pub fn pair_supported(&self, a: Leg, b: Leg) -> Result<(), String> {
        if a == Leg::Vsock && b == Leg::Vsock {
            return self.vsock_pair.clone();
        }
        Ok(())
    }

    fn vsock_sent(&self, key: &VsockKey) -> u64 {
        self.maps().vsock_sent.get(key, 0).unwrap_or_default()
    }

    fn maps(&self) -> std::sync::MutexGuard<'_, Maps> {
        self.maps.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sockets in the maps now (0 when no connection is joined).
    pub fn sockets(&self) -> usize {
        let m = self.maps();
        m.sockhash.keys().filter(|k| k.is_ok()).count()
            + m.targets.keys().filter(|k| k.is_ok()).count()
    }

    /// Bytes of what the program redirected to `dst` that `dst` has taken (written into its
    /// send path): a TCP target's written count past its base; a vsock target's data bytes
    /// counted by the tracepoint. None: no such count (a vsock target without the tracepoint,
    /// joined only to a TCP source, which its own receive memory holds back).
    fn taken(&self, dst: &Conn, ds: &LegState) -> Option<io::Result<u64>> {
        match (ds.leg, ds.vkey) {
            (Leg::Tcp, _) => {
                Some(sockinfo::tcp_written(dst.reader()).map(|w| w.saturating_sub(ds.base)))
            }
            (Leg::Vsock, Some(k)) if self.vsock_pair.is_ok() => Some(Ok(self.vsock_sent(&k))),
            (Leg::Vsock, _) => None,
        }
    }

    fn counters(&self, cookie: u64) -> Counters {
        self.maps().counters.get(&cookie, 0).unwrap_or_default()
    }

    /// Joins `a` and `b` and serves the connection to its end. `Err` when the join was
    /// refused before any byte moved: the caller relays in user space.
    pub fn run(&self, a: &Conn, b: &Conn) -> Result<Joined, Refusal> {
        let (la, lb) = (
            Leg::of(a).map_err(Refusal::unsupported)?,
            Leg::of(b).map_err(Refusal::unsupported)?,
        );
        self.pair_supported(la, lb).map_err(Refusal::unsupported)?;
        let leg = |c: &Conn, l: Leg| -> Result<LegState, String> {
            let fd = c.reader();
            let cookie =
                sockinfo::cookie(fd).map_err(|e| format!("{}: SO_COOKIE: {e}", c.label))?;
            let (base, vkey) = match l {
                Leg::Tcp => (
                    sockinfo::tcp_written(fd).map_err(|e| format!("{}: TCP_INFO: {e}", c.label))?,
                    None,
                ),
                Leg::Vsock => {
                    use nix::sys::socket::{getpeername, getsockname, VsockAddr};
                    let me: VsockAddr = getsockname(fd.as_raw_fd())
                        .map_err(|e| format!("{}: getsockname: {e}", c.label))?;
                    let peer: VsockAddr = getpeername(fd.as_raw_fd())
                        .map_err(|e| format!("{}: getpeername: {e}", c.label))?;
                    (
                        0,
                        Some(VsockKey {
                            src_port: me.port(),
                            dst_cid: peer.cid(),
                            dst_port: peer.port(),
                            pad: 0,
                        }),
                    )
                }
            };
            let drops = match l {
                Leg::Tcp => 0,
                Leg::Vsock => {
                    sockinfo::drops(fd).map_err(|e| format!("{}: SO_MEMINFO: {e}", c.label))?
                }
            };
            Ok(LegState {
                leg: l,
                cookie,
                base,
                vkey,
                drops,
            })
        };
        let (sa, sb) = (
            leg(a, la).map_err(Refusal::unsupported)?,
            leg(b, lb).map_err(Refusal::unsupported)?,
        );
        // TCP runs data_ready (and so the program) only once SO_RCVLOWAT bytes are queued (or
        // its receive window is nearly closed): held high during the join, then SO_RCVLOWAT 1
        // runs data_ready at once, for what arrived before and during the join. (A verdict
        // during the join finds the other leg in nsr_targets: see insert.)
        let tcp_legs = [(a, &sa), (b, &sb)]
            .into_iter()
            .filter(|(_, s)| s.leg == Leg::Tcp);
        for (c, _) in tcp_legs.clone() {
            let _ = sockinfo::set_rcvlowat(c.reader(), i32::MAX);
        }
        // AF_VSOCK has no data_ready kick: what a vsock leg already holds is forwarded here
        // first (written in full before the join, so it stays ahead of every redirected byte).
        let mut pre = [0u64; 2];
        for (i, (src, ss, dst)) in [(a, &sa, b), (b, &sb, a)].into_iter().enumerate() {
            if ss.leg == Leg::Vsock {
                pre[i] = forward_queued(src.reader(), dst.writer(), 1 << 20)
                    .map_err(|e| Refusal::unsupported(format!("{}: {e}", src.label)))?;
            }
        }
        USER_BYTES.fetch_add(pre[0] + pre[1], Ordering::Relaxed);
        for (n, (src, dst)) in pre.iter().zip([(a, b), (b, a)]) {
            if *n > 0 {
                tracing::debug!(
                    "{} -> {}: joining: {n} bytes forwarded in user space (queued before the join)",
                    src.label,
                    dst.label
                );
            }
        }
        let joined = self.insert(a, &sa, b, &sb).map_err(|mut r| {
            r.pre = pre;
            r
        });
        for (c, _) in tcp_legs {
            let _ = sockinfo::set_rcvlowat(c.reader(), 1);
        }
        joined?;
        // A TCP target's written count (its base taken before the forward above) holds what
        // was forwarded into it there: without it the wait for "the target took every
        // redirected byte" would end that many bytes early, and the remainder could overtake
        // redirected bytes still queued. (A vsock target's count starts at the insert.)
        let (mut sa, mut sb) = (sa, sb);
        if sb.leg == Leg::Tcp {
            sb.base += pre[0];
        }
        if sa.leg == Leg::Tcp {
            sa.base += pre[1];
        }
        let abort = AtomicBool::new(false);
        let unjoin = Unjoin::default();
        let (ab, ba) = std::thread::scope(|sc| {
            let h = sc.spawn(|| self.direction(a, &sa, b, &sb, &abort, &unjoin));
            let ba = self.direction(b, &sb, a, &sa, &abort, &unjoin);
            let ab = h
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("relay thread panicked")));
            (ab, ba)
        });
        let ca = self.counters(sa.cookie);
        let cb = self.counters(sb.cookie);
        self.remove(&sa, &sb);
        // The direction that failed first, not the one that stopped because of it.
        let echo = |r: &io::Result<u64>| r.as_ref().is_err_and(|e| e.to_string().contains(ABORTED));
        let error = match (&ab, &ba) {
            (Err(e), _) if !echo(&ab) || ba.is_ok() => {
                Some(format!("{} -> {}: {e}", a.label, b.label))
            }
            (_, Err(e)) => Some(format!("{} -> {}: {e}", b.label, a.label)),
            (Err(e), _) => Some(format!("{} -> {}: {e}", a.label, b.label)),
            _ => None,
        };
        let ua = *ab.as_ref().unwrap_or(&0) + pre[0];
        let ub = *ba.as_ref().unwrap_or(&0) + pre[1];
        Ok(Joined {
            a_to_b: ca.bytes + ua,
            b_to_a: cb.bytes + ub,
            user_a_to_b: ua,
            user_b_to_a: ub,
            error,
        })
    }

    /// Counters and peer entries first, then both sockets into nsr_targets (redirect targets,
    /// no program), then both into nsr_sockhash (the verdict program): the first leg's verdict
    /// can run before the second leg is in nsr_sockhash, and finds it in nsr_targets. The
    /// AF_VSOCK leg goes first each time: on a kernel without vsock sockmap support that insert
    /// fails before anything else is in a map.
    fn insert(&self, a: &Conn, sa: &LegState, b: &Conn, sb: &LegState) -> Result<(), Refusal> {
        let mut m = self.maps();
        let counters = |s: &LegState| Counters::for_leg(s.leg == Leg::Tcp);
        let r = (|| -> Result<(), Refusal> {
            let map_err = |what: &str| {
                let what = what.to_string();
                move |e: aya::maps::MapError| Refusal::unsupported(format!("{what}: {e}"))
            };
            m.counters
                .insert(sa.cookie, counters(sa), 0)
                .map_err(map_err("counters"))?;
            m.counters
                .insert(sb.cookie, counters(sb), 0)
                .map_err(map_err("counters"))?;
            for k in [sa.vkey, sb.vkey].into_iter().flatten() {
                m.vsock_sent
                    .insert(k, 0, 0)
                    .map_err(map_err("vsock counter"))?;
            }
            // Peers before sockets: the first verdict finds its peer entry.
            m.peers
                .insert(sa.cookie, sb.cookie, 0)
                .map_err(map_err("peers"))?;
            m.peers
                .insert(sb.cookie, sa.cookie, 0)
                .map_err(map_err("peers"))?;
            let mut order = [(a, sa), (b, sb)];
            if sa.leg != Leg::Vsock {
                order.swap(0, 1);
            }
            // Four inserts: both legs into nsr_targets, then both into nsr_sockhash.
            for (i, (c, s)) in order.iter().chain(order.iter()).enumerate() {
                let (into_sockhash, second_leg) = (i >= 2, i % 2 == 1);
                let r = if into_sockhash {
                    m.sockhash.insert(s.cookie, c.reader(), 0)
                } else {
                    m.targets.insert(s.cookie, c.reader(), 0)
                };
                if let Err(e) = r {
                    let notsup = matches!(&e, aya::maps::MapError::SyscallError(se)
                        if se.io_error.raw_os_error() == Some(libc::EOPNOTSUPP));
                    let why = match (notsup, s.leg) {
                        // Only ESTABLISHED TCP sockets join a sockmap: this one's peer already
                        // sent its FIN (a short exchange that ended before the join).
                        (true, Leg::Tcp) => Refusal {
                            reason: format!(
                                "{} is no longer established (its peer already half-closed)",
                                c.label
                            ),
                            fallback_ok: true,
                            pre: [0; 2],
                        },
                        (true, Leg::Vsock) => Refusal::unsupported(format!(
                            "the kernel cannot put {} into a sockmap (EOPNOTSUPP; AF_VSOCK \
                             needs Linux 6.4+ and a transport with read_skb)",
                            c.label
                        )),
                        _ => {
                            Refusal::unsupported(format!("adding {} to the sockmap: {e}", c.label))
                        }
                    };
                    for (_, s) in order {
                        let _ = m.targets.remove(&s.cookie);
                    }
                    if into_sockhash && second_leg {
                        let first = order[0].1;
                        let moved = m.counters.get(&first.cookie, 0).unwrap_or_default();
                        let _ = m.sockhash.remove(&first.cookie);
                        if moved.bytes > 0 || moved.passed > 0 {
                            // Data kept on a psock, or queued there for the other leg's
                            // egress, went with it.
                            return Err(Refusal {
                                reason: format!("{}; bytes already received are lost", why.reason),
                                fallback_ok: false,
                                pre: [0; 2],
                            });
                        }
                    }
                    return Err(why);
                }
            }
            Ok(())
        })();
        if r.is_err() {
            for c in [sa.cookie, sb.cookie] {
                let _ = m.peers.remove(&c);
                let _ = m.counters.remove(&c);
            }
            for k in [sa.vkey, sb.vkey].into_iter().flatten() {
                let _ = m.vsock_sent.remove(&k);
            }
        }
        r
    }

    fn remove(&self, sa: &LegState, sb: &LegState) {
        let mut m = self.maps();
        for c in [sa.cookie, sb.cookie] {
            let _ = m.peers.remove(&c);
            let _ = m.sockhash.remove(&c);
            let _ = m.targets.remove(&c);
            let _ = m.counters.remove(&c);
        }
        for k in [sa.vkey, sb.vkey].into_iter().flatten() {
            let _ = m.vsock_sent.remove(&k);
        }
    }

    /// The program had to drop an skb it could not trim (see bpf/relay.bpf.c): src's stream has
    /// a hole, so the connection fails (both legs reset) rather than go on without those bytes.
    fn check_broken(c: &Counters) -> io::Result<()> {
        if c.flags & FLAG_BROKEN != 0 {
            return Err(io::Error::other(
                "a resent TCP segment could not be trimmed to its new bytes in the kernel \
                 (bpf_skb_adjust_room failed); its bytes were dropped, so the connection is reset",
            ));
        }
        Ok(())
    }

    /// A joined vsock source must not have lost an skb. Taking it out of the verdict's map
    /// from user space (a hand-over) races with a read_skb in the transport's receive path:
    /// one that already took the skb (and returned its credit to the sender) but finds the
    /// program gone drops it (sk_psock_verdict_recv: no program is SK_DROP; 6.12 and 7.2
    /// source). The socket's drop count shows it; the connection then fails (both legs
    /// reset) instead of delivering a stream with a hole.
    fn check_drops(src: &Conn, ss: &LegState) -> io::Result<()> {
        if ss.leg != Leg::Vsock {
            return Ok(());
        }
        let now = sockinfo::drops(src.reader())?;
        if now != ss.drops {
            return Err(io::Error::other(format!(
                "the kernel dropped {} skb(s) received on this AF_VSOCK leg while it left the \
                 sockmap; their bytes are lost, so the connection is reset",
                now.wrapping_sub(ss.drops)
            )));
        }
        Ok(())
    }

    /// One direction, src → dst: kernel until src's EOF (or a hand-over), then the remainder
    /// in user space, then dst's half-close. Returns the bytes moved in user space.
    fn direction(
        &self,
        src: &Conn,
        ss: &LegState,
        dst: &Conn,
        ds: &LegState,
        abort: &AtomicBool,
        unjoin: &Unjoin,
    ) -> io::Result<u64> {
        let r = self.direction_inner(src, ss, dst, ds, abort, unjoin);
        if r.is_err() {
            // It may not have reached the barrier: let the other direction past it (it sees
            // the abort there).
            unjoin.drained.fetch_add(1, Ordering::SeqCst);
        }
        if r.is_err() && !abort.swap(true, Ordering::SeqCst) {
            src.abort();
            dst.abort();
        }
        r
    }

    fn direction_inner(
        &self,
        src: &Conn,
        ss: &LegState,
        dst: &Conn,
        ds: &LegState,
        abort: &AtomicBool,
        unjoin: &Unjoin,
    ) -> io::Result<u64> {
        // Data the program kept on src during the join (tainted: see insert), or a vsock leg
        // with data queued before the join (the program sees it only at the next packet):
        // this direction goes to user space now. Decided once no verdict run is in flight.
        let begin = self.counters(ss.cookie).begin;
        wait_until("no verdict in flight", abort, dst.reader(), || {
            Ok(self.counters(ss.cookie).end >= begin)
        })?;
        let mut stuck = (self.counters(ss.cookie).flags & FLAG_TAINTED != 0)
            .then_some("the program kept data on it during the join");
        if stuck.is_none() {
            // A vsock leg's packets that arrived after the forward above and before the join
            // wait in its queue: each later packet's data_ready redirects the oldest one, so
            // order holds and bulk flows, but with no later packet (a request waiting for its
            // answer) they would wait forever. Readable while the program's skb count stands
            // still for a tick: hand over to user space.
            //
            // And a vsock source has no flow control while it is joined: vsock's read_skb
            // returns the sender's credit as soon as the program takes a packet, and what the
            // program redirected waits on the target's psock, charged to no socket. A target
            // that falls KERNEL_QUEUE_LIMIT behind hands the connection over, and the vsock
            // source leaves the verdict's map (below): its credit then holds the sender back.
            let watch = || -> io::Result<Watch> {
                let c = self.counters(ss.cookie);
                Self::check_broken(&c)?;
                if ss.leg != Leg::Vsock {
                    return Ok(Watch::Fine);
                }
                if let Some(taken) = self.taken(dst, ds) {
                    let behind = c.bytes.saturating_sub(taken?);
                    if behind > KERNEL_QUEUE_LIMIT {
                        return Ok(Watch::Behind(behind));
                    }
                }
                Ok(if readable(src.reader())? {
                    Watch::Waiting
                } else {
                    Watch::Fine
                })
            };
            stuck = match wait_eof(
                src.reader(),
                dst.reader(),
                abort,
                &unjoin.wanted,
                ss.leg == Leg::Vsock,
                watch,
                || self.counters(ss.cookie).skbs,
            )
            .map_err(ctx("waiting for EOF"))?
            {
                Eof::End => None,
                Eof::Waiting => Some("data was queued before the join"),
                Eof::Behind(n) => {
                    tracing::debug!(
                        "{} -> {}: the target is {n} bytes behind (limit {KERNEL_QUEUE_LIMIT}): \
                         handing the connection over to user space",
                        src.label,
                        dst.label
                    );
                    Some("the target fell behind")
                }
                Eof::Other => Some("the other direction left the kernel"),
            };
        }
        if stuck.is_some() {
            // Both directions leave the kernel together (see Unjoin).
            unjoin.wanted.store(true, Ordering::SeqCst);
        }
        check_abort(abort)?;
        // (1) no more redirects from src; (2) none in flight.
        {
            let mut m = self.maps();
            let _ = m.peers.remove(&ss.cookie);
            if stuck.is_some() && ss.leg == Leg::Vsock {
                // A handed-over vsock source also leaves the verdict's map at once (it stays
                // in nsr_targets, so its psock and what the other direction queued there
                // stay): from now on its packets wait in its own receive queue, and vsock's
                // credit holds the sender back while the target is slow. Skbs the program
                // passed before this are read first (see Unjoin).
                let _ = m.sockhash.remove(&ss.cookie);
            }
        }
        let begin = self.counters(ss.cookie).begin;
        wait_until("no verdict in flight", abort, dst.reader(), || {
            Ok(self.counters(ss.cookie).end >= begin)
        })?;
        let redirected = self.counters(ss.cookie).bytes;
        // (3) everything redirected is in dst's send path.
        let mut held = Vec::new();
        if redirected > 0 {
            if self.taken(dst, ds).is_some() {
                // A TCP target's written count, or a vsock target's data packets counted by
                // the tracepoint (needed for vsock -> vsock, and for a hand-over before EOF,
                // where the TCP source's rule below would wait for EOF).
                wait_until(
                    "the target took every redirected byte",
                    abort,
                    dst.reader(),
                    || Ok(self.taken(dst, ds).unwrap_or(Ok(redirected))? >= redirected),
                )?;
            } else {
                // TCP source: its remainder is charged to it as well, so read that first
                // (held, not yet written: it must follow what the kernel still sends).
                read_to_end(src.reader(), &mut held)?;
                wait_until(
                    "the source's redirected skbs freed",
                    abort,
                    dst.reader(),
                    || Ok(sockinfo::rmem_alloc(src.reader())? == 0),
                )?;
            }
        }
        // (3b) a direction handed over before its EOF reads src only once the other direction
        // is out of the kernel too: nothing redirected into src is queued on its psock any
        // more, so what the program passes on src from now on goes straight to the psock's
        // message queue, which recvmsg reads first (see Unjoin).
        unjoin.drained.fetch_add(1, Ordering::SeqCst);
        if stuck.is_some() {
            wait_until(
                "the other direction out of the kernel",
                abort,
                dst.reader(),
                || Ok(unjoin.drained.load(Ordering::SeqCst) >= 2),
            )?;
        }
        // (4) the remainder, in user space.
        let mut user = 0u64;
        write_all(dst.writer(), &held).map_err(ctx("writing the remainder"))?;
        user += held.len() as u64;
        user += copy(src.reader(), ss.leg, dst.writer(), abort)?;
        USER_BYTES.fetch_add(user, Ordering::Relaxed);
        // Everything src received went through the program: a hole there fails the connection
        // instead of a clean half-close.
        let counters = self.counters(ss.cookie);
        Self::check_broken(&counters)?;
        Self::check_drops(src, ss)?;
        let trimmed = counters.trimmed;
        tracing::debug!(
            "{} -> {}: {redirected} bytes through the kernel, {user} in user space{}{}",
            src.label,
            dst.label,
            stuck.map(|why| format!(" ({why})")).unwrap_or_default(),
            if trimmed > 0 {
                format!("; {trimmed} resent bytes trimmed (TCP had delivered them already)")
            } else {
                String::new()
            }
        );
        // (5)
        dst.shutdown_write().map_err(ctx("half-close"))?;
        Ok(user)
    }
}

/// Taking a joined connection back to user space before its EOF (data the program had to
/// keep, or a vsock leg whose queued packets wait for a packet that does not come) takes BOTH
/// directions out of the kernel, and neither reads its source before both are drained.
/// Why: once a source's peer entry is gone the program passes its skbs (SK_PASS), and
/// sk_psock_verdict_apply queues a passed skb on the psock's ingress_skb list, behind the
/// skbs redirected INTO that socket by the other direction, whenever that list is not empty.
/// recvmsg (vsock_bpf_recvmsg, tcp_bpf_recvmsg) reads the psock's message queue only, and
/// with that empty it reads the socket's own receive queue: newer bytes overtake the passed
/// skb, and on a vsock leg whose peer has shut down it returns 0 (EOF) while the skb still
/// waits; the sockets then leave the map and sk_psock_drop purges it (whole skbs lost,
/// measured on 6.12 and 7.2). With the other direction drained first, a passed skb goes
/// straight to the message queue (in order, under the socket lock) and recvmsg reads it
/// before anything newer.
#[derive(Default)]
struct Unjoin {
    /// A direction handed over: the other one follows at its next tick.
    wanted: AtomicBool,
    /// Directions past step (3) (everything they redirected is in their target), or ended.
    drained: std::sync::atomic::AtomicU8,
}

/// Why a connection was not joined.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub reason: String,
    /// The connection can still be relayed in user space, also under `--path kernel` (a leg
    /// that half-closed before the join); false: the kernel path is not available for it.
    pub fallback_ok: bool,
    /// Bytes already forwarded in user space before the join was refused (a → b, b → a).
    pub pre: [u64; 2],
}

impl Refusal {
    fn unsupported(reason: String) -> Self {
        Self {
            reason,
            fallback_ok: false,
            pre: [0; 2],
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

struct LegState {
    leg: Leg,
    cookie: u64,
    /// TCP: bytes in its written count (sockinfo::tcp_written) that the program did not
    /// redirect into it: its count before the join and what the join forwarded into it.
    base: u64,
    /// AF_VSOCK: its key in nsr_vsock_sent (own port, peer CID, peer port).
    vkey: Option<VsockKey>,
    /// AF_VSOCK: its drop count (SO_MEMINFO) at the join; see [`KernelPath::check_drops`].
    drops: u32,
}

fn ctx(what: &'static str) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

const ABORTED: &str = "the other direction failed";

fn check_abort(abort: &AtomicBool) -> io::Result<()> {
    if abort.load(Ordering::SeqCst) {
        return Err(io::Error::new(io::ErrorKind::ConnectionAborted, ABORTED));
    }
    Ok(())
}

/// A pending socket error on `fd` (SO_ERROR, which clears it) as an io::Error.
fn sock_error(fd: BorrowedFd<'_>) -> io::Result<()> {
    match nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::SocketError) {
        Ok(0) => Ok(()),
        Ok(e) => Err(io::Error::from_raw_os_error(e)),
        Err(e) => Err(e.into()),
    }
}

/// Waits up to `ms` for events on `fds` (each with its interest; EPOLLERR and EPOLLHUP are
/// always reported) and returns what each reported. epoll, not poll: nix's poll drops
/// revents that carry POLLRDHUP, which it does not name.
fn wait_events(fds: &[(BorrowedFd<'_>, EpollFlags)], ms: u16) -> io::Result<Vec<EpollFlags>> {
    let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
    for (i, (fd, flags)) in fds.iter().enumerate() {
        ep.add(fd, EpollEvent::new(*flags, i as u64))?;
    }
    let mut evs = vec![EpollEvent::empty(); fds.len()];
    let n = match ep.wait(&mut evs, EpollTimeout::from(ms)) {
        Ok(n) => n,
        Err(Errno::EINTR) => 0,
        Err(e) => return Err(e.into()),
    };
    let mut out = vec![EpollFlags::empty(); fds.len()];
    for e in &evs[..n] {
        if let Some(o) = out.get_mut(e.data() as usize) {
            *o = e.events();
        }
    }
    Ok(out)
}

fn readable(fd: BorrowedFd<'_>) -> io::Result<bool> {
    Ok(wait_events(&[(fd, EpollFlags::EPOLLIN)], 0)?[0].contains(EpollFlags::EPOLLIN))
}

/// What a joined direction's watch found at a tick.
enum Watch {
    Fine,
    /// Readable while joined: counts only if the program's skb count stood still since the
    /// last tick (a packet that waits for a later one that may not come).
    Waiting,
    /// The target this many bytes behind the source.
    Behind(u64),
}

/// How [`wait_eof`] ended.
#[derive(Debug, PartialEq, Eq)]
enum Eof {
    /// src's end of data.
    End,
    /// [`Watch::Waiting`] on two ticks in a row with no skb redirected in between.
    Waiting,
    /// [`Watch::Behind`].
    Behind(u64),
    /// The other direction left the kernel.
    Other,
}

/// Bytes more than this that a joined AF_VSOCK source's target has not taken yet (queued on
/// its psock, charged to no socket) hand the connection over to user space, where vsock's
/// credit holds the sender back. Per connection; what a tick can add on top is the source's
/// rate times the 10 ms tick.
pub const KERNEL_QUEUE_LIMIT: u64 = 4 << 20;

/// Waits for src's end of data (RDHUP/HUP), while watching both legs for errors, and runs
/// `watch` at every tick: 10 ms apart for the first second, then 200 ms, or 10 ms while
/// `progress` moves when `fast` (a source whose target can fall behind, see
/// [`KERNEL_QUEUE_LIMIT`]).
fn wait_eof(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    abort: &AtomicBool,
    unjoin: &AtomicBool,
    fast: bool,
    watch: impl Fn() -> io::Result<Watch>,
    progress: impl Fn() -> u64,
) -> io::Result<Eof> {
    let mut watch_dst = true;
    let start = Instant::now();
    let mut last_waiting: Option<u64> = None;
    let mut last = progress();
    let mut moving = false;
    loop {
        check_abort(abort)?;
        let mut fds = vec![(src, EpollFlags::EPOLLRDHUP)];
        if watch_dst {
            fds.push((dst, EpollFlags::empty()));
        }
        let tick = if start.elapsed() < Duration::from_secs(1) || (fast && moving) {
            10
        } else {
            200
        };
        let r = wait_events(&fds, tick)?;
        let rs = r[0];
        let rd = r.get(1).copied().unwrap_or(EpollFlags::empty());
        if rs.contains(EpollFlags::EPOLLERR) {
            sock_error(src)?;
        }
        if rd.contains(EpollFlags::EPOLLERR) {
            sock_error(dst)?;
        }
        if rd.contains(EpollFlags::EPOLLHUP) {
            sock_error(dst)?;
            // Shut both ways without an error: nothing more to watch there.
            watch_dst = false;
        }
        if rs.intersects(EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLHUP) {
            sock_error(src)?;
            return Ok(Eof::End);
        }
        if unjoin.load(Ordering::SeqCst) {
            return Ok(Eof::Other);
        }
        let now = progress();
        moving = now != last;
        last = now;
        match watch()? {
            Watch::Behind(n) => return Ok(Eof::Behind(n)),
            Watch::Waiting => {
                if last_waiting == Some(now) {
                    return Ok(Eof::Waiting);
                }
                last_waiting = Some(now);
            }
            Watch::Fine => last_waiting = None,
        }
    }
}

/// Forwards what `src` holds now (MSG_DONTWAIT reads until EAGAIN, or once past `max` bytes
/// until a short read), each chunk written in full to `dst`. Returns the bytes forwarded.
///
/// Never leaves a vsock skb partly read: virtio_transport_read_skb hands the psock the whole
/// skb (its read offset ignored: the bytes already read would be sent again) and subtracts
/// the whole length from rx_bytes a second time. A read shorter than the buffer emptied the
/// receive queue (the dequeue stops only at an empty queue or a full buffer), so stopping
/// only at EAGAIN or after a short read leaves whole skbs, or none.
fn forward_queued(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, max: usize) -> io::Result<u64> {
    use nix::sys::socket::{recv, MsgFlags};
    let mut buf = vec![0u8; 64 << 10];
    let mut total = 0usize;
    loop {
        match recv(src.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
            Ok(0) => break,
            Ok(n) => {
                write_all(dst, &buf[..n])?;
                total += n;
                if total >= max && n < buf.len() {
                    break;
                }
            }
            Err(Errno::EINTR) => {}
            Err(Errno::EAGAIN) => break,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(total as u64)
}

/// Polls `ok` (1 ms, growing to 20 ms) until it holds; fails on an abort or an error on
/// `dst` (the kernel's workqueue reports a failed send there).
fn wait_until(
    what: &str,
    abort: &AtomicBool,
    dst: BorrowedFd<'_>,
    mut ok: impl FnMut() -> io::Result<bool>,
) -> io::Result<()> {
    let mut pause = Duration::from_micros(200);
    let start = Instant::now();
    let mut next_log = Duration::from_secs(2);
    loop {
        if ok()? {
            return Ok(());
        }
        if start.elapsed() > next_log {
            tracing::debug!("still waiting after {:?}: {what}", start.elapsed());
            next_log *= 2;
        }
        check_abort(abort)?;
        if start.elapsed() > Duration::from_millis(50) {
            pause = (pause * 2).min(Duration::from_millis(20));
        }
        // Sleeps `pause` (whole ms in epoll; below 1 ms a plain sleep), woken by an error.
        let ms = pause.as_millis() as u16;
        if ms == 0 {
            std::thread::sleep(pause);
        }
        if wait_events(&[(dst, EpollFlags::empty())], ms)?[0].contains(EpollFlags::EPOLLERR) {
            sock_error(dst)?;
        }
    }
}

/// One read from a socket that may be in the sockmap. A blocking recvmsg there can return
/// EAGAIN when data lands in the receive queue while it waits for the psock's queue
/// (tcp_bpf_recvmsg_parser): wait until readable and read again. (AF_VSOCK: a blocking read
/// here can stall the vsock transport, docs/vsock.md; a MSG_DONTWAIT + epoll version is not
/// used: with it the host's TCP <-> TCP test got duplicate bytes once in the VM runs, not
/// told apart from a flake. The vsock kernel path is experimental.)
fn read_some(src: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match nix::unistd::read(src, buf) {
            Ok(n) => return Ok(n),
            Err(Errno::EINTR) => {}
            Err(Errno::EAGAIN) => {
                wait_events(&[(src, EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP)], 200)?;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// One read from an AF_VSOCK socket in the sockmap, never blocking in the kernel: a
/// blocking vsock_bpf_recvmsg with nothing queued sleeps in vsock_msg_wait_data while it
/// holds the socket lock, and the transport delivers every packet under that lock, so it
/// stalls every vsock connection of the transport. End of data: the peer's SHUTDOWN was seen
/// (RDHUP) and then a read finds nothing (EAGAIN: no data in the receive queue nor anywhere
/// on the psock). A read of 0 there is not the end: vsock_bpf_recvmsg took the receive-queue
/// path because the psock's ingress_skb list was not empty, so wait and read again.
fn read_vsock(src: BorrowedFd<'_>, buf: &mut [u8], abort: &AtomicBool) -> io::Result<usize> {
    use nix::sys::socket::{recv, MsgFlags};
    let mut shut = false;
    let mut pause = 1u16;
    loop {
        check_abort(abort)?;
        match recv(src.as_raw_fd(), buf, MsgFlags::MSG_DONTWAIT) {
            Ok(0) if buf.is_empty() => return Ok(0),
            Ok(0) => {
                // Data still on the psock (or the other direction's egress): wait for it.
                wait_events(&[(src, EpollFlags::EPOLLIN)], pause)?;
                pause = (pause * 2).min(20);
            }
            Ok(n) => return Ok(n),
            Err(Errno::EINTR) => {}
            Err(Errno::EAGAIN) if shut => return Ok(0),
            Err(Errno::EAGAIN) => {
                let r = wait_events(&[(src, EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP)], 200)?;
                if r[0].intersects(EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLHUP) {
                    sock_error(src)?;
                    shut = true;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Reads what src still holds, to its end (called after src's EOF).
fn read_to_end(src: BorrowedFd<'_>, out: &mut Vec<u8>) -> io::Result<()> {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match read_some(src, &mut buf)? {
            0 => return Ok(()),
            n => out.extend_from_slice(&buf[..n]),
        }
    }
}

fn write_all(dst: BorrowedFd<'_>, mut b: &[u8]) -> io::Result<()> {
    while !b.is_empty() {
        match nix::unistd::write(dst, b) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => b = &b[n..],
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// read/write (not splice: a TCP socket in a sockmap keeps data its program passed in the
/// psock, which only recvmsg reads) until src's EOF.
fn copy(src: BorrowedFd<'_>, leg: Leg, dst: BorrowedFd<'_>, abort: &AtomicBool) -> io::Result<u64> {
    let mut buf = vec![0u8; 256 << 10];
    let mut total = 0u64;
    loop {
        check_abort(abort)?;
        let n = match leg {
            Leg::Tcp => read_some(src, &mut buf),
            Leg::Vsock => read_vsock(src, &mut buf, abort),
        };
        match n.map_err(ctx("read"))? {
            0 => return Ok(total),
            n => {
                write_all(dst, &buf[..n]).map_err(ctx("write"))?;
                total += n as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    fn wait(
        src: &UnixStream,
        dst: &UnixStream,
        watch: impl Fn() -> io::Result<Watch>,
        progress: impl Fn() -> u64,
    ) -> io::Result<Eof> {
        let (abort, unjoin) = (AtomicBool::new(false), AtomicBool::new(false));
        wait_eof(
            src.as_fd(),
            dst.as_fd(),
            &abort,
            &unjoin,
            true,
            watch,
            progress,
        )
    }

    #[test]
    fn a_target_behind_ends_the_wait_at_the_first_tick() {
        let (src, _peer) = UnixStream::pair().unwrap();
        let (dst, _dpeer) = UnixStream::pair().unwrap();
        let ticks = Cell::new(0);
        let r = wait(
            &src,
            &dst,
            || {
                ticks.set(ticks.get() + 1);
                Ok(Watch::Behind(5 << 20))
            },
            || 0,
        );
        assert_eq!(r.unwrap(), Eof::Behind(5 << 20));
        assert_eq!(ticks.get(), 1);
    }

    #[test]
    fn waiting_counts_only_while_no_skb_moves() {
        let (src, _peer) = UnixStream::pair().unwrap();
        let (dst, _dpeer) = UnixStream::pair().unwrap();
        // The skb count moves on each of the first 5 ticks: no hand-over before it stands still.
        let ticks = Cell::new(0u64);
        let r = wait(
            &src,
            &dst,
            || Ok(Watch::Waiting),
            || {
                ticks.set(ticks.get() + 1);
                ticks.get().min(6)
            },
        );
        assert_eq!(r.unwrap(), Eof::Waiting);
        assert!(ticks.get() >= 7, "{} ticks", ticks.get());
    }

    #[test]
    fn the_sources_end_ends_the_wait() {
        let (src, peer) = UnixStream::pair().unwrap();
        let (dst, _dpeer) = UnixStream::pair().unwrap();
        peer.shutdown(std::net::Shutdown::Write).unwrap();
        let r = wait(&src, &dst, || Ok(Watch::Fine), || 0);
        assert_eq!(r.unwrap(), Eof::End);
    }
}
