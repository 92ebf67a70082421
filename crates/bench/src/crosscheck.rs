//! `--cross-check`: run sockperf (ping-pong latency) and iperf3 (bulk TCP) on the same built
//! topology, same namespaces, cgroups and CPUs, and put their figure next to ours.

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::built::Built;
use crate::proc::{command_in, sleep_interruptible, ChildGuard};
use crate::runner::{Runner, Sample};
use crate::spec::{Placement, Sizes, Workload};
use crate::BenchError;

/// Ours must agree with the established tool within this fraction on host and veth.
pub const AGREEMENT: f64 = 0.15;

/// Alternating runs of the tool and of ours; medians are compared (this machine is noisy).
pub const REPS: usize = 3;

/// sockperf's default message size, used for both sides of the latency comparison.
pub const SOCKPERF_MSG: u32 = 14;

/// One comparison.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CrossCheck {
    pub topology: String,
    pub placement: Placement,
    pub tool: String,
    /// What is compared, e.g. "TCP ping-pong p50 RTT, 14 B".
    pub metric: String,
    pub unit: String,
    /// Median of the tool's runs.
    pub tool_value: Option<f64>,
    /// Median of our runs.
    pub ours: Option<f64>,
    /// Every run of the tool, alternating with ours (tool, ours, tool, ours, ...).
    pub tool_runs: Vec<f64>,
    pub our_runs: Vec<f64>,
    /// (ours - tool) / tool, in percent.
    pub diff_pct: Option<f64>,
    pub agree: Option<bool>,
    pub note: Option<String>,
}

/// Finds `prog` on PATH.
pub fn which(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

/// Parses sockperf's `percentile 50.000 = X` line (µs).
pub fn parse_sockperf_p50(out: &str) -> Option<f64> {
    out.lines().find_map(|l| {
        let (_, rest) = l.split_once("percentile 50.000 =")?;
        rest.trim().parse().ok()
    })
}

/// Parses iperf3 `-J` output: end.sum_received.bits_per_second, as Gbit/s.
pub fn parse_iperf3_gbps(out: &str) -> Option<f64> {
    let v: serde_json::Value = serde_json::from_str(out).ok()?;
    let bps = v
        .get("end")?
        .get("sum_received")?
        .get("bits_per_second")?
        .as_f64()?;
    Some(bps / 1e9)
}

fn read_all(g: &mut ChildGuard) -> String {
    let mut s = String::new();
    let _ = g.stdout().read_to_string(&mut s);
    s
}

fn compare(mut c: CrossCheck) -> CrossCheck {
    c.tool_value = crate::stats::median(&c.tool_runs);
    c.ours = crate::stats::median(&c.our_runs);
    if let (Some(t), Some(o)) = (c.tool_value, c.ours) {
        if t > 0.0 {
            let d = (o - t) / t;
            c.diff_pct = Some(d * 100.0);
            c.agree = Some(d.abs() <= AGREEMENT);
        }
    }
    c
}

/// A cross-check of `b` with nothing measured yet.
fn new_check(
    b: &Built,
    placement: Placement,
    tool: &str,
    metric: String,
    unit: &str,
) -> CrossCheck {
    CrossCheck {
        topology: b.name.into(),
        placement,
        tool: tool.into(),
        metric,
        unit: unit.into(),
        tool_value: None,
        ours: None,
        tool_runs: vec![],
        our_runs: vec![],
        diff_pct: None,
        agree: None,
        note: None,
    }
}

/// Alternates `REPS` times: one run of the tool (its value, or a note why there is none),
/// then one of ours; then compares the medians.
fn alternate(
    mut c: CrossCheck,
    mut tool_once: impl FnMut() -> Result<Result<f64, String>, BenchError>,
    mut ours_once: impl FnMut() -> Result<Sample, BenchError>,
) -> Result<CrossCheck, BenchError> {
    for _ in 0..REPS {
        match tool_once()? {
            Ok(v) => c.tool_runs.push(v),
            Err(note) => c.note = Some(note),
        }
        c.our_runs.extend(ours_once()?.value);
    }
    Ok(compare(c))
}

/// Runs both cross-checks on `b`.
pub fn run(
    runner: &Runner,
    b: &Built,
    placement: Placement,
    ccpu: Option<usize>,
    scpu: Option<usize>,
    duration: Duration,
) -> Result<Vec<CrossCheck>, BenchError> {
    Ok(vec![
        sockperf(runner, b, placement, ccpu, scpu, duration)?,
        iperf3(runner, b, placement, ccpu, scpu, duration)?,
    ])
}

fn sockperf(
    runner: &Runner,
    b: &Built,
    placement: Placement,
    ccpu: Option<usize>,
    scpu: Option<usize>,
    duration: Duration,
) -> Result<CrossCheck, BenchError> {
    let mut c = new_check(
        b,
        placement,
        "sockperf",
        format!("TCP ping-pong p50 round trip, {SOCKPERF_MSG} B"),
        "µs",
    );
    let Some(prog) = which("sockperf") else {
        c.note = Some("sockperf not installed (apt-get install sockperf)".into());
        return Ok(c);
    };
    let sizes = Sizes {
        request: SOCKPERF_MSG,
        response: SOCKPERF_MSG,
        ..runner.config.sizes
    };
    alternate(
        c,
        || sockperf_once(&prog, b, scpu, ccpu, duration),
        || runner.measure_with(b, Workload::Ping, sizes, placement, ccpu, scpu, duration, 0),
    )
}

/// One sockperf ping-pong run: the p50 round trip, or why there is none.
fn sockperf_once(
    prog: &std::path::Path,
    b: &Built,
    scpu: Option<usize>,
    ccpu: Option<usize>,
    duration: Duration,
) -> Result<Result<f64, String>, BenchError> {
    let ip = b.server_ip.to_string();
    let port = "11111".to_string();
    // sockperf spends its first 400 ms warming up; give it that on top.
    let secs = format!("{}", duration.as_secs_f64().ceil().max(1.0) as u64 + 1);
    let srv = command_in(
        prog,
        &[
            "sr".into(),
            "--tcp".into(),
            "-i".into(),
            ip.clone(),
            "-p".into(),
            port.clone(),
        ],
        b.server_ns(),
        b.server.cgroup.path(),
        scpu,
    );
    let _server = ChildGuard::spawn(srv, format!("sockperf server ({})", b.name))?;
    sleep_interruptible(Duration::from_millis(400))?;
    let cli = command_in(
        prog,
        &[
            "pp".into(),
            "--tcp".into(),
            "-i".into(),
            ip,
            "-p".into(),
            port,
            "-t".into(),
            secs,
            "-m".into(),
            SOCKPERF_MSG.to_string(),
            "--full-rtt".into(),
        ],
        b.client_ns(),
        b.client.cgroup.path(),
        ccpu,
    );
    let mut client = ChildGuard::spawn(cli, format!("sockperf client ({})", b.name))?;
    client.wait(Duration::from_secs(30) + duration)?;
    let text = read_all(&mut client);
    Ok(parse_sockperf_p50(&text)
        .ok_or_else(|| format!("could not parse sockperf output: {}", client.stderr_text())))
}

fn iperf3(
    runner: &Runner,
    b: &Built,
    placement: Placement,
    ccpu: Option<usize>,
    scpu: Option<usize>,
    duration: Duration,
) -> Result<CrossCheck, BenchError> {
    let mut c = new_check(
        b,
        placement,
        "iperf3",
        format!(
            "TCP bulk, one stream, {} KiB writes",
            runner.config.sizes.stream_write / 1024
        ),
        "Gbit/s",
    );
    let Some(prog) = which("iperf3") else {
        c.note = Some("iperf3 not installed (apt-get install iperf3)".into());
        return Ok(c);
    };
    let secs = duration.as_secs_f64().ceil().max(1.0) as u64;
    alternate(
        c,
        || iperf3_once(&prog, runner, b, scpu, ccpu, secs),
        || {
            runner.measure_with(
                b,
                Workload::Stream,
                runner.config.sizes,
                placement,
                ccpu,
                scpu,
                Duration::from_secs(secs),
                0,
            )
        },
    )
}

/// One iperf3 run: Gbit/s received, or why there is none.
fn iperf3_once(
    prog: &std::path::Path,
    runner: &Runner,
    b: &Built,
    scpu: Option<usize>,
    ccpu: Option<usize>,
    secs: u64,
) -> Result<Result<f64, String>, BenchError> {
    let ip = b.server_ip.to_string();
    let port = "15201".to_string();
    let srv = command_in(
        prog,
        &[
            "-s".into(),
            "-1".into(),
            "-B".into(),
            ip.clone(),
            "-p".into(),
            port.clone(),
        ],
        b.server_ns(),
        b.server.cgroup.path(),
        scpu,
    );
    let mut server = ChildGuard::spawn(srv, format!("iperf3 server ({})", b.name))?;
    sleep_interruptible(Duration::from_millis(400))?;
    let cli = command_in(
        prog,
        &[
            "-c".into(),
            ip,
            "-p".into(),
            port,
            "-t".into(),
            secs.to_string(),
            "-l".into(),
            runner.config.sizes.stream_write.to_string(),
            "-i".into(),
            "0".into(),
            "-J".into(),
        ],
        b.client_ns(),
        b.client.cgroup.path(),
        ccpu,
    );
    let mut client = ChildGuard::spawn(cli, format!("iperf3 client ({})", b.name))?;
    client.wait(Duration::from_secs(30 + secs))?;
    let text = read_all(&mut client);
    server.kill();
    Ok(parse_iperf3_gbps(&text)
        .ok_or_else(|| format!("could not parse iperf3 output: {}", client.stderr_text())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tool_output() {
        let sp = "sockperf: Summary: Round trip is 21.093 usec\n\
sockperf: ---> percentile 90.000 =   12.778\n\
sockperf: ---> percentile 50.000 =   12.087\n";
        assert_eq!(parse_sockperf_p50(sp), Some(12.087));
        let ip = r#"{"end":{"sum_received":{"bits_per_second":12.5e9}}}"#;
        assert_eq!(parse_iperf3_gbps(ip), Some(12.5));
        assert_eq!(parse_iperf3_gbps("{}"), None);
        let c = compare(CrossCheck {
            topology: "host".into(),
            placement: Placement::SameCpu,
            tool: "x".into(),
            metric: "m".into(),
            unit: "u".into(),
            tool_value: None,
            ours: None,
            tool_runs: vec![9.0, 10.0, 30.0],
            our_runs: vec![11.0, 1.0, 12.0],
            diff_pct: None,
            agree: None,
            note: None,
        });
        assert!((c.diff_pct.unwrap() - 10.0).abs() < 1e-9);
        assert_eq!(c.agree, Some(true));
    }
}
