//! The run: build the selected topologies, warm up, then N interleaved rounds
//! (round 1: A B C, round 2: A B C, ...) of every workload and placement, each measurement a
//! fresh server + client worker pair started in the topology's namespaces and cgroups, pinned.
//! CPU use is read from the two cgroups' `cpu.stat` plus the pinned CPUs' softirq time.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub use crate::cputime::irq_time_accounting;
use crate::cputime::CpuSnapshot;
use crate::crosscheck;
use crate::evidence::{Evidence, FastPath, Reading};
use crate::load::{ClientResult, ServerCounts};
pub use crate::model::{CpuCost, Outcome, Sample, Skipped};
use crate::model::{CrossCheck, Machine};
use crate::proc::{check_interrupt, command_in, ChildGuard, Launcher};
use crate::spec::{Config, Placement, Sizes, Workload};
use crate::topology::{self, BuildCtx, Built, ProbeCtx, RunCgroup, TopologyDef};
use crate::worker::{read_report, FloorEnd, Role, VsockEnd, WorkerReport, WorkerSpec};
use crate::BenchError;

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
    /// Prefix for namespaces and cgroups (`nsfb<pid>` by default).
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
        let placements = self.placements()?;
        let mut skipped = Vec::new();
        // Probe and pick topologies before touching the system.
        let probe = ProbeCtx {
            tenant: self.config.tenant.clone(),
        };
        let defs = probe_topologies(&self.config.topologies, &probe, obs, &mut skipped)?;
        let run_cg = RunCgroup::create(&self.prefix)?;
        let ctx = BuildCtx {
            prefix: self.prefix.clone(),
            cgroup_root: run_cg.path().to_path_buf(),
            launcher: Some(self.launcher.clone()),
            tenant: self.config.tenant.clone(),
        };
        let mut notes = Vec::new();
        let built = build_topologies(&defs, &ctx, obs, &mut skipped, &mut notes)?;
        let pairs = self.count_pairs(&built, obs, &mut notes)?;
        let samples = self.rounds(&built, &placements, pairs)?;
        let cross_check = self.cross_checks(&built, &placements, obs)?;
        let topologies = built.iter().map(|b| b.name.to_string()).collect();
        drop(built);
        drop(run_cg);
        Ok(Outcome {
            machine: Machine::current(),
            config: self.config.clone(),
            topologies,
            skipped,
            notes,
            samples,
            cross_check,
        })
    }

    /// The placements to measure, each with its client and server CPU (needs root).
    fn placements(&self) -> Result<Vec<Pinning>, BenchError> {
        if !nix::unistd::geteuid().is_root() {
            return Err(BenchError::NotRoot);
        }
        let allowed = nsfast_sys::sched::allowed_cpus().map_err(|e| BenchError::Spawn {
            what: "sched_getaffinity".into(),
            source: e,
        })?;
        self.config
            .placements
            .iter()
            .map(|&p| p.cpus(&allowed).map(|(c, s)| (p, c, s)))
            .collect::<Result<_, _>>()
    }

    /// The number of topology × workload pairs per placement and round; notes the workloads
    /// a topology cannot run.
    fn count_pairs(
        &self,
        built: &[Built],
        obs: &mut dyn Observer,
        notes: &mut Vec<String>,
    ) -> Result<usize, BenchError> {
        let cfg = &self.config;
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
        Ok(pairs)
    }

    /// The warm-up round (round 0, not kept) and the measured rounds, interleaved: every
    /// placement × workload × topology once per round.
    fn rounds(
        &self,
        built: &[Built],
        placements: &[Pinning],
        pairs: usize,
    ) -> Result<Vec<Sample>, BenchError> {
        let cfg = &self.config;
        let warm = !cfg.warmup.is_zero();
        let per_round = (placements.len() * pairs) as u64;
        let total = per_round * (u64::from(cfg.rounds) + u64::from(warm));
        let pb = self.progress_bar(total);
        let mut samples = Vec::new();
        let rounds = if warm { 0..=cfg.rounds } else { 1..=cfg.rounds };
        for round in rounds {
            let d = if round == 0 { cfg.warmup } else { cfg.duration };
            for &(placement, ccpu, scpu) in placements {
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
                        let s = match self.measure(b, w, placement, ccpu, scpu, d, round) {
                            Ok(s) => s,
                            Err(e @ BenchError::Interrupted(_)) => {
                                pb.abandon();
                                return Err(e);
                            }
                            Err(e) => failed_sample(b, w, (placement, ccpu, scpu), round, &e),
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
        Ok(samples)
    }

    /// `--cross-check`: sockperf and iperf3 next to ours, on host and veth (where ours must
    /// agree with them) and through both shortcuts (the tools' processes are in the same
    /// cgroups, so the shortcut carries their bytes as it carries ours).
    fn cross_checks(
        &self,
        built: &[Built],
        placements: &[Pinning],
        obs: &mut dyn Observer,
    ) -> Result<Vec<CrossCheck>, BenchError> {
        let mut cross_check = Vec::new();
        if !self.config.cross_check {
            return Ok(cross_check);
        }
        for b in built.iter().filter(|b| CROSS_CHECKED.contains(&b.name)) {
            for &(placement, ccpu, scpu) in placements {
                obs.note(&format!(
                    "cross-check on {} ({placement}): sockperf, iperf3",
                    b.name
                ));
                let d = self.config.duration.max(Duration::from_secs(2));
                let ours =
                    |w, sizes, d| self.measure_with(b, w, sizes, placement, ccpu, scpu, d, 0);
                let cfg = crosscheck::Setup {
                    sizes: self.config.sizes,
                    placement,
                    ccpu,
                    scpu,
                    duration: d,
                };
                cross_check.extend(crosscheck::run(b, &cfg, &ours)?);
            }
        }
        Ok(cross_check)
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
    pub(crate) fn spawn_worker(
        &self,
        b: &Built,
        spec: &WorkerSpec,
    ) -> Result<ChildGuard, BenchError> {
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
        let mut spec = server_spec(b, w, sizes, scpu, duration);
        let (mut server, addr) = self.start_server(b, &spec)?;
        let fast_path = FastPathWatch::new(b, w);
        let fp_before = fast_path.before()?;
        let bpf_before = self.config.bpf_stats.then(crate::bpfstats::snapshot);
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
        let bpf_after = bpf_before.as_ref().map(|_| crate::bpfstats::snapshot());
        let creport = read_report(client.stdout());
        // Stop the server: close its stdin, then collect its counts.
        drop(server.take_stdin());
        server.wait(Duration::from_secs(10))?;
        let sreport = read_report(server.stdout());
        let evidence = fast_path.evidence(fp_before.as_ref())?;
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
        check_counts(b, w, &cres, &scount)?;
        let (value, loss) = headline(w, &cres, &scount);
        let cpu = cpu_cost(w, (ccpu, scpu), &before, &after, &cres, &scount);
        let bpf = match (&bpf_before, &bpf_after) {
            (Some(a), Some(b)) => crate::bpfstats::cost(a, b, work_units(w, &cres, &scount)),
            _ => None,
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
            bpf,
            error: idle,
        })
    }

    /// Places the topology's helper (if any) on the server CPU, starts the server worker and
    /// waits for it to listen; returns it and the address the client goes to.
    fn start_server(
        &self,
        b: &Built,
        spec: &WorkerSpec,
    ) -> Result<(ChildGuard, SocketAddr), BenchError> {
        if let Some(pid) = b.vsock.and_then(|v| v.helper_pid) {
            place_helper(pid, spec.cpu).map_err(|source| BenchError::Spawn {
                what: format!("sched_setaffinity of the {} helper (pid {pid})", b.name),
                source,
            })?;
        }
        let mut server = self.spawn_worker(b, spec)?;
        let addr = match read_report(server.stdout()) {
            Some(WorkerReport::Ready(a)) => a,
            // The client goes to the topology's client port (a relay's, or the server's).
            Some(WorkerReport::ReadyVsock(_) | WorkerReport::ReadyFloor(_)) => spec.addr,
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
        Ok((server, addr))
    }
}

/// The server worker's spec for one measurement of `w` on `b`.
fn server_spec(
    b: &Built,
    w: Workload,
    sizes: Sizes,
    scpu: Option<usize>,
    duration: Duration,
) -> WorkerSpec {
    WorkerSpec {
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
        floor: b.floor.map(|f| FloorEnd {
            pipe: f == crate::built::Floor::Pipe,
            id: next_floor_id(),
        }),
        relay_to: None,
        kernel_path: false,
    }
}

/// The topologies `--cross-check` runs the established tools on.
const CROSS_CHECKED: [&str; 4] = ["host", "veth", "sockmap", "bpf-shortcut"];

/// A fresh id for each floor server: this process's pid and a counter, so neither a stale
/// FIFO directory nor another run's socket name is met.
fn next_floor_id() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    (u64::from(std::process::id()) << 32) | N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// A placement with its client and server CPU (`None`: unpinned).
type Pinning = (Placement, Option<usize>, Option<usize>);

/// The topologies of `names` whose probe passes; the others go to `skipped`.
fn probe_topologies(
    names: &[String],
    probe: &ProbeCtx,
    obs: &mut dyn Observer,
    skipped: &mut Vec<Skipped>,
) -> Result<Vec<TopologyDef>, BenchError> {
    let mut defs = Vec::new();
    for name in names {
        let def = topology::find(name)?;
        match (def.probe)(probe) {
            Ok(()) => defs.push(def),
            Err(reason) => skip(obs, skipped, name.clone(), reason),
        }
    }
    nonempty(
        defs,
        "every selected topology was skipped; nothing to measure",
    )
}

/// A topology that will not run: the observer hears of it, the report lists it.
fn skip(obs: &mut dyn Observer, skipped: &mut Vec<Skipped>, topology: String, reason: String) {
    let s = Skipped { topology, reason };
    obs.skipped(&s);
    skipped.push(s);
}

/// `v`, or [`BenchError::NothingToRun`] saying `why` when it is empty.
fn nonempty<T>(v: Vec<T>, why: &str) -> Result<Vec<T>, BenchError> {
    if v.is_empty() {
        return Err(BenchError::NothingToRun(why.into()));
    }
    Ok(v)
}

/// Builds each of `defs`; one that fails to build goes to `skipped`, its note to `notes`.
fn build_topologies(
    defs: &[TopologyDef],
    ctx: &BuildCtx,
    obs: &mut dyn Observer,
    skipped: &mut Vec<Skipped>,
    notes: &mut Vec<String>,
) -> Result<Vec<Built>, BenchError> {
    let mut built: Vec<Built> = Vec::new();
    for def in defs {
        check_interrupt()?;
        match (def.build)(ctx) {
            Ok(b) => {
                if let Some(n) = &b.note {
                    obs.note(n);
                    notes.push(n.clone());
                }
                built.push(b);
            }
            Err(e) => skip(obs, skipped, def.name.into(), format!("build failed: {e}")),
        }
    }
    nonempty(built, "no selected topology could be built")
}

/// The sample of a measurement that failed with `e`.
fn failed_sample(
    b: &Built,
    w: Workload,
    (placement, ccpu, scpu): Pinning,
    round: u32,
    e: &BenchError,
) -> Sample {
    Sample {
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
        bpf: None,
        error: Some(e.to_string()),
    }
}

/// The topology's fast-path counters around one measurement of `w` (nothing to read when it
/// claims no fast path for `w`).
struct FastPathWatch<'a> {
    b: &'a Built,
    fast_path: Option<&'a FastPath>,
    workload: Workload,
}

impl<'a> FastPathWatch<'a> {
    fn new(b: &'a Built, w: Workload) -> Self {
        let fast_path = b.fast_path.as_ref().filter(|f| f.applies(w));
        Self {
            b,
            fast_path,
            workload: w,
        }
    }

    fn error(&self, detail: String) -> BenchError {
        BenchError::Worker {
            what: format!("fast-path counters of {}", self.b.name),
            detail,
        }
    }

    /// The reading before the measurement.
    fn before(&self) -> Result<Option<Reading>, BenchError> {
        self.fast_path
            .map(|f| f.read(&self.b.extras))
            .transpose()
            .map_err(|d| self.error(d))
    }

    /// Reads the counters after the measurement; the evidence between the two readings.
    fn evidence(&self, before: Option<&Reading>) -> Result<Option<Evidence>, BenchError> {
        let (Some(f), Some(before)) = (self.fast_path, before) else {
            return Ok(None);
        };
        let after = f
            .read_after(&self.b.extras, before)
            .map_err(|d| self.error(d))?;
        Ok(Some(f.evidence_for(self.workload, before, &after)))
    }
}

/// Both sides count; a mismatch means a bug or a broken path, not a figure to trust.
fn check_counts(
    b: &Built,
    w: Workload,
    cres: &ClientResult,
    scount: &ServerCounts,
) -> Result<(), BenchError> {
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
    match mismatch {
        Some(m) => Err(BenchError::Worker {
            what: format!("{w} on {}", b.name),
            detail: m,
        }),
        None => Ok(()),
    }
}

/// The units a measurement's costs are divided by: GB for streams, else transactions.
fn work_units(w: Workload, cres: &ClientResult, scount: &ServerCounts) -> f64 {
    match w {
        Workload::Stream | Workload::UdpStream => scount.bytes as f64 / 1e9,
        _ => cres.transactions as f64,
    }
}

/// The CPU cost of one measurement between two snapshots, normalised per transaction or GB.
fn cpu_cost(
    w: Workload,
    (ccpu, scpu): (Option<usize>, Option<usize>),
    before: &CpuSnapshot,
    after: &CpuSnapshot,
    cres: &ClientResult,
    scount: &ServerCounts,
) -> CpuCost {
    // The CPUs whose ksoftirqd/softirq time counts: the pinned ones, or all when unpinned.
    let cpus: Vec<usize> = match (ccpu, scpu) {
        (Some(c), Some(s)) if c == s => vec![c],
        (Some(c), Some(s)) => vec![c, s],
        _ => nsfast_sys::sched::allowed_cpus().unwrap_or_default(),
    };
    let mut cpu = after.since(before, &cpus);
    let mut total_us = (cpu.client_usec + cpu.server_usec + cpu.ksoftirqd_usec) as f64;
    if irq_time_accounting() {
        total_us += cpu.softirq_usec as f64;
    }
    let units = work_units(w, cres, scount);
    cpu.per_unit = match w {
        _ if units <= 0.0 => 0.0,
        // Seconds per GB.
        Workload::Stream | Workload::UdpStream => total_us / 1e6 / units,
        // µs per transaction.
        _ => total_us / units,
    };
    cpu
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
