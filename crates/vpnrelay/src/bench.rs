//! `vpnrelay bench` (hidden; needs root): builds the [`crate::testbed`] world and measures,
//! in interleaved rounds, a UDP stream of 1420-byte datagrams (WireGuard-sized) from the
//! "gluetun" namespace to the server over Docker's normal path (slirp4netns), through the
//! relay, and from a plain host socket (direct); optionally iperf3 TCP through a WireGuard
//! tunnel (wireguard-go on both ends) over slirp4netns and over the relay. Prints medians and
//! ratios. Topologies are library functions so `nsfast bench` can register them later.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nsfast_sys::netns::NetNs;
use nsfast_sys::udp::{self, RecvBatch, SendBatch};

use crate::testbed::{World, WorldOpts, BRIDGE, SERVER_IP, VPN_PORT};

/// Datagram size of the UDP stream (WireGuard's usual 1420-byte MTU payload).
pub const DGRAM: usize = 1420;

/// Sends 1420-byte datagrams from a socket in `from` to `dst` for `secs` seconds (batched
/// sendmmsg, GSO when `gso`), counting what a receiver in `to` gets. Returns Gbit/s received.
pub fn udp_stream(
    from: &NetNs,
    to: &NetNs,
    dst: SocketAddrV4,
    secs: f64,
    gso: bool,
) -> anyhow::Result<f64> {
    let rx_sock = to.run(|| UdpSocket::bind(dst))??;
    let _ = udp::set_buffers(rx_sock.as_fd(), 16 << 20);
    let _ = udp::enable_gro(rx_sock.as_fd());
    udp::set_recv_timeout(rx_sock.as_fd(), Duration::from_millis(100))?;
    let tx_sock = from.run(|| -> std::io::Result<UdpSocket> {
        let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
        s.connect(dst)?;
        Ok(s)
    })??;
    let _ = udp::set_buffers(tx_sock.as_fd(), 16 << 20);
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let bytes = Arc::new(AtomicU64::new(0));
    let (stop2, meas2, bytes2) = (stop.clone(), measuring.clone(), bytes.clone());
    let rx = std::thread::spawn(move || {
        let mut b = RecvBatch::new(16);
        while !stop2.load(Ordering::Relaxed) {
            if let Ok(n) = b.recv(rx_sock.as_fd()) {
                if meas2.load(Ordering::Relaxed) {
                    let total: usize = (0..n).map(|i| b.get(i).1.len).sum();
                    bytes2.fetch_add(total as u64, Ordering::Relaxed);
                }
            }
        }
    });
    let stop3 = stop.clone();
    let gso = gso && udp::probe_gso(tx_sock.as_fd());
    let tx = std::thread::spawn(move || {
        let payload = vec![0x5au8; DGRAM * 64];
        let mut batch = SendBatch::new(gso);
        while !stop3.load(Ordering::Relaxed) {
            for c in payload.chunks(DGRAM) {
                batch.push(c, DGRAM, None);
            }
            if batch.flush(tx_sock.as_fd()).is_err() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    // Warm up (flows get set up, conntrack settles), then measure.
    std::thread::sleep(Duration::from_millis(500));
    measuring.store(true, Ordering::Relaxed);
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    measuring.store(false, Ordering::Relaxed);
    let el = t.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let _ = tx.join();
    let _ = rx.join();
    Ok(bytes.load(Ordering::Relaxed) as f64 * 8.0 / el / 1e9)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    if v.is_empty() {
        return 0.0;
    }
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// A relay started as the tenant, stopped with SIGTERM on drop.
pub struct RelayProc(Child);

impl RelayProc {
    pub fn start(w: &World, bin: &Path) -> anyhow::Result<RelayProc> {
        let mut c = w
            .vpnrelay(
                bin,
                &[
                    "transparent",
                    BRIDGE,
                    &format!("{VPN_PORT}-{}", crate::testbed::WG_PORT),
                ],
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        // Ready when the rule is in place.
        let until = Instant::now() + Duration::from_secs(15);
        loop {
            if w.rules()?
                .contains(&format!("lookup {}", crate::config::DEFAULT_RULE))
            {
                break;
            }
            if let Some(s) = c.try_wait()? {
                bail!("relay exited at start ({s})");
            }
            if Instant::now() > until {
                let _ = c.kill();
                bail!("relay did not install its rule within 15 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(RelayProc(c))
    }
}

impl Drop for RelayProc {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let until = Instant::now() + Duration::from_secs(15);
        while self.0.try_wait().ok().flatten().is_none() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Options of `vpnrelay bench`.
#[derive(Debug, Clone)]
pub struct BenchOpts {
    pub rounds: usize,
    pub secs: f64,
    pub wireguard: bool,
}

/// Runs the benchmark and prints a table; returns the medians (Gbit/s) by topology name.
pub fn run(opts: &BenchOpts) -> anyhow::Result<Vec<(String, f64)>> {
    let bin = std::env::current_exe().context("own executable")?;
    let w = World::build(&WorldOpts::default())?;
    let g = w.gluetun_ns()?;
    let dst = SocketAddrV4::new(SERVER_IP, VPN_PORT);
    let mut slirp = Vec::new();
    let mut relay = Vec::new();
    let mut direct = Vec::new();
    let mut wg_slirp = Vec::new();
    let mut wg_relay = Vec::new();
    let wg = if opts.wireguard {
        Some(crate::testbed::WireGuard::start(&w)?)
    } else {
        None
    };
    for round in 1..=opts.rounds {
        let s = udp_stream(&g, &w.server, dst, opts.secs, true)?;
        let d = udp_stream(&w.host, &w.server, dst, opts.secs, true)?;
        let (r, wr) = {
            let _relay = RelayProc::start(&w, &bin)?;
            let r = udp_stream(&g, &w.server, dst, opts.secs, true)?;
            let wr = match &wg {
                Some(wg) => Some(wg.iperf3(&w, opts.secs)?),
                None => None,
            };
            (r, wr)
        };
        let ws = match &wg {
            Some(wg) => Some(wg.iperf3(&w, opts.secs)?),
            None => None,
        };
        eprintln!(
            "round {round}: udp slirp4netns {s:.2}  relay {r:.2}  direct {d:.2} Gbit/s{}",
            match (ws, wr) {
                (Some(a), Some(b)) =>
                    format!("; wireguard iperf3 slirp4netns {a:.2}  relay {b:.2} Gbit/s"),
                _ => String::new(),
            }
        );
        slirp.push(s);
        relay.push(r);
        direct.push(d);
        if let (Some(a), Some(b)) = (ws, wr) {
            wg_slirp.push(a);
            wg_relay.push(b);
        }
    }
    let (ms, mr, md) = (median(&mut slirp), median(&mut relay), median(&mut direct));
    println!(
        "UDP stream, {DGRAM}-byte datagrams, {} rounds x {} s, medians (Gbit/s received):",
        opts.rounds, opts.secs
    );
    println!("  slirp4netns   {ms:8.2}");
    println!(
        "  vpnrelay      {mr:8.2}   {:.1}x slirp4netns, {:.0}% of direct",
        mr / ms.max(1e-9),
        100.0 * mr / md.max(1e-9)
    );
    println!("  direct host   {md:8.2}");
    let mut out = vec![
        ("udp-slirp4netns".to_string(), ms),
        ("udp-vpnrelay".to_string(), mr),
        ("udp-direct".to_string(), md),
    ];
    if !wg_slirp.is_empty() {
        let (a, b) = (median(&mut wg_slirp), median(&mut wg_relay));
        println!("WireGuard (wireguard-go) tunnel, iperf3 TCP, medians (Gbit/s):");
        println!("  slirp4netns   {a:8.2}");
        println!(
            "  vpnrelay      {b:8.2}   {:.1}x slirp4netns",
            b / a.max(1e-9)
        );
        out.push(("wg-slirp4netns".into(), a));
        out.push(("wg-vpnrelay".into(), b));
    }
    if let Some(mut wg) = wg {
        wg.stop_in(&w);
    }
    let _ = Command::new("true").status();
    Ok(out)
}
