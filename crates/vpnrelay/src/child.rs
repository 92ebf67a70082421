//! The part that runs inside the rootless namespaces (user, mount, network), started by the
//! parent with [`nsfast_sys::userns::Target`]. It holds CAP_NET_ADMIN over the rootless
//! network namespace only; host sockets come from the parent over the control socket.
//!
//! Control protocol (SOCK_SEQPACKET, one text message each):
//! child → parent: `ready <text>`, `error <text>`, `done <text>`, `open <id> <server>`;
//! parent → child: `sock <id> <host-local-addr>` with the socket attached, or `fail <id> <text>`.

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use nsfast_sys::conntrack::{Conntrack, Entry};
use nsfast_sys::net::{self, NetError, PortRule};
use nsfast_sys::udp;
use socket2::{Domain, Protocol, Socket, Type};

use crate::config::Config;
use crate::flow::{Flow, Offloads};

/// What the child was started for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Relay,
    Cleanup,
}

/// Child errors (sent to the parent as `error <text>`).
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    #[error("no bridge {0:?} in the rootless network namespace (the Docker network's bridge of the VPN container: see `docker network inspect -f '{{{{.Id}}}}'`, bridges are named br-<first 12 characters of the id>)")]
    NoBridge(String),
    #[error("{what}: {source}")]
    Net {
        what: String,
        #[source]
        source: NetError,
    },
    #[error("cannot open a transparent UDP socket on port {port} in the rootless network namespace: {source} (needs CAP_NET_ADMIN there)")]
    Listener {
        port: u16,
        #[source]
        source: io::Error,
    },
    #[error("conntrack: {0}")]
    Conntrack(#[from] nsfast_sys::conntrack::ConntrackError),
    #[error("control socket: {0}")]
    Control(#[source] io::Error),
}

fn send_msg(sock: BorrowedFd<'_>, msg: &str) -> io::Result<()> {
    nix::sys::socket::send(
        sock.as_raw_fd(),
        msg.as_bytes(),
        nix::sys::socket::MsgFlags::empty(),
    )
    .map(drop)
    .map_err(io::Error::from)
}

fn in_subnet(ip: Ipv4Addr, net: Ipv4Addr, prefix: u8) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix.min(32)))
    };
    u32::from(ip) & mask == u32::from(net) & mask
}

/// The conntrack entries of the bridge's tunnels: UDP to one of the ports, from one of the
/// bridge's subnets (from anywhere if the bridge has no IPv4 address).
fn is_tunnel(cfg: &Config, subnets: &[(Ipv4Addr, u8)], e: &Entry) -> bool {
    e.orig.proto == libc::IPPROTO_UDP as u8
        && cfg.ports.contains(e.orig.dport)
        && (subnets.is_empty() || subnets.iter().any(|&(n, p)| in_subnet(e.orig.src, n, p)))
}

/// Deletes the bridge's tunnel entries that are wrong for the path now in force: NATed ones
/// (Docker's path) when the relay takes over, un-NATed ones (the relay's) when it hands back.
pub fn conntrack_handover(
    cfg: &Config,
    subnets: &[(Ipv4Addr, u8)],
    to_relay: bool,
) -> Result<usize, ChildError> {
    let mut ct = Conntrack::open()?;
    Ok(ct.delete_where(|e| is_tunnel(cfg, subnets, e) && e.is_src_nat() == to_relay)?)
}

fn bridge_subnets(cfg: &Config) -> Result<Vec<(Ipv4Addr, u8)>, ChildError> {
    match net::link_ipv4_addresses(None, &cfg.bridge) {
        Ok(v) => Ok(v),
        Err(NetError::NoSuchLink(_)) => Err(ChildError::NoBridge(cfg.bridge.clone())),
        Err(source) => Err(ChildError::Net {
            what: format!("addresses of {}", cfg.bridge),
            source,
        }),
    }
}

fn install_rules(cfg: &Config) -> Result<(), ChildError> {
    let err = |what: String| move |source| ChildError::Net { what, source };
    net::add_local_default_route(None, cfg.rule)
        .map_err(err(format!("local route in table {}", cfg.rule)))?;
    for (start, end) in cfg.port_ranges() {
        net::add_port_rule(
            None,
            &PortRule {
                iif: cfg.bridge.clone(),
                ip_proto: libc::IPPROTO_UDP as u8,
                dport: (start, end),
                table: cfg.rule,
                priority: cfg.rule,
            },
        )
        .map_err(err(format!(
            "ip rule iif {} dport {start}-{end}",
            cfg.bridge
        )))?;
    }
    Ok(())
}

/// Removes the rules and the table's route; returns how many rules there were.
pub fn remove_rules(cfg: &Config) -> Result<usize, ChildError> {
    let err = |what: String| move |source| ChildError::Net { what, source };
    let n = net::delete_port_rules(None, &cfg.bridge, cfg.rule, cfg.rule)
        .map_err(err(format!("delete rules of {}", cfg.bridge)))?;
    // The route is shared by all bridges using this table: keep it while other rules use it.
    let others = net::count_any_rules_to_table(None, cfg.rule)
        .map_err(err(format!("list rules to table {}", cfg.rule)))?;
    if others == 0 {
        net::delete_local_default_route(None, cfg.rule)
            .map_err(err(format!("local route in table {}", cfg.rule)))?;
    }
    Ok(n)
}

fn listener(port: u16, sockbuf: usize) -> Result<UdpSocket, ChildError> {
    let mk = || -> io::Result<UdpSocket> {
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
        udp::set_reuseaddr(s.as_fd())?;
        udp::set_transparent(s.as_fd())?;
        udp::set_recv_orig_dst(s.as_fd())?;
        let _ = udp::set_buffers(s.as_fd(), sockbuf);
        s.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)).into())?;
        s.set_nonblocking(true)?;
        Ok(s.into())
    };
    mk().map_err(|source| ChildError::Listener { port, source })
}

/// The rootless side of a flow: bound to the server's address (IP_TRANSPARENT), connected
/// to the client, so the kernel delivers the flow's datagrams to it rather than to the
/// listener.
fn flow_socket(
    client: SocketAddrV4,
    server: SocketAddrV4,
    cfg: &Config,
    gro: bool,
) -> io::Result<UdpSocket> {
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    udp::set_reuseaddr(s.as_fd())?;
    udp::set_transparent(s.as_fd())?;
    let _ = udp::set_buffers(s.as_fd(), cfg.sockbuf);
    if gro {
        udp::enable_gro(s.as_fd())?;
    }
    s.bind(&SocketAddr::V4(server).into())?;
    s.connect(&SocketAddr::V4(client).into())?;
    Ok(s.into())
}

/// Asks the parent for a host socket connected to `server`.
fn open_host(
    ctl: BorrowedFd<'_>,
    id: u64,
    server: SocketAddrV4,
) -> io::Result<(UdpSocket, SocketAddrV4)> {
    send_msg(ctl, &format!("open {id} {server}"))?;
    let mut buf = [0u8; 512];
    let (n, fd) = udp::recv_fd(ctl, &mut buf)?;
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::BrokenPipe,
            "parent closed the control socket",
        ));
    }
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    let mut it = text.splitn(3, ' ');
    match (
        it.next(),
        it.next().and_then(|s| s.parse::<u64>().ok()),
        it.next(),
        fd,
    ) {
        (Some("sock"), Some(rid), Some(addr), Some(fd)) if rid == id => {
            let local = addr
                .parse()
                .unwrap_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
            Ok((UdpSocket::from(fd), local))
        }
        _ => Err(io::Error::other(format!("parent: {text}"))),
    }
}

/// Runs the child; returns the process exit code. Reports to the parent on `ctl`.
pub fn run(mode: Mode, cfg: &Config, ctl: OwnedFd) -> i32 {
    let res = match mode {
        Mode::Relay => relay(cfg, ctl.as_fd()),
        Mode::Cleanup => cleanup(cfg, ctl.as_fd()),
    };
    match res {
        Ok(()) => 0,
        Err(e) => {
            if send_msg(ctl.as_fd(), &format!("error {e}")).is_err() {
                eprintln!("vpnrelay: error: {e}");
            }
            2
        }
    }
}

fn cleanup(cfg: &Config, ctl: BorrowedFd<'_>) -> Result<(), ChildError> {
    let subnets = bridge_subnets(cfg)?;
    let rules = remove_rules(cfg)?;
    let ct = conntrack_handover(cfg, &subnets, false)?;
    send_msg(
        ctl,
        &format!(
            "done removed {rules} rule(s), reset {ct} conntrack entr{}",
            if ct == 1 { "y" } else { "ies" }
        ),
    )
    .map_err(ChildError::Control)
}

/// Whether offloads are on, after the switches and the kernel's say.
pub fn offloads(cfg: &Config) -> Offloads {
    let probe = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).ok();
    let gso = !cfg.no_gso && probe.as_ref().is_some_and(|s| udp::probe_gso(s.as_fd()));
    let gro = !cfg.no_gro
        && probe
            .as_ref()
            .is_some_and(|s| udp::enable_gro(s.as_fd()).unwrap_or(false));
    Offloads { gro, gso }
}

struct Relay<'a> {
    cfg: &'a Config,
    subnets: Vec<(Ipv4Addr, u8)>,
    ctl: BorrowedFd<'a>,
    offloads: Offloads,
    flows: HashMap<(SocketAddrV4, SocketAddrV4), Flow>,
    refused: HashSet<(SocketAddrV4, SocketAddrV4)>,
    next_id: u64,
}

impl Relay<'_> {
    fn datagram(&mut self, data: &[u8], client: SocketAddrV4, server: SocketAddrV4) {
        // A datagram still matching a NATed conntrack entry during the hand-over arrives
        // with the rootless namespace's own address as source: not a client of the bridge.
        if !self.subnets.is_empty()
            && !self
                .subnets
                .iter()
                .any(|&(n, p)| in_subnet(*client.ip(), n, p))
        {
            tracing::debug!(
                "ignoring {client} -> {server}: not from {}",
                self.cfg.bridge
            );
            return;
        }
        let key = (client, server);
        if let Some(f) = self.flows.get(&key) {
            f.touch();
            let _ = f.host.send(data);
            return;
        }
        if self.flows.len() >= self.cfg.max_flows {
            if self.refused.insert(key) {
                tracing::warn!(
                    "flow limit reached ({} flows): refusing flow {client} -> {server}",
                    self.cfg.max_flows
                );
            }
            return;
        }
        self.next_id += 1;
        let (host, host_local) = match open_host(self.ctl, self.next_id, server) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!("flow {client} -> {server}: no host socket: {e}");
                return;
            }
        };
        let local = match flow_socket(client, server, self.cfg, self.offloads.gro) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("flow {client} -> {server}: transparent socket: {e}");
                return;
            }
        };
        let _ = host.send(data);
        match Flow::start(client, server, host_local, local, host, self.offloads) {
            Ok(f) => {
                tracing::info!(
                    "flow {client} -> {server} (host socket {host_local}; {} flow(s))",
                    self.flows.len() + 1
                );
                f.touch();
                self.flows.insert(key, f);
            }
            Err(e) => tracing::warn!("flow {client} -> {server}: threads: {e}"),
        }
    }

    fn reap(&mut self) {
        let idle = self.cfg.idle;
        let gone: Vec<_> = self
            .flows
            .iter()
            .filter(|(_, f)| f.idle() >= idle || f.is_dead())
            .map(|(k, _)| *k)
            .collect();
        let closing: Vec<(Flow, String)> = gone
            .into_iter()
            .filter_map(|k| self.flows.remove(&k))
            .map(|f| {
                let why = if f.is_dead() {
                    "forwarding error".to_string()
                } else {
                    format!("idle for {} s", f.idle().as_secs())
                };
                f.signal_stop();
                (f, why)
            })
            .collect();
        if !closing.is_empty() {
            self.refused.clear();
        }
        for (f, why) in closing {
            let (c, s) = (f.client, f.server);
            let up = f.up.datagrams.load(std::sync::atomic::Ordering::Relaxed);
            let down = f.down.datagrams.load(std::sync::atomic::Ordering::Relaxed);
            f.stop();
            tracing::info!("flow {c} -> {s} closed: {why} ({up} datagrams up, {down} down)");
        }
    }
}

fn relay(cfg: &Config, ctl: BorrowedFd<'_>) -> Result<(), ChildError> {
    let subnets = bridge_subnets(cfg)?;
    let listeners: Vec<UdpSocket> = cfg
        .ports
        .iter()
        .map(|p| listener(p, cfg.sockbuf))
        .collect::<Result<_, _>>()?;
    // Bound until the parent answers; a dead parent must not leave us waiting.
    udp::set_recv_timeout(ctl, Duration::from_secs(10)).map_err(ChildError::Control)?;
    install_rules(cfg).inspect_err(|_| {
        let _ = remove_rules(cfg);
    })?;
    let handed = match conntrack_handover(cfg, &subnets, true) {
        Ok(n) => n,
        Err(e) => {
            let _ = remove_rules(cfg);
            return Err(e);
        }
    };
    let offloads = offloads(cfg);
    send_msg(
        ctl,
        &format!(
            "ready rule iif {} udp dport {} -> table {} (priority {}); moved {handed} tunnel(s) to the relay",
            cfg.bridge,
            cfg.ports.to_compact_string(),
            cfg.rule,
            cfg.rule
        ),
    )
    .map_err(ChildError::Control)?;

    let mut r = Relay {
        cfg,
        subnets: subnets.clone(),
        ctl,
        offloads,
        flows: HashMap::new(),
        refused: HashSet::new(),
        next_id: 0,
    };
    let mut rx = udp::RecvBatch::new(8);
    let mut pfds: Vec<libc::pollfd> = listeners
        .iter()
        .map(|l| libc::pollfd {
            fd: l.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let stop_signal = loop {
        if let Some(sig) = nsfast_sys::signals::pending_termination() {
            break sig;
        }
        // SAFETY: `pfds` is a valid array of pollfd of the given length for the call.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 250) };
        if n > 0 {
            for (i, p) in pfds.iter_mut().enumerate() {
                if p.revents & libc::POLLIN == 0 {
                    continue;
                }
                p.revents = 0;
                while let Ok(got) = rx.recv(listeners[i].as_fd()) {
                    for k in 0..got {
                        let (data, meta) = rx.get(k);
                        let (Some(client), Some(server)) = (meta.src, meta.orig_dst) else {
                            continue;
                        };
                        let data = data.to_vec();
                        r.datagram(&data, client, server);
                    }
                }
            }
        }
        r.reap();
    };
    tracing::info!("{stop_signal}: handing tunnels back to Docker's path");
    let rules = remove_rules(cfg);
    let flows: Vec<Flow> = r.flows.drain().map(|(_, f)| f).collect();
    flows.iter().for_each(Flow::signal_stop);
    flows.into_iter().for_each(Flow::stop);
    drop(listeners);
    let ct = conntrack_handover(cfg, &subnets, false);
    let rules = rules?;
    let ct = ct?;
    let _ = send_msg(
        ctl,
        &format!("done removed {rules} rule(s), reset {ct} conntrack entries"),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnet_match() {
        assert!(in_subnet(
            Ipv4Addr::new(172, 30, 0, 2),
            Ipv4Addr::new(172, 30, 0, 1),
            24
        ));
        assert!(!in_subnet(
            Ipv4Addr::new(172, 31, 0, 2),
            Ipv4Addr::new(172, 30, 0, 1),
            24
        ));
        assert!(in_subnet(
            Ipv4Addr::new(1, 2, 3, 4),
            Ipv4Addr::new(9, 9, 9, 9),
            0
        ));
    }
}
