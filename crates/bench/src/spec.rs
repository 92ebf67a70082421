//! What to run: workloads, placements, topology names and the run configuration, each parsed
//! with an error that names the bad value and lists the valid ones. Sizes, durations and
//! counts are parsed by the shared parsers (`nsfast_sys::args`) as typed clap values.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::BenchError;

/// The one of `all` whose `name` is `s`; the error names `flag`, `s` and the valid names.
fn by_name<T: Copy>(
    flag: &'static str,
    s: &str,
    all: &[T],
    name: fn(T) -> &'static str,
) -> Result<T, BenchError> {
    all.iter()
        .copied()
        .find(|&v| name(v) == s)
        .ok_or_else(|| BenchError::BadArg {
            flag,
            value: s.into(),
            valid: all.iter().map(|&v| name(v)).collect::<Vec<_>>().join(", "),
        })
}

/// A load pattern of the built-in load generator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Request/response over one connection (netperf TCP_RR): transactions per second.
    Rr,
    /// A new connection per transaction (netperf TCP_CRR): transactions per second.
    Crr,
    /// Bulk TCP, one connection: Gbit/s delivered.
    Stream,
    /// UDP datagrams of a given size: Gbit/s delivered, loss.
    UdpStream,
    /// Ping-pong latency over one connection: p50 (and p90/p99/p99.9) in microseconds.
    Ping,
}

impl Workload {
    pub const ALL: [Workload; 5] = [
        Workload::Rr,
        Workload::Crr,
        Workload::Stream,
        Workload::UdpStream,
        Workload::Ping,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Rr => "rr",
            Workload::Crr => "crr",
            Workload::Stream => "stream",
            Workload::UdpStream => "udp-stream",
            Workload::Ping => "ping",
        }
    }

    /// The unit of the headline figure.
    pub fn unit(self) -> &'static str {
        match self {
            Workload::Rr | Workload::Crr => "tx/s",
            Workload::Stream | Workload::UdpStream => "Gbit/s",
            Workload::Ping => "µs p50",
        }
    }

    /// Whether a larger headline figure is better (latency: smaller is better).
    pub fn higher_is_better(self) -> bool {
        !matches!(self, Workload::Ping)
    }

    /// The unit CPU cost is normalised to.
    pub fn cpu_unit(self) -> &'static str {
        match self {
            Workload::Rr | Workload::Crr | Workload::Ping => "CPU µs/tx",
            Workload::Stream | Workload::UdpStream => "CPU s/GB",
        }
    }

    /// What costs are counted per (`cpu_unit`, the BPF cost): a transaction, or a GB moved.
    pub fn work_unit(self) -> &'static str {
        match self {
            Workload::Rr | Workload::Crr | Workload::Ping => "tx",
            Workload::Stream | Workload::UdpStream => "GB",
        }
    }

    pub fn is_udp(self) -> bool {
        matches!(self, Workload::UdpStream)
    }

    pub fn parse(s: &str) -> Result<Self, BenchError> {
        by_name("--workloads", s, &Self::ALL, Self::name)
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where the client and the server run relative to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Both pinned to the same CPU: no cross-CPU wake-ups.
    SameCpu,
    /// Client and server pinned to two different CPUs.
    CrossCpu,
    /// Not pinned: the scheduler places both (what an untuned deployment sees).
    Unpinned,
}

impl Placement {
    pub const ALL: [Placement; 3] = [Placement::SameCpu, Placement::CrossCpu, Placement::Unpinned];

    pub fn name(self) -> &'static str {
        match self {
            Placement::SameCpu => "same-cpu",
            Placement::CrossCpu => "cross-cpu",
            Placement::Unpinned => "unpinned",
        }
    }

    pub fn parse(s: &str) -> Result<Self, BenchError> {
        by_name("--placement", s, &Self::ALL, Self::name)
    }

    /// (client CPU, server CPU) chosen from the CPUs this process may use; `None` is unpinned.
    pub fn cpus(self, allowed: &[usize]) -> Result<(Option<usize>, Option<usize>), BenchError> {
        let first = *allowed.first().ok_or(BenchError::NoCpus)?;
        match self {
            Placement::SameCpu => Ok((Some(first), Some(first))),
            Placement::CrossCpu => match allowed.get(1) {
                Some(&second) => Ok((Some(first), Some(second))),
                None => Err(BenchError::CrossCpuNeedsTwo(first)),
            },
            Placement::Unpinned => Ok((None, None)),
        }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Message sizes and other per-workload knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sizes {
    /// rr/crr/ping request size in bytes.
    pub request: u32,
    /// rr/crr/ping response size in bytes.
    pub response: u32,
    /// stream write size in bytes.
    pub stream_write: u32,
    /// udp-stream datagram payload size in bytes.
    pub datagram: u32,
}

impl Default for Sizes {
    fn default() -> Self {
        Self {
            request: 1,
            response: 1,
            stream_write: 128 * 1024,
            datagram: 1400,
        }
    }
}

/// Largest rr/crr/ping message and stream write accepted.
pub const MAX_MESSAGE: u32 = 16 * 1024 * 1024;
/// Largest UDP payload over IPv4.
pub const MAX_DATAGRAM: u32 = 65_507;

impl Sizes {
    pub fn validate(&self) -> Result<(), BenchError> {
        let check = |flag: &'static str, v: u32, max: u32| {
            if v == 0 || v > max {
                Err(BenchError::BadArg {
                    flag,
                    value: v.to_string(),
                    valid: format!("a size of 1-{max} bytes"),
                })
            } else {
                Ok(())
            }
        };
        check("--request-size", self.request, MAX_MESSAGE)?;
        check("--response-size", self.response, MAX_MESSAGE)?;
        check("--stream-size", self.stream_write, MAX_MESSAGE)?;
        check("--udp-size", self.datagram, MAX_DATAGRAM)
    }
}

/// A whole benchmark run.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    pub topologies: Vec<String>,
    pub workloads: Vec<Workload>,
    pub placements: Vec<Placement>,
    pub rounds: u32,
    #[serde(with = "secs")]
    pub duration: Duration,
    #[serde(with = "secs")]
    pub warmup: Duration,
    pub sizes: Sizes,
    pub json: Option<PathBuf>,
    pub cross_check: bool,
    pub quick: bool,
    /// The existing user the rootless topologies run as (`--tenant`); `None` skips them.
    pub tenant: Option<nsfast_lab::tenant::Tenant>,
    /// Count nsfast's BPF programs' runs and run time per measurement (`--bpf-stats`;
    /// [`crate::bpfstats`]).
    #[serde(default)]
    pub bpf_stats: bool,
}

mod secs {
    use serde::Serializer;
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_workloads_and_placements() {
        assert_eq!(Workload::parse("udp-stream").unwrap(), Workload::UdpStream);
        let e = Workload::parse("tcp_rr").unwrap_err().to_string();
        assert!(
            e.contains("\"tcp_rr\"") && e.contains("rr, crr, stream"),
            "{e}"
        );
        assert_eq!(
            Placement::SameCpu.cpus(&[3, 5]).unwrap(),
            (Some(3), Some(3))
        );
        assert_eq!(
            Placement::CrossCpu.cpus(&[3, 5]).unwrap(),
            (Some(3), Some(5))
        );
        assert_eq!(Placement::Unpinned.cpus(&[3]).unwrap(), (None, None));
        assert!(Placement::CrossCpu.cpus(&[3]).is_err());
    }

    #[test]
    fn sizes_are_validated() {
        assert!(Sizes::default().validate().is_ok());
        let s = Sizes {
            datagram: 0,
            ..Sizes::default()
        };
        assert!(s.validate().is_err());
        let s = Sizes {
            stream_write: MAX_MESSAGE + 1,
            ..Sizes::default()
        };
        assert!(s.validate().is_err());
    }
}
