//! A real rootless world for tests and benchmarks (needs root to build; everything inside
//! runs as an unprivileged tenant):
//!
//! ```text
//!  "host" netns (throwaway)                      "server" netns
//!   vh0 10.201.0.1/24  <------ veth ------>  vs0 10.201.0.2/24   (VPN server, UDP 51820)
//!   tenant: rootlesskit --net=slirp4netns --mtu=65520 --copy-up=/etc --copy-up=/run
//!           --disable-host-loopback [--detach-netns]
//!           (or --net=pasta --pasta-binary=PATH: RootlessKit >= 2, WorldOpts::pasta)
//!     rootless netns: tap0 10.0.2.100 (slirp4netns or pasta), br-vpn 172.30.0.1/24,
//!                     nft masquerade
//!       "gluetun" netns: vg0 172.30.0.2/24 on br-vpn, default via 172.30.0.1
//!       "gluetun2" netns: vg0 172.30.0.3/24 on br-vpn (a second container)
//! ```
//!
//! The tenant is an existing unprivileged user with subordinate ids ([`Tenant::lookup`]):
//! this module never creates one (tests use the lab's [`crate::test_user`]). Dropping a [`World`] kills every process in the world's user namespace and in its
//! host namespace, deletes the namespaces and the runtime directory.

use std::collections::BTreeSet;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nsfast_sys::netns::NetNs;

pub use crate::tenant::Tenant;

mod cleanup;
mod probe;
mod wireguard;

pub use cleanup::cleanup_stale;
pub use probe::{client, client_from, ping, Echo, Pinger};
pub use wireguard::{
    wireguard_go, wireguard_go_version, Iperf3, WireGuard, WG_CLIENT_IP, WG_PORT, WG_SERVER_IP,
};

pub const HOST_IP: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 1);
pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 2);
pub const GLUETUN_IP: Ipv4Addr = Ipv4Addr::new(172, 30, 0, 2);
/// A second container on the same bridge (plain RootlessKit worlds only).
pub const GLUETUN2_IP: Ipv4Addr = Ipv4Addr::new(172, 30, 0, 3);
pub const BRIDGE: &str = "br-vpn";
/// The bridge port (host-side veth in the rootless namespace) of the "gluetun" container.
pub const GLUETUN_PORT: &str = "vb0";
/// The bridge port of the second container ([`GLUETUN2_IP`]).
pub const GLUETUN2_PORT: &str = "vb1";
pub const VPN_PORT: u16 = 51820;

fn run(cmd: &mut Command) -> anyhow::Result<Output> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

/// Programs the world needs, with the Debian package that ships each.
pub const NEEDS: &[(&str, &str)] = &[
    ("rootlesskit", "rootlesskit"),
    ("slirp4netns", "slirp4netns"),
    ("newuidmap", "uidmap"),
    ("ip", "iproute2"),
    ("nft", "nftables"),
    ("nsenter", "util-linux"),
    ("setpriv", "util-linux"),
    ("unshare", "util-linux"),
];

/// Programs the WireGuard tunnel needs.
pub const NEEDS_WG: &[(&str, &str)] = &[
    ("wireguard-go", "wireguard-go"),
    ("wg", "wireguard-tools"),
    ("iperf3", "iperf3"),
];

/// Fails with the missing program and its Debian package.
pub fn check_programs(needs: &[(&str, &str)]) -> anyhow::Result<()> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut missing = Vec::new();
    for (prog, pkg) in needs {
        let found = std::env::split_paths(&path)
            .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
            .any(|d| d.join(prog).exists());
        if !found {
            missing.push(format!("{prog} (Debian package {pkg})"));
        }
    }
    if !missing.is_empty() {
        bail!("the rootless test world needs: {}", missing.join(", "));
    }
    Ok(())
}

/// Options for [`World::build`].
#[derive(Debug, Clone, Default)]
pub struct WorldOpts {
    /// RootlessKit `--detach-netns` (needs RootlessKit ≥ 2.0).
    pub detach_netns: bool,
    /// The rootlesskit binary (default: `rootlesskit` from PATH).
    pub rootlesskit: Option<PathBuf>,
    /// Run a real rootless dockerd instead (Debian 12's `dockerd-rootless.sh`) from this
    /// directory of unpacked packages (scripts/fetch-docker.sh); the "gluetun" namespace is
    /// then a container on a Docker network whose bridge is `br-vpn`.
    pub docker: Option<PathBuf>,
    /// The rootless network is pasta, not slirp4netns: RootlessKit `--net=pasta
    /// --pasta-binary=PATH` with this binary (scripts/fetch-pasta.sh). Needs
    /// [`WorldOpts::rootlesskit`] set to RootlessKit >= 2.0: 1.x has no pasta driver.
    pub pasta: Option<PathBuf>,
}

/// A built world; dropping it tears everything down.
pub struct World {
    pub prefix: String,
    pub tenant: Tenant,
    pub host: NetNs,
    pub server: NetNs,
    pub runtime_dir: PathBuf,
    pub child_pid: u32,
    pub detach: bool,
    /// The user-space network stack that carries the rootless namespace's traffic out:
    /// `"slirp4netns"` or `"pasta"`.
    pub net: &'static str,
    rootlesskit: Option<Child>,
    userns_ino: u64,
    /// With a real dockerd: the unpacked packages and the container's PID.
    docker: Option<(PathBuf, u32)>,
    children: Mutex<Vec<Child>>,
}

impl World {
    /// Builds the world, run by `tenant` (an existing unprivileged user, see
    /// [`Tenant::lookup`]). Needs root (namespaces, /dev/net/tun mode).
    pub fn build(opts: &WorldOpts, tenant: &Tenant) -> anyhow::Result<World> {
        if !nix::unistd::geteuid().is_root() {
            bail!("building the rootless test world needs root (it creates namespaces and starts RootlessKit as {})", tenant.name);
        }
        if tenant.uid == 0 {
            bail!(
                "the rootless world's tenant {} is uid 0: it must be an unprivileged user",
                tenant.name
            );
        }
        if opts.pasta.is_some() && (opts.rootlesskit.is_none() || opts.docker.is_some()) {
            bail!("a pasta world needs RootlessKit >= 2.0 given as WorldOpts::rootlesskit (RootlessKit 1.x has no --net=pasta) and no dockerd");
        }
        if let Some(p) = &opts.pasta {
            if !p.is_file() {
                bail!("the pasta binary {} is not a file", p.display());
            }
        }
        if opts.rootlesskit.is_some() {
            check_programs(&NEEDS[1..])?;
        } else {
            check_programs(NEEDS)?;
        }
        // Unprivileged slirp4netns needs /dev/net/tun 0666 (the usual default).
        let tun = Path::new("/dev/net/tun");
        if let Ok(m) = std::fs::metadata(tun) {
            if m.mode() & 0o666 != 0o666 {
                std::fs::set_permissions(tun, std::fs::Permissions::from_mode(0o666))
                    .context("chmod 0666 /dev/net/tun")?;
            }
        }
        let prefix = crate::name::world_prefix();
        let host = NetNs::create(&format!("{prefix}-host"))?;
        let server = NetNs::create(&format!("{prefix}-srv"))?;
        let runtime_dir = std::env::temp_dir().join(format!("{prefix}-xdg"));
        let mut w = World {
            prefix: prefix.clone(),
            tenant: tenant.clone(),
            host,
            server,
            runtime_dir: runtime_dir.clone(),
            child_pid: 0,
            detach: opts.detach_netns,
            net: if opts.pasta.is_some() {
                "pasta"
            } else {
                "slirp4netns"
            },
            rootlesskit: None,
            userns_ino: 0,
            docker: None,
            children: Mutex::new(Vec::new()),
        };
        let (vh, vs) = (format!("{prefix}h"), format!("{prefix}s"));
        let (nh, ns) = (w.host.netlink()?, w.server.netlink()?);
        nh.create_veth(&vh, &ns, &vs)?;
        nh.add_address(&vh, HOST_IP.into(), 24)?;
        ns.add_address(&vs, SERVER_IP.into(), 24)?;
        drop((nh, ns));
        std::fs::create_dir_all(&runtime_dir)?;
        nix::unistd::chown(
            &runtime_dir,
            Some(tenant.uid.into()),
            Some(tenant.gid.into()),
        )?;
        std::fs::set_permissions(&runtime_dir, std::fs::Permissions::from_mode(0o700))?;
        let state = w.state_dir();
        if let Some(root) = &opts.docker {
            w.start_docker(root)?;
            return Ok(w);
        }
        let rk = opts
            .rootlesskit
            .clone()
            .unwrap_or_else(|| PathBuf::from("rootlesskit"));
        let mut cmd = w.tenant_command(&rk);
        match &opts.pasta {
            // pasta runs in the host namespace like slirp4netns; RootlessKit's pasta driver
            // gives tap0 the same 10.0.2.100/24 with gateway 10.0.2.2.
            Some(p) => cmd
                .arg("--net=pasta")
                .arg(format!("--pasta-binary={}", p.display())),
            None => cmd.arg("--net=slirp4netns"),
        };
        cmd.args([
            "--mtu=65520",
            "--copy-up=/etc",
            "--copy-up=/run",
            "--disable-host-loopback",
        ])
        .arg(format!("--state-dir={}", state.display()));
        if opts.detach_netns {
            cmd.arg("--detach-netns");
        }
        cmd.args(["sleep", "infinity"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", rk.display()))?;
        w.rootlesskit = Some(child);
        let pid_file = state.join("child_pid");
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(s) = std::fs::read_to_string(&pid_file) {
                if let Ok(p) = s.trim().parse() {
                    w.child_pid = p;
                    break;
                }
            }
            if let Some(c) = w.rootlesskit.as_mut() {
                if let Some(st) = c.try_wait()? {
                    let mut err = String::new();
                    if let Some(mut e) = c.stderr.take() {
                        use std::io::Read;
                        let _ = e.read_to_string(&mut err);
                    }
                    bail!("rootlesskit exited ({st}): {err}");
                }
            }
            if Instant::now() > until {
                bail!("rootlesskit wrote no {} within 20 s", pid_file.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if opts.detach_netns {
            // child_pid may be written before the namespace is bind-mounted at <state>/netns.
            let want = format!(" {} ", state.join("netns").display());
            let until = Instant::now() + Duration::from_secs(20);
            while !std::fs::read_to_string(format!("/proc/{}/mountinfo", w.child_pid))
                .unwrap_or_default()
                .contains(&want)
            {
                if Instant::now() > until {
                    bail!(
                        "RootlessKit did not mount {}/netns within 20 s",
                        state.display()
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        w.userns_ino = std::fs::metadata(format!("/proc/{}/ns/user", w.child_pid))?.ino();
        let g = w.gluetun_path();
        let g2 = w.gluetun2_path();
        let script = format!(
            r#"set -e
mkdir -p {gdir}; touch {g} {g2}
unshare --net={g} true
unshare --net={g2} true
ip link add {br} type bridge
ip addr add 172.30.0.1/24 dev {br}
ip link set {br} up
ip link add vg0 type veth peer name {p1}
ip link set vg0 netns {g}
ip link set {p1} master {br}
ip link set {p1} up
nsenter --net={g} sh -c 'ip link set lo up; ip addr add {gip}/24 dev vg0; ip link set vg0 up; ip route add default via 172.30.0.1'
ip link add vg0 type veth peer name {p2}
ip link set vg0 netns {g2}
ip link set {p2} master {br}
ip link set {p2} up
nsenter --net={g2} sh -c 'ip link set lo up; ip addr add {gip2}/24 dev vg0; ip link set vg0 up; ip route add default via 172.30.0.1'
echo 1 > /proc/sys/net/ipv4/ip_forward
nft add table ip nat
nft 'add chain ip nat post {{ type nat hook postrouting priority 100 ; }}'
nft add rule ip nat post ip saddr 172.30.0.0/24 oifname != {br} masquerade
"#,
            gdir = g.parent().unwrap_or(Path::new("/run")).display(),
            g = g.display(),
            g2 = g2.display(),
            br = BRIDGE,
            gip = GLUETUN_IP,
            gip2 = GLUETUN2_IP,
            p1 = GLUETUN_PORT,
            p2 = GLUETUN2_PORT,
        );
        w.rootless_sh(&script)
            .context("setting up the rootless network")?;
        Ok(w)
    }

    fn docker_cli(&self, root: &Path, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = self.tenant_command(root.join("usr/bin/docker"));
        cmd.args(args).env(
            "DOCKER_HOST",
            format!("unix://{}", self.runtime_dir.join("docker.sock").display()),
        );
        let out = run(&mut cmd)?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Starts Debian 12's rootless dockerd as the tenant (dockerd-rootless.sh: RootlessKit with
    /// slirp4netns, --copy-up=/etc --copy-up=/run --disable-host-loopback), imports a busybox
    /// image from a local tarball, creates network `vpn` (bridge br-vpn, 172.30.0.0/24) and
    /// runs the "gluetun" container on it at 172.30.0.2.
    fn start_docker(&mut self, root: &Path) -> anyhow::Result<()> {
        let path = format!(
            "{}:{}:/usr/sbin:/usr/bin:/sbin:/bin",
            root.join("usr/bin").display(),
            root.join("usr/sbin").display()
        );
        let log = std::fs::File::create(self.runtime_dir.join("dockerd.log"))?;
        let mut cmd = self.tenant_command("sh");
        cmd.arg(root.join("usr/share/docker.io/contrib/dockerd-rootless.sh"))
            .args(["--storage-driver", "vfs"])
            .env("PATH", &path)
            // RootlessKit's own temporary state dir (Docker 20.10 passes no --state-dir)
            // lands in the world's runtime dir and goes with it.
            .env("TMPDIR", &self.runtime_dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        self.rootlesskit = Some(cmd.spawn().context("starting dockerd-rootless.sh")?);
        let sock = self.runtime_dir.join("docker.sock");
        let pid_file = self.runtime_dir.join("docker.pid");
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            if sock.exists() {
                if let Some(p) = std::fs::read_to_string(&pid_file)
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                {
                    if self.docker_cli(root, &["info", "-f", "{{.ID}}"]).is_ok() {
                        self.child_pid = p;
                        break;
                    }
                }
            }
            if let Some(st) = self
                .rootlesskit
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!(
                    "dockerd-rootless.sh exited ({st}): {}",
                    std::fs::read_to_string(self.runtime_dir.join("dockerd.log"))
                        .unwrap_or_default()
                );
            }
            if Instant::now() > until {
                bail!("rootless dockerd not ready within 60 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.userns_ino = std::fs::metadata(format!("/proc/{}/ns/user", self.child_pid))?.ino();
        // An image from a local tarball: a static busybox.
        let img = self.runtime_dir.join("image");
        std::fs::create_dir_all(img.join("bin"))?;
        std::fs::copy("/bin/busybox", img.join("bin/busybox"))
            .context("copying /bin/busybox (Debian package busybox-static) into the image")?;
        let tar = self.runtime_dir.join("image.tar");
        run(Command::new("tar")
            .arg("-C")
            .arg(&img)
            .arg("-cf")
            .arg(&tar)
            .arg("."))?;
        nix::unistd::chown(
            &tar,
            Some(self.tenant.uid.into()),
            Some(self.tenant.gid.into()),
        )?;
        self.docker_cli(
            root,
            &["import", &tar.display().to_string(), "nsfast/busybox:test"],
        )?;
        self.docker_cli(
            root,
            &[
                "network",
                "create",
                "--subnet",
                "172.30.0.0/24",
                "-o",
                &format!("com.docker.network.bridge.name={BRIDGE}"),
                "vpn",
            ],
        )?;
        self.docker_cli(
            root,
            &[
                "run",
                "-d",
                "--network",
                "vpn",
                "--ip",
                &GLUETUN_IP.to_string(),
                "--name",
                "gluetun",
                "nsfast/busybox:test",
                "/bin/busybox",
                "sleep",
                "1000000",
            ],
        )?;
        let pid: u32 = self
            .docker_cli(root, &["inspect", "-f", "{{.State.Pid}}", "gluetun"])?
            .parse()
            .context("container PID")?;
        self.docker = Some((root.to_path_buf(), pid));
        Ok(())
    }

    /// RootlessKit's state directory (what dockerd-rootless.sh uses).
    pub fn state_dir(&self) -> PathBuf {
        self.runtime_dir.join("dockerd-rootless")
    }

    /// The "gluetun" namespace file, as seen inside the rootless mount namespace.
    pub fn gluetun_path(&self) -> PathBuf {
        PathBuf::from(format!("/run/{}/gluetun", self.prefix))
    }

    /// A command that runs `program` as the tenant in the host namespace with the tenant's
    /// environment (XDG_RUNTIME_DIR, HOME).
    pub fn tenant_command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("setpriv");
        cmd.arg(format!("--reuid={}", self.tenant.uid))
            .arg(format!("--regid={}", self.tenant.gid))
            .arg("--clear-groups")
            .arg("--")
            .arg(program)
            .env_clear()
            .env(
                "PATH",
                std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into()),
            )
            .env("XDG_RUNTIME_DIR", &self.runtime_dir)
            .env("HOME", &self.runtime_dir);
        if let Ok(v) = std::env::var("RUST_LOG") {
            cmd.env("RUST_LOG", v);
        }
        self.host.configure_command(&mut cmd, None);
        cmd
    }

    fn nsenter_args(&self) -> Vec<String> {
        let mut a = vec![
            "nsenter".to_string(),
            "-U".into(),
            "--preserve-credentials".into(),
            "-m".into(),
            "-t".into(),
            self.child_pid.to_string(),
        ];
        if self.detach {
            // The file is only a namespace inside the child's mount namespace: enter that
            // first, then the network namespace.
            a.push("nsenter".into());
            a.push(format!(
                "--net={}",
                self.state_dir().join("netns").display()
            ));
        } else {
            a.push("-n".into());
        }
        a
    }

    /// Runs a shell script as the tenant inside the rootless namespaces (like
    /// `rootlesskit --state-dir ... nsenter`); fails with its output on error.
    pub fn rootless_sh(&self, script: &str) -> anyhow::Result<String> {
        let a = self.nsenter_args();
        let mut cmd = self.tenant_command(&a[0]);
        cmd.args(&a[1..]).args(["sh", "-c", script]);
        let out = run(&mut cmd)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The second container's namespace file, as seen inside the rootless mount namespace.
    pub fn gluetun2_path(&self) -> PathBuf {
        PathBuf::from(format!("/run/{}/gluetun2", self.prefix))
    }

    /// The second container's namespace ([`GLUETUN2_IP`]; plain RootlessKit worlds only).
    pub fn gluetun2_ns(&self) -> anyhow::Result<NetNs> {
        if self.docker.is_some() {
            bail!("the rootless Docker world has one container");
        }
        let p = format!(
            "/proc/{}/root{}",
            self.child_pid,
            self.gluetun2_path().display()
        );
        Ok(NetNs::open(&p)?)
    }

    /// A command running `argv` as the tenant inside the "gluetun" namespace.
    pub fn gluetun_command(&self, argv: &[&str]) -> Command {
        let a = self.nsenter_args();
        let mut cmd = self.tenant_command(&a[0]);
        cmd.args(&a[1..])
            .arg("nsenter")
            .arg(format!("--net={}", self.gluetun_path().display()))
            .args(argv);
        cmd
    }

    /// The "gluetun" namespace for threads of this (root) process.
    pub fn gluetun_ns(&self) -> anyhow::Result<NetNs> {
        if let Some((_, pid)) = &self.docker {
            return Ok(NetNs::open(&format!("/proc/{pid}/ns/net"))?);
        }
        let p = format!(
            "/proc/{}/root{}",
            self.child_pid,
            self.gluetun_path().display()
        );
        Ok(NetNs::open(&p)?)
    }

    /// The command `vpnrelay ARGS` as the tenant in the host namespace.
    pub fn vpnrelay(&self, bin: &Path, args: &[&str]) -> Command {
        let mut cmd = self.tenant_command(bin);
        cmd.args(args);
        cmd
    }

    /// Keeps `child` to be killed when the world is dropped.
    pub fn adopt(&self, child: Child) {
        self.children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(child);
    }

    /// The relay's flow counters for [`BRIDGE`] (`$XDG_RUNTIME_DIR/vpnrelay/relay-br-vpn.stats`,
    /// written by a relay running as the tenant; see docs/vpnrelay.md), if there are any.
    pub fn relay_stats(&self) -> Option<serde_json::Value> {
        let p = self
            .runtime_dir
            .join("vpnrelay")
            .join(format!("relay-{BRIDGE}.stats"));
        serde_json::from_slice(&std::fs::read(p).ok()?).ok()
    }

    /// IPv4 rules in the rootless namespace (`ip rule` text).
    pub fn rules(&self) -> anyhow::Result<String> {
        self.rootless_sh("ip -4 rule")
    }

    /// PIDs of processes in this world: in its user namespace or its host namespace.
    pub fn processes(&self) -> BTreeSet<u32> {
        let host_ino = self.host.inode();
        let mut out = BTreeSet::new();
        let Ok(rd) = std::fs::read_dir("/proc") else {
            return out;
        };
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if pid == std::process::id() {
                continue;
            }
            let ino = |ns: &str| {
                std::fs::metadata(format!("/proc/{pid}/ns/{ns}"))
                    .map(|m| m.ino())
                    .ok()
            };
            if (self.userns_ino != 0 && ino("user") == Some(self.userns_ino))
                || ino("net") == Some(host_ino)
            {
                out.insert(pid);
            }
        }
        out
    }
}

/// Kills every process whose network namespace is `ns` (only namespaces a world created).
pub fn kill_in_netns(ns: &NetNs) {
    let ino = ns.inode();
    for _ in 0..3 {
        let mut found = false;
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if pid as u32 == std::process::id() {
                continue;
            }
            if std::fs::metadata(format!("/proc/{pid}/ns/net"))
                .map(|m| m.ino())
                .ok()
                == Some(ino)
            {
                found = true;
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        if !found {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Drop for World {
    fn drop(&mut self) {
        kill_in_netns(&self.server);
        for c in self
            .children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter_mut()
        {
            let _ = c.kill();
            let _ = c.wait();
        }
        for round in 0..3 {
            let pids = self.processes();
            if pids.is_empty() {
                break;
            }
            for p in pids {
                let sig = if round == 0 {
                    nix::sys::signal::Signal::SIGTERM
                } else {
                    nix::sys::signal::Signal::SIGKILL
                };
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p as i32), sig);
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        if let Some(mut c) = self.rootlesskit.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.runtime_dir);
    }
}

impl crate::topology::Topology for WorldOpts {
    /// The tenant that runs the world.
    type Ctx = Tenant;
    type Guard = World;
    type Error = anyhow::Error;

    fn name(&self) -> &str {
        "rootless"
    }

    fn probe(&self) -> Result<(), String> {
        check_programs(NEEDS).map_err(|e| e.to_string())
    }

    /// Tear-down order ([`World`]'s drop): its children, every process of the world's user
    /// and host namespaces (SIGTERM, then SIGKILL), RootlessKit, the runtime folder; the
    /// namespaces with the handles.
    fn build(&self, tenant: &Tenant) -> anyhow::Result<World> {
        World::build(self, tenant)
    }
}

static BIN: OnceLock<PathBuf> = OnceLock::new();

/// Uses `path` as the `vpnrelay` binary (tests; the first call wins).
pub fn set_vpnrelay_bin(path: PathBuf) {
    let _ = BIN.set(path);
}

/// The `vpnrelay` binary: the one set with [`set_vpnrelay_bin`], `NSFAST_VPNRELAY_BIN`, or
/// `vpnrelay` next to the running executable (or one directory up, for test executables).
pub fn vpnrelay_bin() -> Result<PathBuf, String> {
    if let Some(p) = BIN.get() {
        return Ok(p.clone());
    }
    if let Some(p) = std::env::var_os("NSFAST_VPNRELAY_BIN") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("NSFAST_VPNRELAY_BIN={} is not a file", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    for d in [Some(dir.as_path()), dir.parent()].into_iter().flatten() {
        let p = d.join("vpnrelay");
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(format!(
        "no vpnrelay binary next to {} (cargo build -p nsfast --bin vpnrelay, or set NSFAST_VPNRELAY_BIN)",
        exe.display()
    ))
}

/// The unpacked packages of this source tree (`build/`, where scripts/fetch-*.sh put them):
/// found at run time from the current directory or the executable upwards (the source tree
/// that has scripts/fetch-pasta.sh), so no build path is compiled into a binary.
fn repo_build_dir() -> Option<PathBuf> {
    let cwd = std::env::current_dir().ok();
    let exe = std::env::current_exe().ok();
    [cwd, exe].into_iter().flatten().find_map(|start| {
        start
            .ancestors()
            .find(|d| d.join("scripts/fetch-pasta.sh").is_file())
            .map(|root| root.join("build"))
    })
}

/// `p` resolved, if no one but root and this process's user can change what it runs: the file
/// and every directory above it belong to root or to us and are not writable by group or
/// others, except a sticky directory (such as /tmp), where others cannot replace our entries.
/// The binaries found here run as the tenant, so a tree another user could write would let
/// that user run code as the tenant.
pub fn trusted_file(p: &Path) -> Result<PathBuf, String> {
    let real = std::fs::canonicalize(p).map_err(|e| format!("{}: {e}", p.display()))?;
    let me = nix::unistd::geteuid().as_raw();
    for at in real.ancestors() {
        let m = std::fs::metadata(at).map_err(|e| format!("{}: {e}", at.display()))?;
        if m.uid() != 0 && m.uid() != me {
            return Err(format!(
                "{} is not trusted: {} belongs to uid {}, not to root or uid {me} (copy it to a directory of yours)",
                p.display(),
                at.display(),
                m.uid()
            ));
        }
        let sticky_dir = m.is_dir() && m.mode() & 0o1000 != 0;
        if m.mode() & 0o022 != 0 && !sticky_dir {
            return Err(format!(
                "{} is not trusted: {} is writable by group or others (mode {:o}; chmod go-w it)",
                p.display(),
                at.display(),
                m.mode() & 0o7777
            ));
        }
    }
    Ok(real)
}

/// What a pasta world ([`WorldOpts::pasta`]) runs: `(rootlesskit, pasta)`. RootlessKit >= 2.0
/// (1.x has no `--net=pasta`): `$VPNRELAY_ROOTLESSKIT2`, else the source tree's
/// build/rootlesskit-sid (scripts/fetch-rootlesskit2.sh). pasta: `$NSFAST_PASTA`, else
/// build/passt-sid/pasta (scripts/fetch-pasta.sh). Nothing is downloaded here; the error says
/// what is missing.
pub fn pasta_tools() -> Result<(PathBuf, PathBuf), String> {
    let pick = |var: &str, rel: &str, script: &str| -> Result<PathBuf, String> {
        let p = match (std::env::var_os(var), repo_build_dir()) {
            (Some(p), _) => PathBuf::from(p),
            (None, Some(build)) => build.join(rel),
            (None, None) => {
                return Err(format!(
                    "no source tree with build/{rel} above the current directory or this program (set ${var}, or run {script} in the source tree)"
                ))
            }
        };
        if !p.is_file() {
            return Err(format!("no {} (set ${var} or run {script})", p.display()));
        }
        trusted_file(&p)
    };
    let rk = pick(
        "VPNRELAY_ROOTLESSKIT2",
        "rootlesskit-sid/usr/bin/rootlesskit",
        "scripts/fetch-rootlesskit2.sh",
    );
    let pasta = pick("NSFAST_PASTA", "passt-sid/pasta", "scripts/fetch-pasta.sh");
    match (rk, pasta) {
        (Ok(r), Ok(p)) => Ok((r, p)),
        (Err(a), Err(b)) => Err(format!("{a}; {b}")),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::trusted_file;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_file_others_could_change_is_not_trusted() {
        let dir = std::env::temp_dir().join(format!("nsfast-trusted-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let bin = dir.join("pasta");
        std::fs::write(&bin, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&bin, &link).unwrap();
        let check = |p: &std::path::Path| trusted_file(p);

        // Ours, under the sticky /tmp: trusted, and a symlink resolves to its target.
        assert_eq!(check(&bin).unwrap(), bin.canonicalize().unwrap());
        assert_eq!(check(&link).unwrap(), bin.canonicalize().unwrap());
        // A group-writable directory above it: anyone in the group could swap the file.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o775)).unwrap();
        let e = check(&bin).unwrap_err();
        assert!(
            e.contains("writable by group or others") && e.contains("775"),
            "{e}"
        );
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        // The file itself world-writable.
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o757)).unwrap();
        assert!(check(&bin).unwrap_err().contains("757"));
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Another user's file (only root can make one to test with).
        if nix::unistd::geteuid().is_root() {
            nix::unistd::chown(&bin, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
            let e = check(&bin).unwrap_err();
            assert!(e.contains("belongs to uid 65534"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(check(&bin).is_err());
    }
}
