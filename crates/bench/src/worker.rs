//! The worker process: `nsfast bench-worker SPEC_JSON`, started by the runner inside a
//! topology's namespace and cgroup. It pins itself to its CPU, runs one side of one workload
//! and reports on stdout as JSON lines.
//!
//! Server: prints `{"ready":ADDR}` once listening, serves until the client is done or stdin
//! reaches EOF (the runner closes it), then prints its [`ServerCounts`].
//! Client: runs for the duration and prints its [`ClientResult`] (or `{"error":...}`).

use std::io::{BufRead, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::load::{self, ClientResult, Listener, ServerCounts};
use crate::spec::{Sizes, Workload};

/// Which side a worker plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Server,
    Client,
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
}

/// One line a worker prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerReport {
    Ready(SocketAddr),
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
            let l = Listener::bind(spec.workload, spec.addr)
                .map_err(|e| format!("{}: listen on {}: {e}", spec.workload, spec.addr))?;
            let local = l.local_addr().map_err(|e| e.to_string())?;
            let stop = Arc::new(AtomicBool::new(false));
            let s2 = stop.clone();
            // The runner closes our stdin when the client is done.
            std::thread::spawn(move || {
                let mut sink = Vec::new();
                let _ = std::io::stdin().lock().read_to_end(&mut sink);
                s2.store(true, Ordering::Relaxed);
            });
            emit(out, &WorkerReport::Ready(local));
            let c = load::serve(spec.workload, &l, spec.sizes, &stop)
                .map_err(|e| format!("{} server on {local}: {e}", spec.workload))?;
            emit(out, &WorkerReport::Server(c));
            Ok(())
        }
        Role::Client => {
            let r = load::run_client(
                spec.workload,
                spec.addr,
                spec.sizes,
                Duration::from_secs_f64(spec.duration_s),
            )
            .map_err(|e| e.to_string())?;
            emit(out, &WorkerReport::Client(r));
            Ok(())
        }
    }
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
