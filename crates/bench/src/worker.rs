//! The worker process: `nsfast bench-worker SPEC_JSON`, started by the runner inside a
//! topology's namespace and cgroup. It pins itself to its CPU, runs one side of one workload
//! and reports on stdout as JSON lines.
//!
//! Server: prints `{"ready":ADDR}` once listening, serves until the client is done or stdin
//! reaches EOF (the runner closes it), then prints its [`ServerCounts`].
//! Client: runs for the duration and prints its [`ClientResult`] (or `{"error":...}`).
//! Relay (vsock topologies): listens on `vsock.port`, prints `{"readyvsock":...}`, and relays
//! every connection to `relay_to` with nsfast's vsock relay until it is killed.

use std::io::{BufRead, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::load::{self, ClientResult, Listener, Peer, ServerCounts};
use crate::spec::{Sizes, Workload};

/// Which side a worker plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Server,
    Client,
    Relay,
}

/// A vsock endpoint: the server's listening port (any CID) or the client's target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VsockEnd {
    pub cid: u32,
    pub port: u32,
}

/// A floor endpoint ([`crate::floor`]): which transport, and the id both ends derive the
/// socket name or FIFO directory from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FloorEnd {
    pub pipe: bool,
    pub id: u64,
}

/// Everything a worker needs, passed as one JSON argument.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerSpec {
    pub role: Role,
    pub workload: Workload,
    /// Server: where to listen. Client: where to connect.
    pub addr: SocketAddr,
    pub sizes: Sizes,
    pub duration_s: f64,
    pub cpu: Option<usize>,
    /// Use vsock instead of `addr`: server and relay listen on this port, the client
    /// connects to this CID and port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock: Option<VsockEnd>,
    /// Use a floor transport (pipe or AF_UNIX) instead of `addr`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<FloorEnd>,
    /// Relay: where each accepted connection goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay_to: Option<VsockEnd>,
    /// Relay: join the legs with the BPF kernel path (`--path kernel`) instead of splice.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kernel_path: bool,
}

/// One line a worker prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerReport {
    Ready(SocketAddr),
    /// A vsock server or relay is listening (CID to connect to, port).
    ReadyVsock(VsockEnd),
    /// A floor server is listening.
    ReadyFloor(FloorEnd),
    Server(ServerCounts),
    Client(ClientResult),
    Error(String),
}

/// Runs a worker from its JSON spec, writing report lines to `out`. Returns an error message
/// (also reported on `out`) when the work failed.
pub fn run(spec_json: &str, out: &mut dyn Write) -> Result<(), String> {
    let spec: WorkerSpec =
        serde_json::from_str(spec_json).map_err(|e| format!("bad worker spec: {e}"))?;
    let r = run_spec(&spec, out);
    if let Err(e) = &r {
        emit(out, &WorkerReport::Error(e.clone()));
    }
    r
}

fn emit(out: &mut dyn Write, r: &WorkerReport) {
    let line = serde_json::to_string(r).expect("reports serialize");
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn run_spec(spec: &WorkerSpec, out: &mut dyn Write) -> Result<(), String> {
    if let Some(cpu) = spec.cpu {
        nsfast_sys::sched::pin_to_cpu(cpu).map_err(|e| format!("pin to CPU {cpu}: {e}"))?;
    }
    match spec.role {
        Role::Server => {
            let l = match (spec.vsock, spec.floor) {
                (Some(v), _) => Listener::bind_vsock(spec.workload, v.port).map_err(|e| {
                    format!("{}: listen on vsock port {}: {e}", spec.workload, v.port)
                })?,
                (None, Some(f)) => Listener::bind_floor(spec.workload, f.pipe, f.id)
                    .map_err(|e| format!("{}: listen on floor {f:?}: {e}", spec.workload))?,
                (None, None) => Listener::bind(spec.workload, spec.addr)
                    .map_err(|e| format!("{}: listen on {}: {e}", spec.workload, spec.addr))?,
            };
            let local = l.peer().map_err(|e| e.to_string())?;
            let stop = Arc::new(AtomicBool::new(false));
            let s2 = stop.clone();
            // The runner closes our stdin when the client is done.
            std::thread::spawn(move || {
                let mut sink = Vec::new();
                let _ = std::io::stdin().lock().read_to_end(&mut sink);
                s2.store(true, Ordering::Relaxed);
            });
            emit(
                out,
                &match local {
                    Peer::Ip(a) => WorkerReport::Ready(a),
                    Peer::Vsock { cid, port } => WorkerReport::ReadyVsock(VsockEnd { cid, port }),
                    Peer::Unix { id } => WorkerReport::ReadyFloor(FloorEnd { pipe: false, id }),
                    Peer::Pipe { id } => WorkerReport::ReadyFloor(FloorEnd { pipe: true, id }),
                },
            );
            let c = load::serve(spec.workload, &l, spec.sizes, &stop)
                .map_err(|e| format!("{} server on {local}: {e}", spec.workload))?;
            emit(out, &WorkerReport::Server(c));
            Ok(())
        }
        Role::Client => {
            let peer = match (spec.vsock, spec.floor) {
                (Some(v), _) => Peer::Vsock {
                    cid: v.cid,
                    port: v.port,
                },
                (None, Some(FloorEnd { pipe: true, id })) => Peer::Pipe { id },
                (None, Some(FloorEnd { pipe: false, id })) => Peer::Unix { id },
                (None, None) => Peer::Ip(spec.addr),
            };
            let r = load::run_client_to(
                spec.workload,
                peer,
                spec.sizes,
                Duration::from_secs_f64(spec.duration_s),
            )
            .map_err(|e| e.to_string())?;
            emit(out, &WorkerReport::Client(r));
            Ok(())
        }
        Role::Relay => relay(spec, out),
    }
}

/// nsfast's vsock relay (the code behind `nsfast vsock relay --fork`) from `spec.vsock` to
/// `spec.relay_to`, one thread per connection, until the process is killed.
fn relay(spec: &WorkerSpec, out: &mut dyn Write) -> Result<(), String> {
    use nsfast_vsock::conn::{self, Listener as RelayListener, SockOpts};
    use nsfast_vsock::Address;
    let (Some(from), Some(to)) = (spec.vsock, spec.relay_to) else {
        return Err("a relay worker needs vsock and relay_to".into());
    };
    let a = Address::VsockListen {
        port: from.port,
        cid: None,
    };
    let b = Address::VsockConnect {
        cid: to.cid,
        port: to.port,
        to_host: false,
    };
    let opts = nsfast_vsock::relay::Options::default();
    let l = RelayListener::open(&a, opts.sock).map_err(|e| e.to_string())?;
    // Loaded once for the process, like `nsfast vsock relay --path kernel`.
    let kernel = if spec.kernel_path {
        let k = nsfast_vsock::kernel::KernelPath::load()
            .map_err(|e| nsfast_sys::report::error_chain(&e))?;
        k.pair_supported(
            nsfast_vsock::kernel::Leg::Vsock,
            nsfast_vsock::kernel::Leg::Vsock,
        )?;
        Some(k)
    } else {
        None
    };
    let kernel = kernel.as_ref();
    emit(out, &WorkerReport::ReadyVsock(from));
    let sock: SockOpts = opts.sock;
    std::thread::scope(|s| {
        for id in 1u64.. {
            let ca = match l.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("relay accept on {a}: {e}")),
            };
            let b = &b;
            s.spawn(move || match conn::connect(b, sock) {
                Ok(cb) => match kernel {
                    // A refused join (none expected here) is relayed with splice.
                    Some(k) => {
                        if k.run(&ca, &cb).is_err() {
                            nsfast_vsock::relay::relay(id, ca, cb, opts.buffer);
                        }
                    }
                    None => {
                        nsfast_vsock::relay::relay(id, ca, cb, opts.buffer);
                    }
                },
                Err(_) => ca.abort(),
            });
        }
        Ok(())
    })
}

/// Parses one report line.
pub fn parse_report(line: &str) -> Option<WorkerReport> {
    serde_json::from_str(line.trim()).ok()
}

/// Reads report lines until one parses (skipping noise), or EOF.
pub fn read_report(r: &mut dyn BufRead) -> Option<WorkerReport> {
    let mut line = String::new();
    loop {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) => {
                if let Some(rep) = parse_report(&line) {
                    return Some(rep);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_without_vsock_fields_still_parse_and_vsock_ones_round_trip() {
        let old = r#"{"role":"client","workload":"rr","addr":"127.0.0.1:5","sizes":{"request":1,"response":1,"stream_write":131072,"datagram":1400},"duration_s":1.0,"cpu":null}"#;
        let s: WorkerSpec = serde_json::from_str(old).unwrap();
        assert_eq!(s.vsock, None);
        assert_eq!(s.relay_to, None);
        let mut v = s.clone();
        v.role = Role::Relay;
        v.vsock = Some(VsockEnd { cid: 1, port: 7 });
        v.relay_to = Some(VsockEnd { cid: 1, port: 8 });
        let back: WorkerSpec = serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
        assert_eq!(back.role, Role::Relay);
        assert_eq!(back.relay_to, Some(VsockEnd { cid: 1, port: 8 }));
        let line =
            serde_json::to_string(&WorkerReport::ReadyVsock(VsockEnd { cid: 1, port: 9 })).unwrap();
        assert!(matches!(
            parse_report(&line),
            Some(WorkerReport::ReadyVsock(VsockEnd { cid: 1, port: 9 }))
        ));
    }
}
