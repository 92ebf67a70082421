//! `nsfast-lab vpnrelay-bench` (needs root): builds the [`crate::rootless`] world and measures,
//! in interleaved rounds, a UDP stream of 1420-byte datagrams (WireGuard-sized) from the
//! "gluetun" namespace to the server over Docker's normal path (slirp4netns), over pasta (the
//! same world with RootlessKit >= 2 `--net=pasta`, rootless Docker's other choice; skipped
//! with the reason when its binaries are missing), through the relay, and from a plain host
//! socket (direct), each with a GSO sender and a plain one; optionally iperf3 TCP through a
//! WireGuard tunnel (wireguard-go on both ends) over slirp4netns and over the relay. Prints
//! medians of Gbit/s and CPU seconds per GB, and ratios.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use nsfast_sys::netns::NetNs;
use nsfast_sys::udp::{self, RecvBatch, SendBatch};

use crate::rootless::{World, WorldOpts, BRIDGE, SERVER_IP, VPN_PORT};

/// Datagram size of the UDP stream (WireGuard's usual 1420-byte MTU payload).
pub const DGRAM: usize = 1420;

/// One measurement: what the receiver got, and what it cost.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Gbit/s received.
    pub gbps: f64,
    /// CPU seconds per GB received: this process (the sender and receiver threads), the
    /// given processes (the world's: slirp4netns or pasta, the relay, RootlessKit) and the
    /// ksoftirqd threads, over the measured interval.
    pub cpu_s_per_gb: f64,
}

/// CPU microseconds used so far by this process, `pids` and every CPU's ksoftirqd.
fn cpu_usec(pids: &[u32]) -> u64 {
    let me = std::process::id();
    let softirqd = (0..nsfast_sys::procstat::per_cpu_times()
        .map(|v| v.len())
        .unwrap_or(0))
        .filter_map(nsfast_sys::procstat::ksoftirqd_pid);
    std::iter::once(me)
        .chain(pids.iter().copied().filter(|p| *p != me))
        .chain(softirqd)
        .filter_map(|p| nsfast_sys::procstat::process_cpu_usec(p).ok())
        .sum()
}

/// How the stream's sender hands datagrams to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    /// One sendmmsg of 64 datagrams as one GSO super-datagram (UDP_SEGMENT), as quinn or
    /// wireguard-go with GSO send.
    Gso,
    /// sendmmsg of 64 messages of one datagram each, as wireguard-go 0.0.2022 sends.
    Mmsg,
    /// One send(2) per datagram, as a simple VPN client sends.
    Single,
}

impl Sender {
    /// Its name in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Sender::Gso => "gso",
            Sender::Mmsg => "plain",
            Sender::Single => "single",
        }
    }
}

/// Sends 1420-byte datagrams from a socket in `from` to `dst` for `secs` seconds (as
/// `sender` says), counting what a receiver in `to` gets and the CPU time of this
/// process, `pids` and ksoftirqd.
pub fn udp_stream(
    from: &NetNs,
    to: &NetNs,
    dst: SocketAddrV4,
    secs: f64,
    sender: Sender,
    pids: &[u32],
) -> anyhow::Result<Sample> {
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
    let gso = sender == Sender::Gso && udp::probe_gso(tx_sock.as_fd());
    let tx = std::thread::spawn(move || {
        let payload = vec![0x5au8; DGRAM * 64];
        let mut batch = SendBatch::new(gso);
        while !stop3.load(Ordering::Relaxed) {
            if sender == Sender::Single {
                for c in payload.chunks(DGRAM) {
                    if tx_sock.send(c).is_err() {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                continue;
            }
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
    let cpu0 = cpu_usec(pids);
    measuring.store(true, Ordering::Relaxed);
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    measuring.store(false, Ordering::Relaxed);
    let el = t.elapsed().as_secs_f64();
    let cpu = cpu_usec(pids).saturating_sub(cpu0) as f64 / 1e6;
    stop.store(true, Ordering::Relaxed);
    let _ = tx.join();
    let _ = rx.join();
    let got = bytes.load(Ordering::Relaxed) as f64;
    Ok(Sample {
        gbps: got * 8.0 / el / 1e9,
        cpu_s_per_gb: if got > 0.0 {
            cpu / (got / 1e9)
        } else {
            f64::NAN
        },
    })
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

/// The paths measured, in print order within each sender.
const PATHS: [&str; 4] = ["slirp4netns", "pasta", "vpnrelay", "direct"];
/// The senders, in print order.
const SENDERS: [Sender; 3] = [Sender::Gso, Sender::Mmsg, Sender::Single];

/// Runs the benchmark and prints a table; returns the medians (Gbit/s) by topology name
/// (`udp-<sender>-<path>`, `wg-iperf3-<path>`) and, for the UDP streams, the median CPU cost
/// as `<name>-cpu-s-per-gb`.
pub fn run(opts: &BenchOpts) -> anyhow::Result<Vec<(String, f64)>> {
    let bin = &opts.bin;
    let w = World::build(&WorldOpts::default(), &opts.tenant)?;
    let g = w.gluetun_ns()?;
    let dst = SocketAddrV4::new(SERVER_IP, VPN_PORT);
    // The same world with pasta as its network (RootlessKit >= 2 --net=pasta); skipped, with
    // the reason, when the binaries are missing or the world does not come up.
    let pasta = crate::rootless::pasta_tools()
        .map_err(anyhow::Error::msg)
        .and_then(|(rk, pasta)| {
            World::build(
                &WorldOpts {
                    rootlesskit: Some(rk),
                    pasta: Some(pasta),
                    ..Default::default()
                },
                &opts.tenant,
            )
        })
        .and_then(|pw| {
            let pg = pw.gluetun_ns()?;
            Ok((pw, pg))
        });
    let (pasta, pasta_skip) = match pasta {
        Ok(p) => (Some(p), String::new()),
        Err(e) => {
            eprintln!("vpnrelay-bench: pasta rows skipped: {e:#}");
            (None, format!("{e:#}"))
        }
    };
    // samples[sender][path]
    let mut samples: Vec<Vec<Vec<Sample>>> = vec![vec![Vec::new(); PATHS.len()]; SENDERS.len()];
    let mut wg_samples: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let wg = if opts.wireguard {
        Some(crate::rootless::WireGuard::start(&w)?)
    } else {
        None
    };
    for round in 1..=opts.rounds {
        let mut line = Vec::new();
        let mut keep = |si: usize, pi: usize, s: Sample, line: &mut Vec<String>| {
            line.push(format!(
                "{}-{} {:.2} ({:.2} s/GB)",
                SENDERS[si].name(),
                PATHS[pi],
                s.gbps,
                s.cpu_s_per_gb
            ));
            samples[si][pi].push(s);
        };
        // Interleaved: slirp4netns, direct, pasta, then the relay (in the slirp4netns world).
        let world_pids: Vec<u32> = w.processes().into_iter().collect();
        for (si, sender) in SENDERS.iter().enumerate() {
            let s = udp_stream(&g, &w.server, dst, opts.secs, *sender, &world_pids)?;
            keep(si, 0, s, &mut line);
            let s = udp_stream(&w.host, &w.server, dst, opts.secs, *sender, &[])?;
            keep(si, 3, s, &mut line);
            if let Some((pw, pg)) = &pasta {
                let pids: Vec<u32> = pw.processes().into_iter().collect();
                let s = udp_stream(pg, &pw.server, dst, opts.secs, *sender, &pids)?;
                keep(si, 1, s, &mut line);
            }
        }
        if let Some(wg) = &wg {
            let v = wg.iperf3(&w, opts.secs)?;
            line.push(format!("wg-iperf3-slirp4netns {v:.2}"));
            wg_samples[0].push(v);
        }
        {
            let _relay = RelayProc::start(&w, bin)?;
            let world_pids: Vec<u32> = w.processes().into_iter().collect();
            for (si, sender) in SENDERS.iter().enumerate() {
                let s = udp_stream(&g, &w.server, dst, opts.secs, *sender, &world_pids)?;
                keep(si, 2, s, &mut line);
            }
            if let Some(wg) = &wg {
                let v = wg.iperf3(&w, opts.secs)?;
                line.push(format!("wg-iperf3-vpnrelay {v:.2}"));
                wg_samples[1].push(v);
            }
        }
        eprintln!("round {round} (Gbit/s): {}", line.join("  "));
    }
    nsfast_sys::outln!(
        "vpnrelay-bench: {} rounds x {} s, kernel {}, medians: Gbit/s received, CPU s per GB received",
        opts.rounds,
        opts.secs,
        nsfast_sys::kernel::release()
    )?;
    nsfast_sys::outln!(
        "CPU counts this process (sender + receiver), the world's processes (RootlessKit, slirp4netns or pasta, the relay) and ksoftirqd"
    )?;
    if let Some((pw, _)) = &pasta {
        nsfast_sys::outln!(
            "pasta world {}: RootlessKit --net=pasta (same tap0, bridge and masquerade)",
            pw.prefix
        )?;
    }
    let mut out = Vec::new();
    for (si, sender) in SENDERS.iter().enumerate() {
        let med: Vec<(f64, f64)> = samples[si]
            .iter()
            .map(|v| {
                let mut g: Vec<f64> = v.iter().map(|s| s.gbps).collect();
                let mut c: Vec<f64> = v
                    .iter()
                    .map(|s| s.cpu_s_per_gb)
                    .filter(|c| c.is_finite())
                    .collect();
                (median(&mut g), median(&mut c))
            })
            .collect();
        let (slirp, direct) = (med[0], med[3]);
        let label = match sender {
            Sender::Gso => "UDP stream, 1420-byte datagrams, GSO sender (64 datagrams per sendmmsg as one super-datagram)",
            Sender::Mmsg => "UDP stream, 1420-byte datagrams, plain sender (sendmmsg of 64 one-datagram messages)",
            Sender::Single => "UDP stream, 1420-byte datagrams, single sender (one send(2) per datagram)",
        };
        nsfast_sys::outln!("{label}:")?;
        nsfast_sys::outln!(
            "  {:<12} {:>8} {:>9} {:>10} {:>10} {:>11}",
            "path",
            "Gbit/s",
            "CPU s/GB",
            "x slirp",
            "% direct",
            "direct CPU/"
        )?;
        for (pi, path) in PATHS.iter().enumerate() {
            if samples[si][pi].is_empty() {
                nsfast_sys::outln!("  {path:<12} skipped: {pasta_skip}")?;
                continue;
            }
            let (gb, cpu) = med[pi];
            nsfast_sys::outln!(
                "  {path:<12} {gb:8.2} {cpu:9.3} {:9.1}x {:9.0}% {:10.2}x",
                gb / slirp.0.max(1e-9),
                100.0 * gb / direct.0.max(1e-9),
                direct.1 / cpu.max(1e-9),
            )?;
            out.push((format!("udp-{}-{path}", sender.name()), gb));
            out.push((format!("udp-{}-{path}-cpu-s-per-gb", sender.name()), cpu));
        }
        if !samples[si][1].is_empty() {
            let (pasta, relay) = (med[1], med[2]);
            nsfast_sys::outln!(
                "  vpnrelay vs pasta: {:.1}x the throughput, {:.2}x the CPU per GB",
                relay.0 / pasta.0.max(1e-9),
                relay.1 / pasta.1.max(1e-9)
            )?;
        }
    }
    if wg.is_some() {
        let s = median(&mut wg_samples[0]);
        let r = median(&mut wg_samples[1]);
        nsfast_sys::outln!(
            "WireGuard tunnel ({} on both ends), iperf3 TCP:",
            crate::rootless::wireguard_go_version()
        )?;
        nsfast_sys::outln!("  slirp4netns  {s:8.2}")?;
        nsfast_sys::outln!(
            "  vpnrelay     {r:8.2}   {:.1}x slirp4netns",
            r / s.max(1e-9)
        )?;
        out.push(("wg-iperf3-slirp4netns".into(), s));
        out.push(("wg-iperf3-vpnrelay".into(), r));
    }
    if let Some(mut wg) = wg {
        wg.stop_in(&w);
    }
    Ok(out)
}
