//! The parent: runs as the tenant in the host network namespace and never joins the user
//! namespace (from inside it, setns back to the host network namespace fails with EPERM).
//! It starts the child inside RootlessKit's namespaces, opens one connected host socket per
//! flow (no SO_REUSEADDR) and hands it over with SCM_RIGHTS.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use nsfast_sys::udp;

use crate::child::Mode;
use crate::config::Config;
use crate::state::{self, Lock, Rootless, TryLock};

/// Environment variable carrying the child's control socket descriptor.
pub(crate) const CHILD_FD_ENV: &str = "VPNRELAY_CHILD_FD";

struct Started {
    child: Child,
    ctl: OwnedFd,
}

fn spawn_child(mode: Mode, cfg: &Config, rl: &Rootless) -> anyhow::Result<Started> {
    if !rl.alive() {
        bail!(state::StateError::Dead {
            pid: rl.child_pid,
            file: rl.state_dir.join("child_pid"),
        });
    }
    let target = rl.target();
    let (parent, child) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .context("control socketpair")?;
    nix::fcntl::fcntl(
        &child,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .context("control socket flags")?;
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg("__child")
        .arg(match mode {
            Mode::Relay => "relay",
            Mode::Cleanup => "cleanup",
        })
        .arg(&cfg.bridge)
        .arg(cfg.ports.to_compact_string())
        .env(CHILD_FD_ENV, child.as_raw_fd().to_string())
        .env("VPNRELAY_RULE", cfg.rule.to_string())
        .env("VPNRELAY_SOCKBUF", cfg.sockbuf.to_string())
        .env(
            "VPNRELAY_IDLE_TIMEOUT",
            nsfast_sys::args::duration::format(cfg.idle),
        )
        .env(
            "VPNRELAY_MAX_FLOWS_PER_CLIENT",
            cfg.max_flows_per_client.to_string(),
        );
    target.configure_command(&mut cmd);
    let spawned = cmd.spawn();
    drop(child);
    let child = spawned.map_err(|e| {
        if e.raw_os_error() == Some(libc::EPERM) {
            anyhow!(state::StateError::Permission {
                pid: rl.child_pid,
                owner: 0,
                me: nix::unistd::getuid().as_raw(),
            })
        } else {
            anyhow!(e).context(format!(
                "starting the relay inside RootlessKit child PID {}'s namespaces",
                rl.child_pid
            ))
        }
    })?;
    Ok(Started { child, ctl: parent })
}

fn recv_text(ctl: BorrowedFd<'_>) -> io::Result<(String, Option<OwnedFd>)> {
    // `stats` messages carry up to 64 flows and 128 handed-back ones (~25 KB).
    let mut buf = vec![0u8; 128 << 10];
    let (n, fd) = udp::recv_fd(ctl, &mut buf)?;
    Ok((String::from_utf8_lossy(&buf[..n]).into_owned(), fd))
}

fn send_text(ctl: BorrowedFd<'_>, text: &str) -> io::Result<()> {
    nix::sys::socket::send(
        ctl.as_raw_fd(),
        text.as_bytes(),
        nix::sys::socket::MsgFlags::empty(),
    )
    .map(drop)
    .map_err(io::Error::from)
}

/// Reads until a status line (`ready`/`done`/`error`); EOF means the child died.
fn wait_status(st: &mut Started) -> anyhow::Result<String> {
    loop {
        let (text, _) = recv_text(st.ctl.as_fd()).context("control socket")?;
        if text.is_empty() {
            let status = st.child.wait()?;
            bail!("relay child exited before reporting ({status})");
        }
        if let Some(rest) = text.strip_prefix("error ") {
            let _ = st.child.wait();
            bail!("{rest}");
        }
        if let Some(rest) = text.strip_prefix("ready ") {
            return Ok(rest.to_string());
        }
        if let Some(rest) = text.strip_prefix("done ") {
            return Ok(rest.to_string());
        }
    }
}

/// A host socket connected to `server`, without SO_REUSEADDR.
pub(crate) fn host_socket(
    server: SocketAddrV4,
    cfg: &Config,
    gro: bool,
) -> io::Result<(UdpSocket, SocketAddrV4)> {
    let s = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    let _ = udp::set_buffers(s.as_fd(), cfg.sockbuf);
    if gro {
        udp::enable_gro(s.as_fd())?;
    }
    s.connect(&SocketAddr::V4(server).into())?;
    let local = match s.local_addr()?.as_socket() {
        Some(SocketAddr::V4(a)) => a,
        _ => SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
    };
    Ok((s.into(), local))
}

/// Serves host-socket requests until the child closes the control socket; writes the
/// child's flow counters to [`state::stats_path`].
fn serve(ctl: OwnedFd, cfg: Config, gro: bool) {
    let stats = state::stats_path(&cfg.bridge);
    let mut stats_warned = false;
    loop {
        let text = match recv_text(ctl.as_fd()) {
            Ok((t, _)) if !t.is_empty() => t,
            _ => return,
        };
        if let Some(rest) = text.strip_prefix("done ") {
            tracing::info!("{rest}");
            continue;
        }
        if let Some(json) = text.strip_prefix("stats ") {
            if let Err(e) = state::replace_file(&stats, format!("{json}\n").as_bytes()) {
                if !std::mem::replace(&mut stats_warned, true) {
                    tracing::warn!("flow counters: {e}");
                }
            }
            continue;
        }
        let mut it = text.split(' ');
        let (Some("open"), Some(id), Some(server)) = (it.next(), it.next(), it.next()) else {
            tracing::warn!("unexpected message from the relay child: {text:?}");
            continue;
        };
        let reply = match server.parse::<SocketAddrV4>() {
            Ok(srv) => match host_socket(srv, &cfg, gro) {
                Ok((s, local)) => udp::send_fd(
                    ctl.as_fd(),
                    format!("sock {id} {local}").as_bytes(),
                    s.as_fd(),
                ),
                Err(e) => send_text(ctl.as_fd(), &format!("fail {id} host socket to {srv}: {e}")),
            },
            Err(_) => send_text(ctl.as_fd(), &format!("fail {id} bad address {server:?}")),
        };
        if reply.is_err() {
            return;
        }
    }
}

fn read_sysctl(key: &str) -> Option<usize> {
    std::fs::read_to_string(format!("/proc/sys/{}", key.replace('.', "/")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Says which offloads are used and warns about small buffer limits.
pub(crate) fn announce(cfg: &Config) -> crate::flow::Offloads {
    let off = crate::child::offloads(cfg);
    let kernel = nsfast_sys::kernel::KernelVersion::current();
    let why = |on: bool, switch: bool, env: &str, min: &str| {
        if on {
            "on".to_string()
        } else if switch {
            format!("off ({env} set): single datagrams")
        } else {
            format!("off (kernel {kernel}, needs {min}): single datagrams")
        }
    };
    tracing::info!(
        "UDP GRO {}, UDP GSO {}",
        why(off.gro, cfg.no_gro, "VPNRELAY_NO_GRO", "5.0"),
        why(off.gso, cfg.no_gso, "VPNRELAY_NO_GSO", "4.18")
    );
    for key in ["net.core.rmem_max", "net.core.wmem_max"] {
        if let Some(max) = read_sysctl(key) {
            if max < cfg.sockbuf {
                tracing::warn!(
                    "{key} = {max} caps socket buffers below VPNRELAY_SOCKBUF = {} (as root: sysctl -w {key}={})",
                    cfg.sockbuf,
                    cfg.sockbuf
                );
            }
        }
    }
    tracing::info!(
        "IPv4 tunnels only: IPv6 UDP to ports {} keeps Docker's normal path",
        cfg.ports.to_compact_string()
    );
    off
}

fn kill_and_wait(child: &mut Child, grace: Duration) -> io::Result<ExitStatus> {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let until = Instant::now() + grace;
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(s);
        }
        if Instant::now() > until {
            let _ = child.kill();
            return child.wait();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `vpnrelay transparent`: the relay in the foreground until SIGTERM/SIGINT (SIGHUP is logged
/// and changes nothing).
pub fn transparent(cfg: &Config) -> anyhow::Result<()> {
    let rl = Rootless::find()?;
    let lock_path = state::lock_path("relay", &cfg.bridge);
    let _lock = match Lock::try_take(&lock_path)? {
        TryLock::Taken(l) => l,
        TryLock::Busy(pid) => bail!(
            "a relay for bridge {:?} already runs{} (lock {})",
            cfg.bridge,
            pid.map(|p| format!(" (pid {p})")).unwrap_or_default(),
            lock_path.display()
        ),
    };
    let off = announce(cfg);
    let mut st = spawn_child(Mode::Relay, cfg, &rl)?;
    let ready = wait_status(&mut st)?;
    tracing::info!(
        "relay running in RootlessKit child PID {}{}: {ready}",
        rl.child_pid,
        if rl.netns_file.is_some() {
            " (detached netns)"
        } else {
            ""
        }
    );
    let ctl = st.ctl.try_clone()?;
    let c2 = cfg.clone();
    let server = std::thread::Builder::new()
        .name("host-sockets".into())
        .spawn(move || serve(ctl, c2, off.gro))?;
    let result = loop {
        if let Some(sig) = nsfast_sys::signals::pending_stop() {
            tracing::info!("{sig}: stopping the relay");
            let status = kill_and_wait(&mut st.child, Duration::from_secs(10))?;
            if !status.success() {
                tracing::warn!("relay child exited with {status}; cleaning up");
                let _ = cleanup_now(cfg, &rl);
            }
            break Ok(());
        }
        if let Some(status) = st.child.try_wait()? {
            tracing::error!("relay child exited unexpectedly ({status}); removing its rule and resetting conntrack");
            if let Err(e) = cleanup_now(cfg, &rl) {
                tracing::error!("cleanup after the relay child failed: {e:#}");
            }
            break Err(anyhow!("relay child exited unexpectedly ({status})"));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(st);
    let _ = server.join();
    result
}

fn cleanup_now(cfg: &Config, rl: &Rootless) -> anyhow::Result<String> {
    let mut st = spawn_child(Mode::Cleanup, cfg, rl)?;
    let done = wait_status(&mut st)?;
    let _ = st.child.wait();
    Ok(done)
}

/// `vpnrelay cleanup`: removes a stale rule and resets conntrack, unless a relay runs.
pub fn cleanup(cfg: &Config) -> anyhow::Result<()> {
    let rl = Rootless::find()?;
    let lock_path = state::lock_path("relay", &cfg.bridge);
    let _lock = match Lock::try_take(&lock_path)? {
        TryLock::Taken(l) => l,
        TryLock::Busy(pid) => {
            tracing::info!(
                "a relay for bridge {:?} runs{}: nothing to clean up",
                cfg.bridge,
                pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
            );
            return Ok(());
        }
    };
    let done = cleanup_now(cfg, &rl)?;
    tracing::info!("cleanup of {}: {done}", cfg.bridge);
    Ok(())
}
