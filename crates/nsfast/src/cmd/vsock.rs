//! `nsfast vsock ...`

use anyhow::Context;
use clap::Subcommand;
use nsfast_sys::args::{duration, size};
use nsfast_vsock::bridge::{self, Transport};
use nsfast_vsock::conn::SockOpts;
use nsfast_vsock::relay::{self, ConnStats};
use nsfast_vsock::Address;
use std::time::Duration;
use tracing::{info, warn};

use crate::cmd::output::json;

/// Event streams stay one object per line, also under `-p`.
fn json_lines() -> Option<nsfast_sys::out::Json> {
    json().map(|_| nsfast_sys::out::Json::default())
}

fn parse_addr(s: &str) -> Result<Address, String> {
    s.parse::<Address>().map_err(|e| e.to_string())
}

/// A value of a fixed set of names as a typed clap value: `--help` and the shell completions
/// list the names, a bad one exits 2 with them.
fn choice<T>(names: &'static [&'static str]) -> impl clap::builder::TypedValueParser<Value = T>
where
    T: std::str::FromStr<Err = String> + Clone + Send + Sync + 'static,
{
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(names).try_map(|s| s.parse::<T>())
}

const PATHS: &[&str] = &["auto", "kernel", "splice"];

const HOUR: Duration = Duration::from_secs(3600);
/// Largest `--buffer`: the splice pipe size and copy buffer.
const MAX_BUFFER: u64 = 64 << 20;

#[derive(Subcommand, Debug)]
pub enum VsockCmd {
    /// Relay between two addresses, socat-style; half-close is propagated both ways.
    ///
    /// Addresses: vsock-listen:PORT[,cid=CID], vsock-connect:CID:PORT[,to-host],
    /// tcp-listen:PORT[,bind=ADDR], tcp:HOST:PORT, unix-listen:PATH, unix:PATH,
    /// hybrid:PATH:PORT (Firecracker / Cloud Hypervisor host side: CONNECT PORT),
    /// hybrid-listen:PATH[:PORT] (guest-initiated: the VMM connects to PATH_PORT), stdio.
    Relay {
        /// First address (usually a listening one).
        #[arg(value_parser = parse_addr)]
        a: Address,
        /// Second address, opened for each connection of the first.
        #[arg(value_parser = parse_addr)]
        b: Address,
        /// Serve every connection of the first address, each in its own thread.
        #[arg(long)]
        fork: bool,
        /// With --fork: at most N connections at once. A connection that arrives while all N
        /// are busy is accepted and closed at once, with a log line naming it (it does not
        /// wait in the listen backlog for a slot that idle clients may never give back).
        #[arg(long, value_name = "N", default_value_t = 64)]
        max_children: usize,
        /// With --fork: at most N connections at once from one source (the peer's IP for
        /// TCP, its CID for vsock, its uid for UNIX); more are closed at once and logged
        /// [default: no limit].
        #[arg(long, value_name = "N")]
        max_per_source: Option<usize>,
        /// Close a connection that moved no byte either way for this long, with a log line
        /// naming its peer (e.g. 10m, 30s; 0 = never; at most 24h). Off by default, as
        /// socat: quiet long-lived sessions (ssh, database pools) stay up; set it when
        /// untrusted clients could hold the --max-children slots. Only the user-space path
        /// can watch a connection: with it set, --path auto relays with splice and --path
        /// kernel is refused.
        #[arg(long, value_name = "DURATION", default_value = "0", value_parser = duration::arg("--idle-timeout", 24 * HOUR, true))]
        idle_timeout: Duration,
        /// Most bytes moved per call (splice pipe size and largest request / copy buffer),
        /// e.g. 256K, 1M.
        #[arg(long, value_name = "SIZE", default_value = "256K", value_parser = size::arg("--buffer", 1, MAX_BUFFER))]
        buffer: u64,
        /// SO_VM_SOCKETS_BUFFER_SIZE for vsock sockets, e.g. 1M.
        #[arg(long, value_name = "SIZE", value_parser = size::arg("--vsock-buffer", 1, u64::MAX))]
        vsock_buffer: Option<u64>,
        /// Limit for opening a connecting address: TCP/UNIX connect and the hybrid CONNECT/OK
        /// handshake together (e.g. 10s, 500ms; at most 1h). A connection that misses it ends,
        /// the relay keeps serving. AF_VSOCK connects use the kernel's timeout (2 s default).
        #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration::arg("--connect-timeout", HOUR, false))]
        connect_timeout: Duration,
        /// Data path: kernel (a BPF sockmap redirects each leg's data to the other leg's
        /// egress; TCP and AF_VSOCK legs, Linux 6.4+ for vsock, CAP_BPF + CAP_NET_ADMIN),
        /// splice (through a pipe in this process), or auto (kernel where possible, else
        /// splice, saying why once).
        #[arg(long, default_value = "auto", value_parser = choice::<relay::DataPath>(PATHS))]
        path: relay::DataPath,
        /// MSG_ZEROCOPY on the user-space path's sends to AF_VSOCK legs (Linux 6.7+): on
        /// (refused on older kernels), off, or auto (off: not faster where measured, see
        /// docs/vsock.md "Zero-copy sends"). --json reports "send": "zerocopy"|"copy".
        #[arg(long, default_value = "auto",
              value_parser = choice::<nsfast_vsock::zerocopy::ZeroCopy>(&["auto", "on", "off"]))]
        zerocopy: nsfast_vsock::zerocopy::ZeroCopy,
    },
    /// Host-side bridge so sibling VMs of one group reach each other over vsock.
    ///
    /// A guest dials the host (CID 2) and reaches the one other member of its group (a dial
    /// to a sibling's CID with VMADDR_FLAG_TO_HOST is routed too, where the host delivers it;
    /// vhost-vsock drops those). Connections between VMs that share no group are closed and
    /// logged. Runs until SIGINT/SIGTERM. See docs/vsock.md.
    Bridge {
        /// A group of guest CIDs that may reach each other, e.g. 3,4 (repeat for more groups;
        /// a CID may be in several). A group of one CID isolates that VM (with a warning);
        /// at least one group needs two members.
        #[arg(long = "group", value_name = "CID,CID[,...]", required = true, value_parser = parse_group)]
        groups: Vec<Vec<u32>>,
        /// How to reach a member: CID=vsock (AF_VSOCK through vhost-vsock; the default for
        /// every CID of a group) or CID=hybrid:PATH (Firecracker / Cloud Hypervisor /
        /// vhost-device-vsock --uds-path PATH: the bridge listens on PATH_PORT and dials the
        /// guest with CONNECT PORT on PATH). Repeat per member.
        #[arg(long = "vm", value_name = "CID=vsock|CID=hybrid:PATH", value_parser = parse_vm)]
        vms: Vec<(u32, Transport)>,
        /// vsock ports to bridge, e.g. 5000,6000-6010 (1-4294967294, at most 1024 ports in
        /// all; may be repeated). A connection to port P goes to port P of the target.
        #[arg(long, value_name = "LIST", required = true, value_parser = parse_ports)]
        ports: Vec<Vec<u32>>,
        /// At most N bridged connections at once in all; more are refused (closed and logged).
        #[arg(long, value_name = "N", default_value_t = 256)]
        max_conns: usize,
        /// At most N at once within one group (a connection counts in each group holding both
        /// its ends), so one group cannot lock the others out.
        #[arg(long, value_name = "N", default_value_t = 64)]
        max_conns_per_group: usize,
        /// At most N at once from one guest (source CID), so one guest cannot take its
        /// group's slots.
        #[arg(long, value_name = "N", default_value_t = 32)]
        max_conns_per_cid: usize,
        /// Close a bridged connection that moved no byte either way for this long (e.g. 10m;
        /// 0 = never; at most 24h).
        #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = duration::arg("--idle-timeout", 24 * HOUR, true))]
        idle_timeout: Duration,
        /// Bytes moved per call (splice pipe size / copy buffer), e.g. 256K, 1M.
        #[arg(long, value_name = "SIZE", default_value = "256K", value_parser = size::arg("--buffer", 1, MAX_BUFFER))]
        buffer: u64,
        /// SO_VM_SOCKETS_BUFFER_SIZE for vsock sockets, e.g. 1M.
        #[arg(long, value_name = "SIZE", value_parser = size::arg("--vsock-buffer", 1, u64::MAX))]
        vsock_buffer: Option<u64>,
        /// Limit for a hybrid target: connecting to the VMM's socket and its OK reply (e.g.
        /// 10s, 500ms; a bare number is seconds; at most 1h). AF_VSOCK targets use the
        /// kernel's vsock connect timeout, 2 s by default.
        #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration::arg("--connect-timeout", HOUR, false))]
        connect_timeout: Duration,
        /// Data path for connections between two AF_VSOCK members: kernel (experimental: a
        /// BPF sockmap redirects each leg's data to the other leg's egress; Linux 6.4+,
        /// CAP_BPF + CAP_NET_ADMIN; --idle-timeout does not apply to such a connection), or
        /// splice (the default; auto is the same: it never joins AF_VSOCK legs).
        #[arg(long, default_value = "splice", value_parser = choice::<relay::DataPath>(PATHS))]
        path: relay::DataPath,
        #[command(flatten)]
        metrics: crate::cmd::metrics::ListenArgs,
    },
    /// Linux 7.0 vsock namespace modes (ns_mode / child_ns_mode).
    #[command(subcommand)]
    Ns(NsCmd),
    /// Throughput test (iperf-vsock-like): `--server` on one end, `--cid` on the other.
    Bench {
        /// Run the server (count what arrives, answer with the count).
        #[arg(long, conflicts_with_all = ["cid", "connect"])]
        server: bool,
        /// With --server: serve one connection, then exit.
        #[arg(long, requires = "server")]
        once: bool,
        /// Client: the server's CID.
        #[arg(long)]
        cid: Option<u32>,
        /// vsock port.
        #[arg(long, default_value_t = 5201)]
        port: u32,
        /// Any address instead of vsock (client: a connecting one, server: a listening one).
        #[arg(long, value_parser = parse_addr, value_name = "ADDR")]
        connect: Option<Address>,
        /// With --server: listen on this address (any listening one) instead of vsock PORT.
        #[arg(long, value_parser = parse_addr, value_name = "ADDR", requires = "server")]
        listen: Option<Address>,
        /// Bytes to send, e.g. 1G.
        #[arg(long, default_value = "1G", value_parser = size::arg("--bytes", 1, u64::MAX))]
        bytes: u64,
        /// Bytes per write/read, e.g. 256K.
        #[arg(long, value_name = "SIZE", default_value = "256K", value_parser = size::arg("--buffer", 1, MAX_BUFFER))]
        buffer: u64,
        /// SO_VM_SOCKETS_BUFFER_SIZE for vsock sockets.
        #[arg(long, value_name = "SIZE", value_parser = size::arg("--vsock-buffer", 1, u64::MAX))]
        vsock_buffer: Option<u64>,
        /// Client: no iperf3-style interval lines while it runs, the result line only (JSON
        /// output has none either).
        #[arg(long, short)]
        quiet: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum NsCmd {
    /// Print ns_mode and child_ns_mode of the current namespace or of NAME (/run/netns/NAME
    /// or a path such as /proc/PID/ns/net).
    Show {
        /// Namespace to show: NAME under /run/netns, or a path [default: the current one].
        name: Option<String>,
    },
    /// Create network namespace NAME (at /run/netns/NAME) in the given vsock mode, setting
    /// child_ns_mode in a throwaway parent so the current namespace is never locked.
    Create {
        /// Name of the new namespace (created at /run/netns/NAME).
        name: String,
        /// vsock mode of the new namespace (ns_mode): global or local.
        #[arg(long, value_parser = choice::<nsfast_vsock::nsmode::Mode>(&["global", "local"]))]
        mode: nsfast_vsock::nsmode::Mode,
    },
}

fn parse_group(s: &str) -> Result<Vec<u32>, String> {
    bridge::parse_group(s).map_err(|e| e.to_string())
}

fn parse_vm(s: &str) -> Result<(u32, Transport), String> {
    bridge::parse_vm(s).map_err(|e| e.to_string())
}

/// One `--ports` value, kept whole (clap would otherwise see a list of lists): vsock ports
/// 1-4294967294, at most [`bridge::MAX_PORTS`].
fn parse_ports(s: &str) -> Result<Vec<u32>, nsfast_sys::ports::PortListError> {
    nsfast_sys::ports::parse_list("--ports", s, 1, bridge::MAX_VALUE, Some(bridge::MAX_PORTS))
}

pub fn run(cmd: VsockCmd) -> anyhow::Result<()> {
    match cmd {
        VsockCmd::Relay {
            a,
            b,
            fork,
            max_children,
            max_per_source,
            idle_timeout,
            buffer,
            vsock_buffer,
            connect_timeout,
            path,
            zerocopy,
        } => {
            // -j: one JSON object per finished connection on stdout.
            let json = json_lines();
            if json.is_some() && (a == Address::Stdio || b == Address::Stdio) {
                return Err(crate::usage(
                    "--json writes to stdout, which the stdio address uses: drop one of them",
                ));
            }
            if b.forks() {
                return Err(crate::usage(format!(
                    "invalid address {b}: fork applies to the first address, the one that listens"
                )));
            }
            let opts = relay::Options {
                path,
                // socat's `TCP-LISTEN:P,fork` is --fork.
                fork: fork || a.forks(),
                max_children,
                max_per_source,
                idle_timeout: Some(idle_timeout).filter(|d| !d.is_zero()),
                buffer: buffer as usize,
                sock: SockOpts {
                    vsock_buffer,
                    connect_timeout: Some(connect_timeout),
                },
                zerocopy,
            };
            let report = move |s: &ConnStats| {
                if let Some(e) = &s.error {
                    warn!("connection {}: {e}", s.id);
                } else {
                    info!(
                        "connection {} ({} <-> {}): {} bytes ->, {} bytes <-, {} ms, {}",
                        s.id, s.a, s.b, s.bytes_a_to_b, s.bytes_b_to_a, s.millis, s.path
                    );
                }
                if let Some(j) = json {
                    if let Ok(line) = j.render(s) {
                        let _ = nsfast_sys::outln!("{line}");
                    }
                }
            };
            run_relay(&a, &b, &opts, &report)
        }
        VsockCmd::Bridge {
            groups,
            vms,
            ports,
            max_conns,
            max_conns_per_group,
            max_conns_per_cid,
            idle_timeout,
            buffer,
            vsock_buffer,
            connect_timeout,
            path,
            metrics,
        } => run_bridge(
            groups,
            vms,
            ports,
            bridge::Options {
                max_conns,
                max_conns_per_group,
                max_conns_per_cid,
                idle_timeout,
                buffer: buffer as usize,
                sock: SockOpts {
                    vsock_buffer,
                    connect_timeout: None,
                },
                connect_timeout,
                path,
            },
            json_lines(),
            &metrics,
        ),
        VsockCmd::Ns(NsCmd::Show { name }) => {
            let m = match name {
                Some(n) => nsfast_vsock::nsmode::show(&n)?,
                None => nsfast_vsock::nsmode::current()?,
            };
            print_modes(&m)
        }
        VsockCmd::Ns(NsCmd::Create { name, mode }) => {
            let m = nsfast_vsock::nsmode::create(&name, mode)?;
            print_modes(&m)
        }
        VsockCmd::Bench {
            server,
            once,
            cid,
            port,
            connect,
            listen,
            bytes,
            buffer,
            vsock_buffer,
            quiet,
        } => {
            let sock = SockOpts {
                vsock_buffer,
                ..SockOpts::default()
            };
            if server {
                let addr = listen.unwrap_or(Address::VsockListen { port, cid: None });
                info!("vsock bench server on {addr}");
                nsfast_vsock::bench::server(&addr, buffer as usize, sock, once, &|n| {
                    info!("received {n} bytes")
                })?;
                return Ok(());
            }
            let addr = match (connect, cid) {
                (Some(a), _) => a,
                (None, Some(cid)) => Address::VsockConnect {
                    cid,
                    port,
                    to_host: false,
                },
                (None, None) => {
                    return Err(crate::usage(
                        "give --cid CID (or --connect ADDR) for the client, or --server",
                    ))
                }
            };
            // Interval lines on stdout, as iperf3; a closed stdout loses them, not the run.
            let lines = json().is_none() && !quiet;
            let mut interval = |line: &str| {
                if lines {
                    let _ = nsfast_sys::outln!("{line}");
                }
            };
            let r = nsfast_vsock::bench::client_with_intervals(
                &addr,
                bytes,
                buffer as usize,
                sock,
                &mut interval,
            )?;
            if let Some(j) = json() {
                j.print(&r)?;
            } else {
                nsfast_sys::outln!(
                    "{}: {} bytes in {:.3} s = {:.2} Gbit/s (buffer {}){}",
                    r.address,
                    r.bytes,
                    r.seconds,
                    r.gbit_per_s,
                    r.buffer,
                    r.cpu_s_per_gb
                        .map(|c| format!(", machine CPU {c:.2} s/GB"))
                        .unwrap_or_default()
                )?;
            }
            Ok(())
        }
    }
}

/// Runs the relay. A listening first address is opened here, then the relay serves in its
/// own thread while this one waits for SIGINT/SIGTERM (blocked before any thread starts, so
/// only this thread takes them; SIGHUP is logged and changes nothing): on one, the listening
/// socket file is removed and the process exits 0. A relay that ends by itself (one connection served, an accept error)
/// returns its result.
fn run_relay(
    a: &Address,
    b: &Address,
    opts: &relay::Options,
    report: &(dyn Fn(&ConnStats) + Sync),
) -> anyhow::Result<()> {
    nsfast_sys::signals::block_termination().context("blocking SIGINT/SIGTERM")?;
    let r = relay::Relay::open(a, b, opts).context("vsock relay")?;
    std::thread::scope(|s| {
        let h = s.spawn(|| r.serve(report));
        loop {
            if h.is_finished() {
                return match h.join() {
                    Ok(res) => res.context("vsock relay"),
                    Err(_) => Err(anyhow::anyhow!("vsock relay: the relay thread panicked")),
                };
            }
            // Bounded waits so that a relay which ended by itself is noticed soon after.
            // SIGHUP is logged and changes nothing (nsfast_sys::signals::wait_stop_timeout).
            if let Some(sig) = nsfast_sys::signals::wait_stop_timeout(Duration::from_millis(50)) {
                info!("received {sig}, stopping the relay");
                r.remove_socket();
                // Threads blocked in accept or a transfer are not joined: the process ends.
                std::process::exit(0);
            }
        }
    })
}

fn print_modes(m: &nsfast_vsock::nsmode::Modes) -> anyhow::Result<()> {
    if let Some(j) = json() {
        j.print(m)?;
    } else {
        nsfast_sys::outln!(
            "{}: ns_mode {}, child_ns_mode {}",
            m.namespace,
            m.ns_mode,
            m.child_ns_mode
        )?;
    }
    Ok(())
}

fn run_bridge(
    groups: Vec<Vec<u32>>,
    vms: Vec<(u32, Transport)>,
    ports: Vec<Vec<u32>>,
    opts: bridge::Options,
    json: Option<nsfast_sys::out::Json>,
    metrics: &crate::cmd::metrics::ListenArgs,
) -> anyhow::Result<()> {
    metrics.check()?;
    let mut all: Vec<u32> = ports.concat();
    all.sort_unstable();
    if let Some(w) = all.windows(2).find(|w| w[0] == w[1]) {
        return Err(crate::usage(format!(
            "invalid --ports: port {} is listed twice",
            w[0]
        )));
    }
    if all.len() > bridge::MAX_PORTS {
        return Err(crate::usage(format!(
            "invalid --ports: {} ports in all, at most {}",
            all.len(),
            bridge::MAX_PORTS
        )));
    }
    let cfg = bridge::Config::new(groups, vms, all).map_err(|e| crate::usage(e.to_string()))?;
    lone_members(cfg.groups())?;
    // Block SIGINT/SIGTERM before any thread starts (threads inherit the mask), so the main
    // thread alone takes them and removes the hybrid listening files.
    nsfast_sys::signals::block_termination().context("blocking SIGINT/SIGTERM")?;
    let b = std::sync::Arc::new(bridge::Bridge::open(cfg, opts).context("vsock bridge")?);
    // Before the `listening` line: once it is printed, the endpoint answers too.
    let counters = std::sync::Arc::new(crate::cmd::metrics::BridgeCounters::default());
    let _endpoint = {
        let c = counters.clone();
        metrics.start(move || c.snapshot())?
    };
    for (cid, t) in b.config().members() {
        let groups: Vec<String> = b
            .config()
            .groups()
            .iter()
            .filter(|g| g.contains(cid))
            .map(|g| g.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
            .collect();
        info!("member {cid} via {t}, groups {}", groups.join(" "));
    }
    for l in b.listening() {
        info!("listening on {l}");
    }
    if let Some(j) = json {
        let line = j.render(&serde_json::json!({
            "event": "listening",
            "members": b.config().members(),
            "groups": b.config().groups(),
            "ports": b.config().ports(),
            "listeners": b.listening(),
        }));
        if let Ok(line) = line {
            let _ = nsfast_sys::outln!("{line}");
        }
    }
    let report = std::sync::Arc::new(move |e: &bridge::Event| {
        counters.count(e);
        match e {
            bridge::Event::Deny { .. } | bridge::Event::Fail { .. } => warn!("{e}"),
            bridge::Event::Close { error: Some(_), .. } => warn!("{e}"),
            _ => info!("{e}"),
        }
        if let Some(j) = json {
            if let Ok(line) = j.render(e) {
                let _ = nsfast_sys::outln!("{line}");
            }
        }
    });
    let server = b.clone();
    std::thread::Builder::new()
        .name("bridge".into())
        .spawn(move || {
            if let Err(e) = server.serve(report) {
                tracing::error!("vsock bridge: {e}");
            }
        })
        .context("starting the bridge thread")?;
    // SIGHUP is logged and changes nothing: the groups are fixed at start.
    let sig = nsfast_sys::signals::wait_stop();
    info!("received {sig}, stopping the bridge");
    b.remove_sockets();
    Ok(())
}

/// A group of one CID isolates that VM: every connection from or to it is denied. Beside
/// other groups that may be meant (and is warned about); when every group has one member the
/// bridge could never bridge anything, so that is refused (exit 2) before anything is opened.
fn lone_members(groups: &[Vec<u32>]) -> anyhow::Result<()> {
    let lone: Vec<u32> = groups
        .iter()
        .filter(|g| g.len() == 1)
        .map(|g| g[0])
        .collect();
    if lone.len() == groups.len() {
        let list: Vec<String> = lone.iter().map(u32::to_string).collect();
        return Err(crate::usage(format!(
            "invalid --group: every group has one member ({}), so nothing can be bridged; \
             a group names the CIDs that reach each other, e.g. --group {},4",
            list.join(", "),
            lone[0]
        )));
    }
    for cid in lone {
        warn!(
            "--group {cid} has one member: every connection from or to VM {cid} is denied \
             (it is isolated); to bridge it, put it in a group with its peer (--group {cid},CID)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::lone_members;

    #[test]
    fn a_bridge_of_lone_members_is_refused() {
        let e = lone_members(&[vec![3], vec![5]]).unwrap_err();
        assert!(e.chain().any(nsfast_sys::report::is_usage), "{e}");
        assert!(
            e.to_string().contains("every group has one member (3, 5)"),
            "{e}"
        );
        assert!(lone_members(&[vec![3, 4], vec![7]]).is_ok());
        assert!(lone_members(&[vec![3, 4]]).is_ok());
    }
}
