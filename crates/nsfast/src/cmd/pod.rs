//! `nsfast pod add | del | list`.

use anyhow::Result;
use clap::{Args, Subcommand, ValueEnum};
use nsfast_pod::{AddOptions, ModeRequest, PodAddrs};
use nsfast_sys::args::ifname;

use crate::cmd::output::json;

#[derive(Subcommand, Debug)]
pub enum PodCmd {
    /// Create a pod: its network namespace (named NAME), a device pair, addresses, a /32 host
    /// route, and the BPF host-routing programs.
    Add(AddArgs),
    /// Delete a pod and everything `add` made for it (and, with the host's last pod, the host's
    /// maps, uplink programs and state).
    Del {
        /// Pod name (or --all).
        #[arg(required_unless_present = "all", conflicts_with = "all", value_parser = pod_name)]
        name: Option<String>,
        /// Delete every pod of the host, and with them the host's maps, uplink programs and
        /// state (also what an interrupted run left in them).
        #[arg(long)]
        all: bool,
        /// Host network namespace (under /run/netns); default: the current namespace.
        #[arg(long)]
        host: Option<String>,
    },
    /// List a host's pods with its datapath counters.
    List {
        /// Host network namespace (under /run/netns); default: the current namespace.
        #[arg(long)]
        host: Option<String>,
    },
    /// The sockmap shortcut between pods of one host: TCP between two pods skips TCP/IP (and
    /// with it tc and netfilter). No daemon: the programs stay attached by pinned links.
    #[command(subcommand)]
    Shortcut(ShortcutCmd),
}

#[derive(Subcommand, Debug)]
pub enum ShortcutCmd {
    /// Attach the shortcut for the host's pods (pods added later join it).
    Enable {
        /// Host network namespace (under /run/netns); default: the current namespace.
        #[arg(long)]
        host: Option<String>,
        /// cgroup2 directory whose sockets are looked at (default: the cgroup2 root; only
        /// sockets of the host's pods take the shortcut either way).
        #[arg(long)]
        cgroup: Option<std::path::PathBuf>,
        /// After this many connections in a row between the same endpoints that the shortcut
        /// carried fewer than 8 sends for, new ones keep TCP without joining, but for a probe
        /// every --probe-interval (as `nsfast sockmap run --keep-tcp-after`; default 4; 0:
        /// every connection joins; 0 to 1000). Given to a shortcut already enabled, it must be
        /// what that one has.
        #[arg(long, value_name = "N",
              value_parser = clap::value_parser!(u32).range(0..=crate::cmd::sockmap::MAX_KEEP_TCP_AFTER))]
        keep_tcp_after: Option<u32>,
        /// How often a probe joins while --keep-tcp-after keeps connections on TCP (default
        /// 10ms; 1ms to 1h).
        #[arg(long, value_name = "DURATION", value_parser = crate::cmd::sockmap::probe_interval_arg())]
        probe_interval: Option<std::time::Duration>,
        /// Enable even where the splice guard cannot attach (as `nsfast sockmap run
        /// --allow-splice-hole`): a pod that reads a socket with recv(2) and then switches to
        /// splice(2) or sendfile(2) may then miss bytes. Without it enabling is refused there.
        /// Given to a shortcut already enabled without the guard, it is required.
        #[arg(long, env = "NSFAST_ALLOW_SPLICE_HOLE", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue, hide_env_values = true)]
        allow_splice_hole: bool,
    },
    /// Detach it: new connections take the kernel path; redirected ones drain.
    Disable {
        /// Host network namespace (under /run/netns); default: the current namespace.
        #[arg(long)]
        host: Option<String>,
    },
    /// Whether it is on, where, and its counters per pod.
    Status {
        /// Host network namespace (under /run/netns); default: the current namespace.
        #[arg(long)]
        host: Option<String>,
    },
}

/// `--mode`: the device pair of a pod.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// netkit if the kernel has it, else veth.
    Auto,
    /// netkit in L3 mode.
    #[value(alias = "netkit-l3")]
    Netkit,
    /// netkit in L2 mode (ARP answered by the peer program).
    #[value(name = "netkit-l2")]
    NetkitL2,
    /// veth pair.
    Veth,
}

impl From<Mode> for ModeRequest {
    fn from(m: Mode) -> Self {
        match m {
            Mode::Auto => ModeRequest::Auto,
            Mode::Netkit => ModeRequest::Netkit,
            Mode::NetkitL2 => ModeRequest::NetkitL2,
            Mode::Veth => ModeRequest::Veth,
        }
    }
}

/// A pod name as clap's value parser: a bad one exits 2 naming the rule.
fn pod_name(s: &str) -> Result<String, String> {
    if nsfast_pod::pod::valid_pod_name(s) {
        Ok(s.to_string())
    } else {
        Err(nsfast_pod::PodError::BadName(s.into()).to_string())
    }
}

/// One `--ip` value, checked alone (the pair of families is checked once all are read).
fn pod_ips(s: &str) -> Result<String, String> {
    PodAddrs::parse(&[s])
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

#[derive(Args, Debug)]
pub struct AddArgs {
    /// Pod name (1-40 of [a-z0-9-]); also the name of its network namespace.
    #[arg(value_parser = pod_name)]
    name: String,
    /// The pod's addresses with prefix: an IPv4 one (e.g. 10.244.1.5/24, bare address: /32)
    /// and/or an IPv6 one (e.g. fd00:10:244::5/64, bare: /128); repeat --ip or separate them
    /// with commas. The IPv6 gateway is fe80::1, answered by the datapath.
    #[arg(long, required = true, value_name = "ADDR[/PREFIX][,...]", value_parser = pod_ips)]
    ip: Vec<String>,
    /// Device pair: netkit (L3), netkit-l2, veth, or auto (netkit if the kernel has it).
    /// veth and uplink programs attach as TCX links, or with classic tc (clsact + cls_bpf)
    /// on kernels without TCX (< 6.6); NSFAST_POD_ATTACH=tc|tcx|auto forces the method.
    #[arg(long, value_enum, default_value_t = Mode::Auto)]
    mode: Mode,
    /// Host network namespace (under /run/netns); default: the current namespace.
    #[arg(long)]
    host: Option<String>,
    /// Uplink device(s) on the host: wire traffic for pods jumps straight into them
    /// (attached once per host).
    #[arg(long = "uplink", value_parser = ifname::arg("--uplink"))]
    uplinks: Vec<String>,
    /// Name of the pod's device.
    #[arg(long, default_value = nsfast_pod::pod::POD_IF, value_parser = ifname::arg("--ifname"))]
    ifname: String,
    /// Send this pod's traffic (to and from it) through the host's IP stack, so the host's
    /// netfilter rules see it, instead of redirecting it past them (slower; the source address
    /// check still applies).
    #[arg(long)]
    host_firewall: bool,
    /// Keep this pod's TCP off the pod shortcut (`nsfast pod shortcut`), so it meets the host's
    /// tc and netfilter rules.
    #[arg(long)]
    no_shortcut: bool,
    /// The pod's Kubernetes namespace, which NetworkPolicies select it by (`nsfast policy`).
    #[arg(long, default_value = "default", value_parser = crate::cmd::policy::namespace)]
    namespace: String,
    /// A label KEY=VALUE of the pod, which policies' podSelectors match (repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = crate::cmd::policy::label)]
    labels: Vec<(String, String)>,
    /// A named port NAME=PORT[/PROTOCOL] (protocol TCP, UDP or SCTP; default TCP), which
    /// policies may name instead of the number (repeatable; names unique).
    #[arg(long = "named-port", value_name = "NAME=PORT[/PROTO]", value_parser = named_port)]
    named_ports: Vec<nsfast_policy::NamedPort>,
}

/// `--named-port NAME=PORT[/PROTO]`.
fn named_port(s: &str) -> Result<nsfast_policy::NamedPort, String> {
    let bad = |why: &str| {
        format!("invalid --named-port {s:?}: {why}; expected NAME=PORT[/PROTO], e.g. http=8080/TCP")
    };
    let (name, rest) = s.split_once('=').ok_or_else(|| bad("no '='"))?;
    if !nsfast_policy::parse::port_name(name) {
        return Err(bad(
            "the name is not an IANA_SVC_NAME (1-15 of a-z 0-9 '-', a letter among them)",
        ));
    }
    let (port, proto) = rest.split_once('/').unwrap_or((rest, "TCP"));
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p >= 1)
        .ok_or_else(|| bad("the port must be 1-65535"))?;
    let protocol = nsfast_policy::Protocol::parse(&proto.to_ascii_uppercase())
        .ok_or_else(|| bad("the protocol must be TCP, UDP or SCTP"))?;
    Ok(nsfast_policy::NamedPort {
        name: name.to_string(),
        protocol,
        port,
    })
}

pub fn run(cmd: PodCmd) -> Result<()> {
    // A change is finished once started: SIGINT/SIGTERM wait until it is (or is undone).
    if !matches!(
        cmd,
        PodCmd::List { .. } | PodCmd::Shortcut(ShortcutCmd::Status { .. })
    ) {
        nsfast_sys::signals::block_termination()?;
    }
    let r = run_inner(cmd);
    if let Some(sig) = nsfast_sys::signals::pending_termination() {
        eprintln!("nsfast: {sig} received; the change was completed or undone first");
    }
    r
}

fn run_inner(cmd: PodCmd) -> Result<()> {
    match cmd {
        PodCmd::Add(a) => {
            let addrs = PodAddrs::parse(&a.ip)?;
            let mode = ModeRequest::from(a.mode);
            let mut o = AddOptions::with_addrs(&a.name, addrs);
            o.mode = mode;
            o.host = a.host;
            o.uplinks = a.uplinks;
            o.pod_if = a.ifname;
            o.host_firewall = a.host_firewall;
            o.no_shortcut = a.no_shortcut;
            for (i, np) in a.named_ports.iter().enumerate() {
                if a.named_ports[..i].iter().any(|q| q.name == np.name) {
                    return Err(crate::usage(format!(
                        "--named-port {:?} is given twice: a pod's port names are unique",
                        np.name
                    )));
                }
            }
            o.identity = nsfast_pod::state::PodIdentity {
                namespace: a.namespace,
                k8s_name: None,
                labels: a.labels.into_iter().collect(),
                named_ports: a.named_ports,
            };
            let added = nsfast_pod::add(&o)?;
            if let Some(j) = json() {
                j.print(&added)?;
            } else {
                let r = &added.record;
                nsfast_sys::outln!("mode: {}", added.mode_note)?;
                nsfast_sys::outln!(
                    "pod {} on host {}: {} on {} (netns {}), host device {} (ifindex {})",
                    r.name,
                    r.host,
                    r.cidrs().join(", "),
                    r.pod_if,
                    r.netns,
                    r.host_if,
                    r.host_ifindex
                )?;
                for f in &r.tc_filters {
                    nsfast_sys::outln!(
                        "attach: tc, {} on {} clsact ingress (prio {}, handle {:#x})",
                        f.program,
                        f.ifname,
                        f.priority,
                        f.handle
                    )?;
                }
                if r.tc_filters.is_empty() {
                    nsfast_sys::outln!("attach: {}", r.attach.as_str())?;
                }
                let on = nsfast_pod::Host::open(o.host.as_deref())
                    .is_ok_and(|h| nsfast_pod::shortcut::is_enabled(&h));
                nsfast_sys::outln!(
                    "shortcut: {}",
                    match (on, nsfast_pod::shortcut::keeps_tcp(r)) {
                        (_, true) if r.no_shortcut => "opted out (--no-shortcut)",
                        (_, true) => "off (--host-firewall: its TCP meets the host's rules)",
                        (true, false) =>
                            "on (pod <-> pod TCP on this host bypasses tc and netfilter)",
                        (false, false) => "off on this host",
                    }
                )?;
            }
            Ok(())
        }
        PodCmd::Del {
            all: true, host, ..
        } => {
            let gone = nsfast_pod::pod::del_all(host.as_deref())?;
            if let Some(j) = json() {
                let gone: Vec<_> = gone.iter().map(|r| r.output_json()).collect();
                j.print(&serde_json::json!({ "deleted": gone }))?;
                return Ok(());
            }
            for r in &gone {
                print_deleted(r)?;
            }
            nsfast_sys::outln!("{} pod(s) deleted", gone.len())?;
            Ok(())
        }
        PodCmd::Del { name, host, .. } => {
            let name = name.unwrap_or_default();
            match nsfast_pod::del(&name, host.as_deref())? {
                Some(r) if json().is_some() => {
                    json()
                        .unwrap_or_default()
                        .print(&serde_json::json!({ "deleted": [r.output_json()] }))?;
                    Ok(())
                }
                Some(r) => print_deleted(&r),
                None => anyhow::bail!(
                    "no pod {name:?} on host {} (see `nsfast pod list`)",
                    host.as_deref().unwrap_or("current")
                ),
            }
        }
        PodCmd::List { host } => {
            let l = nsfast_pod::list(host.as_deref())?;
            if let Some(j) = json() {
                j.print(&l)?;
                return Ok(());
            }
            let ups: Vec<String> = l
                .uplinks
                .iter()
                .map(|u| format!("{} ({})", u.ifname, u.attach.as_str()))
                .collect();
            nsfast_sys::outln!("host {}  uplinks: [{}]", l.host, ups.join(", "))?;
            nsfast_sys::outln!(
                "{:<24} {:<8} {:<34} {:<10} {:<7} {:<12} {}",
                "NAME",
                "STATE",
                "IP",
                "MODE",
                "ATTACH",
                "HOST-IF",
                "NETNS"
            )?;
            for (p, st) in l.pods.iter().zip(&l.states) {
                nsfast_sys::outln!(
                    "{:<24} {:<8} {:<34} {:<10} {:<7} {:<12} {}",
                    p.name,
                    st.as_str(),
                    p.cidrs().join(","),
                    p.datapath.as_str(),
                    p.attach.as_str(),
                    p.host_if,
                    if p.host_firewall {
                        format!("{} (host firewall)", p.netns)
                    } else {
                        p.netns.clone()
                    }
                )?;
            }
            for (p, st) in l.pods.iter().zip(&l.states) {
                match st {
                    nsfast_pod::PodState::Pending => nsfast_sys::outln!(
                        "note: pod {}: an add or del of it did not finish (killed?); \
                         `nsfast pod del {}` removes what is left, `nsfast pod add` again \
                         undoes it and makes the pod anew",
                        p.name,
                        p.name
                    )?,
                    nsfast_pod::PodState::Dead => nsfast_sys::outln!(
                        "note: pod {}: its namespace or host device {} is gone; \
                         `nsfast pod del {}` removes what nsfast still holds for it",
                        p.name,
                        p.host_if,
                        p.name
                    )?,
                    nsfast_pod::PodState::Ok => {}
                }
            }
            let c: Vec<String> = l.counters.iter().map(|(k, v)| format!("{k}={v}")).collect();
            nsfast_sys::outln!("counters: {}", c.join(" "))?;
            if !l.policy_drops.is_empty() {
                let d: Vec<String> = l
                    .policy_drops
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                nsfast_sys::outln!("policy drops: {}", d.join(" "))?;
            }
            if l.shortcut_enabled {
                print_shortcut_pods(&l.shortcut)?;
            } else {
                nsfast_sys::outln!("shortcut: off")?;
            }
            Ok(())
        }
        PodCmd::Shortcut(c) => shortcut(c),
    }
}

fn print_shortcut_pods(
    pods: &std::collections::BTreeMap<String, nsfast_pod::shortcut::PodShortcutStats>,
) -> Result<()> {
    nsfast_sys::outln!(
        "{:<24} {:<9} {:>8} {:>16} {:>10} {:>10}",
        "SHORTCUT",
        "STATE",
        "PAIRED",
        "BYTES-REDIRECTED",
        "FALLBACKS",
        "OPTED-OUT"
    )?;
    for (name, s) in pods {
        nsfast_sys::outln!(
            "{:<24} {:<9} {:>8} {:>16} {:>10} {:>10}",
            name,
            if s.shortcut { "on" } else { "opted-out" },
            s.paired,
            s.redirected_bytes,
            s.fallbacks,
            s.opted_out
        )?;
    }
    Ok(())
}

fn shortcut(c: ShortcutCmd) -> Result<()> {
    use nsfast_pod::{shortcut, Host};
    match c {
        ShortcutCmd::Enable {
            host,
            cgroup,
            keep_tcp_after,
            probe_interval,
            allow_splice_hole,
        } => {
            let h = Host::open(host.as_deref())?;
            let request = shortcut::EnableRequest {
                keep_tcp_after,
                probe_interval_ns: probe_interval.map(|d| d.as_nanos() as u64),
                allow_splice_hole,
            };
            let e = shortcut::enable(&h, cgroup.as_deref(), request)?;
            if let Some(j) = json() {
                j.print(&e)?;
                return Ok(());
            }
            nsfast_sys::outln!(
                "shortcut {} on host {}: cgroup {}",
                if e.already {
                    "already enabled"
                } else {
                    "enabled"
                },
                h.display,
                e.state.cgroup.display()
            )?;
            nsfast_sys::outln!(
                "admission: {}",
                crate::cmd::sockmap::admission_flags(
                    e.state.keep_tcp_after,
                    e.state.probe_interval_ns
                )
            )?;
            nsfast_sys::outln!("note: {}", shortcut::BYPASS_NOTE)?;
        }
        ShortcutCmd::Disable { host } => {
            let h = Host::open(host.as_deref())?;
            let was = shortcut::disable(&h)?;
            if let Some(j) = json() {
                j.print(&serde_json::json!({ "host": h.display, "disabled": was }))?;
                return Ok(());
            }
            nsfast_sys::outln!(
                "shortcut {} on host {}",
                if was { "disabled" } else { "was not enabled" },
                h.display
            )?;
        }
        ShortcutCmd::Status { host } => {
            let h = Host::open(host.as_deref())?;
            let s = shortcut::status(&h)?;
            if let Some(j) = json() {
                j.print(&s)?;
                return Ok(());
            }
            if !s.enabled {
                nsfast_sys::outln!("shortcut: off on host {}", s.host)?;
                return Ok(());
            }
            nsfast_sys::outln!(
                "shortcut: on, host {}, cgroup {} ({} sockets, {} pairs, {} bytes redirected, \
                 {} passed, {} pair conflicts)",
                s.host,
                s.cgroup
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "?".into()),
                s.sockets,
                s.pairs,
                s.redirected_bytes,
                s.passed_bytes,
                s.pair_conflicts
            )?;
            if let (Some(a), Some(p)) = (s.keep_tcp_after, s.probe_interval_ns) {
                nsfast_sys::outln!("admission: {}", crate::cmd::sockmap::admission_flags(a, p))?;
            }
            nsfast_sys::outln!("note: {}", s.bypasses)?;
            if s.kept_tcp > 0 {
                nsfast_sys::outln!(
                    "kept on TCP: {} connection ends (last {} below)",
                    s.kept_tcp,
                    s.kept_recent.len()
                )?;
                for k in &s.kept_recent {
                    nsfast_sys::outln!("  {k}")?;
                }
            }
            if s.skipped_short > 0 {
                nsfast_sys::outln!(
                    "not joined: {} connection ends whose endpoints' recent connections gained nothing (a probe still joins every {:?})",
                    s.skipped_short,
                    std::time::Duration::from_nanos(
                        s.probe_interval_ns
                            .unwrap_or(nsfast_sockmap::abi::DEFAULT_ADMIT_PROBE_NS)
                    )
                )?;
            }
            if s.policy_denied > 0 {
                nsfast_sys::outln!(
                    "moved to TCP by a NetworkPolicy change that denies them: {} directions",
                    s.policy_denied
                )?;
            }
            print_shortcut_pods(&s.pods)?;
        }
    }
    Ok(())
}

/// The text line for a deleted pod.
fn print_deleted(r: &nsfast_pod::state::PodRecord) -> Result<()> {
    nsfast_sys::outln!(
        "deleted pod {} ({}) on host {}",
        r.name,
        r.cidrs().join(", "),
        r.host
    )?;
    Ok(())
}
