//! `nsfast bench` and its hidden worker `nsfast bench-worker SPEC`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use nsfast_bench::proc::Launcher;
use nsfast_bench::report::{self, Document};
use nsfast_bench::runner::{Runner, StderrObserver};
use nsfast_bench::spec::{self, Config, Placement, Sizes, Workload, MAX_DATAGRAM, MAX_MESSAGE};
use nsfast_bench::{svg, topology, BenchError};

/// Every path side by side: host, veth, routed, sockmap (and later ones), in one run.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Short run for demos (5 rounds × 0.6 s, 0.2 s warm-up; about a minute on 2 vCPUs).
    #[arg(long)]
    pub quick: bool,
    /// Comma-separated topologies: host, veth, routed, sockmap, bpf, bpf-tc, bpf-remote, netkit,
    /// cni-ptp, cni-ptp-remote, slirp4netns, vpnrelay, vsock, vsock-relay, vsock-socat (the
    /// vsock ones in VM guests only) [default: host,veth,routed,sockmap]. Unsupported ones are
    /// skipped with the reason.
    #[arg(long, value_name = "LIST", allow_hyphen_values = true)]
    pub topologies: Option<String>,
    /// Comma-separated workloads: rr, crr, stream, udp-stream, ping [default: all].
    #[arg(long, value_name = "LIST", allow_hyphen_values = true)]
    pub workloads: Option<String>,
    /// Interleaved rounds (A B C A B C ...) [default: 5, --quick: 5].
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub rounds: Option<String>,
    /// Seconds per measurement [default: 3, --quick: 0.6].
    #[arg(long, value_name = "SECS", allow_hyphen_values = true)]
    pub duration: Option<String>,
    /// Seconds of warm-up per topology × workload before round 1; 0 disables [default: 1, --quick: 0.2].
    #[arg(long, value_name = "SECS", allow_hyphen_values = true)]
    pub warmup: Option<String>,
    /// Comma-separated CPU placements: same-cpu, cross-cpu, unpinned [default: same-cpu].
    #[arg(long, value_name = "LIST", allow_hyphen_values = true)]
    pub placement: Option<String>,
    /// rr/crr/ping request size in bytes (k/m suffixes) [default: 1].
    #[arg(long, value_name = "BYTES", allow_hyphen_values = true)]
    pub request_size: Option<String>,
    /// rr/crr/ping response size in bytes [default: 1].
    #[arg(long, value_name = "BYTES", allow_hyphen_values = true)]
    pub response_size: Option<String>,
    /// stream write size in bytes [default: 128k].
    #[arg(long, value_name = "BYTES", allow_hyphen_values = true)]
    pub stream_size: Option<String>,
    /// udp-stream datagram payload in bytes [default: 1400].
    #[arg(long, value_name = "BYTES", allow_hyphen_values = true)]
    pub udp_size: Option<String>,
    /// Write every round's raw figures plus machine and kernel as JSON to FILE, and one SVG
    /// chart per workload and placement next to it (FILE-stem-WORKLOAD-PLACEMENT.svg).
    /// Without FILE (or `-`, or the global `nsfast -j bench`): --list and --cleanup print JSON,
    /// and a run prints its document on stdout instead of the table.
    #[arg(
        short = 'j',
        long,
        value_name = "FILE",
        num_args = 0..=1,
        default_missing_value = "-"
    )]
    pub json: Option<PathBuf>,
    /// Also run sockperf and iperf3 (when installed) on host and veth and compare.
    #[arg(long)]
    pub cross_check: bool,
    /// List the topologies and whether this machine can run them, then exit.
    #[arg(long)]
    pub list: bool,
    /// Remove what runs that were killed left (namespaces, cgroups and nsfast pod state of
    /// nsfb-<dead pid>-*, pod state whose host namespace is gone, the vpnrelay test world
    /// nsfv<dead pid>x*: its processes, namespaces, runtime folder), then exit.
    #[arg(long)]
    pub cleanup: bool,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

/// Hidden: one side of one measurement, started by `nsfast bench` in a namespace + cgroup.
#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// The worker spec as JSON.
    pub spec: String,
}

fn config(a: &BenchArgs) -> Result<Config, BenchError> {
    let topologies = match &a.topologies {
        Some(s) => spec::parse_list("--topologies", s, |t| {
            topology::find(t).map(|d| d.name.to_string())
        })?,
        None => topology::DEFAULT.iter().map(|s| s.to_string()).collect(),
    };
    let workloads = match &a.workloads {
        Some(s) => spec::parse_list("--workloads", s, Workload::parse)?,
        None => Workload::ALL.to_vec(),
    };
    let placements = match &a.placement {
        Some(s) => spec::parse_list("--placement", s, Placement::parse)?,
        None => vec![Placement::SameCpu],
    };
    let (def_rounds, def_dur, def_warm) = if a.quick {
        ("5", "0.6", "0.2")
    } else {
        ("5", "3", "1")
    };
    let rounds = spec::parse_count("--rounds", a.rounds.as_deref().unwrap_or(def_rounds), 1000)?;
    let duration = spec::parse_seconds(
        "--duration",
        a.duration.as_deref().unwrap_or(def_dur),
        false,
    )?;
    let warmup = spec::parse_seconds("--warmup", a.warmup.as_deref().unwrap_or(def_warm), true)?;
    let d = Sizes::default();
    let size = |flag, v: &Option<String>, def: u32, max| match v {
        Some(s) => spec::parse_size(flag, s, max),
        None => Ok(def),
    };
    let sizes = Sizes {
        request: size("--request-size", &a.request_size, d.request, MAX_MESSAGE)?,
        response: size("--response-size", &a.response_size, d.response, MAX_MESSAGE)?,
        stream_write: size("--stream-size", &a.stream_size, d.stream_write, MAX_MESSAGE)?,
        datagram: size("--udp-size", &a.udp_size, d.datagram, MAX_DATAGRAM)?,
    };
    sizes.validate()?;
    Ok(Config {
        topologies,
        workloads,
        placements,
        rounds,
        duration,
        warmup,
        sizes,
        json: a.json.clone().filter(|p| !is_stdout(p)),
        cross_check: a.cross_check,
        quick: a.quick,
    })
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    // Block SIGINT/SIGTERM before any thread starts: the runner polls for them and tears
    // everything down itself.
    nsfast_sys::signals::block_termination().context("block SIGINT/SIGTERM")?;
    let json = json_out(&a);
    if a.list {
        let rows: Vec<(&str, &str, Result<(), String>)> = topology::registry()
            .iter()
            .map(|d| (d.name, d.about, (d.probe)().map_err(|r| r.to_string())))
            .collect();
        if let Some(j) = json {
            let list: Vec<_> = rows
                .iter()
                .map(|(name, about, r)| {
                    serde_json::json!({
                        "name": name,
                        "about": about,
                        "available": r.is_ok(),
                        "reason": r.as_ref().err(),
                    })
                })
                .collect();
            j.print(&serde_json::json!({ "topologies": list }))?;
            return Ok(());
        }
        for (name, about, r) in rows {
            let status = match r {
                Ok(()) => "available".to_string(),
                Err(r) => format!("skipped: {r}"),
            };
            nsfast_sys::outln!("{name:<12} {about:<70} {status}")?;
        }
        return Ok(());
    }
    if a.cleanup {
        let done = topology::cleanup_stale();
        if let Some(j) = json {
            j.print(&serde_json::json!({ "removed": done }))?;
            return Ok(());
        }
        if done.is_empty() {
            nsfast_sys::outln!("nothing to clean up")?;
        }
        for d in done {
            nsfast_sys::outln!("removed {d}")?;
        }
        return Ok(());
    }
    let cfg = config(&a)?;
    let launcher = Launcher::current_exe().context("find the nsfast executable")?;
    let mut runner = Runner::new(cfg, launcher);
    runner.progress = !a.no_progress;
    let started = std::time::Instant::now();
    let outcome = match runner.run(&mut StderrObserver) {
        Ok(o) => o,
        Err(e @ BenchError::Interrupted(_)) => {
            // Everything the run created is gone by now (the runner's guards dropped).
            eprintln!("nsfast: {e}");
            std::process::exit(130);
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(j) = json.filter(|_| a.json.as_deref().is_none_or(is_stdout)) {
        let doc = Document::new(&outcome);
        nsfast_sys::outln!("{}", j.render(&doc)?)?;
        return Ok(());
    }
    nsfast_sys::out!("{}", report::table(&outcome))?;
    nsfast_sys::outln!("run took {:.0} s", started.elapsed().as_secs_f64())?;
    if let Some(path) = &a.json {
        let doc = Document::new(&outcome);
        nsfast_bench::runner::write_file(path, &doc.to_json())?;
        nsfast_sys::outln!("wrote {}", path.display())?;
        for (p, text) in svg::charts(path, &doc.summary, &outcome.machine) {
            nsfast_bench::runner::write_file(&p, &text)?;
            nsfast_sys::outln!("wrote {}", p.display())?;
        }
    }
    Ok(())
}

fn is_stdout(p: &std::path::Path) -> bool {
    p.as_os_str() == "-"
}

/// JSON on stdout: the global `-j`/`-p`, or `bench --json` without a FILE (or `--json -`).
fn json_out(a: &BenchArgs) -> Option<nsfast_sys::out::Json> {
    crate::cmd::output::json().or(a
        .json
        .as_deref()
        .filter(|p| is_stdout(p))
        .map(|_| nsfast_sys::out::Json::default()))
}

pub fn worker(a: WorkerArgs) -> anyhow::Result<()> {
    let mut out = std::io::stdout();
    nsfast_bench::worker::run(&a.spec, &mut out).map_err(|e| anyhow::anyhow!("bench-worker: {e}"))
}
