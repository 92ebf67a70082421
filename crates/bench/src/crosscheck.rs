//! `--cross-check`: run sockperf (ping-pong latency) and iperf3 (bulk TCP) on the same built
//! topology, same namespaces, cgroups and CPUs, and put their figure next to ours.

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use crate::built::Built;
pub use crate::model::CrossCheck;
use crate::model::Sample;
use crate::proc::{command_in, sleep_interruptible, ChildGuard};
use crate::spec::{Placement, Sizes, Workload};
use crate::BenchError;

/// Ours must agree with the established tool within this fraction on host and veth.
pub const AGREEMENT: f64 = 0.15;

/// Alternating runs of the tool and of ours; medians are compared (this machine is noisy).
pub(crate) const REPS: usize = 3;

/// sockperf's default message size, used for both sides of the latency comparison.
pub(crate) const SOCKPERF_MSG: u32 = 14;

/// Finds `prog` on PATH.
pub fn which(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

/// Parses sockperf's `percentile 50.000 = X` line (µs).
pub(crate) fn parse_sockperf_p50(out: &str) -> Option<f64> {
    out.lines().find_map(|l| {
        let (_, rest) = l.split_once("percentile 50.000 =")?;
        rest.trim().parse().ok()
    })
}

/// Parses iperf3 `-J` output: end.sum_received.bits_per_second, as Gbit/s.
pub(crate) fn parse_iperf3_gbps(out: &str) -> Option<f64> {
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

/// Where and how long a cross-check runs: the run's sizes, the placement and its CPUs.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    pub sizes: Sizes,
    pub placement: Placement,
    pub ccpu: Option<usize>,
    pub scpu: Option<usize>,
    pub duration: Duration,
}

/// One of our measurements on the same topology and placement: workload, sizes, duration.
pub type Ours<'a> = dyn Fn(Workload, Sizes, Duration) -> Result<Sample, BenchError> + 'a;

/// Runs both cross-checks on `b`; `ours` measures with our load generator.
pub fn run(b: &Built, s: &Setup, ours: &Ours) -> Result<Vec<CrossCheck>, BenchError> {
    Ok(vec![sockperf(b, s, ours)?, iperf3(b, s, ours)?])
}

fn sockperf(b: &Built, s: &Setup, ours: &Ours) -> Result<CrossCheck, BenchError> {
    let mut c = new_check(
        b,
        s.placement,
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
        ..s.sizes
    };
    alternate(
        c,
        || sockperf_once(&prog, b, s.scpu, s.ccpu, s.duration),
        || ours(Workload::Ping, sizes, s.duration),
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

fn iperf3(b: &Built, s: &Setup, ours: &Ours) -> Result<CrossCheck, BenchError> {
    let mut c = new_check(
        b,
        s.placement,
        "iperf3",
        format!(
            "TCP bulk, one stream, {} KiB writes",
            s.sizes.stream_write / 1024
        ),
        "Gbit/s",
    );
    let Some(prog) = which("iperf3") else {
        c.note = Some("iperf3 not installed (apt-get install iperf3)".into());
        return Ok(c);
    };
    let secs = s.duration.as_secs_f64().ceil().max(1.0) as u64;
    alternate(
        c,
        || iperf3_once(&prog, s.sizes.stream_write, b, s.scpu, s.ccpu, secs),
        || ours(Workload::Stream, s.sizes, Duration::from_secs(secs)),
    )
}

/// One iperf3 run: Gbit/s received, or why there is none.
fn iperf3_once(
    prog: &std::path::Path,
    stream_write: u32,
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
            stream_write.to_string(),
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
