//! Fast-path evidence: the fast path's own counters, read before and after every sample, so a
//! figure printed under a fast path's name is one that path carried.
//!
//! - `sockmap`: the shortcut's `redirected_bytes` (sk_msg redirects between paired sockets).
//! - `bpf`, `bpf-tc`, `netkit`: the pod datapath's `pod_to_pod` counter on host A
//!   (bpf_redirect_peer / netkit peer redirect between two local pods).
//! - `bpf-remote`: host A's `fib_redirect` + `fib_redirect_neigh` (out over the wire) and
//!   host B's `wire_to_pod` (redirect_peer in).
//! - `vpnrelay` (UDP workloads; the relay steers only the VPN ports' UDP): the relay's own
//!   `up_bytes` total from its stats file (`$XDG_RUNTIME_DIR/vpnrelay/relay-br-vpn.stats`,
//!   rewritten about once a second while counters change, so the reading after a sample
//!   waits up to [`STATS_FILE_WAIT`] for it to move).
//!
//! A sample whose required counters did not move is marked failed ("fast path idle").

use std::any::Any;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::spec::Workload;

/// Where a topology's fast path keeps its counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FastPath {
    /// The `nsfast_sockmap::Shortcut` kept in the topology's extras. Applies to TCP
    /// workloads only (UDP is not in the shortcut's scope).
    Sockmap,
    /// nsfast pod datapath counters of the named host namespaces; `required` lists, per
    /// check, the host (index into `hosts`) and the counters whose sum must move.
    Pod {
        /// (label, host namespace name), e.g. ("A", "nsfb1-bpf-ha").
        hosts: Vec<(&'static str, String)>,
        required: Vec<(usize, Vec<&'static str>)>,
    },
    /// The vpnrelay relay's stats file of the [`nsfast_lab::rootless::World`] kept in the
    /// topology's extras. UDP workloads only.
    VpnRelay,
    /// The pod shortcut (`nsfast pod shortcut`) of the named host namespace. TCP only.
    PodShortcut { host: String },
}

/// How long the reading after a vpnrelay sample waits for the relay's stats file to change.
pub const STATS_FILE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Cumulative counters at one moment, by name (`redirected_bytes`, `A.pod_to_pod`, ...).
pub type Reading = BTreeMap<String, u64>;

/// What the fast path counted during one sample.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    /// Where the counters come from.
    pub source: String,
    /// The counters that must move for the sample to count, with how much they moved
    /// (`A.fib_redirect+A.fib_redirect_neigh` for a sum).
    pub carried: BTreeMap<String, u64>,
    /// Every counter that moved during the sample (deltas), for diagnosis.
    pub moved: BTreeMap<String, u64>,
}

impl Evidence {
    /// The required counters that did not move.
    pub fn idle(&self) -> Vec<&str> {
        self.carried
            .iter()
            .filter(|(_, v)| **v == 0)
            .map(|(k, _)| k.as_str())
            .collect()
    }

    /// Whether every required counter moved (and there is at least one).
    pub fn carried_all(&self) -> bool {
        !self.carried.is_empty() && self.idle().is_empty()
    }

    /// The sample error for an idle fast path, `None` when it carried the traffic.
    pub fn idle_error(&self) -> Option<String> {
        if self.carried_all() {
            return None;
        }
        Some(format!(
            "fast path idle: {} did not move during the sample ({})",
            self.idle().join(", "),
            self.source
        ))
    }
}

impl FastPath {
    /// Whether the fast path is meant to carry workload `w`.
    pub fn applies(&self, w: Workload) -> bool {
        match self {
            FastPath::Sockmap | FastPath::PodShortcut { .. } => !w.is_udp(),
            FastPath::Pod { .. } => true,
            FastPath::VpnRelay => w.is_udp(),
        }
    }

    pub fn source(&self) -> String {
        match self {
            FastPath::Sockmap => "sockmap shortcut stats (nsf_stats)".into(),
            FastPath::Pod { hosts, .. } => format!(
                "nsfast pod datapath counters (nsf_pod_cnt) of {}",
                hosts
                    .iter()
                    .map(|(l, n)| format!("host {l} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            FastPath::VpnRelay => "vpnrelay stats file (relay-br-vpn.stats)".into(),
            FastPath::PodShortcut { host } => {
                format!("pod shortcut stats (nsf_stats, nsf_pod_stats) of host {host}")
            }
        }
    }

    /// Reads the counters after a sample whose `before` reading was taken: like [`read`],
    /// but a stats file written periodically (vpnrelay) is waited for, up to
    /// [`STATS_FILE_WAIT`], until it shows a change.
    ///
    /// [`read`]: FastPath::read
    pub fn read_after(&self, extras: &[Box<dyn Any>], before: &Reading) -> Result<Reading, String> {
        if *self != FastPath::VpnRelay {
            return self.read(extras);
        }
        let until = std::time::Instant::now() + STATS_FILE_WAIT;
        loop {
            let r = self.read(extras)?;
            if r != *before || std::time::Instant::now() >= until {
                return Ok(r);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Reads the counters now.
    pub fn read(&self, extras: &[Box<dyn Any>]) -> Result<Reading, String> {
        match self {
            FastPath::Sockmap => {
                let sc = extras
                    .iter()
                    .find_map(|e| e.downcast_ref::<nsfast_sockmap::Shortcut>())
                    .ok_or("the topology holds no sockmap shortcut")?;
                let s = sc.stats().map_err(|e| format!("sockmap stats: {e}"))?;
                Ok(BTreeMap::from([
                    ("redirected_bytes".to_string(), s.redirected_bytes),
                    ("redirected_msgs".to_string(), s.redirected_msgs),
                    ("passed_bytes".to_string(), s.passed_bytes),
                    ("gated_bytes".to_string(), s.gated_bytes),
                    ("pairs".to_string(), s.pairs),
                    ("skipped_short".to_string(), s.skipped_short),
                    ("tainted".to_string(), s.tainted),
                    ("redirect_failed".to_string(), s.redirect_failed),
                ]))
            }
            FastPath::PodShortcut { host } => {
                let h = nsfast_pod::Host::open(Some(host))
                    .map_err(|e| format!("host namespace {host}: {e}"))?;
                let s = nsfast_pod::shortcut::status(&h)
                    .map_err(|e| format!("pod shortcut of {host}: {e}"))?;
                Ok(BTreeMap::from([
                    ("redirected_bytes".to_string(), s.redirected_bytes),
                    ("passed_bytes".to_string(), s.passed_bytes),
                    ("pairs".to_string(), s.pairs),
                    ("skipped_short".to_string(), s.skipped_short),
                ]))
            }
            FastPath::Pod { hosts, .. } => {
                let mut out = BTreeMap::new();
                for (label, name) in hosts {
                    let host = nsfast_pod::Host::open(Some(name))
                        .map_err(|e| format!("host namespace {name}: {e}"))?;
                    let v = nsfast_pod::datapath::counters(&host)
                        .map_err(|e| format!("pod counters of {name}: {e}"))?;
                    for (c, n) in nsfast_pod::abi::COUNTERS.iter().zip(v) {
                        out.insert(format!("{label}.{c}"), n);
                    }
                }
                Ok(out)
            }
            FastPath::VpnRelay => {
                let w = extras
                    .iter()
                    .find_map(|e| e.downcast_ref::<nsfast_lab::rootless::World>())
                    .ok_or("the topology holds no vpnrelay world")?;
                // No file yet: the relay has carried nothing so far.
                let st = w.relay_stats().unwrap_or_default();
                Ok(["up_bytes", "up_datagrams", "down_bytes", "down_datagrams"]
                    .iter()
                    .map(|k| (k.to_string(), st[*k].as_u64().unwrap_or(0)))
                    .collect())
            }
        }
    }

    /// The evidence of a measurement of `w` between two readings. A crr connection through a
    /// shortcut exchanges one request and one reply, both sent before their receiver has read
    /// anything, so they stay on TCP (docs/sockmap.md, "What keeps TCP"): what the shortcut
    /// does for crr is pairing the first connections and then keeping the rest out
    /// (`skipped_short`, in `moved`) but for a probe every 10 ms, which pairs; its pair count
    /// is the evidence.
    pub fn evidence_for(&self, w: Workload, before: &Reading, after: &Reading) -> Evidence {
        let mut e = self.evidence(before, after);
        if w == Workload::Crr && matches!(self, FastPath::Sockmap | FastPath::PodShortcut { .. }) {
            let d = after
                .get("pairs")
                .copied()
                .unwrap_or(0)
                .saturating_sub(before.get("pairs").copied().unwrap_or(0));
            e.carried = BTreeMap::from([("pairs".to_string(), d)]);
        }
        e
    }

    /// The evidence between two readings.
    pub fn evidence(&self, before: &Reading, after: &Reading) -> Evidence {
        let delta = |k: &str| {
            after
                .get(k)
                .copied()
                .unwrap_or(0)
                .saturating_sub(before.get(k).copied().unwrap_or(0))
        };
        let moved = after
            .keys()
            .map(|k| (k.clone(), delta(k)))
            .filter(|(_, d)| *d > 0)
            .collect();
        let carried = match self {
            FastPath::Sockmap | FastPath::PodShortcut { .. } => {
                BTreeMap::from([("redirected_bytes".to_string(), delta("redirected_bytes"))])
            }
            FastPath::VpnRelay => BTreeMap::from([("up_bytes".to_string(), delta("up_bytes"))]),
            FastPath::Pod { hosts, required } => required
                .iter()
                .map(|(h, counters)| {
                    let label = hosts.get(*h).map(|(l, _)| *l).unwrap_or("?");
                    let keys: Vec<String> =
                        counters.iter().map(|c| format!("{label}.{c}")).collect();
                    (keys.join("+"), keys.iter().map(|k| delta(k)).sum())
                })
                .collect(),
        };
        Evidence {
            source: self.source(),
            carried,
            moved,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(kv: &[(&str, u64)]) -> Reading {
        kv.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn pod_evidence_needs_every_required_counter_to_move() {
        let fp = FastPath::Pod {
            hosts: vec![("A", "ha".into()), ("B", "hb".into())],
            required: vec![
                (0, vec!["fib_redirect", "fib_redirect_neigh"]),
                (1, vec!["wire_to_pod"]),
            ],
        };
        let before = reading(&[
            ("A.fib_redirect", 10),
            ("A.fib_redirect_neigh", 1),
            ("B.wire_to_pod", 7),
        ]);
        let after = reading(&[
            ("A.fib_redirect", 10),
            ("A.fib_redirect_neigh", 5),
            ("B.wire_to_pod", 7),
            ("A.pod_to_stack", 2),
        ]);
        let e = fp.evidence(&before, &after);
        assert_eq!(e.carried["A.fib_redirect+A.fib_redirect_neigh"], 4);
        assert_eq!(e.carried["B.wire_to_pod"], 0);
        assert_eq!(e.idle(), vec!["B.wire_to_pod"]);
        let err = e.idle_error().unwrap();
        assert!(err.starts_with("fast path idle: B.wire_to_pod"), "{err}");
        assert_eq!(e.moved.len(), 2, "{:?}", e.moved);
        // The positive control: everything moved.
        let mut after2 = after.clone();
        after2.insert("B.wire_to_pod".into(), 9);
        let e2 = fp.evidence(&before, &after2);
        assert!(e2.carried_all(), "{e2:?}");
        assert_eq!(e2.idle_error(), None);
    }

    #[test]
    fn sockmap_evidence_is_redirected_bytes_and_skips_udp() {
        let fp = FastPath::Sockmap;
        let e = fp.evidence(
            &reading(&[("redirected_bytes", 100), ("passed_bytes", 5)]),
            &reading(&[("redirected_bytes", 100), ("passed_bytes", 900)]),
        );
        assert_eq!(e.idle(), vec!["redirected_bytes"]);
        assert!(fp.applies(Workload::Rr) && !fp.applies(Workload::UdpStream));
        let relay = FastPath::VpnRelay;
        assert!(relay.applies(Workload::UdpStream) && !relay.applies(Workload::Stream));
        let e = relay.evidence(
            &reading(&[("up_bytes", 5), ("down_bytes", 0)]),
            &reading(&[("up_bytes", 5), ("down_bytes", 9)]),
        );
        assert_eq!(e.idle(), vec!["up_bytes"], "{e:?}");
        let e = fp.evidence(&Reading::new(), &reading(&[("redirected_bytes", 1)]));
        assert!(e.carried_all());
    }
}
