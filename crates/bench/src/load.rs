//! The built-in load generator: a client and a server for each workload, on blocking std
//! sockets (one connection at a time, like netperf), counting on both sides so the two counts
//! can be checked against each other.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use socket2::{Domain, Protocol, Socket, Type};

use crate::spec::{Sizes, Workload};

/// How often blocked server calls wake up to look at the stop flag.
const POLL: Duration = Duration::from_millis(100);

/// Load generator errors; each says what the peer did or which call failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The server closed the connection while the client still had work to do.
    #[error("{workload}: the peer at {addr} closed the connection early (after {done} complete transactions)")]
    PeerClosed {
        workload: Workload,
        addr: SocketAddr,
        done: u64,
    },
    /// A socket call failed.
    #[error("{workload}: {op} {addr}: {source}")]
    Io {
        workload: Workload,
        op: &'static str,
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Latency {
    fn from_histogram(h: &Histogram<u64>) -> Option<Self> {
        if h.is_empty() {
            return None;
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        Some(Self {
            mean: h.mean() / 1000.0,
            p50: us(h.value_at_quantile(0.50)),
            p90: us(h.value_at_quantile(0.90)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
        })
    }
}

/// What the client measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClientResult {
    pub workload: Option<Workload>,
    /// Seconds between the first operation and the end.
    pub elapsed_s: f64,
    /// Completed transactions (rr, crr, ping).
    pub transactions: u64,
    /// Payload bytes written (stream, udp-stream) or exchanged (rr, crr, ping).
    pub bytes: u64,
    /// Datagrams sent (udp-stream).
    pub datagrams: u64,
    /// Per-transaction latency (rr, crr, ping).
    pub latency_us: Option<Latency>,
}

/// What the server counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerCounts {
    /// Complete transactions answered (rr, crr, ping).
    pub transactions: u64,
    /// Payload bytes received.
    pub bytes: u64,
    /// Datagrams received (udp-stream).
    pub datagrams: u64,
    /// Connections accepted.
    pub connections: u64,
}

/// A bound server socket, ready before the client starts.
pub enum Listener {
    Tcp(TcpListener),
    Udp(UdpSocket),
}

impl Listener {
    /// Binds the socket `workload` needs at `addr` (port 0 picks a free one).
    pub fn bind(workload: Workload, addr: SocketAddr) -> io::Result<Self> {
        let domain = Domain::for_address(addr);
        if workload.is_udp() {
            let s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
            s.set_reuse_address(true)?;
            // A larger receive buffer, as iperf3 users commonly set; loss is still reported.
            let _ = s.set_recv_buffer_size(4 << 20);
            s.bind(&addr.into())?;
            let u: UdpSocket = s.into();
            u.set_read_timeout(Some(POLL))?;
            Ok(Listener::Udp(u))
        } else {
            let s = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
            s.set_reuse_address(true)?;
            s.bind(&addr.into())?;
            s.listen(1024)?;
            // accept() honours SO_RCVTIMEO on Linux, so the stop flag is seen.
            s.set_read_timeout(Some(POLL))?;
            Ok(Listener::Tcp(s.into()))
        }
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Listener::Tcp(l) => l.local_addr(),
            Listener::Udp(u) => u.local_addr(),
        }
    }
}

fn timed_out(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Serves `workload` until `stop` is set (or, for one-connection workloads, until the client
/// closes its connection), and returns what it counted.
pub fn serve(
    workload: Workload,
    listener: &Listener,
    sizes: Sizes,
    stop: &AtomicBool,
) -> io::Result<ServerCounts> {
    let mut c = ServerCounts::default();
    match (workload, listener) {
        (Workload::UdpStream, Listener::Udp(sock)) => {
            let mut buf = vec![0u8; 65_536];
            while !stop.load(Ordering::Relaxed) {
                match sock.recv(&mut buf) {
                    Ok(n) => {
                        c.datagrams += 1;
                        c.bytes += n as u64;
                    }
                    Err(e) if timed_out(&e) || e.kind() == ErrorKind::Interrupted => {}
                    // A previous ICMP error reported late; keep receiving.
                    Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
                    Err(e) => return Err(e),
                }
            }
            // Count what was delivered before the stop but is still queued.
            sock.set_nonblocking(true)?;
            while let Ok(n) = sock.recv(&mut buf) {
                c.datagrams += 1;
                c.bytes += n as u64;
            }
        }
        (_, Listener::Tcp(l)) => {
            while !stop.load(Ordering::Relaxed) {
                let conn = match l.accept() {
                    Ok((s, _)) => s,
                    Err(e) if timed_out(&e) || e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                };
                c.connections += 1;
                conn.set_nodelay(workload != Workload::Stream)?;
                conn.set_read_timeout(Some(POLL))?;
                let one_conn = workload != Workload::Crr;
                match workload {
                    Workload::Stream => serve_stream(conn, sizes, &mut c, stop)?,
                    _ => serve_rr(conn, sizes, &mut c, stop)?,
                }
                if one_conn {
                    break;
                }
            }
        }
        _ => {
            return Err(io::Error::new(
                ErrorKind::InvalidInput,
                "listener kind does not match the workload",
            ))
        }
    }
    Ok(c)
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` on a clean EOF before the first byte.
fn read_full(s: &mut TcpStream, buf: &mut [u8], stop: &AtomicBool) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                return Err(io::Error::new(
                    ErrorKind::UnexpectedEof,
                    "truncated message",
                ))
            }
            Ok(n) => got += n,
            Err(e) if timed_out(&e) || e.kind() == ErrorKind::Interrupted => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(false);
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn serve_rr(
    mut s: TcpStream,
    sizes: Sizes,
    c: &mut ServerCounts,
    stop: &AtomicBool,
) -> io::Result<()> {
    let mut req = vec![0u8; sizes.request as usize];
    let resp = vec![0x5au8; sizes.response as usize];
    loop {
        match read_full(&mut s, &mut req, stop) {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            // A client that resets (crr close, or a killed client) ends the connection.
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(()),
            Err(e) => return Err(e),
        }
        c.bytes += req.len() as u64;
        match s.write_all(&resp) {
            Ok(()) => c.transactions += 1,
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) => {
                return Ok(())
            }
            Err(e) => return Err(e),
        }
    }
}

fn serve_stream(
    mut s: TcpStream,
    sizes: Sizes,
    c: &mut ServerCounts,
    stop: &AtomicBool,
) -> io::Result<()> {
    // Read in the client's write size, as iperf3's server does.
    let mut buf = vec![0u8; sizes.stream_write as usize];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => c.bytes += n as u64,
            Err(e) if timed_out(&e) || e.kind() == ErrorKind::Interrupted => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
            }
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

/// Runs the client side of `workload` against `addr` for `duration`, then stops by itself.
pub fn run_client(
    workload: Workload,
    addr: SocketAddr,
    sizes: Sizes,
    duration: Duration,
) -> Result<ClientResult, LoadError> {
    let io_err = |op: &'static str| {
        move |source| LoadError::Io {
            workload,
            op,
            addr,
            source,
        }
    };
    let mut r = ClientResult {
        workload: Some(workload),
        ..ClientResult::default()
    };
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
        .expect("static histogram bounds are valid");
    let start;
    match workload {
        Workload::Rr | Workload::Ping => {
            let mut s = connect(addr, true).map_err(io_err("connect to"))?;
            let req = vec![0xa5u8; sizes.request as usize];
            let mut resp = vec![0u8; sizes.response as usize];
            start = Instant::now();
            let deadline = start + duration;
            let mut now = start;
            while now < deadline {
                s.write_all(&req).map_err(io_err("send to"))?;
                read_reply(&mut s, &mut resp)
                    .map_err(|e| reply_err(e, workload, addr, r.transactions))?;
                let t = Instant::now();
                let _ = hist.record((t - now).as_nanos().max(1) as u64);
                now = t;
                r.transactions += 1;
            }
            r.bytes = r.transactions * u64::from(sizes.request + sizes.response);
            let _ = s.shutdown(Shutdown::Both);
        }
        Workload::Crr => {
            let req = vec![0xa5u8; sizes.request as usize];
            let mut resp = vec![0u8; sizes.response as usize];
            start = Instant::now();
            let deadline = start + duration;
            let mut now = start;
            while now < deadline {
                let mut s = connect(addr, true).map_err(io_err("connect to"))?;
                s.write_all(&req).map_err(io_err("send to"))?;
                read_reply(&mut s, &mut resp)
                    .map_err(|e| reply_err(e, workload, addr, r.transactions))?;
                drop(s);
                let t = Instant::now();
                let _ = hist.record((t - now).as_nanos().max(1) as u64);
                now = t;
                r.transactions += 1;
            }
            r.bytes = r.transactions * u64::from(sizes.request + sizes.response);
        }
        Workload::Stream => {
            let mut s = connect(addr, false).map_err(io_err("connect to"))?;
            let buf = vec![0xa5u8; sizes.stream_write as usize];
            start = Instant::now();
            let deadline = start + duration;
            while Instant::now() < deadline {
                match s.write(&buf) {
                    Ok(0) => {
                        return Err(LoadError::PeerClosed {
                            workload,
                            addr,
                            done: 0,
                        })
                    }
                    Ok(n) => r.bytes += n as u64,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            ErrorKind::BrokenPipe | ErrorKind::ConnectionReset
                        ) =>
                    {
                        return Err(LoadError::PeerClosed {
                            workload,
                            addr,
                            done: 0,
                        })
                    }
                    Err(e) => return Err(io_err("send to")(e)),
                }
            }
            // Wait until the server has read everything: it closes after our FIN.
            s.shutdown(Shutdown::Write).map_err(io_err("shut down"))?;
            let mut sink = [0u8; 64];
            let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
            let _ = s.read(&mut sink);
        }
        Workload::UdpStream => {
            let bind: SocketAddr = if addr.is_ipv4() {
                "0.0.0.0:0".parse().expect("literal")
            } else {
                "[::]:0".parse().expect("literal")
            };
            let s = UdpSocket::bind(bind).map_err(io_err("bind for"))?;
            s.connect(addr).map_err(io_err("connect to"))?;
            let buf = vec![0xa5u8; sizes.datagram as usize];
            start = Instant::now();
            let deadline = start + duration;
            let mut refused = 0u32;
            let mut n = 0u32;
            loop {
                // Check the clock every 16 datagrams: a send is far cheaper than a read of it.
                n = n.wrapping_add(1);
                if n.is_multiple_of(16) && Instant::now() >= deadline {
                    break;
                }
                match s.send(&buf) {
                    Ok(sent) => {
                        r.datagrams += 1;
                        r.bytes += sent as u64;
                    }
                    // The local queue is full: the datagram was not sent; try again.
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                        refused += 1;
                        if refused > 3 {
                            return Err(LoadError::PeerClosed {
                                workload,
                                addr,
                                done: r.datagrams,
                            });
                        }
                    }
                    Err(e) => return Err(io_err("send to")(e)),
                }
            }
        }
    }
    r.elapsed_s = start.elapsed().as_secs_f64();
    r.latency_us = Latency::from_histogram(&hist);
    Ok(r)
}

/// Connects; request/response sockets get TCP_NODELAY (as netperf's RR tests), bulk ones keep
/// Nagle (as iperf3 and netperf's STREAM tests).
fn connect(addr: SocketAddr, nodelay: bool) -> io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_nodelay(nodelay)?;
    Ok(s)
}

/// Reads one whole reply; EOF or reset means the server went away.
fn read_reply(s: &mut TcpStream, buf: &mut [u8]) -> io::Result<()> {
    s.read_exact(buf)
}

fn reply_err(e: io::Error, workload: Workload, addr: SocketAddr, done: u64) -> LoadError {
    if matches!(
        e.kind(),
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
    ) {
        LoadError::PeerClosed {
            workload,
            addr,
            done,
        }
    } else {
        LoadError::Io {
            workload,
            op: "receive from",
            addr,
            source: e,
        }
    }
}
