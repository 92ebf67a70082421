//! The run: build the selected topologies, warm up, then N interleaved rounds
//! (round 1: A B C, round 2: A B C, ...) of every workload and placement, each measurement a
//! fresh server + client worker pair started in the topology's namespaces and cgroups, pinned.
//! CPU use is read from the two cgroups' `cpu.stat` plus the pinned CPUs' softirq time.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use nsfast_sys::cgroup::Cgroup;
use serde::{Deserialize, Serialize};

use crate::crosscheck::CrossCheck;
use crate::load::{ClientResult, ServerCounts};
use crate::proc::{check_interrupt, command_in, ChildGuard, Launcher};
use crate::report::Machine;
use crate::spec::{Config, Placement, Sizes, Workload};
use crate::topology::{self, BuildCtx, Built, RunCgroup};
use crate::worker::{read_report, Role, VsockEnd, WorkerReport, WorkerSpec};
use crate::BenchError;

/// CPU time one measurement consumed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuCost {
    /// cgroup `usage_usec` delta of the client side.
    pub client_usec: u64,
    /// cgroup `usage_usec` delta of the server side.
    pub server_usec: u64,
    /// softirq time on the pinned CPUs (from /proc/stat, USER_HZ resolution). Without
    /// CONFIG_IRQ_TIME_ACCOUNTING most of it is already inside the cgroup figures.
    pub softirq_usec: u64,
    /// CPU time of ksoftirqd on the pinned CPUs: softirq work charged to no cgroup of ours.
    pub ksoftirqd_usec: u64,
    /// What `per_unit` counts: client + server + ksoftirqd (+ softirq when the kernel
    /// accounts IRQ time apart from tasks), normalised: µs per transaction or seconds per GB.
    pub per_unit: f64,
}

/// One measurement of one topology × workload × placement in one round.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sample {
    pub round: u32,
    pub topology: String,
    pub workload: Workload,
    pub placement: Placement,
    /// `None`: unpinned.
    pub client_cpu: Option<usize>,
    pub server_cpu: Option<usize>,
    /// The headline figure in the workload's unit (NaN-free: absent on error).
    pub value: Option<f64>,
    pub unit: String,
    pub client: Option<ClientResult>,
    pub server: Option<ServerCounts>,
    /// udp-stream: fraction of datagrams sent that the server did not receive.
    pub loss: Option<f64>,
    pub cpu: Option<CpuCost>,
    /// What the topology's fast path counted during the sample (`None`: the topology claims
    /// no fast path, or not for this workload). A fast path that counted nothing makes the
    /// sample failed ("fast path idle"), its value absent.
    #[serde(default)]
    pub fast_path: Option<crate::evidence::Evidence>,
    pub error: Option<String>,
}

/// A topology that did not run, and why.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Skipped {
    pub topology: String,
    pub reason: String,
}

/// Everything a run produced.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub machine: Machine,
    pub config: Config,
    /// Topologies that ran, in order.
    pub topologies: Vec<String>,
    pub skipped: Vec<Skipped>,
    pub notes: Vec<String>,
    pub samples: Vec<Sample>,
    pub cross_check: Vec<CrossCheck>,
}

/// What the run reports as it goes.
pub trait Observer {
    fn skipped(&mut self, _s: &Skipped) {}
    fn note(&mut self, _s: &str) {}
}

/// Prints skips and notes on stderr.
pub struct StderrObserver;

impl Observer for StderrObserver {
    fn skipped(&mut self, s: &Skipped) {
        eprintln!("skipping topology {}: {}", s.topology, s.reason);
    }
    fn note(&mut self, s: &str) {
        eprintln!("{s}");
    }
}

/// The benchmark runner.
pub struct Runner {
    pub config: Config,
    pub launcher: Launcher,
    /// Prefix for namespaces and cgroups (`nsfb-<pid>` by default).
    pub prefix: String,
    /// Show a progress bar on stderr.
    pub progress: bool,
}

impl Runner {
    pub fn new(config: Config, launcher: Launcher) -> Self {
        Self {
            config,
            launcher,
            prefix: nsfast_lab::name::run_prefix(),
            progress: true,
        }
    }

    /// Runs the whole benchmark. Everything it creates is removed before it returns, also
    /// on error and on SIGINT/SIGTERM (which the caller must have blocked, see
    /// `nsfast_sys::signals::block_termination`).
    pub fn run(&self, obs: &mut dyn Observer) -> Result<Outcome, BenchError> {
        if !nix::unistd::geteuid().is_root() {
            return Err(BenchError::NotRoot);
        }
        let allowed = nsfast_sys::sched::allowed_cpus().map_err(|e| BenchError::Spawn {
            what: "sched_getaffinity".into(),
            source: e,
        })?;
        let placements: Vec<(Placement, Option<usize>, Option<usize>)> = self
            .config
            .placements
            .iter()
            .map(|&p| p.cpus(&allowed).map(|(c, s)| (p, c, s)))
            .collect::<Result<_, _>>()?;

        // Probe and pick topologies before touching the system.
        let mut defs = Vec::new();
        let mut skipped = Vec::new();
        for name in &self.config.topologies {
            let def = topology::find(name)?;
            match (def.probe)() {
                Ok(()) => defs.push(def),
                Err(reason) => {
                    let s = Skipped {
                        topology: name.clone(),
                        reason,
                    };
                    obs.skipped(&s);
                    skipped.push(s);
                }
            }
        }
        if defs.is_empty() {
            return Err(BenchError::NothingToRun(
                "every selected topology was skipped; nothing to measure".into(),
            ));
        }

        let run_cg = RunCgroup::create(&self.prefix)?;
        let ctx = BuildCtx {
            prefix: self.prefix.clone(),
            cgroup_root: run_cg.path().to_path_buf(),
            launcher: Some(self.launcher.clone()),
        };
        let mut built: Vec<Built> = Vec::new();
        let mut notes = Vec::new();
        for def in &defs {
            check_interrupt()?;
            match (def.build)(&ctx) {
                Ok(b) => {
                    if let Some(n) = &b.note {
                        obs.note(n);
                        notes.push(n.clone());
                    }
                    built.push(b);
                }
                Err(e) => {
                    let s = Skipped {
                        topology: def.name.into(),
                        reason: format!("build failed: {e}"),
                    };
                    obs.skipped(&s);
                    skipped.push(s);
                }
            }
        }
        if built.is_empty() {
            return Err(BenchError::NothingToRun(
                "no selected topology could be built".into(),
            ));
        }

        let cfg = &self.config;
        let warm = !cfg.warmup.is_zero();
        // vsock is streams only: udp-stream is not measured on the vsock topologies.
        let pairs = cfg
            .workloads
            .iter()
            .map(|&w| built.iter().filter(|b| b.supports(w)).count())
            .sum::<usize>();
        if cfg.workloads.iter().any(|w| w.is_udp()) && built.iter().any(|b| b.vsock.is_some()) {
            let n =
                "udp-stream is not measured on vsock topologies (vsock loopback has streams only)";
            obs.note(n);
            notes.push(n.to_string());
        }
        if pairs == 0 {
            return Err(BenchError::NothingToRun(
                "no selected workload runs on the selected topologies (vsock topologies have no udp-stream)".into(),
            ));
        }
        let per_round = (placements.len() * pairs) as u64;
        let total = per_round * (u64::from(cfg.rounds) + u64::from(warm));
        let pb = self.progress_bar(total);
        let mut samples = Vec::new();

        let rounds = if warm { 0..=cfg.rounds } else { 1..=cfg.rounds };
        for round in rounds {
            let d = if round == 0 { cfg.warmup } else { cfg.duration };
            for &(placement, ccpu, scpu) in &placements {
                for &w in &cfg.workloads {
                    for b in built.iter().filter(|b| b.supports(w)) {
                        pb.set_message(format!(
                            "{} {} {} {w} {placement}",
                            if round == 0 {
                                "warm-up".to_string()
                            } else {
                                format!("round {round}/{}", cfg.rounds)
                            },
                            "·",
                            b.name
                        ));
                        let s = self.measure(b, w, placement, ccpu, scpu, d, round);
                        let s = match s {
                            Ok(s) => s,
                            Err(e @ BenchError::Interrupted(_)) => {
                                pb.abandon();
                                return Err(e);
                            }
                            Err(e) => Sample {
                                round,
                                topology: b.name.into(),
                                workload: w,
                                placement,
                                client_cpu: ccpu,
                                server_cpu: scpu,
                                value: None,
                                unit: w.unit().into(),
                                client: None,
                                server: None,
                                loss: None,
                                cpu: None,
                                fast_path: None,
                                error: Some(e.to_string()),
                            },
                        };
                        if let Some(e) = &s.error {
                            pb.suspend(|| {
                                eprintln!("{} {w} {placement} round {round}: {e}", b.name)
                            });
                        }
                        if round > 0 {
                            samples.push(s);
                        }
                        pb.inc(1);
                    }
                }
            }
        }
        pb.finish_and_clear();
        let mut cross_check = Vec::new();
        if cfg.cross_check {
            for b in built
                .iter()
                .filter(|b| b.name == "host" || b.name == "veth")
            {
                for &(placement, ccpu, scpu) in &placements {
                    obs.note(&format!(
                        "cross-check on {} ({placement}): sockperf, iperf3",
                        b.name
                    ));
                    let d = cfg.duration.max(Duration::from_secs(2));
                    cross_check.extend(crate::crosscheck::run(self, b, placement, ccpu, scpu, d)?);
                }
            }
        }
        let topologies = built.iter().map(|b| b.name.to_string()).collect();
        drop(built);
        drop(run_cg);
        Ok(Outcome {
            machine: Machine::current(),
            config: cfg.clone(),
            topologies,
            skipped,
            notes,
            samples,
            cross_check,
        })
    }

    fn progress_bar(&self, total: u64) -> ProgressBar {
        if !self.progress {
            return ProgressBar::hidden();
        }
        let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        pb.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
                .expect("static template")
                .progress_chars("=> "),
        );
        pb
    }

    /// Starts a worker of `role` on `b`, pinned to `cpu`.
    pub fn spawn_worker(&self, b: &Built, spec: &WorkerSpec) -> Result<ChildGuard, BenchError> {
        let (ns, cg) = match spec.role {
            Role::Server | Role::Relay => (b.server_ns(), &b.server.cgroup),
            Role::Client => (b.client_ns(), &b.client.cgroup),
        };
        let mut args = self.launcher.args.clone();
        args.push(serde_json::to_string(spec).expect("spec serializes"));
        // The worker pins itself too; pinning before exec keeps even its start-up on the CPU.
        let cmd = command_in(&self.launcher.program, &args, ns, cg.path(), spec.cpu);
        ChildGuard::spawn(
            cmd,
            format!("{} {:?} worker ({})", spec.workload, spec.role, b.name).to_lowercase(),
        )
    }

    /// One measurement with the configured sizes.
    #[allow(clippy::too_many_arguments)]
    pub fn measure(
        &self,
        b: &Built,
        w: Workload,
        placement: Placement,
        ccpu: Option<usize>,
        scpu: Option<usize>,
        duration: Duration,
        round: u32,
    ) -> Result<Sample, BenchError> {
        self.measure_with(
            b,
            w,
            self.config.sizes,
            placement,
            ccpu,
            scpu,
            duration,
            round,
        )
    }

    /// One measurement. Public so tests and the cross-check can run single ones.
    #[allow(clippy::too_many_arguments)]
    pub fn measure_with(
        &self,
        b: &Built,
        w: Workload,
        sizes: Sizes,
        placement: Placement,
        ccpu: Option<usize>,
        scpu: Option<usize>,
        duration: Duration,
        round: u32,
    ) -> Result<Sample, BenchError> {
        let mut spec = WorkerSpec {
            role: Role::Server,
            workload: w,
            addr: SocketAddr::new(b.server_ip, b.server_port),
            sizes,
            duration_s: duration.as_secs_f64(),
            cpu: scpu,
            vsock: b.vsock.map(|v| VsockEnd {
                cid: nsfast_sys::vsock::VMADDR_CID_ANY,
                port: v.server_port,
            }),
            relay_to: None,
        };
        if let Some(pid) = b.vsock.and_then(|v| v.helper_pid) {
            place_helper(pid, scpu).map_err(|source| BenchError::Spawn {
                what: format!("sched_setaffinity of the {} helper (pid {pid})", b.name),
                source,
            })?;
        }
        let mut server = self.spawn_worker(b, &spec)?;
        let addr = match read_report(server.stdout()) {
            Some(WorkerReport::Ready(a)) => a,
            // The client goes to the topology's client port (a relay's, or the server's).
            Some(WorkerReport::ReadyVsock(_)) => spec.addr,
            Some(WorkerReport::Error(e)) => {
                return Err(BenchError::Worker {
                    what: server.what.clone(),
                    detail: e,
                })
            }
            _ => {
                server.kill();
                return Err(BenchError::Worker {
                    what: server.what.clone(),
                    detail: format!("exited before listening: {}", server.stderr_text()),
                });
            }
        };
        let fast_path = b.fast_path.as_ref().filter(|f| f.applies(w));
        let read_fast_path = || -> Result<_, BenchError> {
            fast_path
                .map(|f| f.read(b))
                .transpose()
                .map_err(|detail| BenchError::Worker {
                    what: format!("fast-path counters of {}", b.name),
                    detail,
                })
        };
        let fp_before = read_fast_path()?;
        let before = CpuSnapshot::take(&b.client.cgroup, &b.server.cgroup);
        spec.role = Role::Client;
        spec.addr = addr;
        spec.cpu = ccpu;
        spec.vsock = b.vsock.map(|v| VsockEnd {
            cid: nsfast_sys::vsock::VMADDR_CID_LOCAL,
            port: v.client_port,
        });
        let mut client = self.spawn_worker(b, &spec)?;
        let st = client.wait(duration + Duration::from_secs(20))?;
        let after = CpuSnapshot::take(&b.client.cgroup, &b.server.cgroup);
        let creport = read_report(client.stdout());
        // Stop the server: close its stdin, then collect its counts.
        drop(server.take_stdin());
        server.wait(Duration::from_secs(10))?;
        let sreport = read_report(server.stdout());
        let fp_after = match (fast_path, &fp_before) {
            (Some(f), Some(before)) => {
                Some(
                    f.read_after(b, before)
                        .map_err(|detail| BenchError::Worker {
                            what: format!("fast-path counters of {}", b.name),
                            detail,
                        })?,
                )
            }
            _ => None,
        };
        let evidence = match (fast_path, &fp_before, &fp_after) {
            (Some(f), Some(a), Some(z)) => Some(f.evidence(a, z)),
            _ => None,
        };
        let cres = expect_report(
            creport,
            &mut client,
            |g| format!("{st}: {}", g.stderr_text()),
            |r| match r {
                WorkerReport::Client(r) => Ok(r),
                other => Err(other),
            },
        )?;
        let scount = expect_report(
            sreport,
            &mut server,
            |g| format!("no counts reported: {}", g.stderr_text()),
            |r| match r {
                WorkerReport::Server(c) => Ok(c),
                other => Err(other),
            },
        )?;
        // Both sides count; a mismatch means a bug or a broken path, not a figure to trust.
        let mismatch = match w {
            Workload::Rr | Workload::Crr | Workload::Ping
                if cres.transactions != scount.transactions =>
            {
                Some(format!(
                    "client counted {} transactions, server {}",
                    cres.transactions, scount.transactions
                ))
            }
            Workload::Stream if cres.bytes != scount.bytes => Some(format!(
                "client sent {} bytes, server received {}",
                cres.bytes, scount.bytes
            )),
            _ => None,
        };
        if let Some(m) = mismatch {
            return Err(BenchError::Worker {
                what: format!("{w} on {}", b.name),
                detail: m,
            });
        }
        // The CPUs whose ksoftirqd/softirq time counts: the pinned ones, or all when unpinned.
        let cpus: Vec<usize> = match (ccpu, scpu) {
            (Some(c), Some(s)) if c == s => vec![c],
            (Some(c), Some(s)) => vec![c, s],
            _ => nsfast_sys::sched::allowed_cpus().unwrap_or_default(),
        };
        let (value, loss) = headline(w, &cres, &scount);
        let mut cpu = after.since(&before, &cpus);
        let mut total_us = (cpu.client_usec + cpu.server_usec + cpu.ksoftirqd_usec) as f64;
        if irq_time_accounting() {
            total_us += cpu.softirq_usec as f64;
        }
        cpu.per_unit = match w {
            Workload::Stream | Workload::UdpStream => {
                let gb = scount.bytes as f64 / 1e9;
                if gb > 0.0 {
                    total_us / 1e6 / gb
                } else {
                    0.0
                }
            }
            _ => {
                if cres.transactions > 0 {
                    total_us / cres.transactions as f64
                } else {
                    0.0
                }
            }
        };
        // A fast path that carried nothing: the figure is the ordinary path's, not its.
        let idle = evidence.as_ref().and_then(|e| e.idle_error());
        Ok(Sample {
            round,
            topology: b.name.into(),
            workload: w,
            placement,
            client_cpu: ccpu,
            server_cpu: scpu,
            value: if idle.is_some() { None } else { Some(value) },
            unit: w.unit().into(),
            client: Some(cres),
            server: Some(scount),
            loss,
            cpu: Some(cpu),
            fast_path: evidence,
            error: idle,
        })
    }
}

/// Pins process `pid` (its main thread: the threads and children it starts later inherit
/// it) to `cpu`, or lets it run on every CPU this process may use.
fn place_helper(pid: u32, cpu: Option<usize>) -> std::io::Result<()> {
    use nix::sched::{sched_setaffinity, CpuSet};
    let cpus = match cpu {
        Some(c) => vec![c],
        None => nsfast_sys::sched::allowed_cpus()?,
    };
    let mut set = CpuSet::new();
    for c in cpus {
        set.set(c).map_err(std::io::Error::from)?;
    }
    sched_setaffinity(nix::unistd::Pid::from_raw(pid as i32), &set).map_err(std::io::Error::from)
}

/// The headline figure (and udp loss) from what both sides counted.
pub fn headline(w: Workload, c: &ClientResult, s: &ServerCounts) -> (f64, Option<f64>) {
    let secs = c.elapsed_s.max(1e-9);
    match w {
        Workload::Rr | Workload::Crr => (c.transactions as f64 / secs, None),
        Workload::Ping => (c.latency_us.map(|l| l.p50).unwrap_or(0.0), None),
        Workload::Stream => (s.bytes as f64 * 8.0 / secs / 1e9, None),
        Workload::UdpStream => {
            let loss = if c.datagrams > 0 {
                1.0 - (s.datagrams as f64 / c.datagrams as f64).min(1.0)
            } else {
                0.0
            };
            (s.bytes as f64 * 8.0 / secs / 1e9, Some(loss))
        }
    }
}

/// Whether the kernel accounts softirq time apart from tasks (cached; assumed not when the
/// kernel config cannot be read, the common tick-based default).
pub fn irq_time_accounting() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| nsfast_sys::procstat::irq_time_accounting().unwrap_or(false))
}

fn ksoftirqd_pids() -> &'static Vec<Option<u32>> {
    static V: std::sync::OnceLock<Vec<Option<u32>>> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        let n = nsfast_sys::procstat::per_cpu_times()
            .map(|v| v.len())
            .unwrap_or(0);
        (0..n).map(nsfast_sys::procstat::ksoftirqd_pid).collect()
    })
}

struct CpuSnapshot {
    client: u64,
    server: u64,
    stat: Vec<Option<nsfast_sys::procstat::CpuTimes>>,
    ksoftirqd: Vec<u64>,
}

impl CpuSnapshot {
    fn take(client: &Cgroup, server: &Cgroup) -> Self {
        Self {
            client: client.cpu_usage_usec().unwrap_or(0),
            server: server.cpu_usage_usec().unwrap_or(0),
            stat: nsfast_sys::procstat::per_cpu_times().unwrap_or_default(),
            ksoftirqd: ksoftirqd_pids()
                .iter()
                .map(|p| {
                    p.and_then(|p| nsfast_sys::procstat::process_cpu_usec(p).ok())
                        .unwrap_or(0)
                })
                .collect(),
        }
    }

    fn since(&self, before: &CpuSnapshot, cpus: &[usize]) -> CpuCost {
        let hz = nsfast_sys::procstat::user_hz();
        let mut soft_ticks = 0;
        let mut ksoft = 0;
        for &c in cpus {
            if let (Some(a), Some(b)) = (self.ksoftirqd.get(c), before.ksoftirqd.get(c)) {
                ksoft += a.saturating_sub(*b);
            }
            if let (Some(Some(a)), Some(Some(b))) = (self.stat.get(c), before.stat.get(c)) {
                soft_ticks += a.since(b).softirq;
            }
        }
        CpuCost {
            client_usec: self.client.saturating_sub(before.client),
            server_usec: self.server.saturating_sub(before.server),
            softirq_usec: soft_ticks * 1_000_000 / hz,
            ksoftirqd_usec: ksoft,
            per_unit: 0.0,
        }
    }
}

/// Writes `text` to `path`, naming the path on error.
pub fn write_file(path: &std::path::Path, text: &str) -> Result<(), BenchError> {
    let w = || -> std::io::Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let mut f = std::fs::File::create(path)?;
        f.write_all(text.as_bytes())
    };
    w().map_err(|source| BenchError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// The report `worker` was expected to give (`pick` accepts it); otherwise the error it
/// reported, or `missing()` when it reported nothing usable.
fn expect_report<T>(
    report: Option<WorkerReport>,
    worker: &mut ChildGuard,
    missing: impl FnOnce(&mut ChildGuard) -> String,
    pick: impl FnOnce(WorkerReport) -> Result<T, WorkerReport>,
) -> Result<T, BenchError> {
    let detail = match report.map(pick) {
        Some(Ok(v)) => return Ok(v),
        Some(Err(WorkerReport::Error(e))) => e,
        _ => missing(worker),
    };
    Err(BenchError::Worker {
        what: worker.what.clone(),
        detail,
    })
}
