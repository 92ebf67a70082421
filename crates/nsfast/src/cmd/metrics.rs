//! `nsfast metrics` and the `--metrics-listen` option of `sockmap run` and `vsock bridge`:
//! the counters the status commands show, as Prometheus metrics (docs/metrics.md).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use clap::Args;
use nsfast_sys::metrics::{self, Snapshot};

/// `--metrics-listen ADDR` and `--metrics-public`, shared by the daemons.
#[derive(Args, Debug, Clone, Default)]
pub struct ListenArgs {
    /// Serve the counters as Prometheus metrics at http://ADDR/metrics: PORT or :PORT
    /// (loopback, 127.0.0.1), localhost:PORT, IPV4:PORT or [IPV6]:PORT [default: no endpoint].
    #[arg(long, value_name = "ADDR", value_parser = metrics::listen_arg("--metrics-listen"))]
    pub metrics_listen: Option<SocketAddr>,
    /// Allow --metrics-listen on an address other than loopback (the endpoint has no
    /// authentication).
    #[arg(long, requires = "metrics_listen")]
    pub metrics_public: bool,
}

impl ListenArgs {
    /// Exit 2 for an address other than loopback without --metrics-public. Call it before
    /// the command changes anything.
    pub fn check(&self) -> anyhow::Result<()> {
        match self.metrics_listen {
            Some(addr) => metrics::check_exposure(
                "--metrics-listen",
                addr,
                self.metrics_public,
                "--metrics-public",
            )
            .map_err(crate::usage),
            None => Ok(()),
        }
    }

    /// Starts the endpoint ([`Self::check`]ed again); `None` without --metrics-listen.
    pub fn start<F>(&self, render: F) -> anyhow::Result<Option<metrics::Endpoint>>
    where
        F: Fn() -> Snapshot + Send + Sync + 'static,
    {
        self.check()?;
        let Some(addr) = self.metrics_listen else {
            return Ok(None);
        };
        let ep = metrics::serve(addr, render)?;
        tracing::info!("metrics at http://{}/metrics", ep.addr());
        Ok(Some(ep))
    }
}

/// `nsfast metrics`: what `sockmap status` and `pod list` show, once.
#[derive(Args, Debug)]
pub struct MetricsArgs {
    /// Write the metrics to FILE instead of stdout, atomically (a temporary file in the same
    /// folder, renamed over FILE), so node_exporter's textfile collector never reads half a
    /// file, e.g. /var/lib/prometheus/node-exporter/nsfast.prom.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Pod host network namespace to report (under /run/netns; repeat for more)
    /// [default: the current namespace].
    #[arg(long = "pod-host", value_name = "NAME")]
    pub pod_hosts: Vec<String>,
}

pub fn run(a: MetricsArgs) -> anyhow::Result<()> {
    // The same counters are JSON in the status commands; a metrics document is Prometheus's.
    if crate::cmd::output::json().is_some() {
        return Err(crate::usage(
            "nsfast metrics prints the Prometheus text format, not JSON: the same counters \
             are JSON in `nsfast sockmap status -j` and `nsfast pod list -j`",
        ));
    }
    let snap = collect(&a.pod_hosts)?;
    let text = snap.to_text();
    match &a.output {
        None => nsfast_sys::out!("{text}")?,
        Some(path) => write_atomically(path, text.as_bytes())?,
    }
    Ok(())
}

fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| crate::usage(format!("invalid --output {}: not a file", path.display())))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow::Error::new(e).context(format!("writing {}", path.display()))
    })
}

/// Every sockmap instance in the kernel and the pods of `pod_hosts` (the current namespace
/// when empty).
fn collect(pod_hosts: &[String]) -> anyhow::Result<Snapshot> {
    let mut s = Snapshot::new();
    let instances = nsfast_sockmap::instances().context("reading loaded BPF programs and maps")?;
    s.gauge(
        "nsfast_sockmap_instances",
        "Shortcut instances loaded in the kernel (sockmap run and pod shortcut)",
        &[],
        instances.len() as u64,
    );
    for i in &instances {
        sockmap_instance(&mut s, i);
    }
    let hosts: Vec<Option<&str>> = if pod_hosts.is_empty() {
        vec![None]
    } else {
        pod_hosts.iter().map(|h| Some(h.as_str())).collect()
    };
    for h in hosts {
        let l = match nsfast_pod::list(h) {
            Ok(l) => l,
            // The current namespace need not be a pod host; a host asked for must be one.
            Err(e) if h.is_none() => {
                tracing::debug!("current namespace: no pod listing: {e}");
                continue;
            }
            Err(e) => return Err(e).context(format!("pod host {}", h.unwrap_or("current"))),
        };
        if h.is_none() && l.pods.is_empty() {
            continue;
        }
        pod_host(&mut s, &l);
    }
    Ok(s)
}

/// One sockmap instance: its state and every counter of `sockmap status`.
pub fn sockmap_instance(s: &mut Snapshot, i: &nsfast_sockmap::Instance) {
    let cgroup = i
        .cgroup_path
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| format!("id:{}", i.cgroup_id));
    let mode = if i.pod_mode { "pod" } else { "run" };
    let labels = [("cgroup", cgroup.as_str()), ("mode", mode)];
    s.gauge(
        "nsfast_sockmap_attached",
        "1 while the instance's sockops program is attached to its cgroup, 0 while it drains",
        &labels,
        i.attached as u64,
    );
    sockmap_stats(s, &labels, &i.stats);
}

/// The counters of one instance (`sockmap status`, `nsfast_sockmap::Stats`).
pub fn sockmap_stats(s: &mut Snapshot, labels: &[(&str, &str)], st: &nsfast_sockmap::Stats) {
    s.gauge(
        "nsfast_sockmap_sockets",
        "Sockets in the instance's map now",
        labels,
        st.sockets,
    );
    let counters: [(&str, &str, u64); 19] = [
        (
            "sockets_added",
            "Sockets added to the map",
            st.sockets_added,
        ),
        (
            "sockets_add_failed",
            "Sockets the map refused",
            st.sockets_add_failed,
        ),
        ("pairs", "Connections whose two ends were paired", st.pairs),
        (
            "pair_conflicts",
            "Ambiguous pair keys: neither connection was paired",
            st.pair_conflicts,
        ),
        (
            "redirected_messages",
            "Messages redirected by the shortcut",
            st.redirected_msgs,
        ),
        (
            "redirected_bytes",
            "Bytes redirected by the shortcut",
            st.redirected_bytes,
        ),
        (
            "passed_messages",
            "Messages passed to the kernel's TCP path",
            st.passed_msgs,
        ),
        (
            "passed_bytes",
            "Bytes passed to the kernel's TCP path",
            st.passed_bytes,
        ),
        (
            "tainted",
            "Directions that sent on TCP before pairing completed (stay on it)",
            st.tainted,
        ),
        (
            "redirect_failed",
            "Redirects that found the peer gone and fell back to TCP",
            st.redirect_failed,
        ),
        (
            "skipped_port",
            "Connections skipped by the port filter",
            st.skipped_port,
        ),
        ("closed", "Tracked sockets that closed", st.closed),
        (
            "splice_pass",
            "Directions moved to TCP because the receiver reads with splice/sendfile",
            st.splice_pass,
        ),
        (
            "splice_refused",
            "splice/sendfile calls refused because shortcut bytes were unread",
            st.splice_refused,
        ),
        (
            "queue_limit",
            "Directions moved to TCP because the receiver fell behind by the queue limit",
            st.queue_limit,
        ),
        (
            "rx_missing",
            "Directions kept on TCP because the receiver's read counters were missing",
            st.rx_missing,
        ),
        (
            "gated_bytes",
            "Bytes kept on TCP until the receiver was seen reading all of it",
            st.gated_bytes,
        ),
        (
            "kept_tcp",
            "Sockets kept on TCP for an option or read flag the shortcut cannot honour",
            st.kept_tcp,
        ),
        (
            "skipped_short",
            "Connection ends kept on TCP without joining: their endpoints' recent connections gained nothing",
            st.skipped_short,
        ),
    ];
    for (name, help, v) in counters {
        s.counter(&format!("nsfast_sockmap_{name}"), help, labels, v);
    }
}

/// One pod host: its pods, datapath counters and pod shortcut counters (`pod list`).
pub fn pod_host(s: &mut Snapshot, l: &nsfast_pod::Listing) {
    let host = [("host", l.host.as_str())];
    s.gauge(
        "nsfast_pod_pods",
        "Pods of the host",
        &host,
        l.pods.len() as u64,
    );
    for (name, v) in &l.counters {
        let help = match name.as_str() {
            "spoofed" => "Packets dropped: a source address that is not the pod's own",
            "pod_not_ipv4" => "Packets dropped: neither IPv4, IPv6 nor ARP, or malformed",
            "pod_to_pod" => "Packets from a pod redirected to a local pod",
            "fib_redirect" => "Packets from a pod redirected to an uplink after a FIB lookup",
            "fib_redirect_neigh" => "Packets from a pod redirected with redirect_neigh",
            "pod_to_stack" => "Packets from a pod handed to the host's stack",
            "wire_to_pod" => "Packets from an uplink redirected into a pod",
            "wire_to_stack" => "Packets from an uplink left to the host's stack",
            "arp_reply" => "ARP requests answered by the datapath",
            "ndp_reply" => "NDP solicitations answered by the datapath",
            _ => "A pod datapath counter",
        };
        s.counter(&format!("nsfast_pod_{name}_packets"), help, &host, *v);
    }
    s.gauge(
        "nsfast_pod_shortcut_enabled",
        "1 when the pod shortcut is on for the host",
        &host,
        l.shortcut_enabled as u64,
    );
    for (pod, st) in &l.shortcut {
        let labels = [("host", l.host.as_str()), ("pod", pod.as_str())];
        s.counter(
            "nsfast_pod_shortcut_paired",
            "Connection ends of the pod paired by the shortcut",
            &labels,
            st.paired,
        );
        s.counter(
            "nsfast_pod_shortcut_redirected_bytes",
            "Bytes of the pod redirected by the shortcut",
            &labels,
            st.redirected_bytes,
        );
        s.counter(
            "nsfast_pod_shortcut_passed_bytes",
            "Bytes the pod's tracked sockets sent on the kernel path",
            &labels,
            st.passed_bytes,
        );
        s.counter(
            "nsfast_pod_shortcut_fallbacks",
            "Sockets of the pod that fell back to the kernel path (no peer pod, or the peer closed)",
            &labels,
            st.fallbacks,
        );
        s.counter(
            "nsfast_pod_shortcut_opted_out",
            "Connection ends skipped because the pod opted out",
            &labels,
            st.opted_out,
        );
    }
}

/// `vsock bridge`'s counters, counted from its events (each event line of `--json`).
#[derive(Debug, Default)]
pub struct BridgeCounters {
    opened: AtomicU64,
    denied: AtomicU64,
    failed: AtomicU64,
    closed: AtomicU64,
    close_errors: AtomicU64,
    /// Closed connections and their bytes each way, by data path: kernel, splice, copy.
    by_path: [(AtomicU64, AtomicU64, AtomicU64); 3],
}

const BRIDGE_PATHS: [&str; 3] = ["kernel", "splice", "copy"];

impl BridgeCounters {
    pub fn count(&self, e: &nsfast_vsock::bridge::Event) {
        use nsfast_vsock::bridge::Event;
        let add = |c: &AtomicU64, v: u64| {
            c.fetch_add(v, Ordering::Relaxed);
        };
        match e {
            Event::Open { .. } => add(&self.opened, 1),
            Event::Deny { .. } => add(&self.denied, 1),
            Event::Fail { .. } => add(&self.failed, 1),
            Event::Close {
                bytes_src_to_dst,
                bytes_dst_to_src,
                path,
                error,
                ..
            } => {
                add(&self.closed, 1);
                if error.is_some() {
                    add(&self.close_errors, 1);
                }
                let i = BRIDGE_PATHS.iter().position(|p| p == path).unwrap_or(2);
                let (n, up, down) = &self.by_path[i];
                add(n, 1);
                add(up, *bytes_src_to_dst);
                add(down, *bytes_dst_to_src);
            }
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut s = Snapshot::new();
        let opened = get(&self.opened);
        let closed = get(&self.closed);
        s.gauge(
            "nsfast_vsock_bridge_connections_open",
            "Bridged connections open now",
            &[],
            opened.saturating_sub(closed),
        );
        s.counter(
            "nsfast_vsock_bridge_connections_opened",
            "Connections accepted and connected to their target",
            &[],
            opened,
        );
        s.counter(
            "nsfast_vsock_bridge_connections_denied",
            "Connections refused by the routing policy or a connection limit",
            &[],
            get(&self.denied),
        );
        s.counter(
            "nsfast_vsock_bridge_connections_failed",
            "Connections whose target could not be reached",
            &[],
            get(&self.failed),
        );
        s.counter(
            "nsfast_vsock_bridge_connection_errors",
            "Bridged connections that ended with an error",
            &[],
            get(&self.close_errors),
        );
        for (p, (n, up, down)) in BRIDGE_PATHS.iter().zip(&self.by_path) {
            let l = [("path", *p)];
            s.counter(
                "nsfast_vsock_bridge_connections_closed",
                "Bridged connections that ended, by data path",
                &l,
                get(n),
            );
            let bytes = "Bytes of closed bridged connections, by data path and direction";
            for (dir, v) in [("src_to_dst", up), ("dst_to_src", down)] {
                s.counter(
                    "nsfast_vsock_bridge_bytes",
                    bytes,
                    &[("path", p), ("direction", dir)],
                    get(v),
                );
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nsfast_vsock::bridge::Event;

    #[test]
    fn bridge_counters_follow_the_events() {
        let c = BridgeCounters::default();
        c.count(&Event::Open {
            id: 1,
            src: 3,
            dst: 4,
            port: 5000,
            dialled: 2,
        });
        c.count(&Event::Open {
            id: 2,
            src: 3,
            dst: 4,
            port: 5000,
            dialled: 2,
        });
        c.count(&Event::Deny {
            src: 5,
            dialled: 2,
            port: 5000,
            reason: "x".into(),
        });
        c.count(&Event::Close {
            id: 1,
            src: 3,
            dst: 4,
            port: 5000,
            bytes_src_to_dst: 10,
            bytes_dst_to_src: 20,
            millis: 1,
            spliced: true,
            path: "splice",
            error: Some("reset".into()),
        });
        let t = c.snapshot().to_text();
        for line in [
            "nsfast_vsock_bridge_connections_open 1\n",
            "nsfast_vsock_bridge_connections_opened_total 2\n",
            "nsfast_vsock_bridge_connections_denied_total 1\n",
            "nsfast_vsock_bridge_connection_errors_total 1\n",
            "nsfast_vsock_bridge_connections_closed_total{path=\"splice\"} 1\n",
            "nsfast_vsock_bridge_bytes_total{path=\"splice\",direction=\"src_to_dst\"} 10\n",
            "nsfast_vsock_bridge_bytes_total{path=\"splice\",direction=\"dst_to_src\"} 20\n",
            "nsfast_vsock_bridge_bytes_total{path=\"kernel\",direction=\"src_to_dst\"} 0\n",
        ] {
            assert!(t.contains(line), "no {line:?} in\n{t}");
        }
    }
}
