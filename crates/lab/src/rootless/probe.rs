//! UDP probes of a rootless world: an echo server standing in for the VPN server, clients,
//! and a pinger that proves a path stays up.

use super::*;

/// A UDP echo server (a stand-in for the VPN server) on a thread in `ns`; it records every
/// source address it sees.
pub struct Echo {
    pub addr: SocketAddrV4,
    stop: Arc<AtomicBool>,
    sources: Arc<Mutex<Vec<SocketAddrV4>>>,
    /// The source each (short) payload came from, most recent first wins (bounded).
    by_payload: Arc<Mutex<std::collections::HashMap<Vec<u8>, SocketAddrV4>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Echo {
    pub fn start(ns: &NetNs, addr: SocketAddrV4) -> anyhow::Result<Echo> {
        let sock = ns.run(|| UdpSocket::bind(addr))??;
        sock.set_read_timeout(Some(Duration::from_millis(200)))?;
        let stop = Arc::new(AtomicBool::new(false));
        let sources = Arc::new(Mutex::new(Vec::new()));
        let by_payload = Arc::new(Mutex::new(std::collections::HashMap::new()));
        let (s2, src2, by2) = (stop.clone(), sources.clone(), by_payload.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            while !s2.load(Ordering::Relaxed) {
                if let Ok((n, std::net::SocketAddr::V4(from))) = sock.recv_from(&mut buf) {
                    {
                        let mut v = src2.lock().unwrap_or_else(|e| e.into_inner());
                        if v.last() != Some(&from) {
                            v.push(from);
                        }
                    }
                    if n <= 64 {
                        let mut m = by2.lock().unwrap_or_else(|e| e.into_inner());
                        if m.len() >= 8192 {
                            m.clear();
                        }
                        m.insert(buf[..n].to_vec(), from);
                    }
                    let _ = sock.send_to(&buf[..n], from);
                }
            }
        });
        Ok(Echo {
            addr,
            stop,
            sources,
            by_payload,
            thread: Some(thread),
        })
    }

    /// The source the payload `p` (at most 64 bytes) last came from.
    pub fn source_of(&self, p: &[u8]) -> Option<SocketAddrV4> {
        self.by_payload
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(p)
            .copied()
    }

    /// Distinct consecutive sources seen so far.
    pub fn sources(&self) -> Vec<SocketAddrV4> {
        self.sources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn last_source(&self) -> Option<SocketAddrV4> {
        self.sources().last().copied()
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A client socket in `ns` bound to `port`, connected to `server`.
pub fn client(ns: &NetNs, port: u16, server: SocketAddrV4) -> io::Result<UdpSocket> {
    let s = ns
        .run(|| -> io::Result<UdpSocket> {
            let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port))?;
            s.connect(server)?;
            Ok(s)
        })
        .map_err(|e| io::Error::other(e.to_string()))??;
    s.set_read_timeout(Some(Duration::from_millis(300)))?;
    Ok(s)
}

/// A client socket in `ns` bound to `local` (an address the namespace holds), connected to
/// `server`.
pub fn client_from(ns: &NetNs, local: SocketAddrV4, server: SocketAddrV4) -> io::Result<UdpSocket> {
    let s = ns
        .run(|| -> io::Result<UdpSocket> {
            let s = UdpSocket::bind(local)?;
            s.connect(server)?;
            Ok(s)
        })
        .map_err(|e| io::Error::other(e.to_string()))??;
    s.set_read_timeout(Some(Duration::from_millis(300)))?;
    Ok(s)
}

/// Sends one datagram and waits for its echo.
pub fn ping(s: &UdpSocket, payload: &[u8]) -> bool {
    if s.send(payload).is_err() {
        return false;
    }
    let mut buf = [0u8; 2048];
    let until = Instant::now() + Duration::from_millis(600);
    while Instant::now() < until {
        match s.recv(&mut buf) {
            Ok(n) if &buf[..n] == payload => return true,
            Ok(_) => continue,
            Err(_) => return false,
        }
    }
    false
}

/// Pings every `interval` on a thread until stopped; counts echoes.
pub struct Pinger {
    stop: Arc<AtomicBool>,
    pub sent: Arc<std::sync::atomic::AtomicU64>,
    pub ok: Arc<std::sync::atomic::AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Pinger {
    pub fn start(sock: UdpSocket, interval: Duration) -> Pinger {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let ok = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (s2, sent2, ok2) = (stop.clone(), sent.clone(), ok.clone());
        let thread = std::thread::spawn(move || {
            let mut i = 0u64;
            while !s2.load(Ordering::Relaxed) {
                i += 1;
                sent2.fetch_add(1, Ordering::Relaxed);
                if ping(&sock, format!("ping {i}").as_bytes()) {
                    ok2.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(interval);
            }
        });
        Pinger {
            stop,
            sent,
            ok,
            thread: Some(thread),
        }
    }

    pub fn ok(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    /// Waits until `n` more echoes arrive (false on timeout).
    pub fn wait_more(&self, n: u64, timeout: Duration) -> bool {
        let start = self.ok();
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if self.ok() >= start + n {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Pinger {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
