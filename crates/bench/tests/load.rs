//! Each workload against a local server in a throwaway network namespace: counts match the
//! server's, a peer that closes early gives a clear error, the client stops by itself.
//! Needs root (it creates a network namespace); fails, rather than passing, without it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nsfast_bench::load::{run_client, serve, ClientResult, Listener, LoadError, ServerCounts};
use nsfast_bench::spec::{Sizes, Workload};
use nsfast_lab::require_root;
use nsfast_sys::netns::NetNs;

const DUR: Duration = Duration::from_millis(300);

/// A throwaway namespace, deleted on drop (also when the test panics).
fn netns(tag: &str) -> NetNs {
    require_root();
    NetNs::create(&nsfast_lab::name::unique(&format!("t{tag}"))).expect("create netns")
}

fn run_pair(tag: &str, w: Workload, sizes: Sizes) -> (ClientResult, ServerCounts) {
    let ns = netns(tag);
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let s2 = stop.clone();
    let server = ns
        .spawn(move || {
            let l = Listener::bind(w, addr).unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            serve(w, &l, sizes, &s2).unwrap()
        })
        .unwrap();
    let addr = rx.recv().unwrap();
    let start = Instant::now();
    let c = ns
        .run(move || run_client(w, addr, sizes, DUR))
        .unwrap()
        .unwrap();
    let took = start.elapsed();
    assert!(took >= DUR, "{w}: stopped early after {took:?}");
    assert!(
        took < DUR + Duration::from_secs(2),
        "{w}: did not stop by itself ({took:?})"
    );
    if w.is_udp() {
        // Let the server drain what is queued before it is stopped.
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    let s = server.join().unwrap();
    (c, s)
}

#[test]
fn rr_counts_match_the_server() {
    let sizes = Sizes {
        request: 100,
        response: 3000,
        ..Sizes::default()
    };
    let (c, s) = run_pair("rr", Workload::Rr, sizes);
    assert!(c.transactions > 0);
    assert_eq!(c.transactions, s.transactions);
    assert_eq!(s.bytes, s.transactions * 100);
    assert_eq!(c.bytes, c.transactions * 3100);
    assert_eq!(s.connections, 1);
    let l = c.latency_us.unwrap();
    assert!(l.p50 <= l.p90 && l.p90 <= l.p99 && l.p99 <= l.p999 && l.p999 <= l.max);
}

#[test]
fn ping_reports_percentiles() {
    let (c, s) = run_pair("ping", Workload::Ping, Sizes::default());
    assert_eq!(c.transactions, s.transactions);
    assert!(c.latency_us.unwrap().p50 > 0.0);
}

#[test]
fn crr_counts_one_connection_per_transaction() {
    let (c, s) = run_pair("crr", Workload::Crr, Sizes::default());
    assert!(c.transactions > 0);
    assert_eq!(c.transactions, s.transactions);
    assert_eq!(s.connections, c.transactions);
}

#[test]
fn stream_bytes_match_the_server() {
    let sizes = Sizes {
        stream_write: 64 * 1024,
        ..Sizes::default()
    };
    let (c, s) = run_pair("stream", Workload::Stream, sizes);
    assert!(c.bytes > 0);
    assert_eq!(c.bytes, s.bytes);
}

#[test]
fn udp_stream_counts_delivered_datagrams() {
    let sizes = Sizes {
        datagram: 1200,
        ..Sizes::default()
    };
    let (c, s) = run_pair("udp", Workload::UdpStream, sizes);
    assert!(c.datagrams > 0 && s.datagrams > 0);
    assert!(s.datagrams <= c.datagrams, "server saw more than was sent");
    assert_eq!(c.bytes, c.datagrams * 1200);
    assert_eq!(s.bytes, s.datagrams * 1200);
}

#[test]
fn peer_that_closes_early_is_a_clear_error() {
    let ns = netns("early");
    let (tx, rx) = std::sync::mpsc::channel();
    // A server that answers three 1-byte requests, then hangs up.
    let server = ns
        .spawn(move || {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            let (mut s, _) = l.accept().unwrap();
            let mut b = [0u8; 1];
            for _ in 0..3 {
                s.read_exact(&mut b).unwrap();
                s.write_all(&b).unwrap();
            }
        })
        .unwrap();
    let addr = rx.recv().unwrap();
    let r = ns
        .run(move || run_client(Workload::Rr, addr, Sizes::default(), Duration::from_secs(5)))
        .unwrap();
    server.join().unwrap();
    match r {
        Err(e @ LoadError::PeerClosed { done: 3, .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("closed the connection early"), "{msg}");
            assert!(msg.contains("after 3 complete transactions"), "{msg}");
        }
        other => panic!("expected PeerClosed after 3, got {other:?}"),
    }
    // Nothing listening at all: connect error names the address.
    let e = ns
        .run(move || run_client(Workload::Stream, addr, Sizes::default(), DUR))
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(e.contains(&addr.to_string()), "{e}");
}
