//! `nsfast sockmap run|status`

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use nsfast_sockmap::{Options, Shortcut};
use nsfast_sys::args::{duration, size};
use nsfast_sys::ports::PortList;
use tracing::{debug, info, warn};

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
        /// direction; beyond it that direction moves to TCP, whose receive window then holds
        /// the sender back, until the receiver has read everything (e.g. 4M, 64M).
        #[arg(long, value_name = "SIZE", default_value = "16M",
              value_parser = size::arg("--queue-limit", 64 << 10, 1 << 40))]
        queue_limit: u64,
        /// After this many connections in a row between the same client address and server
        /// address and port, each closed within 1 s of the one before, that the shortcut
        /// carried fewer than 8 sends for (joining costs more than they gain), new ones keep
        /// TCP without joining, but for a probe every --probe-interval; the first connection
        /// that gains lets the next ones join again. 0: every connection joins (0 to 1000).
        #[arg(long, value_name = "N", default_value_t = 4,
              value_parser = clap::value_parser!(u32).range(0..=MAX_KEEP_TCP_AFTER))]
        keep_tcp_after: u32,
        /// While --keep-tcp-after keeps the connections between some endpoints on TCP, one of
        /// them joins anyway at most this often, to see whether they have become long, e.g.
        /// 10ms, 1s (1ms to 1h).
        #[arg(long, value_name = "DURATION", default_value = "10ms",
              value_parser = probe_interval_arg())]
        probe_interval: Duration,
        /// Start even where the splice guard cannot attach (kernels without BPF trampolines or
        /// without `bpf` among the LSMs; `nsfast probe` says): a program in the cgroup that
        /// reads a socket with recv(2) and then switches to splice(2) or sendfile(2), as
        /// HAProxy with option splice-* does, may then miss bytes. Without this flag `run`
        /// refuses to start there.
        #[arg(long, env = "NSFAST_ALLOW_SPLICE_HOLE", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue, hide_env_values = true)]
        allow_splice_hole: bool,
        /// Log the counters this often while running, e.g. 10 (seconds), 500ms, 1m; 0: only at
        /// exit (at most 24h).
        #[arg(long, value_name = "DURATION", default_value = "0",
              value_parser = duration::arg("--stats-interval", Duration::from_secs(86400), true))]
        stats_interval: Duration,
        #[command(flatten)]
        metrics: crate::cmd::metrics::ListenArgs,
    },
    /// Show the instances loaded in the kernel: sockets in the map, messages and bytes
    /// redirected and passed, and where they are attached. With --cgroup or --slice, only
    /// the instances of that cgroup, and exit 1 unless one is attached to it (a script's
    /// check that the shortcut is on there).
    #[command(group(clap::ArgGroup::new("which").args(["cgroup", "slice"])))]
    Status {
        /// Only the instances of this cgroup2 directory.
        #[arg(long, value_name = "PATH")]
        cgroup: Option<PathBuf>,
        /// Only the instances of this systemd slice's cgroup, e.g. myapp.slice.
        #[arg(long, value_name = "NAME.slice")]
        slice: Option<String>,
    },
}

pub fn run(cmd: SockmapCmd) -> anyhow::Result<()> {
    match cmd {
        SockmapCmd::Run {
            cgroup,
            slice,
            ports,
            exclude_ports,
            queue_limit,
            keep_tcp_after,
            probe_interval,
            allow_splice_hole,
            stats_interval,
            metrics,
        } => {
            metrics.check()?;
            let cgroup = target_cgroup(cgroup, slice)?;
            run_shortcut(
                Options {
                    cgroup,
                    ports,
                    exclude_ports,
                    queue_limit: Some(queue_limit),
                    keep_tcp_after: Some(keep_tcp_after),
                    probe_interval: Some(probe_interval),
                    allow_splice_hole,
                },
                stats_interval,
                &metrics,
            )
        }
        SockmapCmd::Status { cgroup, slice } => status(cgroup, slice),
    }
}

fn run_shortcut(
    opts: Options,
    stats_interval: Duration,
    metrics: &crate::cmd::metrics::ListenArgs,
) -> anyhow::Result<()> {
    // Block the termination signals before anything is attached, so a signal arriving at any
    // point is seen by the wait below and the programs are always detached.
    nsfast_sys::signals::block_termination().context("blocking SIGINT/SIGTERM")?;
    let shortcut = std::sync::Arc::new(Shortcut::attach(&opts)?);
    // Before READY=1: a port in use fails the start (exit 1), and the shortcut is dropped,
    // so detached.
    let endpoint = {
        let sc = shortcut.clone();
        let cgroup = sc.cgroup_path().display().to_string();
        metrics.start(move || {
            let mut s = nsfast_sys::metrics::Snapshot::new();
            let labels = [("cgroup", cgroup.as_str()), ("mode", "run")];
            match sc.stats() {
                Ok(st) => crate::cmd::metrics::sockmap_stats(&mut s, &labels, &st),
                Err(e) => tracing::warn!("metrics: reading the counters: {e}"),
            }
            s
        })?
    };
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
    // Each connection end that keeps TCP is logged once, with the process and the reason; the
    // programs keep the last 64, so a poll each second misses them only in a burst.
    let mut kept_next = 0;
    let mut log_kept = |shortcut: &Shortcut| match shortcut.kept_since(kept_next) {
        Ok(b) => {
            for k in &b.events {
                info!("{k}");
            }
            if b.lost > 0 {
                warn!(
                    "{} more connection ends kept TCP (not logged one by one; see kept_tcp)",
                    b.lost
                );
            }
            kept_next = b.next;
        }
        Err(e) => debug!("reading the kept-TCP log: {e}"),
    };
    let mut next_stats = std::time::Instant::now() + stats_interval;
    let signal = loop {
        // SIGHUP is logged and changes nothing: the options are fixed at attach.
        if let Some(sig) = nsfast_sys::signals::wait_stop_timeout(Duration::from_secs(1)) {
            break sig;
        }
        log_kept(&shortcut);
        if !stats_interval.is_zero() && std::time::Instant::now() >= next_stats {
            next_stats = std::time::Instant::now() + stats_interval;
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
    log_kept(&shortcut);
    if let Ok(s) = shortcut.stats() {
        info!(
            "final: pairs {} redirected {} msgs / {} bytes, passed {} msgs / {} bytes, {} sockets still redirected (they keep the shortcut until they close)",
            s.pairs, s.redirected_msgs, s.redirected_bytes, s.passed_msgs, s.passed_bytes, s.sockets
        );
    }
    // The endpoint's thread holds the other reference: stopping it leaves this one alone.
    drop(endpoint);
    match std::sync::Arc::try_unwrap(shortcut) {
        Ok(s) => s.detach()?,
        Err(_) => anyhow::bail!("the shortcut is still in use at exit"),
    }
    Ok(())
}

/// The cgroup `--cgroup` or `--slice` names (a slice's cgroup must exist), if either is given.
fn target_cgroup(
    cgroup: Option<PathBuf>,
    slice: Option<String>,
) -> anyhow::Result<Option<PathBuf>> {
    let Some(s) = slice else {
        return Ok(cgroup);
    };
    let p = nsfast_sockmap::slice_cgroup(&s).map_err(|e| match e {
        e @ nsfast_sockmap::SockmapError::BadSlice { .. } => crate::usage(e.to_string()),
        e => e.into(),
    })?;
    if !p.exists() {
        anyhow::bail!(
            "slice {s} has no cgroup yet ({} does not exist): start it first (systemctl start {s}) or give --cgroup",
            p.display()
        );
    }
    Ok(Some(p))
}

/// `sockmap status`: every instance, or (`--cgroup`/`--slice`) those of one cgroup, which
/// fails unless one of them is attached.
fn status(cgroup: Option<PathBuf>, slice: Option<String>) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let want = target_cgroup(cgroup, slice)?;
    let mut instances =
        nsfast_sockmap::instances().context("reading loaded BPF programs and maps")?;
    // A cgroup's id is its directory's inode number on cgroup2.
    let want = match want {
        Some(p) => {
            let id = std::fs::metadata(&p)
                .with_context(|| format!("cgroup {}", p.display()))?
                .ino();
            instances.retain(|i| i.cgroup_id == id);
            Some(p)
        }
        None => None,
    };
    let attached = instances.iter().any(|i| i.attached);
    status_print(&instances)?;
    match want {
        Some(p) if !attached => anyhow::bail!(
            "no nsfast sockmap instance is attached to {}{}",
            p.display(),
            if instances.is_empty() {
                ""
            } else {
                " (only draining ones)"
            }
        ),
        _ => Ok(()),
    }
}

fn status_print(instances: &[nsfast_sockmap::Instance]) -> anyhow::Result<()> {
    if let Some(j) = crate::cmd::output::json() {
        j.print(&serde_json::json!({ "instances": instances }))?;
        return Ok(());
    }
    if instances.is_empty() {
        nsfast_sys::outln!("no nsfast sockmap instance is loaded")?;
        return Ok(());
    }
    for i in instances {
        nsfast_sys::outln!("{}", headline(i))?;
        if let Some(t) = &i.settings {
            nsfast_sys::outln!("  settings            {}", settings_line(t))?;
        }
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
            "  kept on TCP         {} (splice readers {}, over the queue limit {})",
            s.kept_tcp,
            s.splice_readers,
            s.queue_limit
        )?;
        nsfast_sys::outln!("  not joined (short)  {} connection ends", s.skipped_short)?;
        for k in &i.kept_recent {
            nsfast_sys::outln!("    {k}")?;
        }
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

/// The largest `--keep-tcp-after` (also `pod shortcut enable`'s): a longer streak would keep
/// admission from ever acting.
pub(crate) const MAX_KEEP_TCP_AFTER: i64 = 1000;

/// `--probe-interval`'s parser (also `pod shortcut enable`'s): 1 ms to 1 h.
pub(crate) fn probe_interval_arg(
) -> impl Fn(&str) -> Result<Duration, nsfast_sys::args::ArgError> + Clone + Send + Sync + 'static {
    duration::arg_in(
        "--probe-interval",
        Duration::from_millis(1),
        Duration::from_secs(3600),
    )
}

/// Admission settings as the options that give them.
pub(crate) fn admission_flags(keep_tcp_after: u32, probe_interval_ns: u64) -> String {
    if keep_tcp_after == 0 {
        "--keep-tcp-after 0 (every connection joins)".to_string()
    } else {
        format!(
            "--keep-tcp-after {keep_tcp_after} --probe-interval {:?}",
            Duration::from_nanos(probe_interval_ns)
        )
    }
}

/// An instance's settings as `run`'s options would give them.
fn settings_line(t: &nsfast_sockmap::status::Settings) -> String {
    format!(
        "--queue-limit {} {}",
        nsfast_sys::args::size::format(t.queue_limit),
        admission_flags(t.keep_tcp_after, t.probe_interval_ns)
    )
}

/// An instance's first `status` line: its cgroup, its state and, for a `sockmap run`
/// instance, its loader.
fn headline(i: &nsfast_sockmap::Instance) -> String {
    let cgroup = i
        .cgroup_path
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "?".into());
    // A pod shortcut's recorded pid is the `pod shortcut enable` that pinned it, which has
    // exited: the instance has no loader to show.
    let (state, loader) = match (i.attached, i.loader_alive) {
        (true, _) if i.pod_mode => (
            "pod shortcut (pinned; see `nsfast pod shortcut status`)",
            String::new(),
        ),
        _ if i.pod_mode => ("pod shortcut, draining (detached)", String::new()),
        (true, true) => ("running", format!(", loader pid {}", i.loader_pid)),
        (true, false) => (
            "attached",
            format!(", loader pid {} not running", i.loader_pid),
        ),
        (false, alive) => (
            "draining (detached; redirected sockets keep the shortcut until they close)",
            format!(
                ", loader pid {}{}",
                i.loader_pid,
                if alive { "" } else { " not running" }
            ),
        ),
    };
    format!("cgroup {cgroup} (id {}): {state}{loader}", i.cgroup_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(pod_mode: bool, attached: bool, loader_alive: bool) -> nsfast_sockmap::Instance {
        nsfast_sockmap::Instance {
            sk_msg_prog_id: 10,
            sockops_prog_id: Some(11),
            cgroup_id: 17030,
            cgroup_path: Some("/sys/fs/cgroup/unified/myapp".into()),
            loader_pid: 4242,
            loader_alive,
            attached,
            started_unix: 0,
            pod_mode,
            settings: None,
            stats: Default::default(),
            kept_recent: Vec::new(),
            map_entries: None,
        }
    }

    #[test]
    fn settings_read_as_the_options_that_give_them() {
        let t = |queue_limit, keep_tcp_after, probe_interval_ns| {
            settings_line(&nsfast_sockmap::status::Settings {
                queue_limit,
                keep_tcp_after,
                probe_interval_ns,
            })
        };
        assert_eq!(
            t(16 << 20, 4, 10_000_000),
            "--queue-limit 16M --keep-tcp-after 4 --probe-interval 10ms"
        );
        assert_eq!(
            t(64 << 10, 0, 10_000_000),
            "--queue-limit 64K --keep-tcp-after 0 (every connection joins)"
        );
        assert_eq!(
            t((1 << 30) + 1, 2, 1_500_000_000),
            "--queue-limit 1073741825 --keep-tcp-after 2 --probe-interval 1.5s"
        );
        assert_eq!(
            t(3 << 30, 1, 3_600_000_000_000),
            "--queue-limit 3G --keep-tcp-after 1 --probe-interval 3600s"
        );
    }

    /// A loader pid is shown only for a loader that runs; a pinned pod shortcut has none
    /// (the pid is the `pod shortcut enable` that pinned it, long gone).
    #[test]
    fn headline_names_only_a_running_loader() {
        let running = headline(&instance(false, true, true));
        assert_eq!(
            running,
            "cgroup /sys/fs/cgroup/unified/myapp (id 17030): running, loader pid 4242"
        );
        let pod = headline(&instance(true, true, false));
        assert_eq!(
            pod,
            "cgroup /sys/fs/cgroup/unified/myapp (id 17030): pod shortcut (pinned; see \
             `nsfast pod shortcut status`)"
        );
        let gone = headline(&instance(false, true, false));
        assert_eq!(
            gone,
            "cgroup /sys/fs/cgroup/unified/myapp (id 17030): attached, loader pid 4242 not \
             running"
        );
        let draining = headline(&instance(false, false, false));
        assert!(
            draining.contains("draining") && draining.ends_with("loader pid 4242 not running"),
            "{draining}"
        );
    }
}
