//! `vpnrelay supervise --metrics-listen`: the relay's counters (what `vpnrelay status`
//! shows, from its `relay-BRIDGE.stats` file, read at every scrape) and the supervisor's
//! restarts, as Prometheus metrics (docs/metrics.md).

use std::path::Path;

use nsfast_sys::metrics::Snapshot;

/// The metrics of `bridge`'s relay from the stats files in `dir` (`$XDG_RUNTIME_DIR/vpnrelay`)
/// and the supervisor's `restarts`. A missing or unreadable stats file leaves the relay's
/// counters out (`vpnrelay_relay_running` 0; unreadable: logged).
pub fn snapshot(dir: &Path, bridge: &str, restarts: u64) -> Snapshot {
    let mut s = Snapshot::new();
    let b = [("bridge", bridge)];
    s.counter(
        "vpnrelay_supervisor_restarts",
        "Times the supervisor restarted the relay after it exited",
        &b,
        restarts,
    );
    let relay = match crate::state::read_status(dir, None) {
        Ok(all) => all.into_iter().find(|r| r.bridge == bridge),
        Err(e) => {
            tracing::warn!("metrics: {e}");
            None
        }
    };
    s.gauge(
        "vpnrelay_relay_running",
        "1 while a relay for the bridge runs (holds its lock)",
        &b,
        relay.as_ref().is_some_and(|r| r.running) as u64,
    );
    let Some(r) = relay else {
        return s;
    };
    let n = |k: &str| r.stats.get(k).and_then(|v| v.as_u64());
    let gauges = [
        ("flows_open", "Flows the relay holds now"),
        ("max_flows", "Flows the relay may hold"),
        ("max_flows_per_client", "Flows one client may hold"),
    ];
    for (k, help) in gauges {
        if let Some(v) = n(k) {
            s.gauge(&format!("vpnrelay_{k}"), help, &b, v);
        }
    }
    if let Some(v) = n("flows_opened") {
        s.counter(
            "vpnrelay_flows_opened",
            "Flows the relay opened (counted from the relay's start)",
            &b,
            v,
        );
    }
    for (k, how) in [
        ("refused_handed_back", "handed_back"),
        ("refused_dropped", "dropped"),
    ] {
        if let Some(v) = n(k) {
            s.counter(
                "vpnrelay_flows_refused",
                "Flows refused by the per-client or total limit: handed back to Docker's \
                 normal path, or dropped",
                &[("bridge", bridge), ("how", how)],
                v,
            );
        }
    }
    for dir in ["up", "down"] {
        let l = [("bridge", bridge), ("direction", dir)];
        if let Some(v) = n(&format!("{dir}_datagrams")) {
            s.counter(
                "vpnrelay_datagrams",
                "Datagrams relayed (up: client to server)",
                &l,
                v,
            );
        }
        if let Some(v) = n(&format!("{dir}_bytes")) {
            s.counter(
                "vpnrelay_bytes",
                "Bytes relayed (up: client to server)",
                &l,
                v,
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stats_file_becomes_metrics() {
        let d = std::env::temp_dir().join(format!("vpnrelay-metrics-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let dir = d.join("vpnrelay");
        let stats = serde_json::json!({
            "schema_version": 1, "bridge": "br-a", "max_flows": 256, "max_flows_per_client": 8,
            "flows_open": 2, "flows_opened": 5, "refused_handed_back": 1, "refused_dropped": 3,
            "up_datagrams": 10, "up_bytes": 1000, "down_datagrams": 20, "down_bytes": 2000,
        });
        crate::state::replace_file(&dir.join("relay-br-a.stats"), stats.to_string().as_bytes())
            .unwrap();
        let t = snapshot(&dir, "br-a", 4).to_text();
        for line in [
            "vpnrelay_supervisor_restarts_total{bridge=\"br-a\"} 4\n",
            "vpnrelay_relay_running{bridge=\"br-a\"} 0\n",
            "vpnrelay_flows_open{bridge=\"br-a\"} 2\n",
            "vpnrelay_flows_opened_total{bridge=\"br-a\"} 5\n",
            "vpnrelay_flows_refused_total{bridge=\"br-a\",how=\"dropped\"} 3\n",
            "vpnrelay_bytes_total{bridge=\"br-a\",direction=\"down\"} 2000\n",
            "vpnrelay_datagrams_total{bridge=\"br-a\",direction=\"up\"} 10\n",
        ] {
            assert!(t.contains(line), "no {line:?} in\n{t}");
        }
        // Another bridge's supervisor: no relay counters, not running.
        let other = snapshot(&dir, "br-b", 0).to_text();
        assert!(
            other.contains("vpnrelay_relay_running{bridge=\"br-b\"} 0\n"),
            "{other}"
        );
        assert!(!other.contains("vpnrelay_bytes"), "{other}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
