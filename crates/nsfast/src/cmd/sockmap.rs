//! `nsfast sockmap run|status`

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use nsfast_sockmap::{Options, Shortcut};
use nsfast_sys::args::{duration, size};
use nsfast_sys::ports::PortList;
use tracing::info;

#[derive(Subcommand, Debug)]
pub enum SockmapCmd {
    /// Attach the shortcut to a cgroup and run until SIGINT/SIGTERM, then detach.
    ///
    /// Sockets created by processes in the cgroup take the shortcut once both ends of a
    /// connection are established inside it. Connections established before `run` starts keep
    /// the normal path.
    ///
    /// Under systemd (Type=notify, nsfast-sockmap@NAME.slice) READY=1 is sent once both
    /// programs are attached.
    #[command(group(clap::ArgGroup::new("target").required(true).args(["cgroup", "slice"])))]
    Run {
        /// cgroup2 directory to attach to (it must exist). This or --slice is required.
        #[arg(long, value_name = "PATH")]
        cgroup: Option<PathBuf>,
        /// systemd slice to attach to, e.g. myapp.slice (its cgroup must exist: start the
        /// slice first). nsfast-sockmap@NAME.slice runs this.
        #[arg(long, value_name = "NAME.slice")]
        slice: Option<String>,
        /// Only connections to these server ports take the shortcut, e.g. 80,443,8000-8100
        /// [default: all ports].
        #[arg(long, value_name = "LIST", value_parser = PortList::arg("--ports"))]
        ports: Option<PortList>,
        /// Connections to these server ports never take the shortcut.
        #[arg(long, value_name = "LIST", value_parser = PortList::arg("--exclude-ports"))]
        exclude_ports: Option<PortList>,
        /// Bytes a receiver may leave unread in its shortcut queue, per connection and
        /// direction; beyond it that direction moves to TCP for good, whose receive window then
        /// holds the sender back (e.g. 4M, 64M).
        #[arg(long, value_name = "SIZE", default_value = "16M",
              value_parser = size::arg("--queue-limit", 64 << 10, 1 << 40))]
        queue_limit: u64,
        /// Log the counters this often while running, e.g. 10 (seconds), 500ms, 1m; 0: only at
        /// exit (at most 24h).
        #[arg(long, value_name = "DURATION", default_value = "0",
              value_parser = duration::arg("--stats-interval", Duration::from_secs(86400), true))]
        stats_interval: Duration,
    },
    /// Show the instances loaded in the kernel: sockets in the map, messages and bytes
    /// redirected and passed, and where they are attached.
    Status,
}

pub fn run(cmd: SockmapCmd) -> anyhow::Result<()> {
    match cmd {
        SockmapCmd::Run {
            cgroup,
            slice,
            ports,
            exclude_ports,
            queue_limit,
            stats_interval,
        } => {
            let cgroup = match slice {
                Some(s) => {
                    let p = nsfast_sockmap::slice_cgroup(&s)?;
                    if !p.exists() {
                        anyhow::bail!(
                            "slice {s} has no cgroup yet ({} does not exist): start it first (systemctl start {s}) or give --cgroup",
                            p.display()
                        );
                    }
                    Some(p)
                }
                None => cgroup,
            };
            run_shortcut(
                Options {
                    cgroup,
                    ports,
                    exclude_ports,
                    queue_limit: Some(queue_limit),
                },
                stats_interval,
            )
        }
        SockmapCmd::Status => status(),
    }
}

fn run_shortcut(opts: Options, stats_interval: Duration) -> anyhow::Result<()> {
    // Block the termination signals before anything is attached, so a signal arriving at any
    // point is seen by the wait below and the programs are always detached.
    nsfast_sys::signals::block_termination().context("blocking SIGINT/SIGTERM")?;
    let shortcut = Shortcut::attach(&opts)?;
    info!(
        "nsfast sockmap running on {} (pid {}); stop with Ctrl-C or SIGTERM",
        shortcut.cgroup_path().display(),
        std::process::id()
    );
    // Type=notify: only now, with both programs attached, new connections take the shortcut.
    nsfast_sys::systemd::notify(&format!(
        "READY=1\nSTATUS=attached to {}",
        shortcut.cgroup_path().display()
    ))
    .context("telling systemd the shortcut is attached")?;
    let signal = loop {
        let wait = if stats_interval.is_zero() {
            Duration::from_secs(3600)
        } else {
            stats_interval
        };
        if let Some(sig) = nsfast_sys::signals::wait_termination_timeout(wait) {
            break sig;
        }
        if !stats_interval.is_zero() {
            if let Ok(s) = shortcut.stats() {
                info!(
                    "sockets {} pairs {} redirected {} msgs / {} bytes, passed {} msgs / {} bytes; \
                     to TCP: {} splice readers, {} over the queue limit; {} splices refused",
                    s.sockets,
                    s.pairs,
                    s.redirected_msgs,
                    s.redirected_bytes,
                    s.passed_msgs,
                    s.passed_bytes,
                    s.splice_pass,
                    s.queue_limit,
                    s.splice_refused
                );
            }
        }
    };
    info!("received {signal}, detaching");
    if let Ok(s) = shortcut.stats() {
        info!(
            "final: pairs {} redirected {} msgs / {} bytes, passed {} msgs / {} bytes, {} sockets still redirected (they keep the shortcut until they close)",
            s.pairs, s.redirected_msgs, s.redirected_bytes, s.passed_msgs, s.passed_bytes, s.sockets
        );
    }
    shortcut.detach()?;
    Ok(())
}

fn status() -> anyhow::Result<()> {
    let instances =
        nsfast_sockmap::instances().context("reading loaded BPF programs and maps (needs root)")?;
    if let Some(j) = crate::cmd::output::json() {
        j.print(&serde_json::json!({ "instances": instances }))?;
        return Ok(());
    }
    if instances.is_empty() {
        nsfast_sys::outln!("no nsfast sockmap instance is loaded")?;
        return Ok(());
    }
    for i in &instances {
        let state = match (i.attached, i.loader_alive) {
            (true, _) if i.pod_mode => "pod shortcut (pinned; see `nsfast pod shortcut status`)",
            (true, true) => "running",
            (true, false) => "attached (loader gone)",
            (false, _) => {
                "draining (detached; redirected sockets keep the shortcut until they close)"
            }
        };
        nsfast_sys::outln!(
            "cgroup {} (id {}): {state}, loader pid {}",
            i.cgroup_path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "?".into()),
            i.cgroup_id,
            i.loader_pid
        )?;
        let s = &i.stats;
        nsfast_sys::outln!("  sockets in map      {}", s.sockets)?;
        nsfast_sys::outln!(
            "  pairs               {} (conflicts {})",
            s.pairs,
            s.pair_conflicts
        )?;
        nsfast_sys::outln!(
            "  redirected          {} msgs, {} bytes",
            s.redirected_msgs,
            s.redirected_bytes
        )?;
        nsfast_sys::outln!(
            "  passed (kernel)     {} msgs, {} bytes",
            s.passed_msgs,
            s.passed_bytes
        )?;
        nsfast_sys::outln!(
            "  kernel-path dirs    {} (redirect failed {}), skipped by port {}",
            s.tainted,
            s.redirect_failed,
            s.skipped_port
        )?;
        nsfast_sys::outln!(
            "  programs            sk_msg id {}, sockops id {}",
            i.sk_msg_prog_id,
            i.sockops_prog_id
                .map(|v| v.to_string())
                .unwrap_or_else(|| "-".into())
        )?;
    }
    Ok(())
}
