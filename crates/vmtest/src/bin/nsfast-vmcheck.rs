//! `nsfast-vmcheck` — checks that run inside vmtest guests.
//!
//! - `probe-config`: runs `nsfast probe --json` and checks its netkit/vsock/TCX answers against
//!   the kernel's own config file (shipped in the same Debian package).
//! - `vsock-loopback`: a vsock round trip over the local transport (CID 1) with nsfast-sys's
//!   vsock sockets. Refuses to run outside a vmtest guest: a host's vsock may belong to others.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use nsfast_sys::vsock::{VsockAddr, VsockListener, VsockStream, VMADDR_CID_LOCAL};

#[derive(Parser, Debug)]
#[command(
    name = "nsfast-vmcheck",
    about = "Checks run inside nsfast's VM test guests"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Check `nsfast probe --json` against the kernel config.
    ProbeConfig {
        /// Kernel config file.
        #[arg(long, default_value = "/boot/config")]
        config: PathBuf,
        /// The nsfast binary to run.
        #[arg(long, default_value = "nsfast")]
        nsfast: String,
    },
    /// vsock round trip over the loopback transport (CID 1). Guest only (NSFAST_VM_GUEST=1).
    VsockLoopback {
        /// Port to listen on.
        #[arg(long, default_value_t = 5201)]
        port: u32,
        /// Bytes to echo through the connection.
        #[arg(long, default_value_t = 4 << 20)]
        bytes: usize,
        /// Small-message ping-pongs after the bulk transfer.
        #[arg(long, default_value_t = 1000)]
        pings: u32,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::ProbeConfig { config, nsfast } => probe_config(&config, &nsfast),
        Cmd::VsockLoopback { port, bytes, pings } => vsock_loopback(port, bytes, pings),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nsfast-vmcheck: FAIL: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// (probe feature, expected answer, where the expectation comes from). The VMCI and Hyper-V
/// transports are not checked: their modules need their hypervisors, so guests do not carry them.
fn expectations(config: &str, version: (u64, u64)) -> Vec<(&'static str, bool, String)> {
    let on = |k: &str| matches!(config_value(config, k).as_deref(), Some("y") | Some("m"));
    let mut v = vec![
        ("netkit", on("CONFIG_NETKIT"), "CONFIG_NETKIT".to_string()),
        ("vsock", on("CONFIG_VSOCKETS"), "CONFIG_VSOCKETS".into()),
        (
            "vsock_loopback",
            on("CONFIG_VSOCKETS_LOOPBACK"),
            "CONFIG_VSOCKETS_LOOPBACK".into(),
        ),
        (
            "vsock_virtio",
            on("CONFIG_VIRTIO_VSOCKETS"),
            "CONFIG_VIRTIO_VSOCKETS".into(),
        ),
        (
            "vhost_vsock",
            on("CONFIG_VHOST_VSOCK"),
            "CONFIG_VHOST_VSOCK".into(),
        ),
    ];
    let ns = on("CONFIG_VSOCKETS") && version >= (7, 0);
    v.push((
        "vsock_ns_mode",
        ns,
        "CONFIG_VSOCKETS and kernel >= 7.0".into(),
    ));
    v.push((
        "vsock_child_ns_mode",
        ns,
        "CONFIG_VSOCKETS and kernel >= 7.0".into(),
    ));
    let tcx = on("CONFIG_NET_XGRESS") && version >= (6, 6);
    v.push(("tcx", tcx, "CONFIG_NET_XGRESS and kernel >= 6.6".into()));
    v
}

fn config_value(config: &str, key: &str) -> Option<String> {
    let prefix = format!("{key}=");
    config
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(str::to_string)
}

fn probe_config(config_path: &PathBuf, nsfast: &str) -> Result<()> {
    let config = std::fs::read_to_string(config_path)
        .with_context(|| format!("reading kernel config {}", config_path.display()))?;
    let out = Command::new(nsfast)
        .args(["probe", "--json"])
        .output()
        .with_context(|| format!("running {nsfast} probe --json"))?;
    if !out.status.success() {
        bail!(
            "{nsfast} probe --json failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("parsing nsfast probe --json output")?;
    let v = &report["kernel_version"];
    let version = (
        v["major"].as_u64().unwrap_or(0),
        v["minor"].as_u64().unwrap_or(0),
    );
    let features: BTreeMap<String, (bool, String)> = report["features"]
        .as_array()
        .context("probe output has no features array")?
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap_or("").to_string(),
                (
                    f["available"].as_bool().unwrap_or(false),
                    f["reason"].as_str().unwrap_or("").to_string(),
                ),
            )
        })
        .collect();
    println!(
        "kernel {} ({}.{})",
        report["kernel_release"].as_str().unwrap_or("?"),
        version.0,
        version.1
    );
    let mut bad = 0;
    for (name, want, from) in expectations(&config, version) {
        let Some((got, reason)) = features.get(name) else {
            println!("MISMATCH {name}: missing from nsfast probe output");
            bad += 1;
            continue;
        };
        let verdict = if *got == want { "ok      " } else { "MISMATCH" };
        if *got != want {
            bad += 1;
        }
        println!(
            "{verdict} {name:<20} probe={:<3} config={:<3} ({from})  probe says: {reason}",
            if *got { "yes" } else { "no" },
            if want { "yes" } else { "no" }
        );
    }
    let checked: Vec<&str> = expectations(&config, version).iter().map(|e| e.0).collect();
    for (name, (got, reason)) in &features {
        if !checked.contains(&name.as_str()) {
            println!(
                "info     {name:<20} probe={:<3}  {reason}",
                if *got { "yes" } else { "no" }
            );
        }
    }
    if bad > 0 {
        bail!(
            "{bad} probe answer(s) disagree with {}",
            config_path.display()
        );
    }
    Ok(())
}

fn vsock_loopback(port: u32, bytes: usize, pings: u32) -> Result<()> {
    if std::env::var("NSFAST_VM_GUEST").as_deref() != Ok("1") {
        bail!(
            "refusing to open AF_VSOCK sockets outside a vmtest guest (NSFAST_VM_GUEST=1 is not set): \
             a host's vsock device may belong to someone else"
        );
    }
    let addr = VsockAddr {
        cid: VMADDR_CID_LOCAL,
        port,
    };
    let listener = VsockListener::bind(addr)?;
    let server = std::thread::spawn(move || -> Result<u64> {
        let (s, peer) = listener.accept().context("accept")?;
        let mut buf = vec![0u8; 64 * 1024];
        let mut echoed = 0u64;
        loop {
            let n = (&s).read(&mut buf).context("server read")?;
            if n == 0 {
                break;
            }
            (&s).write_all(&buf[..n]).context("server write")?;
            echoed += n as u64;
        }
        eprintln!(
            "server: echoed {echoed} bytes to {}:{}",
            peer.cid, peer.port
        );
        Ok(echoed)
    });
    let c = VsockStream::connect(addr)?;
    let data: Vec<u8> = (0..bytes).map(|i| (i * 31 % 251) as u8).collect();
    let t = Instant::now();
    // Bulk: write and read back concurrently so neither side's buffer fills up.
    let reader_c = &c;
    let got = std::thread::scope(|s| -> Result<Vec<u8>> {
        let r = s.spawn(move || -> Result<Vec<u8>> {
            let mut got = vec![0u8; bytes];
            let mut r = reader_c;
            r.read_exact(&mut got).context("client read (bulk)")?;
            Ok(got)
        });
        let mut w = &c;
        w.write_all(&data).context("client write (bulk)")?;
        r.join()
            .map_err(|_| anyhow::anyhow!("reader thread panicked"))?
    })?;
    if got != data {
        let at = got.iter().zip(&data).position(|(a, b)| a != b).unwrap_or(0);
        bail!("bulk echo differs from what was sent at byte {at}");
    }
    let bulk = t.elapsed();
    let t = Instant::now();
    let mut one = [0u8; 8];
    for i in 0..pings {
        let msg = u64::from(i).to_le_bytes();
        (&c).write_all(&msg)?;
        (&c).read_exact(&mut one)?;
        if one != msg {
            bail!("ping {i}: got {one:?}, sent {msg:?}");
        }
    }
    let ping = t.elapsed();
    c.shutdown_write()?;
    let echoed = server
        .join()
        .map_err(|_| anyhow::anyhow!("server thread panicked"))??;
    let expected = bytes as u64 + u64::from(pings) * 8;
    if echoed != expected {
        bail!("server echoed {echoed} bytes, expected {expected}");
    }
    println!(
        "vsock loopback CID {VMADDR_CID_LOCAL} port {port}: {bytes} bytes echoed in {:.1} ms ({:.1} MiB/s), \
         {pings} ping-pongs, {:.1} us each",
        bulk.as_secs_f64() * 1e3,
        bytes as f64 / 1048576.0 / bulk.as_secs_f64(),
        ping.as_secs_f64() * 1e6 / f64::from(pings.max(1))
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expectations_follow_config() {
        let c = "CONFIG_NETKIT=y\nCONFIG_VSOCKETS=m\n# CONFIG_VSOCKETS_LOOPBACK is not set\nCONFIG_NET_XGRESS=y\n";
        let e = expectations(c, (6, 12));
        let get = |n: &str| e.iter().find(|x| x.0 == n).unwrap().1;
        assert!(get("netkit"));
        assert!(get("vsock"));
        assert!(!get("vsock_loopback"));
        assert!(!get("vsock_ns_mode"));
        assert!(get("tcx"));
        assert!(
            expectations(c, (7, 2))
                .iter()
                .find(|x| x.0 == "vsock_ns_mode")
                .unwrap()
                .1
        );
        assert!(
            !expectations(c, (6, 1))
                .iter()
                .find(|x| x.0 == "tcx")
                .unwrap()
                .1
        );
    }

    #[test]
    fn vsock_refuses_outside_guest() {
        std::env::remove_var("NSFAST_VM_GUEST");
        let e = vsock_loopback(1, 1, 1).unwrap_err().to_string();
        assert!(e.contains("refusing"), "{e}");
    }
}
