//! BPF_PROG_TEST_RUN tests of the sockmap helpers (`bpf/lib/sockmap_key.h`, `nsf_port_allowed`)
//! through the tc harness `bpf/tests/sockmap_keys.bpf.c`: sockops and sk_msg programs cannot
//! be test-run, so their helpers are compiled into a classifier that can. Needs root.

use std::net::{IpAddr, SocketAddr};

use aya::maps::{Array, HashMap as BpfHashMap, MapData};
use aya::programs::{SchedClassifier, TestRun, TestRunOptions};
use aya::Ebpf;
use nsfast_lab::require_root;
use nsfast_sockmap::abi::{self, expected_key, ip4_word, ip6_words, Config, ConnView, PairKey};

struct Harness {
    ebpf: Ebpf,
}

const UNKEYABLE: u32 = 255;

impl Harness {
    fn new() -> Self {
        let mut ebpf = Ebpf::load(nsfast_lab::bpf::TEST_SOCKMAP_KEYS).expect("load test object");
        let prog: &mut SchedClassifier = ebpf
            .program_mut("nsf_test_keys")
            .unwrap()
            .try_into()
            .unwrap();
        prog.load().expect("verifier accepts the harness");
        Self { ebpf }
    }

    /// Runs the helpers on `v`: (return value, key written).
    fn run(&self, v: &ConnView) -> (u32, PairKey) {
        let mut data = vec![0u8; 14];
        data.extend_from_slice(&v.to_bytes());
        let prog: &SchedClassifier = self
            .ebpf
            .program("nsf_test_keys")
            .unwrap()
            .try_into()
            .unwrap();
        let r = prog
            .test_run(TestRunOptions {
                data_in: Some(&data),
                ..Default::default()
            })
            .expect("BPF_PROG_TEST_RUN");
        let out: Array<&MapData, PairKey> =
            Array::try_from(self.ebpf.map("nsf_test_out").unwrap()).unwrap();
        (r.return_value, out.get(&0, 0).unwrap())
    }

    fn set_ports(&mut self, include: &[u16], exclude: &[u16]) {
        let mode = if include.is_empty() {
            0
        } else {
            abi::PORTS_INCLUDE
        };
        let mut cfg: Array<&mut MapData, Config> =
            Array::try_from(self.ebpf.map_mut(abi::MAP_CONFIG).unwrap()).unwrap();
        cfg.set(
            0,
            Config {
                port_mode: mode,
                ..Default::default()
            },
            0,
        )
        .unwrap();
        let mut ports: BpfHashMap<&mut MapData, u16, u8> =
            BpfHashMap::try_from(self.ebpf.map_mut(abi::MAP_PORTS).unwrap()).unwrap();
        for p in include {
            ports.insert(p, abi::PORT_INCLUDE, 0).unwrap();
        }
        for p in exclude {
            let old = ports.get(p, 0).unwrap_or(0);
            ports.insert(p, old | abi::PORT_EXCLUDE, 0).unwrap();
        }
    }
}

/// The view one end of a connection has at its ESTABLISHED callback.
fn view(
    local: SocketAddr,
    remote: SocketAddr,
    active: bool,
    snd_isn: u32,
    rcv_isn: u32,
) -> ConnView {
    let mut v = ConnView {
        active: u32::from(active),
        local_port: u32::from(local.port()),
        remote_port: u32::from(remote.port()),
        snd_nxt: snd_isn.wrapping_add(1),
        rcv_nxt: rcv_isn.wrapping_add(1),
        ..Default::default()
    };
    match (local.ip(), remote.ip()) {
        (IpAddr::V4(l), IpAddr::V4(r)) => {
            v.family = libc::AF_INET as u32;
            v.local_ip4 = ip4_word(l);
            v.remote_ip4 = ip4_word(r);
        }
        (IpAddr::V6(l), IpAddr::V6(r)) => {
            v.family = libc::AF_INET6 as u32;
            v.local_ip6 = ip6_words(l);
            v.remote_ip6 = ip6_words(r);
        }
        _ => panic!("mixed families"),
    }
    v
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[test]
fn both_ends_of_a_connection_build_the_same_key() {
    require_root();
    let h = Harness::new();
    let (c, s) = (sa("10.99.0.1:40000"), sa("10.99.0.2:5001"));
    let (isn_c, isn_s) = (0x1111_2222, 0xffff_ffff); // the server's wraps around at +1
    let (rc, kc) = h.run(&view(c, s, true, isn_c, isn_s));
    let (rs, ks) = h.run(&view(s, c, false, isn_s, isn_c));
    assert_eq!((rc, rs), (1, 1));
    assert_eq!(kc, ks);
    assert_eq!(kc, expected_key(c, s, isn_c, isn_s));
}

#[test]
fn equal_four_tuples_with_other_sequence_numbers_get_other_keys() {
    require_root();
    let h = Harness::new();
    let (c, s) = (sa("10.99.0.1:40000"), sa("10.99.0.2:5001"));
    let (_, k1) = h.run(&view(c, s, true, 1000, 2000));
    let (_, k2) = h.run(&view(c, s, true, 1000, 2001));
    let (_, k3) = h.run(&view(c, s, true, 1001, 2000));
    assert_ne!(k1, k2);
    assert_ne!(k1, k3);
}

#[test]
fn v4_mapped_ipv6_and_ipv4_ends_pair_and_ipv6_works() {
    require_root();
    let h = Harness::new();
    // Client: an AF_INET6 socket talking to ::ffff:10.99.0.2; server: plain AF_INET.
    let (c6, s6) = (
        sa("[::ffff:10.99.0.1]:40001"),
        sa("[::ffff:10.99.0.2]:5001"),
    );
    let (c4, s4) = (sa("10.99.0.1:40001"), sa("10.99.0.2:5001"));
    let (_, kc) = h.run(&view(c6, s6, true, 5, 6));
    let (_, ks) = h.run(&view(s4, c4, false, 6, 5));
    assert_eq!(kc, ks);
    let (a, b) = (sa("[fd99::1]:40002"), sa("[fd99::2]:443"));
    let (_, k1) = h.run(&view(a, b, true, 7, 8));
    let (_, k2) = h.run(&view(b, a, false, 8, 7));
    assert_eq!(k1, k2);
    assert_eq!(k1, expected_key(a, b, 7, 8));
    assert_ne!(k1, kc);
}

#[test]
fn unknown_family_is_not_keyed() {
    require_root();
    let h = Harness::new();
    let v = ConnView {
        family: 1, // AF_UNIX
        ..Default::default()
    };
    assert_eq!(h.run(&v).0, UNKEYABLE);
}

#[test]
fn port_filter_include_and_exclude() {
    require_root();
    let mut h = Harness::new();
    let c = sa("10.99.0.1:40000");
    let allowed = |h: &Harness, port: u16| {
        let s = SocketAddr::new(c.ip(), port);
        h.run(&view(c, s, true, 1, 2)).0
    };
    // No configuration: every port.
    assert_eq!(allowed(&h, 80), 1);
    h.set_ports(&[80, 443], &[443]);
    assert_eq!(allowed(&h, 80), 1);
    assert_eq!(allowed(&h, 443), 0, "exclude wins over include");
    assert_eq!(allowed(&h, 8080), 0, "not in the include list");
    // The port that counts is the server's, on both ends.
    let s = sa("10.99.0.2:80");
    assert_eq!(h.run(&view(s, c, false, 2, 1)).0, 1);
}

#[test]
fn exclude_only_filter() {
    require_root();
    let mut h = Harness::new();
    h.set_ports(&[], &[22]);
    let c = sa("10.99.0.1:40000");
    assert_eq!(h.run(&view(c, sa("10.99.0.2:22"), true, 1, 2)).0, 0);
    assert_eq!(h.run(&view(c, sa("10.99.0.2:23"), true, 1, 2)).0, 1);
}

// ---- pairing (bpf/lib/sockmap_pair.h through nsf_test_pair) ----

const AMBIGUOUS: u32 = 0;
const PENDING: u32 = 1;
const PAIRED: u32 = 2;

impl Harness {
    /// Runs test program `name` on a packet of 14 bytes (an Ethernet header's room), `key`
    /// and then `args`; returns what it returned.
    fn key_op(&self, name: &str, key: &PairKey, args: &[u8]) -> u32 {
        let prog: &SchedClassifier = self
            .ebpf
            .program(name)
            .unwrap_or_else(|| panic!("harness lacks {name}"))
            .try_into()
            .unwrap();
        let mut data = vec![0u8; 14];
        // SAFETY: PairKey is repr(C) plain old data; viewing it as bytes is sound.
        data.extend_from_slice(unsafe {
            std::slice::from_raw_parts((key as *const PairKey).cast::<u8>(), 48)
        });
        data.extend_from_slice(args);
        prog.test_run(TestRunOptions {
            data_in: Some(&data),
            ..Default::default()
        })
        .expect("BPF_PROG_TEST_RUN")
        .return_value
    }

    fn pair_op(&self, key: &PairKey, cookie: u64, role: u32, op: u32) -> u32 {
        let mut args = cookie.to_ne_bytes().to_vec();
        args.extend_from_slice(&role.to_ne_bytes());
        args.extend_from_slice(&op.to_ne_bytes());
        self.key_op("nsf_test_pair", key, &args)
    }

    fn established(&self, key: &PairKey, cookie: u64, role: u32) -> u32 {
        self.pair_op(key, cookie, role, 0)
    }

    /// The peer cookie the last `established` handed its socket to cache (0: none). The
    /// claimer's peer lives only there, never in nsf_peers.
    fn claimed(&self) -> u64 {
        let out: Array<&MapData, u64> =
            Array::try_from(self.ebpf.map("nsf_test_claimed").unwrap()).unwrap();
        out.get(&0, 0).unwrap()
    }

    fn closed(&self, key: &PairKey, cookie: u64) {
        assert_eq!(self.pair_op(key, cookie, 0, 1), 3);
    }

    fn peer_of(&self, cookie: u64) -> Option<u64> {
        let m: BpfHashMap<&MapData, u64, u64> =
            BpfHashMap::try_from(self.ebpf.map(abi::MAP_PEERS).unwrap()).unwrap();
        m.get(&cookie, 0).ok()
    }

    fn pending(&self, key: &PairKey) -> Option<abi::Pending> {
        let m: BpfHashMap<&MapData, PairKey, abi::Pending> =
            BpfHashMap::try_from(self.ebpf.map(abi::MAP_PENDING).unwrap()).unwrap();
        m.get(key, 0).ok()
    }
}

fn pair_harness() -> Harness {
    let mut h = Harness::new();
    let prog: &mut SchedClassifier = h
        .ebpf
        .program_mut("nsf_test_pair")
        .unwrap()
        .try_into()
        .unwrap();
    prog.load().expect("verifier accepts nsf_test_pair");
    h
}

fn key(isn_c: u32, isn_s: u32) -> PairKey {
    expected_key(sa("10.99.0.1:40000"), sa("10.99.0.2:6000"), isn_c, isn_s)
}

#[test]
fn the_two_ends_pair_through_cookies_and_the_pending_entry_is_consumed() {
    require_root();
    let h = pair_harness();
    let k = key(100, 200);
    assert_eq!(h.established(&k, 11, abi::ROLE_ACTIVE), PENDING);
    assert_eq!(h.claimed(), 0, "a pending end has no peer yet");
    assert_eq!(h.pending(&k).map(|p| p.cookie), Some(11));
    assert_eq!(h.established(&k, 12, abi::ROLE_PASSIVE), PAIRED);
    assert_eq!(
        h.claimed(),
        11,
        "the claimer is handed the first end's cookie"
    );
    assert_eq!(h.peer_of(11), Some(12));
    assert_eq!(h.peer_of(12), None, "the claimer owns no nsf_peers entry");
    assert_eq!(h.pending(&k), None, "claimed entries are removed");
    // Whichever end establishes first, the result is the same.
    let k2 = key(101, 201);
    assert_eq!(h.established(&k2, 21, abi::ROLE_PASSIVE), PENDING);
    assert_eq!(h.established(&k2, 22, abi::ROLE_ACTIVE), PAIRED);
    assert_eq!(h.claimed(), 21);
    assert_eq!(h.peer_of(21), Some(22));
    // The first end's close removes the connection's only entry.
    h.closed(&k2, 21);
    assert_eq!(
        (h.peer_of(21), h.peer_of(22), h.pending(&k2)),
        (None, None, None)
    );
}

#[test]
fn two_connections_with_one_pair_key_are_never_paired() {
    require_root();
    let h = pair_harness();
    let k = key(300, 400);
    // Two clients (in two namespaces) with the same 4-tuple and ISNs: ambiguous.
    assert_eq!(h.established(&k, 31, abi::ROLE_ACTIVE), PENDING);
    assert_eq!(h.established(&k, 32, abi::ROLE_ACTIVE), AMBIGUOUS);
    assert_eq!(h.claimed(), 0);
    assert_eq!(h.pending(&k).map(|p| p.cookie), Some(abi::POISON));
    // Their servers then find the poisoned key: nobody is paired, everyone uses TCP.
    assert_eq!(h.established(&k, 33, abi::ROLE_PASSIVE), AMBIGUOUS);
    assert_eq!(h.claimed(), 0);
    assert_eq!(h.established(&k, 34, abi::ROLE_PASSIVE), AMBIGUOUS);
    for c in 31..=34 {
        assert_eq!(h.peer_of(c), None, "cookie {c} must not be paired");
    }
    // Same for two servers.
    let k2 = key(301, 401);
    assert_eq!(h.established(&k2, 35, abi::ROLE_PASSIVE), PENDING);
    assert_eq!(h.established(&k2, 36, abi::ROLE_PASSIVE), AMBIGUOUS);
    assert_eq!(h.established(&k2, 37, abi::ROLE_ACTIVE), AMBIGUOUS);
    assert_eq!(h.peer_of(37), None);
}

#[test]
fn equal_four_tuples_in_two_namespaces_pair_with_their_own_ends_only() {
    require_root();
    let h = pair_harness();
    // Pair X and pair Y share the 4-tuple, not the ISNs; their handshakes interleave.
    let (kx, ky) = (key(500, 600), key(501, 601));
    assert_eq!(h.established(&kx, 41, abi::ROLE_ACTIVE), PENDING);
    assert_eq!(h.established(&ky, 51, abi::ROLE_ACTIVE), PENDING);
    assert_eq!(h.established(&ky, 52, abi::ROLE_PASSIVE), PAIRED);
    assert_eq!(h.claimed(), 51);
    assert_eq!(h.established(&kx, 42, abi::ROLE_PASSIVE), PAIRED);
    assert_eq!(h.claimed(), 41);
    assert_eq!((h.peer_of(41), h.peer_of(51)), (Some(42), Some(52)));
    // Y goes away while X stays: X's entry is untouched, Y's is gone.
    h.closed(&ky, 51);
    assert_eq!(h.peer_of(51), None);
    assert_eq!(h.peer_of(41), Some(42));
    // A new connection Y' on the same 4-tuple pairs with its own server, never with X.
    let ky2 = key(502, 602);
    assert_eq!(h.established(&ky2, 53, abi::ROLE_ACTIVE), PENDING);
    assert_eq!(h.established(&ky2, 54, abi::ROLE_PASSIVE), PAIRED);
    assert_eq!(h.claimed(), 53);
    assert_eq!(h.peer_of(53), Some(54));
    assert_eq!(h.peer_of(41), Some(42));
}

#[test]
fn a_socket_that_closes_before_its_peer_arrives_leaves_nothing_to_claim() {
    require_root();
    let h = pair_harness();
    let k = key(700, 800);
    assert_eq!(h.established(&k, 61, abi::ROLE_ACTIVE), PENDING);
    h.closed(&k, 61);
    assert_eq!(h.pending(&k), None);
    assert_eq!(h.established(&k, 62, abi::ROLE_PASSIVE), PENDING);
    assert_eq!(h.claimed(), 0, "must not pair with a closed socket");
    assert_eq!(h.peer_of(62), None, "must not pair with a closed socket");
    // Closing someone else's cookie does not remove the pending entry.
    h.closed(&k, 99);
    assert_eq!(h.pending(&k).map(|p| p.cookie), Some(62));
}

// ---- admission (bpf/lib/sockmap_admit.h through nsf_test_admit) ----

const SEC_NS: u64 = 1_000_000_000;
const MS_NS: u64 = 1_000_000;
const AFTER: u32 = abi::DEFAULT_ADMIT_AFTER;
const PROBE: u64 = abi::DEFAULT_ADMIT_PROBE_NS;

impl Harness {
    /// Runs nsf_admit_skip (op 0) or nsf_admit_record (op 1) with the default probe interval.
    fn admit_op(&self, key: &PairKey, now: u64, redirects: u32, after: u32, op: u32) -> u32 {
        self.admit_raw(key, now, redirects, after, op, 1, PROBE)
    }

    #[allow(clippy::too_many_arguments)]
    fn admit_raw(
        &self,
        key: &PairKey,
        now: u64,
        redirects: u32,
        after: u32,
        op: u32,
        active: u32,
        probe_ns: u64,
    ) -> u32 {
        let mut args = now.to_ne_bytes().to_vec();
        for w in [redirects, after, op, active] {
            args.extend_from_slice(&w.to_ne_bytes());
        }
        args.extend_from_slice(&probe_ns.to_ne_bytes());
        self.key_op("nsf_test_admit", key, &args)
    }

    /// Whether the end (`active`: the client end) of a connection with key `key` keeps TCP
    /// without joining at `now` (a probe it claims is recorded).
    fn end_skips(&self, key: &PairKey, now: u64, after: u32, active: bool, probe_ns: u64) -> bool {
        match self.admit_raw(key, now, 0, after, 0, u32::from(active), probe_ns) {
            0 => false,
            1 => true,
            r => panic!("nsf_admit_skip returned {r}"),
        }
    }

    /// Whether the client end of a connection with key `key` keeps TCP without joining at
    /// `now` (with the default probe interval; a probe it claims is recorded).
    fn skips_with(&self, key: &PairKey, now: u64, after: u32) -> bool {
        self.end_skips(key, now, after, true, PROBE)
    }

    /// [`Harness::skips`] for the server end.
    fn server_skips(&self, key: &PairKey, now: u64) -> bool {
        self.end_skips(key, now, AFTER, false, PROBE)
    }

    /// [`Harness::skips_with`] the default streak.
    fn skips(&self, key: &PairKey, now: u64) -> bool {
        self.skips_with(key, now, AFTER)
    }

    /// The first end of a connection with key `key` closes at `now` having carried `redirects`.
    fn record(&self, key: &PairKey, now: u64, redirects: u32) {
        assert_eq!(self.admit_op(key, now, redirects, AFTER, 1), 3);
    }
}

fn admit_harness() -> Harness {
    let mut h = Harness::new();
    let prog: &mut SchedClassifier = h
        .ebpf
        .program_mut("nsf_test_admit")
        .unwrap()
        .try_into()
        .unwrap();
    prog.load().expect("verifier accepts nsf_test_admit");
    h
}

/// The `n`th connection between one client address and one server address and port: a new
/// ephemeral port and ISNs each time.
fn conn(n: u32) -> PairKey {
    let isn_c = 1000 + n * 7919;
    expected_key(
        SocketAddr::new(sa("10.99.0.1:1").ip(), 40000 + n as u16),
        sa("10.99.0.2:6000"),
        isn_c,
        isn_c ^ 5,
    )
}

/// Records `n` short connections (numbered from `first`), 1 ms apart from `start`; returns
/// when the last closed.
fn short_streak(h: &Harness, first: u32, n: u32, start: u64) -> u64 {
    let mut now = start;
    for i in 0..n {
        now = start + u64::from(i) * MS_NS;
        h.record(&conn(first + i), now, 1);
    }
    now
}

#[test]
fn a_streak_of_short_connections_keeps_the_next_ones_on_tcp_but_for_probes() {
    require_root();
    let h = admit_harness();
    let t0 = 50 * SEC_NS;
    assert!(!h.skips(&conn(0), t0), "no history: join");
    let last = short_streak(&h, 0, AFTER - 1, t0);
    assert!(
        !h.skips(&conn(100), last + 1),
        "{} short connections are fewer than {AFTER}",
        AFTER - 1
    );
    let last = short_streak(&h, AFTER - 1, 1, last + MS_NS);
    assert!(h.skips(&conn(101), last + 1), "{AFTER} in a row: TCP");
    assert!(
        h.skips(&conn(102), t0 + PROBE - 1),
        "no probe within the interval from the history's start"
    );
    assert!(!h.skips(&conn(103), t0 + PROBE), "a probe joins");
    assert!(
        h.skips(&conn(104), t0 + PROBE + 1),
        "and the next keeps TCP"
    );
    assert!(
        h.skips(&conn(105), t0 + 2 * PROBE - 1),
        "at most one probe per interval"
    );
    assert!(!h.skips(&conn(106), t0 + 2 * PROBE), "the next probe");
    // The window counts from the last short connection's close (the connections that kept
    // TCP since came within NSF_ADMIT_REFRESH_NS of it, so they did not move it).
    let edge = last + SEC_NS;
    assert!(
        !h.skips(&conn(107), edge),
        "a probe (the last was long ago)"
    );
    assert!(h.skips(&conn(108), edge), "still within the window");
    // ... and from then on from conn(108), which kept TCP (see the next test).
    assert!(h.skips(&conn(109), edge + 1), "the window moved");
    assert!(
        !h.skips(&conn(110), edge + SEC_NS + 1),
        "a connection after a quiet second joins"
    );
}

#[test]
fn connections_that_keep_tcp_keep_the_window_open() {
    require_root();
    let h = admit_harness();
    let t0 = 50 * SEC_NS;
    let last = short_streak(&h, 0, AFTER, t0);
    // One connection every 0.3 s, none of them a probe (1 h interval): skipped connections
    // record nothing at their close, yet the streak's window stays open for 10 s.
    let hour = 3600 * SEC_NS;
    let mut now = last;
    for i in 0..34 {
        now += 300 * MS_NS;
        assert!(
            h.end_skips(&conn(100 + i), now, AFTER, true, hour),
            "connection {i}, {} ms after the last short one",
            (now - last) / MS_NS
        );
        assert!(h.end_skips(&conn(100 + i), now + 1, AFTER, false, hour));
    }
    // A quiet second ends it.
    assert!(!h.end_skips(&conn(200), now + SEC_NS + 1, AFTER, true, hour));
}

#[test]
fn times_from_another_cpu_that_run_ahead_keep_the_history() {
    require_root();
    let h = admit_harness();
    let t0 = 50 * SEC_NS;
    let last = short_streak(&h, 0, AFTER, t0);
    // No probe in this test (1 h interval).
    let skips = |c: u32, now: u64| h.end_skips(&conn(c), now, AFTER, true, 3600 * SEC_NS);
    // An end that read its clock before another CPU recorded a later close: the history is
    // still within the window (an unsigned difference would wrap and end it).
    assert!(skips(100, last - 1), "a clock a little behind");
    // A close recorded with an earlier clock counts, and does not move the window back.
    h.record(&conn(101), last - 2, 0);
    assert!(
        skips(102, last + SEC_NS - 1),
        "window from the latest close"
    );
    assert!(
        !skips(103, last + 2 * SEC_NS),
        "and it runs out a quiet second after the last connection"
    );
}

#[test]
fn both_ends_of_a_probe_join() {
    require_root();
    let h = admit_harness();
    let t0 = 50 * SEC_NS;
    short_streak(&h, 0, AFTER, t0);
    let (probe, other) = (conn(200), conn(201));
    let t = t0 + PROBE;
    // The client's ESTABLISHED claims the probe; the server's comes with the client's ACK.
    assert!(!h.skips(&probe, t), "the client end claims the probe");
    assert!(h.skips(&other, t + 1), "another connection keeps TCP");
    assert!(h.server_skips(&other, t + 1), "at both ends");
    assert!(
        !h.server_skips(&probe, t + 2),
        "the server end of the probe joins too"
    );
    assert!(
        !h.server_skips(&probe, t + PROBE - 1),
        "however late within the interval"
    );
    // A later probe's claim replaces the earlier one's.
    assert!(!h.skips(&other, t + PROBE), "the next probe");
    assert!(
        h.server_skips(&probe, t + PROBE + 1),
        "the earlier probe is no longer one"
    );
}

#[test]
fn a_server_end_never_claims_a_probe() {
    require_root();
    let h = admit_harness();
    let t0 = 50 * SEC_NS;
    short_streak(&h, 0, AFTER, t0);
    let c = conn(200);
    let t = t0 + PROBE;
    // The interval ran out between the client end's decision (keep TCP) and the server's:
    // the server end keeps TCP too, rather than join alone.
    assert!(h.skips(&c, t - 1), "the client end keeps TCP");
    assert!(h.server_skips(&c, t + 1), "and so does the server end");
    // The probe is still there for the next connection's client end.
    assert!(
        !h.skips(&conn(201), t + 2),
        "the next connection is the probe"
    );
    assert!(!h.server_skips(&conn(201), t + 3), "at both ends");
}

#[test]
fn endpoints_that_connect_less_often_than_the_probe_interval_keep_joining() {
    require_root();
    let h = admit_harness();
    let mut now = 50 * SEC_NS;
    let step = PROBE + MS_NS;
    for i in 0..20 {
        assert!(
            !h.skips(&conn(i), now),
            "connection {i}, one every {} ms",
            step / MS_NS
        );
        h.record(&conn(i), now + 1, 0);
        now += step;
    }
}

#[test]
fn admission_off_joins_every_connection() {
    require_root();
    let h = admit_harness();
    let last = short_streak(&h, 0, AFTER + 1, 50 * SEC_NS);
    assert!(!h.skips_with(&conn(100), last, 0));
    assert!(h.skips_with(&conn(100), last, AFTER));
}

#[test]
fn a_probe_that_gains_resets_the_history() {
    require_root();
    let h = admit_harness();
    let t0 = 50 * SEC_NS;
    short_streak(&h, 0, 10, t0);
    let t = t0 + PROBE;
    let probe = conn(200);
    assert!(!h.skips(&probe, t), "a probe joins");
    // A probe that gained little keeps the streak.
    h.record(&probe, t + 1, abi::ADMIT_MIN_REDIRECTS - 1);
    assert!(h.skips(&conn(201), t + 2));
    // One that gained resets it: the next connections join.
    assert!(!h.skips(&conn(202), t + PROBE), "the next probe");
    h.record(&conn(202), t + PROBE + 1, abi::ADMIT_MIN_REDIRECTS);
    assert!(!h.skips(&conn(203), t + PROBE + 2));
    // And it takes a new streak of `after` to skip again.
    let again = short_streak(&h, 300, AFTER - 1, t + PROBE + 3);
    assert!(!h.skips(&conn(204), again + 1));
    h.record(&conn(205), again + 2, 0);
    assert!(h.skips(&conn(206), again + 3));
}

#[test]
fn short_connections_further_apart_than_the_window_are_no_streak() {
    require_root();
    let h = admit_harness();
    // The window the Rust side names (abi::ADMIT_WINDOW_NS, in the help text) is the C one.
    let window = abi::ADMIT_WINDOW_NS;
    let mut now = 50 * SEC_NS;
    for i in 0..20 {
        h.record(&conn(i), now, 0);
        now += window + 1;
    }
    assert!(
        !h.skips(&conn(100), now - 1),
        "one short connection a window keeps joining"
    );
    h.record(&conn(101), now, 0);
    for i in 0..AFTER {
        h.record(&conn(102 + i), now + u64::from(i) * (window - 1), 0);
    }
    assert!(
        h.end_skips(
            &conn(200),
            now + u64::from(AFTER) * (window - 1),
            AFTER,
            true,
            3600 * SEC_NS
        ),
        "closes just within the window are a streak (no probe within the hour)"
    );
}

#[test]
fn history_is_per_server_endpoint_and_host_id() {
    require_root();
    let h = admit_harness();
    let last = short_streak(&h, 0, AFTER, 50 * SEC_NS);
    let same = conn(300);
    assert!(h.skips(&same, last + 1));
    let mut other_port = same;
    other_port.server_port += 1;
    assert!(!h.skips(&other_port, last + 1));
    let mut other_client = same;
    other_client.client_ip[0] ^= 0xff00_0000;
    assert!(!h.skips(&other_client, last + 1));
    let mut other_host = same;
    other_host.pad = 7;
    assert!(
        !h.skips(&other_host, last + 1),
        "pods on another host id have their own history"
    );
    let mut other_ephemeral = same;
    other_ephemeral.client_port ^= 0x0101;
    other_ephemeral.client_isn ^= 0x55;
    assert!(h.skips(&other_ephemeral, last + 1));
}
