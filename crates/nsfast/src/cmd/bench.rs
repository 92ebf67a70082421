//! `nsfast bench` and its hidden worker `nsfast bench-worker SPEC`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use nsfast_bench::proc::Launcher;
use nsfast_bench::report::{self, Document};
use nsfast_bench::runner::{Runner, StderrObserver};
use nsfast_bench::spec::{Config, Placement, Sizes, Workload, MAX_DATAGRAM, MAX_MESSAGE};
use nsfast_bench::stats::summarize;
use nsfast_bench::topology::{ProbeCtx, Tenant};
use nsfast_bench::{export, topology, BenchError};
use nsfast_sys::args::{duration, size};

/// A value parser `parse` whose names (a fixed set) the shell completions offer: the error
/// for a bad value stays `parse`'s, which names the valid ones on the same line; `--help`
/// lists them in the option's text.
#[derive(Clone)]
struct Named<P> {
    names: Vec<&'static str>,
    parse: P,
}

fn named<P: clap::builder::TypedValueParser>(names: Vec<&'static str>, parse: P) -> Named<P> {
    Named { names, parse }
}

impl<P: clap::builder::TypedValueParser> clap::builder::TypedValueParser for Named<P> {
    type Value = P::Value;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Self::Value, clap::Error> {
        self.parse.parse_ref(cmd, arg, value)
    }

    fn possible_values(
        &self,
    ) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        Some(Box::new(
            self.names
                .iter()
                .map(|n| clap::builder::PossibleValue::new(*n)),
        ))
    }
}

/// Every path side by side: host, veth, routed, sockmap (and later ones), in one run.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Short run for demos (5 rounds × 0.6 s, 0.2 s warm-up; about a minute on 2 vCPUs).
    #[arg(long)]
    pub quick: bool,
    /// Comma-separated topologies: host, pipe, unix, veth, routed, sockmap, bpf, bpf-policy-10,
    /// bpf-policy-1000, bpf-tc, bpf-shortcut, bpf-remote, netkit, cni-ptp, cni-ptp-remote,
    /// slirp4netns, pasta, vpnrelay, vsock, vsock-relay, vsock-socat (the vsock ones in VM
    /// guests only; slirp4netns, pasta and vpnrelay with --tenant only)
    /// [default: host,pipe,unix,veth,routed,sockmap]. Unsupported ones are skipped with the reason.
    #[arg(long, value_name = "LIST", value_delimiter = ',', allow_hyphen_values = true,
          hide_possible_values = true,
          value_parser = named(topology::registry().iter().map(|d| d.name).collect(),
                               |s: &str| topology::find(s.trim()).map(|d| d.name.to_string())))]
    pub topologies: Option<Vec<String>>,
    /// The existing user the slirp4netns, pasta and vpnrelay topologies run as (RootlessKit,
    /// slirp4netns, pasta and the relay start as USER, like rootless Docker): not root, with ranges in
    /// /etc/subuid and /etc/subgid. Without it those topologies are skipped with the reason;
    /// nsfast bench never creates users or edits /etc/subuid and /etc/subgid (docs/bench.md
    /// says how to make such a user).
    #[arg(long, value_name = "USER",
          value_parser = |s: &str| nsfast_bench::rootless_hook::tenant(s))]
    pub tenant: Option<Tenant>,
    /// Comma-separated workloads: rr, crr, stream, udp-stream, ping [default: all].
    #[arg(long, value_name = "LIST", value_delimiter = ',', allow_hyphen_values = true,
          hide_possible_values = true,
          value_parser = named(Workload::ALL.iter().map(|w| w.name()).collect(),
                               |s: &str| Workload::parse(s.trim())))]
    pub workloads: Option<Vec<Workload>>,
    /// Interleaved rounds (A B C A B C ...), 1-1000 [default: 5, --quick: 5].
    #[arg(long, value_name = "N", allow_hyphen_values = true,
          value_parser = clap::value_parser!(u32).range(1..=MAX_ROUNDS))]
    pub rounds: Option<u32>,
    /// Time per measurement, e.g. 3, 0.6 or 500ms (a bare number is seconds; at most 1h)
    /// [default: 3, --quick: 0.6].
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true,
          value_parser = duration::arg("--duration", MAX_TIME, false))]
    pub duration: Option<Duration>,
    /// Warm-up per topology × workload before round 1; 0 disables (at most 1h) [default: 1,
    /// --quick: 0.2].
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true,
          value_parser = duration::arg("--warmup", MAX_TIME, true))]
    pub warmup: Option<Duration>,
    /// Comma-separated CPU placements: same-cpu, cross-cpu, unpinned [default: same-cpu].
    #[arg(long, value_name = "LIST", value_delimiter = ',', allow_hyphen_values = true,
          hide_possible_values = true,
          value_parser = named(Placement::ALL.iter().map(|p| p.name()).collect(),
                               |s: &str| Placement::parse(s.trim())))]
    pub placement: Option<Vec<Placement>>,
    /// rr/crr/ping request size in bytes, e.g. 1, 4K, 1MiB (at most 16M) [default: 1].
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true,
          value_parser = size::arg_u32("--request-size", 1, MAX_MESSAGE))]
    pub request_size: Option<u32>,
    /// rr/crr/ping response size in bytes (at most 16M) [default: 1].
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true,
          value_parser = size::arg_u32("--response-size", 1, MAX_MESSAGE))]
    pub response_size: Option<u32>,
    /// stream write size in bytes (at most 16M) [default: 128K].
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true,
          value_parser = size::arg_u32("--stream-size", 1, MAX_MESSAGE))]
    pub stream_size: Option<u32>,
    /// udp-stream datagram payload in bytes (at most 65507) [default: 1400].
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true,
          value_parser = size::arg_u32("--udp-size", 1, MAX_DATAGRAM))]
    pub udp_size: Option<u32>,
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
    /// Write the JSON document to FILE (as --json FILE), or to stdout with `-` (as `-j`).
    /// Whenever the document goes to stdout, the table and the "wrote" lines go to stderr.
    #[arg(long, value_name = "FILE|-", conflicts_with = "json")]
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
    /// Count nsfast's BPF programs' runs and run time during every measurement (the kernel's
    /// BPF statistics, as `sysctl kernel.bpf_stats_enabled=1`): each row's notes, the JSON and
    /// the CSV get nanoseconds and runs per transaction (per GB for streams), by program in
    /// the JSON. The statistics cost each program run two clock reads.
    #[arg(long)]
    pub bpf_stats: bool,
    /// List the topologies and whether this machine can run them, then exit.
    #[arg(long)]
    pub list: bool,
    /// Remove what runs that were killed left (namespaces, cgroups, temporary folders and
    /// nsfast pod state of bench runs nsfb<dead pid>-* and tests nsft<dead pid>x*, pod state
    /// whose host namespace is gone, the vpnrelay test world nsfv<dead pid>x*: its processes,
    /// namespaces, runtime folder), then exit.
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

/// The JSON document's file: `--json FILE` or `--output FILE` (not `-`).
fn json_file(a: &BenchArgs) -> Option<&PathBuf> {
    a.json
        .as_ref()
        .or(a.output.as_ref())
        .filter(|p| !is_stdout(p))
}

/// Most `--rounds`.
const MAX_ROUNDS: i64 = 1000;
/// Longest `--duration` and `--warmup`.
const MAX_TIME: Duration = Duration::from_secs(3600);

/// `v` without repeats, in first-seen order.
fn distinct<T: PartialEq + Clone>(v: &[T]) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for x in v {
        if !out.contains(x) {
            out.push(x.clone());
        }
    }
    out
}

fn config(a: &BenchArgs) -> Result<Config, BenchError> {
    let topologies = match &a.topologies {
        Some(t) => distinct(t),
        None => topology::DEFAULT.iter().map(|s| s.to_string()).collect(),
    };
    let workloads = match &a.workloads {
        Some(w) => distinct(w),
        None => Workload::ALL.to_vec(),
    };
    let placements = match &a.placement {
        Some(p) => distinct(p),
        None => vec![Placement::SameCpu],
    };
    let (def_dur, def_warm) = if a.quick {
        (Duration::from_millis(600), Duration::from_millis(200))
    } else {
        (Duration::from_secs(3), Duration::from_secs(1))
    };
    let d = Sizes::default();
    let sizes = Sizes {
        request: a.request_size.unwrap_or(d.request),
        response: a.response_size.unwrap_or(d.response),
        stream_write: a.stream_size.unwrap_or(d.stream_write),
        datagram: a.udp_size.unwrap_or(d.datagram),
    };
    sizes.validate()?;
    Ok(Config {
        topologies,
        workloads,
        placements,
        rounds: a.rounds.unwrap_or(5),
        duration: a.duration.unwrap_or(def_dur),
        warmup: a.warmup.unwrap_or(def_warm),
        sizes,
        json: json_file(a).cloned(),
        cross_check: a.cross_check,
        quick: a.quick,
        tenant: a.tenant.clone(),
        bpf_stats: a.bpf_stats,
    })
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    // Block SIGINT/SIGTERM before any thread starts: the runner polls for them and tears
    // everything down itself.
    nsfast_sys::signals::block_termination().context("block SIGINT/SIGTERM")?;
    let json = json_out(&a);
    if a.list {
        let probe = ProbeCtx {
            tenant: a.tenant.clone(),
        };
        let rows: Vec<(&str, &str, Result<(), String>)> = topology::registry()
            .iter()
            .map(|d| (d.name, d.about, (d.probe)(&probe)))
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
    // On for the whole run (the kernel turns them off when this closes).
    let _stats = if cfg.bpf_stats {
        Some(nsfast_bench::bpfstats::enable().map_err(anyhow::Error::msg)?)
    } else {
        None
    };
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
    // JSON on stdout (`-j`, `--json -`, `--output -`) unless a JSON file is named: then
    // stdout is the document's alone and the table goes to stderr.
    let stdout_json = json.filter(|_| json_file(&a).is_none());
    let to_stdout = stdout_json.is_some();
    let say = |line: String| -> anyhow::Result<()> {
        if to_stdout {
            eprint!("{line}");
        } else {
            nsfast_sys::out!("{line}")?;
        }
        Ok(())
    };
    // The summary, once: the table, the charts, the CSV and the JSON document all show it.
    let summary = summarize(&outcome.samples, &outcome.topologies);
    say(report::table(&outcome, &summary))?;
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
    let files = targets.files(&outcome, &summary);
    // The histograms are the .hgrm files' (the worker's report carries them); the JSON keeps
    // their percentiles and stays small.
    export::drop_histograms(&mut outcome);
    let doc = Document::new(&outcome, &summary);
    if let Some(path) = &targets.json_file {
        nsfast_bench::runner::write_file(path, &doc.to_json())?;
        say(format!("wrote {}\n", path.display()))?;
    }
    for (p, text) in files {
        nsfast_bench::runner::write_file(&p, &text)?;
        say(format!("wrote {}\n", p.display()))?;
    }
    if let Some(j) = stdout_json {
        nsfast_sys::outln!("{}", j.render(&doc)?)?;
    }
    Ok(())
}

fn is_stdout(p: &std::path::Path) -> bool {
    p.as_os_str() == "-"
}

/// JSON on stdout: the global `-j`/`-p`, or `bench --json` without a FILE (or `--json -`,
/// `--output -`).
fn json_out(a: &BenchArgs) -> Option<nsfast_sys::out::Json> {
    crate::cmd::output::json().or(a
        .json
        .as_deref()
        .or(a.output.as_deref())
        .filter(|p| is_stdout(p))
        .map(|_| nsfast_sys::out::Json::default()))
}

pub fn worker(a: WorkerArgs) -> anyhow::Result<()> {
    let mut out = std::io::stdout();
    nsfast_bench::worker::run(&a.spec, &mut out).map_err(|e| anyhow::anyhow!("bench-worker: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        a: BenchArgs,
    }

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.a)
    }

    #[test]
    fn sizes_and_durations_take_the_units_the_other_commands_take() {
        let a = parse(&[
            "--stream-size",
            "1MiB",
            "--request-size",
            "4K",
            "--response-size",
            "2kib",
            "--udp-size",
            "1400",
            "--duration",
            "500ms",
            "--warmup",
            "0",
        ])
        .unwrap();
        let c = config(&a).unwrap();
        assert_eq!(c.sizes.stream_write, 1 << 20);
        assert_eq!(c.sizes.request, 4 << 10);
        assert_eq!(c.sizes.response, 2 << 10);
        assert_eq!(c.sizes.datagram, 1400);
        assert_eq!(c.duration, std::time::Duration::from_millis(500));
        assert_eq!(c.warmup, std::time::Duration::ZERO);
        // The defaults of a plain and a --quick run.
        let c = config(&parse(&[]).unwrap()).unwrap();
        assert_eq!(c.sizes, Sizes::default());
        assert_eq!(c.duration, std::time::Duration::from_secs(3));
        let c = config(&parse(&["--quick", "--workloads", "rr,ping,rr"]).unwrap()).unwrap();
        assert_eq!(c.duration, std::time::Duration::from_millis(600));
        assert_eq!(c.warmup, std::time::Duration::from_millis(200));
        assert_eq!(c.workloads, vec![Workload::Rr, Workload::Ping]);
    }

    #[test]
    fn bad_values_are_clap_errors_naming_the_value() {
        for (flag, value) in [
            ("--stream-size", "12Q"),
            ("--stream-size", "32M"),
            ("--request-size", "-5"),
            ("--udp-size", "70000"),
            ("--duration", "0"),
            ("--duration", "2h"),
            ("--warmup", "-1"),
            ("--rounds", "0"),
            ("--workloads", "tcp_rr"),
            ("--placement", "numa"),
            ("--topologies", "vxlan"),
        ] {
            let e = parse(&[flag, value]).expect_err(&format!("{flag} {value} was accepted"));
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{flag} {value}: {e}"
            );
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("invalid value '{value}' for '{flag} ")),
                "{msg}"
            );
        }
        let e = parse(&["--workloads", "rr,,crr"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{e}");
    }
}
