//! The part that runs inside the rootless namespaces (user, mount, network), started by the
//! parent with [`nsfast_sys::userns::Target`]. It holds CAP_NET_ADMIN over the rootless
//! network namespace only; host sockets come from the parent over the control socket.
//!
//! Control protocol (SOCK_SEQPACKET, one text message each):
//! child → parent: `ready <text>`, `error <text>`, `done <text>`, `open <id> <server>`,
//! `stats <json>` (flow counters, about once a second);
//! parent → child: `sock <id> <host-local-addr>` with the socket attached, or `fail <id> <text>`.
//! Request IDs increase; a reply that arrives after its request timed out carries an older
//! ID and is discarded (its socket closed), so it never answers a later request.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use nsfast_sys::conntrack::{Conntrack, Entry};
use nsfast_sys::net::{NetError, Netlink, PortRule};
use nsfast_sys::nftables::Nftables;
use nsfast_sys::udp;
use socket2::{Domain, Protocol, Socket, Type};

use crate::client::{self, Client, Keying, Refusal};
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
pub(crate) fn conntrack_handover(
    cfg: &Config,
    subnets: &[(Ipv4Addr, u8)],
    to_relay: bool,
) -> Result<usize, ChildError> {
    let mut ct = Conntrack::open()?;
    Ok(ct.delete_where(|e| is_tunnel(cfg, subnets, e) && e.is_src_nat() == to_relay)?)
}

/// The child's one netlink connection (its namespace: the rootless network namespace),
/// opened once per run (relay or cleanup) and used for every rule and route change.
fn netlink() -> Result<Netlink, ChildError> {
    Netlink::current().map_err(|source| ChildError::Net {
        what: "open a netlink connection".into(),
        source,
    })
}

fn bridge_subnets(nl: &Netlink, cfg: &Config) -> Result<Vec<(Ipv4Addr, u8)>, ChildError> {
    match nl.link_ipv4_addresses(&cfg.bridge) {
        Ok(v) => Ok(v),
        Err(NetError::NoSuchLink(_)) => Err(ChildError::NoBridge(cfg.bridge.clone())),
        Err(source) => Err(ChildError::Net {
            what: format!("addresses of {}", cfg.bridge),
            source,
        }),
    }
}

fn install_rules(nl: &Netlink, cfg: &Config) -> Result<(), ChildError> {
    let err = |what: String| move |source| ChildError::Net { what, source };
    nl.add_local_default_route(cfg.rule)
        .map_err(err(format!("local route in table {}", cfg.rule)))?;
    for (start, end) in cfg.port_ranges() {
        nl.add_port_rule(&PortRule {
            iif: cfg.bridge.clone(),
            ip_proto: libc::IPPROTO_UDP as u8,
            dport: (start, end),
            table: cfg.rule,
            priority: cfg.rule,
            from: None,
        })
        .map_err(err(format!(
            "ip rule iif {} dport {start}-{end}",
            cfg.bridge
        )))?;
    }
    Ok(())
}

/// Removes the rules and the table's route; returns how many rules there were.
pub(crate) fn remove_rules(nl: &Netlink, cfg: &Config) -> Result<usize, ChildError> {
    let err = |what: String| move |source| ChildError::Net { what, source };
    let n = nl
        .delete_port_rules(&cfg.bridge, cfg.rule, cfg.rule)
        .map_err(err(format!("delete rules of {}", cfg.bridge)))?;
    // The hand-back rules of refused flows: those flows stay on Docker's path anyway.
    nl.delete_port_rules(&cfg.bridge, MAIN_TABLE, cfg.handback_priority())
        .map_err(err(format!("delete hand-back rules of {}", cfg.bridge)))?;
    // The port-mark table (absent when the kernel could not take it: nothing to do then).
    if let Err(e) = Nftables::open().and_then(|mut t| t.delete_table(&port_mark_table(cfg))) {
        tracing::debug!("port-mark table {}: {e}", port_mark_table(cfg));
    }
    // The route is shared by all bridges using this table: keep it while other rules use it.
    let others = nl
        .count_any_rules_to_table(cfg.rule)
        .map_err(err(format!("list rules to table {}", cfg.rule)))?;
    if others == 0 {
        nl.delete_local_default_route(cfg.rule)
            .map_err(err(format!("local route in table {}", cfg.rule)))?;
    }
    Ok(n)
}

/// The bridge-family nf_tables table that marks the bridge's frames with their port.
pub(crate) fn port_mark_table(cfg: &Config) -> String {
    format!("vpnrelay-{}", cfg.bridge)
}

/// Sets up what tells clients apart by bridge port (see [`crate::client`]): the port-mark
/// table and `SO_RCVMARK` on every listener. Where the kernel refuses either, clients are
/// told apart by source address, with a warning.
fn port_keying(cfg: &Config, subnets: &[(Ipv4Addr, u8)], listeners: &[UdpSocket]) -> Keying {
    let marks = listeners
        .iter()
        .try_for_each(|l| udp::set_recv_mark(l.as_fd()))
        .map_err(|e| format!("SO_RCVMARK (Linux >= 5.19): {e}"))
        .and_then(|()| {
            Nftables::open()
                .and_then(|mut t| t.set_port_marks(&port_mark_table(cfg), subnets))
                .map_err(|e| e.to_string())
        });
    match marks {
        Ok(()) => {
            tracing::info!(
                "clients are told apart by bridge port (nf_tables bridge table {} marks frames with their port)",
                port_mark_table(cfg)
            );
            Keying::Port
        }
        Err(e) => {
            tracing::warn!(
                "cannot learn the bridge port of a datagram ({e}): the per-client quota goes by source address, which a container with CAP_NET_RAW can forge"
            );
            Keying::Address
        }
    }
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

/// How long the child waits for the parent's answer to `open`.
pub(crate) const PARENT_TIMEOUT: Duration = Duration::from_secs(10);

/// Waits until `fd` is readable, at most `left`.
fn wait_readable(fd: BorrowedFd<'_>, left: Duration) -> io::Result<bool> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::from(ms)) {
        Ok(n) => Ok(n > 0),
        Err(nix::errno::Errno::EINTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Asks the parent for a host socket connected to `server` (request `id`) and waits at most
/// `timeout` for the reply with that ID. Replies to earlier requests (which timed out) are
/// discarded with their socket.
pub(crate) fn open_host(
    ctl: BorrowedFd<'_>,
    id: u64,
    server: SocketAddrV4,
    timeout: Duration,
) -> io::Result<(UdpSocket, SocketAddrV4)> {
    send_msg(ctl, &format!("open {id} {server}"))?;
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 512];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || !wait_readable(ctl, left)? {
            if Instant::now() < deadline {
                continue;
            }
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no answer from the parent within {} s",
                    timeout.as_secs_f64()
                ),
            ));
        }
        let (n, fd) = udp::recv_fd(ctl, &mut buf)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "parent closed the control socket",
            ));
        }
        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
        let mut it = text.splitn(3, ' ');
        let (kind, rid, rest) = (
            it.next(),
            it.next().and_then(|s| s.parse::<u64>().ok()),
            it.next(),
        );
        match rid {
            Some(rid) if rid < id => {
                tracing::debug!("discarding a late reply to request {rid}: {text:?}");
                continue;
            }
            Some(rid) if rid == id => {}
            _ => {
                return Err(io::Error::other(format!(
                    "unexpected reply from the parent: {text:?}"
                )))
            }
        }
        return match (kind, rest, fd) {
            (Some("sock"), Some(addr), Some(fd)) => {
                let local = addr
                    .parse()
                    .unwrap_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
                Ok((UdpSocket::from(fd), local))
            }
            _ => Err(io::Error::other(format!("parent: {text}"))),
        };
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
    let nl = netlink()?;
    let subnets = bridge_subnets(&nl, cfg)?;
    let rules = remove_rules(&nl, cfg)?;
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

/// The main routing table, where a refused flow is sent back to (Docker's normal path).
const MAIN_TABLE: u32 = 254;

/// A refused flow handed back to Docker's path by a rule of its own.
struct HandedBack {
    /// When to look again whether it is still used and whether it could come back.
    recheck: Instant,
    /// The client it counts against.
    client: Client,
}

/// A flow in the relay and the client it counts against.
struct Open {
    client: Client,
    flow: Flow,
}

/// Running totals of the relay (closed flows included).
#[derive(Default, Clone, Copy)]
struct Totals {
    flows_opened: u64,
    handed_back: u64,
    refused_dropped: u64,
    up: (u64, u64),
    down: (u64, u64),
}

struct Relay<'a> {
    cfg: &'a Config,
    nl: &'a Netlink,
    subnets: Vec<(Ipv4Addr, u8)>,
    ctl: BorrowedFd<'a>,
    offloads: Offloads,
    /// What clients are told apart by.
    keying: Keying,
    /// The bridge's interface index (ports are the links whose master it is).
    bridge_index: Option<u32>,
    /// Interface indexes seen in marks: the port's name, or `None` when the index is not a
    /// port of the bridge (bounded: cleared when it grows past 256).
    ports: HashMap<u32, Option<String>>,
    flows: HashMap<(SocketAddrV4, SocketAddrV4), Open>,
    /// Refused flows now on Docker's path (bounded: [`crate::config::MAX_HANDED_BACK`]).
    handed: HashMap<(SocketAddrV4, SocketAddrV4), HandedBack>,
    /// Clients whose excess flows were dropped, and until when that is not logged again
    /// (bounded by the number of clients on the bridge; cleared when it grows past 256).
    drop_logged: HashMap<Client, Instant>,
    totals: Totals,
    next_id: u64,
    parent_timeout: Duration,
    last_stats: Option<String>,
}

fn udp_tuple(client: SocketAddrV4, server: SocketAddrV4) -> nsfast_sys::conntrack::Tuple {
    nsfast_sys::conntrack::Tuple {
        src: *client.ip(),
        dst: *server.ip(),
        proto: libc::IPPROTO_UDP as u8,
        sport: client.port(),
        dport: server.port(),
    }
}

impl Relay<'_> {
    /// The name of bridge port `index`, or `None` when it is not a port of the bridge.
    fn port(&mut self, index: u32) -> Option<String> {
        if let Some(p) = self.ports.get(&index) {
            return p.clone();
        }
        let name = match self.nl.link_by_index(index) {
            Ok(Some((name, master))) if master.is_some() && master == self.bridge_index => {
                Some(name)
            }
            Ok(_) => None,
            Err(e) => {
                // Not cached: the next datagram asks again.
                tracing::warn!("link {index}: {e}");
                return None;
            }
        };
        if self.ports.len() > 256 {
            self.ports.clear();
        }
        self.ports.insert(index, name.clone());
        name
    }

    /// The client a datagram from `src` with packet mark `mark` counts against.
    fn client_of(&mut self, mark: Option<u32>, src: Ipv4Addr) -> Client {
        let mut known = false;
        if let (Keying::Port, Some(m)) = (self.keying, mark) {
            known = m != 0 && self.port(m).is_some();
        }
        client::of_datagram(self.keying, mark, src, |_| known)
    }

    /// The port's name of a [`Client::Port`], as the log and the stats show it.
    fn port_name(&self, c: &Client) -> Option<String> {
        match c {
            Client::Port(i) => Some(
                self.ports
                    .get(i)
                    .cloned()
                    .flatten()
                    .unwrap_or_else(|| format!("ifindex {i}")),
            ),
            _ => None,
        }
    }

    /// `port vb0`, `an unknown bridge port`, `client 172.30.0.2`.
    fn describe(&self, c: &Client) -> String {
        match c {
            Client::Port(_) => format!("port {}", self.port_name(c).unwrap_or_default()),
            Client::UnknownPort => "an unknown bridge port".into(),
            Client::Address(a) => format!("client {a}"),
        }
    }

    /// Why a new flow of `client` would be refused now, if it would.
    fn refusal(&self, client: &Client) -> Option<String> {
        let why = client::refusal(
            self.flows.values().map(|o| &o.client),
            self.cfg.max_flows,
            self.cfg.max_flows_per_client,
            client,
        )?;
        Some(match why {
            Refusal::TableFull => format!("flow limit reached ({} flows)", self.cfg.max_flows),
            Refusal::QuotaFull(held) => format!(
                "{} holds {held} flows (VPNRELAY_MAX_FLOWS_PER_CLIENT={})",
                self.describe(client),
                self.cfg.max_flows_per_client
            ),
        })
    }

    fn handback_rule(&self, client: SocketAddrV4, server: SocketAddrV4) -> PortRule {
        PortRule {
            iif: self.cfg.bridge.clone(),
            ip_proto: libc::IPPROTO_UDP as u8,
            dport: (server.port(), server.port()),
            table: MAIN_TABLE,
            priority: self.cfg.handback_priority(),
            from: Some(client),
        }
    }

    /// Sends a refused flow back to Docker's normal path: a rule `iif BRIDGE from CLIENT
    /// sport P dport Q lookup main` before the relay's own, and its conntrack entry (made by
    /// local delivery to the relay) reset, so its next datagram is forwarded and NATed as if
    /// the relay were not there. Bounded; beyond the bounds the flow is dropped (logged once
    /// per client and idle period).
    fn hand_back(&mut self, key: (SocketAddrV4, SocketAddrV4), who: Client, why: &str) {
        let (client, server) = key;
        let of_client = self.handed.values().filter(|h| h.client == who).count();
        let full = if self.handed.len() >= crate::config::MAX_HANDED_BACK {
            Some(format!(
                "{} refused flows already on Docker's path",
                crate::config::MAX_HANDED_BACK
            ))
        } else if of_client >= crate::config::MAX_HANDED_BACK_PER_CLIENT {
            Some(format!(
                "{of_client} refused flows of {} already on Docker's path",
                self.describe(&who)
            ))
        } else {
            None
        };
        let added = match full {
            Some(f) => Err(f),
            None => self
                .nl
                .add_port_rule(&self.handback_rule(client, server))
                .map_err(|e| format!("hand-back rule: {e}")),
        };
        if let Err(e) = added {
            self.totals.refused_dropped += 1;
            let now = Instant::now();
            if self.drop_logged.len() > 256 {
                self.drop_logged.clear();
            }
            let due = self.drop_logged.get(&who).is_none_or(|&t| t <= now);
            if due {
                self.drop_logged.insert(who, now + self.cfg.idle);
                tracing::warn!(
                    "{why}: refusing flow {client} -> {server} and dropping it ({e}); further drops of {} are not logged for {} s",
                    self.describe(&who),
                    self.cfg.idle.as_secs()
                );
            }
            return;
        }
        let reset = Conntrack::open()
            .and_then(|mut ct| ct.delete(&udp_tuple(client, server), 0))
            .map_err(|e| tracing::warn!("flow {client} -> {server}: conntrack reset: {e}"));
        let _ = reset;
        self.handed.insert(
            key,
            HandedBack {
                recheck: Instant::now() + self.cfg.idle,
                client: who,
            },
        );
        self.totals.handed_back += 1;
        tracing::warn!(
            "{why}: refusing flow {client} -> {server}: it keeps Docker's normal path ({} refused flow(s) there)",
            self.handed.len()
        );
    }

    /// Takes a refused flow off Docker's path again: rule first, then its (NATed) conntrack
    /// entry, so its next datagram reaches the relay with its own source.
    fn take_back(&mut self, key: (SocketAddrV4, SocketAddrV4), reset: bool) {
        let (client, server) = key;
        if let Err(e) = self.nl.delete_port_rules_from(
            &self.cfg.bridge,
            MAIN_TABLE,
            self.cfg.handback_priority(),
            client,
        ) {
            tracing::warn!("flow {client} -> {server}: removing its hand-back rule: {e}");
            return;
        }
        self.handed.remove(&key);
        if reset {
            if let Err(e) =
                Conntrack::open().and_then(|mut ct| ct.delete(&udp_tuple(client, server), 0))
            {
                tracing::warn!("flow {client} -> {server}: conntrack reset: {e}");
            }
        }
    }

    /// Handed-back flows due for a look: unused ones (no conntrack entry any more) lose their
    /// rule; used ones come back to the relay if there is room now, else stay.
    fn recheck_handed(&mut self) {
        let now = Instant::now();
        let due: Vec<_> = self
            .handed
            .iter()
            .filter(|(_, h)| h.recheck <= now)
            .map(|(k, h)| (*k, h.client))
            .collect();
        if due.is_empty() {
            return;
        }
        let live: Option<std::collections::HashSet<_>> = Conntrack::open()
            .and_then(|mut ct| ct.dump())
            .map(|v| v.into_iter().map(|e| e.orig).collect())
            .map_err(|e| tracing::warn!("conntrack dump: {e}"))
            .ok();
        for (key, who) in due {
            let used = live
                .as_ref()
                .is_none_or(|l| l.contains(&udp_tuple(key.0, key.1)));
            if !used {
                tracing::info!(
                    "refused flow {} -> {} is gone from Docker's path",
                    key.0,
                    key.1
                );
                self.take_back(key, false);
            } else if self.refusal(&who).is_none() {
                tracing::info!(
                    "room in the relay again: moving flow {} -> {} back from Docker's path",
                    key.0,
                    key.1
                );
                self.take_back(key, true);
            } else if let Some(h) = self.handed.get_mut(&key) {
                h.recheck = now + self.cfg.idle;
            }
        }
    }

    fn datagram(
        &mut self,
        data: &[u8],
        client: SocketAddrV4,
        server: SocketAddrV4,
        mark: Option<u32>,
    ) {
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
        if let Some(o) = self.flows.get(&key) {
            o.flow.forward(data);
            return;
        }
        if self.handed.contains_key(&key) {
            // Sent before its hand-back rule went in: the flow is on Docker's path now.
            return;
        }
        let who = self.client_of(mark, *client.ip());
        if let Some(why) = self.refusal(&who) {
            self.hand_back(key, who, &why);
            return;
        }
        self.next_id += 1;
        let (host, host_local) =
            match open_host(self.ctl, self.next_id, server, self.parent_timeout) {
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
        match Flow::start(client, server, host_local, local, host, self.offloads) {
            Ok(f) => {
                tracing::info!(
                    "flow {client} -> {server} (host socket {host_local}; {} flow(s); from {})",
                    self.flows.len() + 1,
                    self.describe(&who)
                );
                f.forward(data);
                self.totals.flows_opened += 1;
                self.flows.insert(
                    key,
                    Open {
                        client: who,
                        flow: f,
                    },
                );
            }
            Err(e) => tracing::warn!("flow {client} -> {server}: threads: {e}"),
        }
    }

    fn close(&mut self, f: Flow, why: &str) {
        let (c, s) = (f.client, f.server);
        let up = f.up.get();
        let down = f.down.get();
        f.stop();
        self.totals.up.0 += up.0;
        self.totals.up.1 += up.1;
        self.totals.down.0 += down.0;
        self.totals.down.1 += down.1;
        tracing::info!(
            "flow {c} -> {s} closed: {why} ({} datagrams up, {} down; {} bytes up, {} down)",
            up.0,
            down.0,
            up.1,
            down.1
        );
    }

    fn reap(&mut self) {
        let idle = self.cfg.idle;
        let gone: Vec<_> = self
            .flows
            .iter()
            .filter(|(_, o)| o.flow.idle() >= idle || o.flow.is_dead())
            .map(|(k, _)| *k)
            .collect();
        let closing: Vec<(Flow, String)> = gone
            .into_iter()
            .filter_map(|k| self.flows.remove(&k))
            .map(|Open { flow: f, .. }| {
                let why = if f.is_dead() {
                    "forwarding error".to_string()
                } else {
                    format!("idle for {} s", f.idle().as_secs())
                };
                f.signal_stop();
                (f, why)
            })
            .collect();
        for (f, why) in closing {
            self.close(f, &why);
        }
        self.recheck_handed();
    }

    /// The counters as JSON: totals (closed flows included) and each open flow.
    fn stats_json(&self) -> String {
        let mut t = self.totals;
        let flows: Vec<serde_json::Value> = self
            .flows
            .values()
            .map(|Open { client, flow: f }| {
                let (ud, ub) = f.up.get();
                let (dd, db) = f.down.get();
                t.up.0 += ud;
                t.up.1 += ub;
                t.down.0 += dd;
                t.down.1 += db;
                serde_json::json!({
                    "client": f.client.to_string(),
                    "port": self.port_name(client),
                    "server": f.server.to_string(),
                    "host_socket": f.host_local.to_string(),
                    "up_datagrams": ud, "up_bytes": ub,
                    "down_datagrams": dd, "down_bytes": db,
                })
            })
            .collect();
        let handed: Vec<serde_json::Value> = self
            .handed
            .iter()
            .map(|((c, s), h)| {
                serde_json::json!({
                    "client": c.to_string(),
                    "port": self.port_name(&h.client),
                    "server": s.to_string(),
                })
            })
            .collect();
        // Each client with its flows, refused flows and the source addresses of both.
        let mut clients: std::collections::BTreeMap<
            Client,
            (usize, usize, std::collections::BTreeSet<Ipv4Addr>),
        > = Default::default();
        for ((c, _), o) in &self.flows {
            let e = clients.entry(o.client).or_default();
            e.0 += 1;
            e.2.insert(*c.ip());
        }
        for ((c, _), h) in &self.handed {
            let e = clients.entry(h.client).or_default();
            e.1 += 1;
            e.2.insert(*c.ip());
        }
        let clients: Vec<serde_json::Value> = clients
            .iter()
            .map(|(c, (flows, handed, addrs))| {
                serde_json::json!({
                    "port": self.port_name(c),
                    "ifindex": match c { Client::Port(i) => Some(*i), _ => None },
                    "addresses": addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
                    "flows": flows,
                    "handed_back": handed,
                })
            })
            .collect();
        serde_json::json!({
            "schema_version": nsfast_sys::out::SCHEMA_VERSION,
            "bridge": self.cfg.bridge,
            "max_flows": self.cfg.max_flows,
            "max_flows_per_client": self.cfg.max_flows_per_client,
            "client_key": self.keying.as_str(),
            "flows_open": self.flows.len(),
            "flows_opened": t.flows_opened,
            "refused_handed_back": t.handed_back,
            "refused_dropped": t.refused_dropped,
            "up_datagrams": t.up.0, "up_bytes": t.up.1,
            "down_datagrams": t.down.0, "down_bytes": t.down.1,
            "flows": flows,
            "handed_back": handed,
            "clients": clients,
        })
        .to_string()
    }

    /// Sends the counters to the parent when they changed.
    fn report(&mut self) {
        let s = self.stats_json();
        if self.last_stats.as_deref() != Some(s.as_str()) {
            if let Err(e) = send_msg(self.ctl, &format!("stats {s}")) {
                tracing::debug!("stats: {e}");
            }
            self.last_stats = Some(s);
        }
    }
}

fn relay(cfg: &Config, ctl: BorrowedFd<'_>) -> Result<(), ChildError> {
    let nl = netlink()?;
    let subnets = bridge_subnets(&nl, cfg)?;
    let listeners: Vec<UdpSocket> = cfg
        .ports
        .iter()
        .map(|p| listener(p, cfg.sockbuf))
        .collect::<Result<_, _>>()?;
    // Bound until the parent answers; a dead parent must not leave us waiting.
    udp::set_recv_timeout(ctl, PARENT_TIMEOUT).map_err(ChildError::Control)?;
    let keying = port_keying(cfg, &subnets, &listeners);
    let bridge_index = nl.link_index(&cfg.bridge).ok();
    let handed = take_over(&nl, cfg, &subnets)?;
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
        nl: &nl,
        subnets: subnets.clone(),
        ctl,
        offloads,
        keying,
        bridge_index,
        ports: HashMap::new(),
        flows: HashMap::new(),
        handed: HashMap::new(),
        drop_logged: HashMap::new(),
        totals: Totals::default(),
        next_id: 0,
        parent_timeout: PARENT_TIMEOUT,
        last_stats: None,
    };
    let stop_signal = serve(&mut r, &listeners);
    tracing::info!("{stop_signal}: handing tunnels back to Docker's path");
    hand_back(r, listeners, &subnets)
}

/// Installs the steering rule and moves the bridge's live tunnels' conntrack entries to the
/// relay; returns how many were moved. On error the rule is removed again.
fn take_over(nl: &Netlink, cfg: &Config, subnets: &[(Ipv4Addr, u8)]) -> Result<usize, ChildError> {
    install_rules(nl, cfg).inspect_err(|_| {
        let _ = remove_rules(nl, cfg);
    })?;
    match conntrack_handover(cfg, subnets, true) {
        Ok(n) => Ok(n),
        Err(e) => {
            let _ = remove_rules(nl, cfg);
            Err(e)
        }
    }
}

/// Relays datagrams from the transparent listeners until SIGINT/SIGTERM; reaps dead flows and
/// reports once a second. Returns the signal.
fn serve(r: &mut Relay<'_>, listeners: &[UdpSocket]) -> nix::sys::signal::Signal {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut rx = udp::RecvBatch::new(8);
    let mut next_report = Instant::now();
    loop {
        if let Some(sig) = nsfast_sys::signals::pending_stop() {
            return sig;
        }
        let mut pfds: Vec<PollFd<'_>> = listeners
            .iter()
            .map(|l| PollFd::new(l.as_fd(), PollFlags::POLLIN))
            .collect();
        let n = poll(&mut pfds, PollTimeout::from(250u16)).unwrap_or(0);
        let ready: Vec<usize> = if n > 0 {
            pfds.iter()
                .enumerate()
                .filter(|(_, p)| p.revents().is_some_and(|r| r.contains(PollFlags::POLLIN)))
                .map(|(i, _)| i)
                .collect()
        } else {
            Vec::new()
        };
        drop(pfds);
        for i in ready {
            while let Ok(got) = rx.recv(listeners[i].as_fd()) {
                for k in 0..got {
                    let (data, meta) = rx.get(k);
                    let (Some(client), Some(server)) = (meta.src, meta.orig_dst) else {
                        continue;
                    };
                    let data = data.to_vec();
                    let mark = meta.mark;
                    r.datagram(&data, client, server, mark);
                }
            }
        }
        r.reap();
        if Instant::now() >= next_report {
            r.report();
            next_report = Instant::now() + Duration::from_secs(1);
        }
    }
}

/// Hands the tunnels back to Docker's path: the rule goes, every flow stops, the listeners
/// close, the relay's conntrack entries are reset; the parent gets a `done` line.
fn hand_back(
    mut r: Relay<'_>,
    listeners: Vec<UdpSocket>,
    subnets: &[(Ipv4Addr, u8)],
) -> Result<(), ChildError> {
    let (cfg, ctl) = (r.cfg, r.ctl);
    let rules = remove_rules(r.nl, cfg);
    let flows: Vec<Flow> = r.flows.drain().map(|(_, o)| o.flow).collect();
    flows.iter().for_each(Flow::signal_stop);
    for f in flows {
        r.close(f, "relay stopping");
    }
    r.handed.clear();
    r.report();
    drop(listeners);
    let ct = conntrack_handover(cfg, subnets, false);
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

    fn recv_request(parent: BorrowedFd<'_>) -> String {
        let mut buf = [0u8; 256];
        let (n, _) = udp::recv_fd(parent, &mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    fn answer(parent: BorrowedFd<'_>, id: u64) -> SocketAddrV4 {
        let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let SocketAddr::V4(local) = s.local_addr().unwrap() else {
            unreachable!()
        };
        udp::send_fd(parent, format!("sock {id} {local}").as_bytes(), s.as_fd()).unwrap();
        local
    }

    /// The parent answers request 1 only after the child gave up on it (it has seen request
    /// 2, which the child sends after its timeout): the late reply is discarded and requests 2
    /// and 3 get their own sockets.
    #[test]
    fn a_late_parent_reply_does_not_answer_later_requests() {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        let (child, parent) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let server = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9);
        let fake_parent = std::thread::spawn(move || {
            let p = parent.as_fd();
            assert_eq!(recv_request(p), "open 1 127.0.0.1:9");
            assert_eq!(recv_request(p), "open 2 127.0.0.1:9");
            answer(p, 1);
            let second = answer(p, 2);
            assert_eq!(recv_request(p), "open 3 127.0.0.1:9");
            let third = answer(p, 3);
            (second, third)
        });
        let c = child.as_fd();
        // Times out (the fixed code says TimedOut; any error will do here).
        assert!(open_host(c, 1, server, Duration::from_millis(200)).is_err());
        let two = open_host(c, 2, server, Duration::from_secs(10));
        let three = open_host(c, 3, server, Duration::from_secs(10));
        let (second, third) = fake_parent.join().unwrap();
        let (sock, local) = two.expect("request 2 after a late reply to request 1");
        assert_eq!(local, second);
        assert_eq!(sock.local_addr().unwrap(), SocketAddr::V4(second));
        let (sock, local) = three.expect("request 3");
        assert_eq!(local, third);
        assert_eq!(sock.local_addr().unwrap(), SocketAddr::V4(third));
    }

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
