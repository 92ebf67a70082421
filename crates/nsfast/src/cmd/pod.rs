//! `nsfast pod add | del | list`.

use anyhow::Result;
use clap::{Args, Subcommand};
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
        #[arg(required_unless_present = "all", conflicts_with = "all")]
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
}

#[derive(Args, Debug)]
pub struct AddArgs {
    /// Pod name (1-40 of [a-z0-9-]); also the name of its network namespace.
    name: String,
    /// The pod's addresses with prefix: an IPv4 one (e.g. 10.244.1.5/24, bare address: /32)
    /// and/or an IPv6 one (e.g. fd00:10:244::5/64, bare: /128); repeat --ip or separate them
    /// with commas. The IPv6 gateway is fe80::1, answered by the datapath.
    #[arg(long, required = true)]
    ip: Vec<String>,
    /// Device pair: netkit (L3), netkit-l2, veth, or auto (netkit if the kernel has it).
    /// veth and uplink programs attach as TCX links, or with classic tc (clsact + cls_bpf)
    /// on kernels without TCX (< 6.6); NSFAST_POD_ATTACH=tc|tcx|auto forces the method.
    #[arg(long, default_value = "auto")]
    mode: String,
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
}

pub fn run(cmd: PodCmd) -> Result<()> {
    // A change is finished once started: SIGINT/SIGTERM wait until it is (or is undone).
    if !matches!(cmd, PodCmd::List { .. }) {
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
            let mode: ModeRequest = a.mode.parse()?;
            let mut o = AddOptions::with_addrs(&a.name, addrs);
            o.mode = mode;
            o.host = a.host;
            o.uplinks = a.uplinks;
            o.pod_if = a.ifname;
            o.host_firewall = a.host_firewall;
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
            }
            Ok(())
        }
        PodCmd::Del {
            all: true, host, ..
        } => {
            let gone = nsfast_pod::pod::del_all(host.as_deref())?;
            if let Some(j) = json() {
                j.print(&serde_json::json!({ "deleted": gone }))?;
                return Ok(());
            }
            for r in &gone {
                nsfast_sys::outln!(
                    "deleted pod {} ({}) on host {}",
                    r.name,
                    r.cidrs().join(", "),
                    r.host
                )?;
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
                        .print(&serde_json::json!({ "deleted": [r] }))?;
                    Ok(())
                }
                Some(r) => {
                    nsfast_sys::outln!(
                        "deleted pod {} ({}) on host {}",
                        r.name,
                        r.cidrs().join(", "),
                        r.host
                    )?;
                    Ok(())
                }
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
                "{:<24} {:<34} {:<10} {:<7} {:<12} {:<20}",
                "NAME",
                "IP",
                "MODE",
                "ATTACH",
                "HOST-IF",
                "NETNS"
            )?;
            for p in &l.pods {
                nsfast_sys::outln!(
                    "{:<24} {:<34} {:<10} {:<7} {:<12} {:<20}",
                    p.name,
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
            for p in l.pods.iter().filter(|p| p.pending) {
                nsfast_sys::outln!(
                    "note: pod {}: its add did not finish (killed?); `nsfast pod del {}` or \
                     `nsfast pod add` again undoes what it made",
                    p.name,
                    p.name
                )?;
            }
            let c: Vec<String> = l.counters.iter().map(|(k, v)| format!("{k}={v}")).collect();
            nsfast_sys::outln!("counters: {}", c.join(" "))?;
            Ok(())
        }
    }
}
