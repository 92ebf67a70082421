//! JSON parses back with every round; SVG charts are well-formed XML with one bar per topology.
//! No root needed: the outcome is synthetic.

use std::time::Duration;

use nsfast_bench::load::{ClientResult, Latency, ServerCounts};
use nsfast_bench::report::{self, Document, Machine};
use nsfast_bench::runner::{CpuCost, Outcome, Sample};
use nsfast_bench::spec::{Config, Placement, Sizes, Workload};
use nsfast_bench::stats::summarize;
use nsfast_bench::svg;

fn outcome() -> Outcome {
    let topologies: Vec<String> = ["host", "veth", "routed"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let workloads = [Workload::Rr, Workload::Stream, Workload::Ping];
    let mut samples = Vec::new();
    for round in 1..=3u32 {
        for w in workloads {
            for (i, t) in topologies.iter().enumerate() {
                let v = 100.0 * (1.0 + round as f64 / 10.0) / (1.0 + i as f64);
                samples.push(Sample {
                    round,
                    topology: t.clone(),
                    workload: w,
                    placement: Placement::SameCpu,
                    client_cpu: Some(0),
                    server_cpu: Some(0),
                    value: Some(v),
                    unit: w.unit().into(),
                    client: Some(ClientResult {
                        workload: Some(w),
                        elapsed_s: 1.0,
                        transactions: 1000,
                        bytes: 2000,
                        datagrams: 0,
                        latency_us: Some(Latency {
                            mean: 10.0,
                            p50: 9.0,
                            p90: 12.0,
                            p99: 20.0,
                            p999: 40.0,
                            max: 90.0,
                        }),
                        latency_ns_recorded: vec![[9_000, 900], [20_000, 99], [90_000, 1]],
                    }),
                    server: Some(ServerCounts {
                        transactions: 1000,
                        bytes: 1000,
                        datagrams: 0,
                        connections: 1,
                    }),
                    loss: None,
                    cpu: Some(CpuCost {
                        client_usec: 500_000,
                        server_usec: 500_000,
                        softirq_usec: 10_000,
                        ksoftirqd_usec: 0,
                        per_unit: 1000.0,
                    }),
                    fast_path: None,
                    bpf: None,
                    error: None,
                });
            }
        }
    }
    Outcome {
        machine: Machine::current(),
        config: Config {
            topologies: vec![
                "host".into(),
                "veth".into(),
                "routed".into(),
                "sockmap".into(),
            ],
            workloads: workloads.to_vec(),
            placements: vec![Placement::SameCpu],
            rounds: 3,
            duration: Duration::from_secs(1),
            warmup: Duration::from_millis(300),
            sizes: Sizes::default(),
            json: None,
            cross_check: false,
            quick: true,
            tenant: None,
            bpf_stats: false,
        },
        topologies,
        skipped: vec![nsfast_bench::runner::Skipped {
            topology: "sockmap".into(),
            reason: "sockmap crate not merged yet".into(),
        }],
        notes: vec![],
        samples,
        cross_check: vec![],
    }
}

#[test]
fn json_parses_back_with_every_round() {
    let o = outcome();
    let rows = summarize(&o.samples, &o.topologies);
    let text = Document::new(&o, &rows).to_json();
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let samples: Vec<Sample> =
        serde_json::from_value(v["samples"].clone()).expect("samples parse back");
    assert_eq!(samples.len(), o.samples.len());
    for round in 1..=3 {
        assert_eq!(samples.iter().filter(|s| s.round == round).count(), 9);
    }
    assert_eq!(v["machine"]["kernel"], nsfast_sys::kernel::release());
    assert_eq!(v["skipped"][0]["topology"], "sockmap");
    assert_eq!(v["summary"].as_array().unwrap().len(), 9);
    // Ratio to host: host 1.0, veth 0.5, routed 1/3 in every round.
    let veth_rr = v["summary"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["topology"] == "veth" && r["workload"] == "rr")
        .unwrap();
    assert!((veth_rr["ratio_to_host"].as_f64().unwrap() - 0.5).abs() < 1e-9);
}

#[test]
fn svg_is_well_formed_with_one_bar_per_topology() {
    let o = outcome();
    let rows = summarize(&o.samples, &o.topologies);
    let charts = svg::charts(std::path::Path::new("/tmp/x/bench.json"), &rows, &o.machine);
    assert_eq!(charts.len(), 3);
    for (path, text) in charts {
        assert!(path.to_string_lossy().ends_with("-same-cpu.svg"));
        let doc = roxmltree::Document::parse(&text).expect("well-formed XML");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let bars: Vec<_> = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("bar"))
            .map(|n| n.attribute("data-topology").unwrap().to_string())
            .collect();
        assert_eq!(bars, o.topologies, "{}", path.display());
    }
}

#[test]
fn table_has_a_row_per_topology_and_workload() {
    let o = outcome();
    let rows = summarize(&o.samples, &o.topologies);
    let t = report::table(&o, &rows);
    assert!(t.contains("placement same-cpu"));
    for w in ["rr", "stream", "ping"] {
        assert!(t.lines().any(|l| l.starts_with(w)), "{t}");
    }
    assert_eq!(
        t.lines().filter(|l| l.contains(" routed ")).count(),
        3,
        "{t}"
    );
    assert!(t.contains("skipped sockmap: sockmap crate not merged yet"));
}

/// An idle fast path's samples are failed rounds in the table (no figure), and their evidence
/// is in the JSON next to them.
#[test]
fn idle_fast_path_samples_are_failed_rounds_with_their_evidence() {
    let mut o = outcome();
    let evidence = nsfast_bench::evidence::Evidence {
        source: "sockmap shortcut stats (nsf_stats)".into(),
        carried: [("redirected_bytes".to_string(), 0)].into(),
        moved: Default::default(),
    };
    for s in o
        .samples
        .iter_mut()
        .filter(|s| s.topology == "routed" && s.workload == Workload::Rr)
    {
        s.error = evidence.idle_error();
        s.value = None;
        s.fast_path = Some(evidence.clone());
    }
    let summary = summarize(&o.samples, &o.topologies);
    let t = report::table(&o, &summary);
    let rows: Vec<&str> = t.lines().filter(|l| l.contains(" routed ")).collect();
    assert_eq!(rows.len(), 3, "{t}");
    // rr is the first workload: its routed row is the first.
    let row = rows[0];
    assert!(
        row.contains("3 round(s) failed: fast path idle: redirected_bytes"),
        "{row}"
    );
    assert!(
        row.contains(" – tx/s") && !row.contains("µs/tx"),
        "no figure and no CPU cost for an idle fast path: {row}"
    );
    assert!(!rows[1].contains("failed"), "{t}");
    let v: serde_json::Value =
        serde_json::from_str(&Document::new(&o, &summary).to_json()).unwrap();
    let s = v["samples"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["topology"] == "routed" && s["workload"] == "rr")
        .unwrap();
    assert_eq!(s["fast_path"]["carried"]["redirected_bytes"], 0, "{s}");
    assert!(s["value"].is_null(), "{s}");
}

/// The spread the JSON summary gives is the one the table prints (one function computes it).
#[test]
fn json_spread_equals_the_tables() {
    let o = outcome();
    let rows = summarize(&o.samples, &o.topologies);
    let t = report::table(&o, &rows);
    let v: serde_json::Value = serde_json::from_str(&Document::new(&o, &rows).to_json()).unwrap();
    let rows = v["summary"].as_array().unwrap();
    assert_eq!(rows.len(), 9);
    for r in rows {
        let json = format!("±{:.1}%", r["spread_pct"].as_f64().unwrap());
        let line = table_row(
            &t,
            r["workload"].as_str().unwrap(),
            r["topology"].as_str().unwrap(),
        )
        .unwrap_or_else(|| panic!("no table row for {r}\n{t}"));
        assert!(
            line.split_whitespace().any(|c| c == json),
            "JSON spread {json} not in the table row {line:?}"
        );
    }
}

/// The table line of `workload` × `topology` (the workload column is blank under its first row).
pub fn table_row<'a>(table: &'a str, workload: &str, topology: &str) -> Option<&'a str> {
    let mut current = String::new();
    for line in table.lines() {
        if line.is_empty() || line.starts_with(' ') {
            if let Some(t) = line.split_whitespace().next() {
                if t == topology && current == workload {
                    return Some(line);
                }
            }
            continue;
        }
        let mut cols = line.split_whitespace();
        current = cols.next().unwrap_or_default().to_string();
        if current == workload && cols.next() == Some(topology) {
            return Some(line);
        }
    }
    None
}

/// CSV: a header, one line per sample and one per summary row, the summary's spread and ratio
/// as in the JSON; .hgrm: one distribution per topology × workload × placement with latencies.
#[test]
fn csv_and_hgrm_exports() {
    let o = outcome();
    let rows = summarize(&o.samples, &o.topologies);
    let csv = nsfast_bench::export::csv(&o, &rows);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], nsfast_bench::export::CSV_HEADER);
    assert_eq!(lines.len(), 1 + o.samples.len() + 9, "{csv}");
    let veth_rr = lines
        .iter()
        .find(|l| l.starts_with("median,,veth,rr,same-cpu,"))
        .unwrap();
    let cols: Vec<&str> = veth_rr.split(',').collect();
    let row = summarize(&o.samples, &o.topologies)
        .into_iter()
        .find(|r| r.topology == "veth" && r.workload == Workload::Rr)
        .unwrap();
    assert_eq!(cols[7].parse::<f64>().unwrap(), row.spread_pct.unwrap());
    assert!(
        (cols[8].parse::<f64>().unwrap() - 0.5).abs() < 1e-9,
        "{veth_rr}"
    );
    let files = nsfast_bench::export::hgrm(&o);
    assert_eq!(files.len(), 9);
    let (name, text) = &files[0];
    assert_eq!(name, "host-rr-same-cpu.hgrm");
    // Three rounds of 900 × 9 µs, 99 × 20 µs, 1 × 90 µs.
    assert!(
        text.contains("#[Max     =       90.047, Total count    =         3000]"),
        "{text}"
    );
}
