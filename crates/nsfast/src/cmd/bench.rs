//! `nsfast bench` and its hidden worker `nsfast bench-worker SPEC`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use nsfast_bench::proc::Launcher;
use nsfast_bench::report::{self, Document};
use nsfast_bench::runner::{Runner, StderrObserver};
use nsfast_bench::spec::{self, Config, Placement, Sizes, Workload, MAX_DATAGRAM, MAX_MESSAGE};
use nsfast_bench::stats::summarize;
use nsfast_bench::{export, topology, BenchError};

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
    #[arg(long, value_name = "FILE", conflicts_with = "output")]
    pub json: Option<PathBuf>,
    /// Write the JSON document to FILE (as --json), or to stdout with `-`: then the table and
    /// the "wrote" lines go to stderr.
    #[arg(long, value_name = "FILE|-")]
    pub output: Option<PathBuf>,
    /// Write the SVG charts into DIR (default: next to the JSON file; none without one).
    #[arg(long, value_name = "DIR", conflicts_with = "no_charts")]
    pub svg_dir: Option<PathBuf>,
    /// No SVG charts.
    #[arg(long)]
    pub no_charts: bool,
    /// Write every sample and every summary figure as CSV to FILE (topology, workload,
    /// placement, value, unit, spread, ratio).
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Write one HdrHistogram percentile distribution (.hgrm, µs) per topology × workload ×
    /// placement with latencies (rr, crr, ping) into DIR.
    #[arg(long, value_name = "DIR")]
    pub hgrm_dir: Option<PathBuf>,
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

/// The JSON document's file: `--json FILE` or `--output FILE` (not `--output -`).
fn json_file(a: &BenchArgs) -> Option<&PathBuf> {
    a.json
        .as_ref()
        .or(a.output.as_ref())
        .filter(|p| p.as_os_str() != "-")
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
        json: json_file(a).cloned(),
        cross_check: a.cross_check,
        quick: a.quick,
    })
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    // Block SIGINT/SIGTERM before any thread starts: the runner polls for them and tears
    // everything down itself.
    nsfast_sys::signals::block_termination().context("block SIGINT/SIGTERM")?;
    if a.list {
        for d in topology::registry() {
            let status = match (d.probe)() {
                Ok(()) => "available".to_string(),
                Err(r) => format!("skipped: {r}"),
            };
            nsfast_sys::outln!("{:<12} {:<70} {status}", d.name, d.about)?;
        }
        return Ok(());
    }
    if a.cleanup {
        let done = topology::cleanup_stale();
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
    let to_stdout = a.output.as_deref().is_some_and(|p| p.as_os_str() == "-");
    // With `--output -` stdout is the JSON document's alone; the table goes to stderr.
    let say = |line: String| -> anyhow::Result<()> {
        if to_stdout {
            eprint!("{line}");
        } else {
            nsfast_sys::out!("{line}")?;
        }
        Ok(())
    };
    say(report::table(&outcome))?;
    say(format!(
        "run took {:.0} s\n",
        started.elapsed().as_secs_f64()
    ))?;
    let targets = export::Targets {
        json_file: json_file(&a).cloned(),
        svg_dir: a.svg_dir.clone(),
        no_charts: a.no_charts,
        csv: a.csv.clone(),
        hgrm_dir: a.hgrm_dir.clone(),
    };
    let mut outcome = outcome;
    let files = targets.files(&outcome, &summarize(&outcome.samples, &outcome.topologies));
    // The histograms are the .hgrm files' (the worker's report carries them); the JSON keeps
    // their percentiles and stays small.
    export::drop_histograms(&mut outcome);
    let doc = Document::new(&outcome);
    if let Some(path) = &targets.json_file {
        nsfast_bench::runner::write_file(path, &doc.to_json())?;
        say(format!("wrote {}\n", path.display()))?;
    }
    for (p, text) in files {
        nsfast_bench::runner::write_file(&p, &text)?;
        say(format!("wrote {}\n", p.display()))?;
    }
    if to_stdout {
        nsfast_sys::outln!("{}", doc.to_json())?;
    }
    Ok(())
}

pub fn worker(a: WorkerArgs) -> anyhow::Result<()> {
    let mut out = std::io::stdout();
    nsfast_bench::worker::run(&a.spec, &mut out).map_err(|e| anyhow::anyhow!("bench-worker: {e}"))
}
