//! One relayed flow: a connected transparent socket in the rootless namespace (answering as
//! the VPN server) and a connected host socket (made by the parent), with two forwarding
//! threads: recvmmsg (+GRO) on one side, sendmmsg (+GSO) on the other.

use std::net::{SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nsfast_sys::udp::{RecvBatch, SendBatch};

/// Datagrams (or GRO super-datagrams) taken per recvmmsg.
pub(crate) const BATCH: usize = 16;

/// Offloads in use for a relay.
#[derive(Debug, Clone, Copy)]
pub struct Offloads {
    pub gro: bool,
    pub gso: bool,
}

/// Counters of one direction.
#[derive(Debug, Default)]
pub struct Counters {
    /// Datagrams handed to the kernel on the other side (GSO segments counted one by one).
    pub datagrams: AtomicU64,
    /// Payload bytes taken for forwarding (UDP payload, GRO super-datagrams in full).
    pub bytes: AtomicU64,
    /// Datagrams the other side refused (send errors that do not stop the flow).
    pub dropped: AtomicU64,
}

impl Counters {
    /// `(datagrams, bytes)`.
    pub fn get(&self) -> (u64, u64) {
        (
            self.datagrams.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }
}

/// A running flow.
pub struct Flow {
    pub client: SocketAddrV4,
    pub server: SocketAddrV4,
    pub host_local: SocketAddrV4,
    pub host: Arc<UdpSocket>,
    stop: Arc<AtomicBool>,
    dead: Arc<AtomicBool>,
    last: Arc<AtomicU64>,
    epoch: Instant,
    pub up: Arc<Counters>,
    pub down: Arc<Counters>,
    threads: Vec<JoinHandle<()>>,
}

#[allow(clippy::too_many_arguments)]
fn pump(
    name: String,
    from: Arc<UdpSocket>,
    to: Arc<UdpSocket>,
    gso: bool,
    stop: Arc<AtomicBool>,
    dead: Arc<AtomicBool>,
    last: Arc<AtomicU64>,
    epoch: Instant,
    counters: Arc<Counters>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name).spawn(move || {
        let mut rx = RecvBatch::new(BATCH);
        let mut tx = SendBatch::new(gso);
        while !stop.load(Ordering::Relaxed) {
            let n = match rx.recv(from.as_fd()) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                // ICMP errors reported on a connected socket: the peer is not there (yet).
                Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => continue,
                Err(e) => {
                    tracing::warn!("flow receive failed: {e}");
                    break;
                }
            };
            last.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
            let mut bytes = 0u64;
            for i in 0..n {
                let (data, meta) = rx.get(i);
                bytes += data.len() as u64;
                tx.push(data, meta.stride, None);
            }
            match tx.flush(to.as_fd()) {
                Ok(s) => {
                    counters.bytes.fetch_add(bytes, Ordering::Relaxed);
                    counters
                        .datagrams
                        .fetch_add(s.datagrams as u64, Ordering::Relaxed);
                    counters
                        .dropped
                        .fetch_add(s.dropped as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::warn!("flow send failed: {e}");
                    break;
                }
            }
        }
        dead.store(true, Ordering::Relaxed);
    })
}

impl Flow {
    /// Starts forwarding between `local` (rootless side, connected to the client) and `host`
    /// (host side, connected to the server).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        client: SocketAddrV4,
        server: SocketAddrV4,
        host_local: SocketAddrV4,
        local: UdpSocket,
        host: UdpSocket,
        offloads: Offloads,
    ) -> std::io::Result<Self> {
        let wake = Duration::from_millis(500);
        nsfast_sys::udp::set_recv_timeout(local.as_fd(), wake)?;
        nsfast_sys::udp::set_recv_timeout(host.as_fd(), wake)?;
        let local = Arc::new(local);
        let host = Arc::new(host);
        let stop = Arc::new(AtomicBool::new(false));
        let dead = Arc::new(AtomicBool::new(false));
        let epoch = Instant::now();
        let last = Arc::new(AtomicU64::new(0));
        let up = Arc::new(Counters::default());
        let down = Arc::new(Counters::default());
        let mut threads = Vec::new();
        threads.push(pump(
            format!("up-{}", client.port()),
            local.clone(),
            host.clone(),
            offloads.gso,
            stop.clone(),
            dead.clone(),
            last.clone(),
            epoch,
            up.clone(),
        )?);
        let t = pump(
            format!("down-{}", client.port()),
            host.clone(),
            local,
            offloads.gso,
            stop.clone(),
            dead.clone(),
            last.clone(),
            epoch,
            down.clone(),
        );
        match t {
            Ok(t) => threads.push(t),
            Err(e) => {
                stop.store(true, Ordering::Relaxed);
                for t in threads {
                    let _ = t.join();
                }
                return Err(e);
            }
        }
        Ok(Self {
            client,
            server,
            host_local,
            host,
            stop,
            dead,
            last,
            epoch,
            up,
            down,
            threads,
        })
    }

    /// Forwards a datagram that reached the flow through the listener (before the flow's
    /// own socket took over) and counts it.
    pub fn forward(&self, data: &[u8]) {
        self.touch();
        match self.host.send(data) {
            Ok(n) => {
                self.up.datagrams.fetch_add(1, Ordering::Relaxed);
                self.up.bytes.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(_) => {
                self.up.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Marks traffic seen now (datagrams that reached the flow through the listener).
    pub fn touch(&self) {
        self.last
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// How long since the last datagram in either direction.
    pub fn idle(&self) -> Duration {
        let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }

    /// True when a forwarding thread stopped on an error.
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }

    /// Asks both threads to stop without waiting (see [`Flow::stop`]).
    pub(crate) fn signal_stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Stops both threads and waits for them (at most about the receive timeout).
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Flow {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
