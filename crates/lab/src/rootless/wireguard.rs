//! Real WireGuard (wireguard-go) between a container of a rootless world and its VPN server,
//! and iperf3 through it.

use super::*;

/// UDP port of the WireGuard server (the UDP echo uses [`VPN_PORT`]).
pub const WG_PORT: u16 = 51821;
pub const WG_SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
pub const WG_CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);

/// The wireguard-go program for both ends: `NSFAST_WIREGUARD_GO` (a path, e.g. a newer
/// wireguard-go unpacked by `scripts/fetch-debs.sh sid wireguard-go-sid wireguard-go`), else
/// `wireguard-go` from PATH (Debian 12's 0.0.20220316, which has no UDP GSO/GRO).
pub fn wireguard_go() -> String {
    std::env::var("NSFAST_WIREGUARD_GO").unwrap_or_else(|_| "wireguard-go".into())
}

/// `wireguard-go --version`'s first line, for reports.
pub fn wireguard_go_version() -> String {
    Command::new(wireguard_go())
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.trim().to_string())
        })
        .unwrap_or_else(|| format!("{} (version unknown)", wireguard_go()))
}

/// One iperf3 run through the tunnel.
#[derive(Debug, Clone, Copy)]
pub struct Iperf3 {
    /// Gbit/s received by the server.
    pub gbps: f64,
    /// TCP payload bytes received by the server.
    pub bytes: u64,
}

/// A WireGuard tunnel, wireguard-go on both ends: the server in the server namespace (root),
/// the client in "gluetun" (as the tenant, like gluetun in a rootless container).
pub struct WireGuard {
    server: Option<Child>,
}

fn wg_key(private: Option<&str>) -> anyhow::Result<String> {
    use std::io::Write;
    let mut cmd = Command::new("wg");
    cmd.arg(if private.is_some() {
        "pubkey"
    } else {
        "genkey"
    })
    .stdin(Stdio::piped())
    .stdout(Stdio::piped());
    let mut c = cmd.spawn().context("running wg (wireguard-tools)")?;
    if let (Some(k), Some(mut i)) = (private, c.stdin.take()) {
        i.write_all(k.as_bytes())?;
    }
    drop(c.stdin.take());
    let out = c.wait_with_output()?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl WireGuard {
    pub fn start(w: &World) -> anyhow::Result<WireGuard> {
        check_programs(NEEDS_WG)?;
        let (sk, ck) = (wg_key(None)?, wg_key(None)?);
        let (sp, cp) = (wg_key(Some(&sk))?, wg_key(Some(&ck))?);
        let skf = w.runtime_dir.join("wg-server.key");
        let ckf = w.runtime_dir.join("wg-client.key");
        std::fs::write(&skf, &sk)?;
        std::fs::write(&ckf, &ck)?;
        nix::unistd::chown(&ckf, Some(w.tenant.uid.into()), Some(w.tenant.gid.into()))?;
        let ifname = format!("wg{}", &w.prefix[4..].replace('x', ""));
        let ifname: String = ifname.chars().take(15).collect();
        // The server side runs as root in the server namespace, in a private mount namespace
        // with its own /run, so its UAPI socket never lands in the machine's /run.
        let mut server = Command::new("unshare");
        server
            .args(["-m", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "set -e; mount -t tmpfs none /run; \
                 WG_PROCESS_FOREGROUND=1 {wg_go} -f {ifname} & \
                 for i in $(seq 200); do [ -S /run/wireguard/{ifname}.sock ] && break; sleep 0.05; done; \
                 wg set {ifname} listen-port {WG_PORT} private-key {key} peer {cp} allowed-ips {WG_CLIENT_IP}/32; \
                 ip addr add {WG_SERVER_IP}/24 dev {ifname}; ip link set {ifname} mtu 1420 up; \
                 touch {ready}; wait",
                key = skf.display(),
                ready = w.runtime_dir.join("wg-server.ready").display(),
                wg_go = wireguard_go(),
            ))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(w.runtime_dir.join("wg-server.log"))?)
            .stderr(std::fs::File::create(w.runtime_dir.join("wg-server.err"))?);
        w.server.configure_command(&mut server, None);
        let mut me = WireGuard {
            server: Some(server.spawn().context("starting wireguard-go (server)")?),
        };
        let until = Instant::now() + Duration::from_secs(15);
        while !w.runtime_dir.join("wg-server.ready").exists() {
            if Instant::now() > until {
                me.stop();
                bail!(
                    "WireGuard server did not come up: {}{}",
                    std::fs::read_to_string(w.runtime_dir.join("wg-server.log"))
                        .unwrap_or_default(),
                    std::fs::read_to_string(w.runtime_dir.join("wg-server.err"))
                        .unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // The rootless /run is a copy-up of the host's: give wireguard-go its own directory.
        w.rootless_sh(
            "if [ -L /run/wireguard ]; then rm /run/wireguard; fi; mkdir -p /run/wireguard",
        )?;
        let client = w
            .gluetun_command(&[&wireguard_go(), "-f", "wg0"])
            .env("WG_PROCESS_FOREGROUND", "1")
            .env("LOG_LEVEL", "debug")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(w.runtime_dir.join("wg-client.log"))?)
            .stderr(Stdio::null())
            .spawn()
            .context("starting wireguard-go (client, as the tenant)")?;
        w.adopt(client);
        let script = format!(
            "for i in $(seq 100); do [ -S /var/run/wireguard/wg0.sock ] && break; sleep 0.05; done; \
             wg set wg0 private-key {key} peer {sp} allowed-ips {WG_SERVER_IP}/32 endpoint {SERVER_IP}:{WG_PORT} persistent-keepalive 1 && \
             ip addr add {WG_CLIENT_IP}/24 dev wg0 && ip link set wg0 mtu 1420 up",
            key = ckf.display()
        );
        let out = w
            .gluetun_command(&["sh", "-c", &script])
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            bail!(
                "configuring the WireGuard client: {} (wireguard-go: {})",
                String::from_utf8_lossy(&out.stderr),
                std::fs::read_to_string(w.runtime_dir.join("wg-client.log")).unwrap_or_default()
            );
        }
        // Handshake: a UDP echo through the tunnel.
        let echo = Echo::start(&w.server, SocketAddrV4::new(WG_SERVER_IP, 7))?;
        let probe = self::client(&w.gluetun_ns()?, 0, echo.addr)?;
        let ok = (0..40).any(|i| ping(&probe, format!("wg probe {i}").as_bytes()));
        drop(echo);
        if !ok {
            me.stop();
            let log = |n: &str| std::fs::read_to_string(w.runtime_dir.join(n)).unwrap_or_default();
            let state = w
                .gluetun_command(&["sh", "-c", "wg show; ip -br addr"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            bail!(
                "no ping through the WireGuard tunnel\nclient: {}\nserver: {}\n{state}",
                log("wg-client.log"),
                log("wg-server.log")
            );
        }
        Ok(me)
    }

    /// iperf3 TCP from "gluetun" (as the tenant) to the server through the tunnel; Gbit/s
    /// received.
    pub fn iperf3(&self, w: &World, secs: f64) -> anyhow::Result<f64> {
        Ok(self.iperf3_run(w, secs)?.gbps)
    }

    /// Like [`WireGuard::iperf3`], with the bytes the server received.
    pub fn iperf3_run(&self, w: &World, secs: f64) -> anyhow::Result<Iperf3> {
        let mut srv = Command::new("iperf3");
        srv.args(["-s", "-1", "-B", &WG_SERVER_IP.to_string(), "-p", "5201"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        w.server.configure_command(&mut srv, None);
        let mut srv = srv.spawn().context("starting iperf3 -s")?;
        std::thread::sleep(Duration::from_millis(300));
        let out = w
            .gluetun_command(&[
                "iperf3",
                "-c",
                &WG_SERVER_IP.to_string(),
                "-p",
                "5201",
                "-t",
                &format!("{secs}"),
                "-J",
            ])
            .stdin(Stdio::null())
            .output()?;
        let _ = srv.kill();
        let _ = srv.wait();
        let json: serde_json::Value = serde_json::from_slice(&out.stdout)
            .with_context(|| format!("iperf3 output: {}", String::from_utf8_lossy(&out.stdout)))?;
        if let Some(e) = json.get("error") {
            bail!("iperf3: {e}");
        }
        let bps = json["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .context("iperf3 JSON without end.sum_received")?;
        let bytes = json["end"]["sum_received"]["bytes"]
            .as_u64()
            .context("iperf3 JSON without end.sum_received.bytes")?;
        Ok(Iperf3 {
            gbps: bps / 1e9,
            bytes,
        })
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills what [`WireGuard::start`] left in `w`'s server namespace (wireguard-go).
    pub fn stop_in(&mut self, w: &World) {
        self.stop();
        kill_in_netns(&w.server);
    }
}

impl Drop for WireGuard {
    fn drop(&mut self) {
        self.stop();
    }
}
