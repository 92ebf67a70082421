//! `nsfast-lab vpnrelay-bench` (needs root): builds the [`crate::rootless`] world and measures,
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

use anyhow::bail;
use nsfast_sys::netns::NetNs;
use nsfast_sys::udp::{self, RecvBatch, SendBatch};

use crate::rootless::{World, WorldOpts, BRIDGE, SERVER_IP, VPN_PORT};

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
                    &format!("{VPN_PORT}-{}", crate::rootless::WG_PORT),
                ],
            )
            // A benchmark client may open more flows than one container normally would:
            // keep them all in the relay so a figure never mixes in Docker's path.
            .env(
                "VPNRELAY_MAX_FLOWS_PER_CLIENT",
                nsfast_vpnrelay::config::MAX_FLOWS.to_string(),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        // Ready when the rule is in place.
        let until = Instant::now() + Duration::from_secs(15);
        loop {
            if w.rules()?
                .contains(&format!("lookup {}", nsfast_vpnrelay::config::DEFAULT_RULE))
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
        crate::wait_or_kill(&mut self.0, Duration::from_secs(15));
    }
}

/// Options of `nsfast-lab vpnrelay-bench`.
#[derive(Debug, Clone)]
pub struct BenchOpts {
    /// The `vpnrelay` binary to measure.
    pub bin: std::path::PathBuf,
    pub rounds: usize,
    pub secs: f64,
    pub wireguard: bool,
    /// Who runs the world.
    pub tenant: crate::tenant::Tenant,
}

/// Runs the benchmark and prints a table; returns the medians (Gbit/s) by topology name.
pub fn run(opts: &BenchOpts) -> anyhow::Result<Vec<(String, f64)>> {
    let bin = &opts.bin;
    let w = World::build(&WorldOpts::default(), &opts.tenant)?;
    let g = w.gluetun_ns()?;
    let dst = SocketAddrV4::new(SERVER_IP, VPN_PORT);
    // name -> samples, in print order
    let names = [
        "udp-gso-slirp4netns",
        "udp-gso-vpnrelay",
        "udp-gso-direct",
        "udp-plain-slirp4netns",
        "udp-plain-vpnrelay",
        "udp-plain-direct",
        "wg-iperf3-slirp4netns",
        "wg-iperf3-vpnrelay",
    ];
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let wg = if opts.wireguard {
        Some(crate::rootless::WireGuard::start(&w)?)
    } else {
        None
    };
    for round in 1..=opts.rounds {
        let mut got = vec![f64::NAN; names.len()];
        // Interleaved: off, direct, on; sender with GSO (one sendmmsg of 64 datagrams as
        // one super-datagram) and plain (sendmmsg of single datagrams, as wireguard-go 0.0.2022).
        for (k, gso) in [(0, true), (3, false)] {
            got[k] = udp_stream(&g, &w.server, dst, opts.secs, gso)?;
            got[k + 2] = udp_stream(&w.host, &w.server, dst, opts.secs, gso)?;
        }
        if let Some(wg) = &wg {
            got[6] = wg.iperf3(&w, opts.secs)?;
        }
        {
            let _relay = RelayProc::start(&w, bin)?;
            got[1] = udp_stream(&g, &w.server, dst, opts.secs, true)?;
            got[4] = udp_stream(&g, &w.server, dst, opts.secs, false)?;
            if let Some(wg) = &wg {
                got[7] = wg.iperf3(&w, opts.secs)?;
            }
        }
        let line: Vec<String> = names
            .iter()
            .zip(&got)
            .filter(|(_, v)| !v.is_nan())
            .map(|(n, v)| format!("{n} {v:.2}"))
            .collect();
        eprintln!("round {round} (Gbit/s): {}", line.join("  "));
        for (k, v) in got.into_iter().enumerate() {
            if !v.is_nan() {
                samples[k].push(v);
            }
        }
    }
    let med: Vec<f64> = samples.iter_mut().map(|v| median(v)).collect();
    nsfast_sys::outln!(
        "vpnrelay-bench: {} rounds x {} s, kernel {}, medians in Gbit/s received",
        opts.rounds,
        opts.secs,
        nsfast_sys::kernel::release()
    )?;
    for (label, base) in [
        ("UDP stream, 1420-byte datagrams, GSO sender", 0),
        ("UDP stream, 1420-byte datagrams, plain sender", 3),
    ] {
        let (s, r, d) = (med[base], med[base + 1], med[base + 2]);
        nsfast_sys::outln!("{label}:")?;
        nsfast_sys::outln!("  slirp4netns  {s:8.2}")?;
        nsfast_sys::outln!(
            "  vpnrelay     {r:8.2}   {:.1}x slirp4netns, {:.0}% of direct",
            r / s.max(1e-9),
            100.0 * r / d.max(1e-9)
        )?;
        nsfast_sys::outln!("  direct host  {d:8.2}")?;
    }
    if wg.is_some() {
        let (s, r) = (med[6], med[7]);
        nsfast_sys::outln!(
            "WireGuard tunnel ({} on both ends), iperf3 TCP:",
            crate::rootless::wireguard_go_version()
        )?;
        nsfast_sys::outln!("  slirp4netns  {s:8.2}")?;
        nsfast_sys::outln!(
            "  vpnrelay     {r:8.2}   {:.1}x slirp4netns",
            r / s.max(1e-9)
        )?;
    }
    let out: Vec<(String, f64)> = names
        .iter()
        .zip(med)
        .filter(|(_, v)| *v > 0.0)
        .map(|(n, v)| (n.to_string(), v))
        .collect();
    if let Some(mut wg) = wg {
        wg.stop_in(&w);
    }
    let _ = Command::new("true").status();
    Ok(out)
}
