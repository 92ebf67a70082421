//! The built-in load generator: a client and a server for each workload, on blocking std
//! sockets (one connection at a time, like netperf), counting on both sides so the two counts
//! can be checked against each other.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use nsfast_sys::vsock::{VsockAddr, VsockListener, VsockStream, VMADDR_CID_ANY};
use serde::{Deserialize, Serialize};
use socket2::{Domain, Protocol, SockRef, Socket, Type};

use crate::floor::PipeListener;
pub use crate::floor::PipeStream;
use crate::spec::{Sizes, Workload};

/// How often blocked server calls wake up to look at the stop flag.
const POLL: Duration = Duration::from_millis(100);

/// Where a client connects: an IP socket address, or a vsock CID and port (stream
/// workloads only; vsock has no datagram transport on loopback).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Peer {
    Ip(SocketAddr),
    Vsock {
        cid: u32,
        port: u32,
    },
    /// The `unix` floor: an abstract AF_UNIX name ([`crate::floor::unix_name`]).
    Unix {
        id: u64,
    },
    /// The `pipe` floor: two FIFOs ([`crate::floor::pipe_dir`]).
    Pipe {
        id: u64,
    },
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Ip(a) => write!(f, "{a}"),
            Peer::Vsock { cid, port } => write!(f, "vsock {cid}:{port}"),
            Peer::Unix { id } => write!(f, "unix @{}", crate::floor::unix_name(*id)),
            Peer::Pipe { id } => write!(f, "pipe {}", crate::floor::pipe_dir(*id).display()),
        }
    }
}

/// A connected stream: TCP, or vsock.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Vsock(VsockStream),
    Unix(UnixStream),
    Pipe(PipeStream),
}

impl Stream {
    fn sock(&self) -> Option<SockRef<'_>> {
        match self {
            Stream::Tcp(s) => Some(SockRef::from(s)),
            Stream::Vsock(s) => Some(SockRef::from(s)),
            Stream::Unix(s) => Some(SockRef::from(s)),
            Stream::Pipe(_) => None,
        }
    }

    /// TCP_NODELAY on TCP; vsock, AF_UNIX and pipes have no Nagle, so nothing to do there.
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_nodelay(on),
            _ => Ok(()),
        }
    }

    pub fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        match (self.sock(), self) {
            (Some(s), _) => s.set_read_timeout(d),
            (None, Stream::Pipe(p)) => {
                p.set_read_timeout(d);
                Ok(())
            }
            (None, _) => Ok(()),
        }
    }

    pub fn shutdown(&mut self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Pipe(p) => {
                if how != Shutdown::Read {
                    p.shutdown_write();
                }
                Ok(())
            }
            s => s.sock().map_or(Ok(()), |k| k.shutdown(how)),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Vsock(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
            Stream::Pipe(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Vsock(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
            Stream::Pipe(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Load generator errors; each says what the peer did or which call failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The server closed the connection while the client still had work to do.
    #[error("{workload}: the peer at {addr} closed the connection early (after {done} complete transactions)")]
    PeerClosed {
        workload: Workload,
        addr: Peer,
        done: u64,
    },
    /// A socket call failed.
    #[error("{workload}: {op} {addr}: {source}")]
    Io {
        workload: Workload,
        op: &'static str,
        addr: Peer,
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
    /// The latency histogram itself: every recorded `[nanoseconds, count]` (rr, crr, ping),
    /// for `nsfast bench --hgrm-dir` (left out of the JSON document).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub latency_ns_recorded: Vec<[u64; 2]>,
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
    /// A vsock stream listener (rr, crr, stream, ping) and the port it is bound to.
    Vsock(VsockListener, u32),
    /// The `unix` floor (rr, crr, stream, ping) and its id.
    Unix(UnixListener, u64),
    /// The `pipe` floor (rr, stream, ping: one connection) and its id.
    Pipe(PipeListener, u64),
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

    /// Binds a vsock stream listener on `port` (any CID) for `workload`; udp-stream has no
    /// vsock form and is refused with InvalidInput.
    pub fn bind_vsock(workload: Workload, port: u32) -> io::Result<Self> {
        if workload.is_udp() {
            return Err(io::Error::new(
                ErrorKind::InvalidInput,
                format!("{workload} has no vsock form (vsock streams only)"),
            ));
        }
        let l = VsockListener::bind(VsockAddr {
            cid: VMADDR_CID_ANY,
            port,
        })?;
        // vsock's accept() honours SO_RCVTIMEO too, so the stop flag is seen.
        SockRef::from(&l).set_read_timeout(Some(POLL))?;
        Ok(Listener::Vsock(l, port))
    }

    /// Listens on floor `id` (`pipe` or `unix`) for `workload`; udp-stream has no such form, and
    /// a pipe carries no `crr` (one connection): refused with InvalidInput.
    pub fn bind_floor(workload: Workload, pipe: bool, id: u64) -> io::Result<Self> {
        if workload.is_udp() || (pipe && workload == Workload::Crr) {
            return Err(io::Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "{workload} does not run on the {} floor",
                    if pipe { "pipe" } else { "unix" }
                ),
            ));
        }
        if pipe {
            return Ok(Listener::Pipe(PipeListener::bind(id)?, id));
        }
        let l = crate::floor::unix_listen(id)?;
        // AF_UNIX accept() honours SO_RCVTIMEO as well, so the stop flag is seen.
        SockRef::from(&l).set_read_timeout(Some(POLL))?;
        Ok(Listener::Unix(l, id))
    }

    /// The bound address (vsock listeners: port only, in [`Listener::peer`]).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Listener::Tcp(l) => l.local_addr(),
            Listener::Udp(u) => u.local_addr(),
            Listener::Vsock(..) | Listener::Unix(..) | Listener::Pipe(..) => Err(io::Error::new(
                ErrorKind::InvalidInput,
                "a vsock or floor listener has no IP address",
            )),
        }
    }

    /// Where a client on this machine reaches this listener.
    pub fn peer(&self) -> io::Result<Peer> {
        match self {
            Listener::Vsock(_, port) => Ok(Peer::Vsock {
                cid: nsfast_sys::vsock::VMADDR_CID_LOCAL,
                port: *port,
            }),
            Listener::Unix(_, id) => Ok(Peer::Unix { id: *id }),
            Listener::Pipe(_, id) => Ok(Peer::Pipe { id: *id }),
            _ => self.local_addr().map(Peer::Ip),
        }
    }

    fn accept_stream(&self) -> io::Result<Stream> {
        match self {
            Listener::Tcp(l) => l.accept().map(|(s, _)| Stream::Tcp(s)),
            Listener::Vsock(l, _) => l.accept().map(|(s, _)| Stream::Vsock(s)),
            Listener::Unix(l, _) => l.accept().map(|(s, _)| Stream::Unix(s)),
            Listener::Pipe(l, _) => l.accept(POLL).map(Stream::Pipe),
            Listener::Udp(_) => Err(io::Error::new(
                ErrorKind::InvalidInput,
                "a UDP socket accepts no connections",
            )),
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
        (w, Listener::Tcp(_) | Listener::Vsock(..) | Listener::Unix(..) | Listener::Pipe(..))
            if !w.is_udp() =>
        {
            while !stop.load(Ordering::Relaxed) {
                let conn = match listener.accept_stream() {
                    Ok(s) => s,
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
fn read_full(s: &mut Stream, buf: &mut [u8], stop: &AtomicBool) -> io::Result<bool> {
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
    mut s: Stream,
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
    mut s: Stream,
    sizes: Sizes,
    c: &mut ServerCounts,
    stop: &AtomicBool,
) -> io::Result<()> {
    // The client's hello first, then its go-ahead: as iperf3's data connection starts with a
    // cookie the server reads before the control channel starts the test. (A shortcut
    // redirects only into a receiver seen reading everything sent to it.)
    let mut hello = [0u8; 1];
    loop {
        match s.read(&mut hello) {
            Ok(0) => return Ok(()),
            Ok(_) => break,
            Err(e) if timed_out(&e) || e.kind() == ErrorKind::Interrupted => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
            }
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    s.write_all(&hello)?;
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
    run_client_to(workload, Peer::Ip(addr), sizes, duration)
}

/// [`run_client`] for any [`Peer`]: TCP/UDP at an IP address, or vsock streams.
pub fn run_client_to(
    workload: Workload,
    addr: Peer,
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
            // Hello and go-ahead (see serve_stream), before the clock starts.
            s.write_all(&[0x5a]).map_err(io_err("send to"))?;
            let mut ack = [0u8; 1];
            s.read_exact(&mut ack)
                .map_err(io_err("read the go-ahead from"))?;
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
            let Peer::Ip(ip) = addr else {
                return Err(io_err("send to")(io::Error::new(
                    ErrorKind::InvalidInput,
                    "udp-stream has no vsock form (vsock streams only)",
                )));
            };
            let bind: SocketAddr = if ip.is_ipv4() {
                "0.0.0.0:0".parse().expect("literal")
            } else {
                "[::]:0".parse().expect("literal")
            };
            let s = UdpSocket::bind(bind).map_err(io_err("bind for"))?;
            s.connect(ip).map_err(io_err("connect to"))?;
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
    r.latency_ns_recorded = hist
        .iter_recorded()
        .map(|v| [v.value_iterated_to(), v.count_at_value()])
        .collect();
    Ok(r)
}

/// Connects; request/response sockets get TCP_NODELAY (as netperf's RR tests), bulk ones keep
/// Nagle (as iperf3 and netperf's STREAM tests).
fn connect(addr: Peer, nodelay: bool) -> io::Result<Stream> {
    let s = match addr {
        Peer::Ip(a) => Stream::Tcp(TcpStream::connect_timeout(&a, Duration::from_secs(5))?),
        Peer::Vsock { cid, port } => Stream::Vsock(VsockStream::connect(VsockAddr { cid, port })?),
        Peer::Unix { id } => Stream::Unix(crate::floor::unix_connect(id)?),
        Peer::Pipe { id } => Stream::Pipe(crate::floor::pipe_connect(id)?),
    };
    s.set_nodelay(nodelay)?;
    Ok(s)
}

/// Reads one whole reply; EOF or reset means the server went away.
fn read_reply(s: &mut Stream, buf: &mut [u8]) -> io::Result<()> {
    s.read_exact(buf)
}

fn reply_err(e: io::Error, workload: Workload, addr: Peer, done: u64) -> LoadError {
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
