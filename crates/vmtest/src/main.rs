//! `vmtest` — nsfast's kernel-matrix VM test harness.
//!
//! For each kernel in `tests/vm/kernels.txt`: fetch the Debian kernel packages with a private
//! apt configuration (cached under `build/vm/`), build an initramfs with busybox, the needed
//! modules and the project's test binaries, boot it under QEMU, run the guest tests of
//! `tests/vm/guest-tests.txt`, and print a per-kernel summary. Exits 1 if any guest test fails,
//! a result is missing, a guest times out, or a guest kernel WARNs, BUGs, oopses or panics.
//!
//! Module map:
//! - [`config`]    — parse the kernel matrix and the guest test list.
//! - [`apt`]       — private apt configuration per suite; Debian version order.
//! - [`kernel`]    — resolve, download and unpack a kernel; module dependencies.
//! - [`initramfs`] — stage the guest tree, depmod it, write a newc cpio.
//! - [`qemu`]      — accelerator choice, boot, console streaming, time limits.
//! - [`report`]    — console markers, guest dmesg, kernel trouble.

mod apt;
mod checks;
mod config;
mod initramfs;
mod kernel;
mod qemu;
mod report;

use std::collections::BTreeMap;
use std::fs;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use config::{GuestSuite, GuestTest, MajorMinor, Matrix};
use qemu::{Accel, AccelChoice, BootSpec, Ending};
use report::GuestRun;

#[derive(Parser, Debug)]
#[command(
    name = "vmtest",
    about = "Boot Debian kernels under QEMU and run nsfast's guest tests"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Fetch kernels, build initramfs images, boot every kernel and run the guest tests.
    Run(RunArgs),
    /// Only resolve, download and unpack the kernels (and busybox); print what was chosen.
    Fetch(CommonArgs),
}

#[derive(Args, Debug, Clone)]
struct CommonArgs {
    /// Workspace root (holds tests/vm/ and Cargo.toml) [default: this source tree].
    #[arg(long, value_name = "DIR")]
    root_dir: Option<PathBuf>,
    /// Kernel matrix file [default: ROOT/tests/vm/kernels.txt].
    #[arg(long)]
    kernels: Option<PathBuf>,
    /// Cache and work folder [default: ROOT/build/vm].
    #[arg(long)]
    build_dir: Option<PathBuf>,
    /// Only these kernels (labels from the matrix file; repeatable).
    #[arg(long = "kernel", value_name = "LABEL")]
    only_kernels: Vec<String>,
    /// Never run `apt-get update`; use the package lists already cached.
    #[arg(long)]
    offline: bool,
    /// Refresh package lists older than this many hours.
    #[arg(long, default_value_t = 24)]
    lists_max_age_hours: u64,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Guest test list [default: ROOT/tests/vm/guest-tests.txt].
    #[arg(long)]
    tests: Option<PathBuf>,
    /// Only tests with these names (repeatable).
    #[arg(long = "test", value_name = "NAME")]
    only_tests: Vec<String>,
    /// An extra test line, in the test list's syntax (`NAME [ATTRS] -- COMMAND`); repeatable.
    #[arg(long = "add-test", value_name = "LINE")]
    add_tests: Vec<String>,
    /// Start each guest at this test, in the list's order (as a guest booted again after an
    /// emulator fault does): the ones before it are not run.
    #[arg(long, value_name = "NAME")]
    from_test: Option<String>,
    /// CPU accelerator.
    #[arg(long, value_enum, default_value_t = AccelChoice::Auto)]
    accel: AccelChoice,
    /// Kernels booted at the same time [default: the host's CPU count, at most the number of
    /// kernels]. Each kernel's boot profiles still run one after another. The guests run their
    /// tests one at a time (`--test-threads=1`) and keep about 1.5 of their 2 vCPUs' host CPUs
    /// busy, so two at once on a 2-CPU host use what one left idle (make test, 2026-12-01:
    /// 1,792 guest-seconds in 930 s).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=16))]
    jobs: Option<u32>,
    /// vCPUs per guest.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=8))]
    cpus: u32,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(256..=8192))]
    mem: u32,
    /// Seconds a guest may take to reach /init.
    #[arg(long, default_value_t = 120)]
    init_timeout: u64,
    /// Seconds a whole guest may take [default: init timeout + the tests' timeouts + 60].
    #[arg(long)]
    vm_timeout: Option<u64>,
    /// Use these binaries instead of building (a cargo target profile folder, e.g. target/release).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Do not echo guest console lines (they are still logged under BUILD/logs/).
    #[arg(long, short)]
    quiet: bool,
    /// Also echo kernel boot messages before /init.
    #[arg(long, short)]
    verbose: bool,
}

fn default_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    here.canonicalize().unwrap_or(here)
}

impl CommonArgs {
    fn root(&self) -> PathBuf {
        self.root_dir.clone().unwrap_or_else(default_root)
    }

    fn build_dir(&self) -> PathBuf {
        self.build_dir
            .clone()
            .unwrap_or_else(|| self.root().join("build/vm"))
    }

    fn matrix(&self) -> Result<Matrix> {
        let path = self
            .kernels
            .clone()
            .unwrap_or_else(|| self.root().join("tests/vm/kernels.txt"));
        let text = fs::read_to_string(&path)
            .with_context(|| format!("reading kernel matrix {}", path.display()))?;
        let mut m = config::parse_matrix(&text, &path)?;
        if !self.only_kernels.is_empty() {
            for k in &self.only_kernels {
                if !m.kernels.iter().any(|s| &s.label == k) {
                    let labels: Vec<_> = m.kernels.iter().map(|s| s.label.as_str()).collect();
                    bail!(
                        "unknown kernel {k:?} in --kernel: {} lists {}",
                        path.display(),
                        labels.join(", ")
                    );
                }
            }
            m.kernels.retain(|s| self.only_kernels.contains(&s.label));
        }
        Ok(m)
    }
}

fn main() -> ExitCode {
    nsfast_sys::logging::init("info");
    let cli = Cli::parse();
    let r = match cli.command {
        Cmd::Run(a) => run(a),
        Cmd::Fetch(a) => fetch_only(a).map(|()| true),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("vmtest: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

struct Fetched {
    kernels: Vec<kernel::Kernel>,
    busybox: PathBuf,
}

fn fetch_all(c: &CommonArgs) -> Result<Fetched> {
    let m = c.matrix()?;
    let build = c.build_dir();
    fs::create_dir_all(&build).with_context(|| format!("creating {}", build.display()))?;
    let max_age = Duration::from_secs(c.lists_max_age_hours * 3600);
    let mut apts: BTreeMap<String, apt::Apt> = BTreeMap::new();
    let mut get_apt = |suite: &str| -> Result<apt::Apt> {
        if let Some(a) = apts.get(suite) {
            return Ok(a.clone());
        }
        let a = apt::Apt::new(&build, suite, &m.mirror)?;
        a.update(max_age, c.offline)?;
        apts.insert(suite.to_string(), a.clone());
        Ok(a)
    };
    let tools = get_apt(&m.tools_suite)?;
    let busybox = fetch_busybox(&tools, &build)?;
    let mut kernels = Vec::new();
    for spec in &m.kernels {
        let a = get_apt(&spec.suite)?;
        let k = kernel::fetch(&a, spec, &build)?;
        tracing::info!(
            "kernel {}: {} {} (release {})",
            spec.label,
            k.package.name,
            k.package.version,
            k.release
        );
        kernels.push(k);
    }
    Ok(Fetched { kernels, busybox })
}

fn fetch_busybox(a: &apt::Apt, build: &Path) -> Result<PathBuf> {
    let info = a
        .show("busybox-static")?
        .with_context(|| format!("busybox-static is not in the {} index", a.suite))?;
    let deb = a.download(&info, &build.join("debs").join(&a.suite))?;
    let root = build.join("tools").join(format!(
        "busybox-static_{}",
        info.version.replace(':', "%3a")
    ));
    let stamp = root.join(".unpacked");
    if !stamp.exists() {
        fs::create_dir_all(&root)?;
        kernel::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
        fs::write(&stamp, "")?;
    }
    ["bin/busybox", "usr/bin/busybox"]
        .iter()
        .map(|p| root.join(p))
        .find(|p| p.exists())
        .with_context(|| format!("no busybox binary in {}", deb.display()))
}

fn fetch_only(c: CommonArgs) -> Result<()> {
    let f = fetch_all(&c)?;
    println!("busybox: {}", f.busybox.display());
    for k in &f.kernels {
        println!(
            "{:6} {} {} release {} (vmlinuz {})",
            k.spec.label,
            k.package.name,
            k.package.version,
            k.release,
            k.vmlinuz.display()
        );
    }
    Ok(())
}

/// A `@host-bin` program: the first executable NAME on PATH (like `which`), symlinks resolved
/// so the real file is copied; its shared libraries come from `ldd` like any binary's.
fn host_bin(name: &str) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let p = dir.join(name);
        if let Ok(m) = fs::metadata(&p) {
            if m.is_file() && m.permissions().mode() & 0o111 != 0 {
                return fs::canonicalize(&p).with_context(|| format!("resolving {}", p.display()));
            }
        }
    }
    bail!("@host-bin {name}: not found on PATH; install it on this host (e.g. apt-get install {name}; `make deps` installs the VM test packages)")
}

/// Builds the guest binaries with cargo; returns (guest path, host path).
fn build_binaries(
    root: &Path,
    suite: &GuestSuite,
    bin_dir: Option<&Path>,
) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    if let Some(dir) = bin_dir {
        for b in &suite.bins {
            let p = dir.join(b);
            if !p.exists() {
                bail!("--bin-dir {}: no binary {b:?} there", dir.display());
            }
            out.push((format!("/bin/{b}"), p));
        }
        if !suite.cargo_tests.is_empty() {
            bail!("--bin-dir cannot provide @cargo-tests executables; run without --bin-dir");
        }
        return Ok(out);
    }
    if !suite.bins.is_empty() {
        let mut cmd = cargo();
        cmd.current_dir(root).args([
            "build",
            "--release",
            "--workspace",
            "--message-format=json-render-diagnostics",
        ]);
        for b in &suite.bins {
            cmd.args(["--bin", b]);
        }
        for a in cargo_artifacts(&mut cmd, false)? {
            if suite.bins.contains(&a.name) {
                out.push((format!("/bin/{}", a.name), a.path));
            }
        }
        for b in &suite.bins {
            if !out.iter().any(|(g, _)| g == &format!("/bin/{b}")) {
                bail!("cargo built no binary named {b:?} (listed by @bin in the guest test list)");
            }
        }
    }
    let wanted = wanted_test_targets(root, suite)?;
    if !wanted.packages.is_empty() {
        // One cargo invocation for every @cargo-tests package: one feature resolution, so the
        // shared dependencies compile once instead of once per package (minutes under CI).
        // Only the test targets a test line runs are built (about half of them: not the
        // binaries' unit tests, nor the host-only integration tests).
        let mut cmd = cargo();
        cmd.current_dir(root)
            .args(["test", "--release", "--no-run"]);
        for pkg in &wanted.packages {
            cmd.args(["-p", pkg]);
        }
        if wanted.lib {
            cmd.arg("--lib");
        }
        for t in &wanted.tests {
            cmd.args(["--test", t]);
        }
        cmd.arg("--message-format=json-render-diagnostics");
        let arts = cargo_artifacts(&mut cmd, true)?;
        for pkg in &wanted.packages {
            if !arts.iter().any(|a| &a.package == pkg) {
                bail!("cargo built no test executables for package {pkg:?} (@cargo-tests)");
            }
        }
        for a in arts {
            if !wanted.packages.contains(&a.package) || !wanted.names.contains(&a.name) {
                continue;
            }
            let guest = format!("/tests/{}", a.name);
            if out.iter().any(|(g, _)| *g == guest) {
                bail!(
                    "two @cargo-tests executables would both be {guest} (the second from package {:?}); rename one test target",
                    a.package
                );
            }
            out.push((guest, a.path));
        }
    }
    Ok(out)
}

/// A cargo command: `$CARGO` (set when run by cargo) or `cargo` on PATH.
fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// The test targets of the `@cargo-tests` packages that the suite's commands run.
#[derive(Debug, Default, PartialEq, Eq)]
struct WantedTests {
    /// Packages with at least one wanted target.
    packages: Vec<String>,
    /// A library's unit tests are wanted (cargo's `--lib` then builds every selected
    /// package's; only the wanted ones go into the guest).
    lib: bool,
    /// Integration test targets (`--test`).
    tests: Vec<String>,
    /// Every wanted target name.
    names: std::collections::BTreeSet<String>,
}

fn wanted_test_targets(root: &Path, suite: &GuestSuite) -> Result<WantedTests> {
    if suite.cargo_tests.is_empty() {
        return Ok(WantedTests::default());
    }
    let out = cargo()
        .current_dir(root)
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed ({})", out.status);
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(select_test_targets(&meta, suite))
}

/// [`wanted_test_targets`] from `cargo metadata` output. Binaries' unit tests are never
/// selected: a command's `nsfast` is the binary itself (`@bin`).
fn select_test_targets(meta: &serde_json::Value, suite: &GuestSuite) -> WantedTests {
    let programs = suite.programs();
    let mut w = WantedTests::default();
    let empty = Vec::new();
    for pkg in &suite.cargo_tests {
        let Some(p) = meta["packages"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .find(|p| p["name"] == pkg.as_str())
        else {
            // Unknown package: let cargo say so.
            w.packages.push(pkg.clone());
            continue;
        };
        let mut any = false;
        for t in p["targets"].as_array().unwrap_or(&empty) {
            let name = t["name"].as_str().unwrap_or_default();
            if !programs.contains(name) {
                continue;
            }
            let kinds = t["kind"].as_array().unwrap_or(&empty);
            if kinds.iter().any(|k| k == "test") {
                w.tests.push(name.to_string());
            } else if kinds.iter().any(|k| k == "lib" || k == "rlib") {
                w.lib = true;
            } else {
                continue;
            }
            w.names.insert(name.to_string());
            any = true;
        }
        if any {
            w.packages.push(pkg.clone());
        }
    }
    w.tests.sort();
    w.tests.dedup();
    w
}

/// An executable cargo built: its target name, its package's name and its path.
struct Artifact {
    name: String,
    package: String,
    path: PathBuf,
}

/// The package name in a cargo package id: `path+file:///x/crates/sys#nsfast-sys@0.1.0`,
/// `registry+...#name@1.0` or the old `name 0.1.0 (path+file://...)` form.
fn package_name(id: &str) -> String {
    if let Some((_, frag)) = id.rsplit_once('#') {
        let name = frag.split('@').next().unwrap_or(frag);
        // `#0.1.0` alone (the package's directory name is its name) has no '@'.
        if !frag.contains('@') {
            let dir = id[..id.len() - frag.len() - 1]
                .rsplit('/')
                .next()
                .unwrap_or("");
            return dir.to_string();
        }
        return name.to_string();
    }
    id.split_whitespace().next().unwrap_or(id).to_string()
}

/// Runs a cargo command with JSON messages; returns the executables that are tests (`tests`)
/// or not.
fn cargo_artifacts(cmd: &mut Command, tests: bool) -> Result<Vec<Artifact>> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = cmd.spawn().context("running cargo")?;
    let stdout = child.stdout.take().expect("piped");
    let mut out = Vec::new();
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line?;
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if v["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(exe) = v["executable"].as_str() else {
            continue;
        };
        if v["profile"]["test"].as_bool() != Some(tests) {
            continue;
        }
        let name = v["target"]["name"]
            .as_str()
            .unwrap_or("unknown")
            .to_string();
        let package = package_name(v["package_id"].as_str().unwrap_or(""));
        out.push(Artifact {
            name,
            package,
            path: PathBuf::from(exe),
        });
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("{:?} failed ({status})", cmd);
    }
    Ok(out)
}

fn load_suite(a: &RunArgs) -> Result<GuestSuite> {
    let path = a
        .tests
        .clone()
        .unwrap_or_else(|| a.common.root().join("tests/vm/guest-tests.txt"));
    let mut text = fs::read_to_string(&path)
        .with_context(|| format!("reading guest test list {}", path.display()))?;
    for t in &a.add_tests {
        text.push('\n');
        text.push_str(t);
    }
    let mut s = config::parse_guest_suite(&text, &path)?;
    if !a.only_tests.is_empty() {
        for t in &a.only_tests {
            if !s.tests.iter().any(|x| &x.name == t) {
                bail!("unknown test {t:?} in --test: not in {}", path.display());
            }
        }
        // Tests given with --add-test always run.
        let added: Vec<&str> = a
            .add_tests
            .iter()
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        s.tests
            .retain(|t| a.only_tests.contains(&t.name) || added.contains(&t.name.as_str()));
    }
    if s.tests.is_empty() {
        bail!("no guest tests to run ({})", path.display());
    }
    Ok(s)
}

/// Outcome of one test on one kernel.
#[derive(Debug, Clone, serde::Serialize)]
enum Verdict {
    Pass,
    Fail(String),
    Skip(String),
}

#[derive(Debug, serde::Serialize)]
struct KernelResult {
    label: String,
    package: String,
    release: String,
    accel: Option<Accel>,
    boot_secs: Option<f64>,
    secs: f64,
    tests: BTreeMap<String, Verdict>,
    /// Failures not tied to one test (panic, WARN, timeout, modprobe, missing markers).
    problems: Vec<String>,
    modules: Vec<String>,
}

impl KernelResult {
    fn passed(&self) -> bool {
        self.problems.is_empty() && !self.tests.values().any(|v| matches!(v, Verdict::Fail(_)))
    }
}

fn run(a: RunArgs) -> Result<bool> {
    let suite = load_suite(&a)?;
    let root = a.common.root();
    let build = a.common.build_dir();
    let init_script = root.join("tests/vm/init.sh");
    if !init_script.exists() {
        bail!("missing guest init script {}", init_script.display());
    }
    let started = Instant::now();
    let fetched = fetch_all(&a.common)?;
    let fetch_secs = started.elapsed().as_secs_f64();
    let mut binaries = build_binaries(&root, &suite, a.bin_dir.as_deref())?;
    for b in &suite.host_bins {
        binaries.push((format!("/bin/{b}"), host_bin(b)?));
    }
    let build_secs = started.elapsed().as_secs_f64() - fetch_secs;
    let (accel, why) = qemu::detect_accel(a.accel);
    println!("vmtest: accelerator {accel}: {why}");

    let results = run_kernels(&a, &suite, &fetched, &init_script, &binaries, &build, accel)?;
    let total = started.elapsed().as_secs_f64();
    let ok = print_summary(&suite, &results, fetch_secs, build_secs, total);
    let json = build.join("results.json");
    fs::write(&json, serde_json::to_string_pretty(&results)?)?;
    println!(
        "vmtest: results in {}, logs in {}",
        json.display(),
        build.join("logs").display()
    );
    Ok(ok)
}

/// Runs every kernel, up to `--jobs` at once, the most expensive first (by the sum of its
/// applicable tests' time limits), and returns the results in the matrix's order.
fn run_kernels(
    a: &RunArgs,
    suite: &GuestSuite,
    fetched: &Fetched,
    init_script: &Path,
    binaries: &[(String, PathBuf)],
    build: &Path,
    accel: Accel,
) -> Result<Vec<KernelResult>> {
    let n = fetched.kernels.len();
    let jobs = a
        .jobs
        .map(|j| j as usize)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |p| p.get()))
        .clamp(1, n.max(1));
    let order = cost_order(suite, fetched.kernels.iter().map(|k| k.version));
    if jobs > 1 {
        println!("vmtest: {jobs} kernels at a time");
    }
    let run = KernelRun {
        a,
        suite,
        busybox: &fetched.busybox,
        init_script,
        binaries,
        build,
        accel,
    };
    let next = std::sync::Mutex::new(order.into_iter());
    let slots: Vec<std::sync::Mutex<Option<Result<KernelResult>>>> =
        (0..n).map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                // Each qemu and helper is started by this thread and dies with it
                // (PR_SET_PDEATHSIG), so the thread lives until its kernel is done.
                let Some(i) = next.lock().expect("queue").next() else {
                    break;
                };
                let r = run_kernel(&run, &fetched.kernels[i]);
                *slots[i].lock().expect("slot") = Some(r);
            });
        }
    });
    slots
        .into_iter()
        .map(|m| {
            m.into_inner()
                .expect("slot")
                .unwrap_or_else(|| Err(anyhow::anyhow!("kernel not run")))
        })
        .collect()
}

/// Kernel indexes, the largest budget of applicable test time limits first (ties: matrix order).
fn cost_order(suite: &GuestSuite, versions: impl Iterator<Item = MajorMinor>) -> Vec<usize> {
    let mut cost: Vec<(usize, u64)> = versions
        .enumerate()
        .map(|(i, v)| {
            let budget = suite
                .tests
                .iter()
                .filter(|t| t.skip_reason(v).is_none())
                .map(|t| u64::from(t.timeout))
                .sum();
            (i, budget)
        })
        .collect();
    cost.sort_by_key(|&(i, budget)| (std::cmp::Reverse(budget), i));
    cost.into_iter().map(|(i, _)| i).collect()
}

/// What every kernel of a run shares: the options, the suite, the initramfs inputs, the build
/// directory and the accelerator.
struct KernelRun<'a> {
    a: &'a RunArgs,
    suite: &'a GuestSuite,
    busybox: &'a Path,
    init_script: &'a Path,
    binaries: &'a [(String, PathBuf)],
    build: &'a Path,
    accel: Accel,
}

/// One boot profile's guest on one kernel: the profile, its label in messages (`LABEL`, or
/// `LABEL/PROFILE` for a profile other than `default`), its tests and the kernel's log
/// directory.
struct ProfileRun<'a> {
    kernel: &'a kernel::Kernel,
    profile: &'a str,
    tag: String,
    tests: Vec<&'a GuestTest>,
    logs: &'a Path,
}

/// Runs the suite on kernel `k`: one guest per boot profile, each with the profile's
/// applicable tests (the others are skipped with their reason).
fn run_kernel(run: &KernelRun<'_>, k: &kernel::Kernel) -> Result<KernelResult> {
    let t0 = Instant::now();
    let mut res = KernelResult {
        label: k.spec.label.clone(),
        package: format!("{} {}", k.package.name, k.package.version),
        release: k.release.clone(),
        accel: None,
        boot_secs: None,
        secs: 0.0,
        tests: BTreeMap::new(),
        problems: Vec::new(),
        modules: Vec::new(),
    };
    let groups = group_tests(run.suite, k, &mut res);
    let logs = run.build.join("logs").join(&k.spec.label);
    fs::create_dir_all(&logs)?;
    for (profile, tests) in groups {
        let tag = if profile == "default" {
            k.spec.label.clone()
        } else {
            format!("{}/{profile}", k.spec.label)
        };
        let p = ProfileRun {
            kernel: k,
            profile,
            tag,
            tests,
            logs: &logs,
        };
        let cpio = build_initramfs(run, &p, &mut res)?;
        let ran = run_profile(run, &p, &cpio, &mut res);
        // Rebuilt each run: kept, the images of every kernel and profile fill the disk.
        let _ = fs::remove_file(&cpio);
        ran?;
    }
    res.secs = t0.elapsed().as_secs_f64();
    Ok(res)
}

/// The tests that apply to `k`, by boot profile (one guest per profile); the others go into
/// `res` as skipped, with their reason.
fn group_tests<'a>(
    suite: &'a GuestSuite,
    k: &kernel::Kernel,
    res: &mut KernelResult,
) -> BTreeMap<&'a str, Vec<&'a GuestTest>> {
    let mut groups: BTreeMap<&str, Vec<&GuestTest>> = BTreeMap::new();
    for t in &suite.tests {
        match t.skip_reason(k.version) {
            Some(why) => {
                res.tests.insert(t.name.clone(), Verdict::Skip(why));
            }
            None => groups.entry(t.boot.as_str()).or_default().push(t),
        }
    }
    groups
}

/// Builds the initramfs of profile `p` (its tests, the suite's modules and binaries, the
/// profile's peer) and notes in `res` which modules it holds. Returns the cpio's path.
fn build_initramfs(
    run: &KernelRun<'_>,
    p: &ProfileRun<'_>,
    res: &mut KernelResult,
) -> Result<PathBuf> {
    let (k, profile, tag) = (p.kernel, p.profile, &p.tag);
    let tests_txt: String = p
        .tests
        .iter()
        .map(|t| format!("{}\t{}\t{}\n", t.name, t.timeout, t.command))
        .collect();
    let payload = initramfs::Payload {
        busybox: run.busybox.to_path_buf(),
        init_script: run.init_script.to_path_buf(),
        binaries: run.binaries.to_vec(),
        modules: run.suite.modules.clone(),
        tests: tests_txt,
        peer: run.suite.boots[profile].peer.clone(),
    };
    let img_dir = run.build.join("initramfs");
    fs::create_dir_all(&img_dir)?;
    let cpio = img_dir.join(format!("{}-{profile}.cpio", k.spec.label));
    let notes = initramfs::build(
        k,
        &payload,
        &img_dir.join(format!("{}-{profile}.root", k.spec.label)),
        &cpio,
    )?;
    res.modules = notes
        .iter()
        .map(|n| format!("{}:{}", n.name, n.fate))
        .collect();
    let absent: Vec<_> = notes
        .iter()
        .filter(|n| n.fate == "absent")
        .map(|n| n.name.as_str())
        .collect();
    println!(
        "vmtest: kernel {tag}: {} (initramfs {:.1} MiB{})",
        k.release,
        fs::metadata(&cpio)?.len() as f64 / 1048576.0,
        if absent.is_empty() {
            String::new()
        } else {
            format!("; modules not in this kernel: {}", absent.join(", "))
        }
    );
    Ok(cpio)
}

/// Boots profile `p`'s guest from `cpio` with the profile's host helpers running, and
/// records in `res` how the boot ended and each test's verdict.
fn run_profile(
    run: &KernelRun<'_>,
    p: &ProfileRun<'_>,
    cpio: &Path,
    res: &mut KernelResult,
) -> Result<()> {
    let (k, profile, tag) = (p.kernel, p.profile, &p.tag);
    let profile_def = &run.suite.boots[profile];
    let run_dir = run.build.join("run").join(tag.replace('/', "-"));
    let _ = fs::remove_dir_all(&run_dir);
    fs::create_dir_all(&run_dir)?;
    // {peer-qemu} before {run}: a peer's command line names no {run} of its own.
    let peer_qemu = qemu::peer_command_line(&k.vmlinuz, cpio, run.accel);
    let subst = |s: &str| {
        s.replace("{peer-qemu}", &peer_qemu)
            .replace("{run}", &run_dir.to_string_lossy())
    };
    let helpers = match start_helpers(profile_def, &subst, p.logs, profile) {
        Ok(h) => h,
        Err(e) => {
            res.problems.push(format!("guest {tag}: {e:#}"));
            for t in &p.tests {
                res.tests.insert(
                    t.name.clone(),
                    Verdict::Fail("not run: boot profile setup failed".into()),
                );
            }
            return Ok(());
        }
    };
    let spec = boot_spec(
        run,
        p,
        cpio,
        profile_def.qemu_args.iter().map(|s| subst(s)).collect(),
    );
    let (spec, g, ending) = boot(run.a, tag, spec)?;
    drop(helpers);
    res.accel = Some(spec.accel);
    res.boot_secs = res.boot_secs.or(g.init_after);
    fs::write(
        p.logs.join(format!("{profile}-dmesg.log")),
        g.dmesg.join("\n") + "\n",
    )?;
    note_ending(tag, &spec, &g, &ending, res);
    judge_tests(p, &g, run.a.from_test.as_deref(), res);
    Ok(())
}

/// The guest of profile `p`: the run's CPUs and memory, the profile's extra QEMU arguments,
/// and a time limit of the tests' budget plus `--init-timeout` and a minute (or `--vm-timeout`).
fn boot_spec(
    run: &KernelRun<'_>,
    p: &ProfileRun<'_>,
    cpio: &Path,
    extra_args: Vec<String>,
) -> BootSpec {
    let a = run.a;
    let test_budget: u64 = p.tests.iter().map(|t| u64::from(t.timeout)).sum();
    let vm_timeout = a.vm_timeout.unwrap_or(a.init_timeout + test_budget + 60);
    BootSpec {
        label: p.tag.clone(),
        kernel: p.kernel.vmlinuz.clone(),
        initrd: cpio.to_path_buf(),
        accel: run.accel,
        cpus: a.cpus,
        mem_mb: a.mem,
        extra_args,
        timeout: Duration::from_secs(vm_timeout),
        init_timeout: Duration::from_secs(
            if run.accel == Accel::Kvm && a.accel == AccelChoice::Auto {
                30
            } else {
                a.init_timeout
            },
        ),
        log: p.logs.join(format!("{}-console.log", p.profile)),
        from_test: a.from_test.clone(),
        echo: !a.quiet,
        verbose: a.verbose,
    }
}

/// Boots `spec`: once more under TCG when an automatic KVM choice reaches no /init, and once
/// more when the kernel stops before /init. Returns the spec of the last boot, what the guest
/// reported and how it ended.
fn boot(a: &RunArgs, tag: &str, mut spec: BootSpec) -> Result<(BootSpec, GuestRun, Ending)> {
    let mut g = GuestRun::default();
    let mut ending = qemu::boot(&spec, &mut g)?;
    if ending == Ending::NoInit && spec.accel == Accel::Kvm && a.accel == AccelChoice::Auto {
        println!(
            "vmtest: kernel {tag}: no /init under KVM within {} s; retrying under TCG",
            spec.init_timeout.as_secs()
        );
        spec.accel = Accel::Tcg;
        spec.init_timeout = Duration::from_secs(a.init_timeout);
        g = GuestRun::default();
        ending = qemu::boot(&spec, &mut g)?;
    }
    if g.init_after.is_none() && matches!(ending, Ending::Exited { .. }) {
        // The kernel died while booting, before /init ran any test (7.2 under TCG can
        // hit "Oops: int3" in sched_clock_cpu during an initcall, a code-patching race of
        // multi-threaded TCG): boot it once more.
        println!(
            "vmtest: kernel {tag}: the guest stopped before /init (last console line: {:?}); \
             booting it once more",
            g.last_line
        );
        let first = spec.log.with_extension("first-boot.log");
        let _ = fs::rename(&spec.log, &first);
        g = GuestRun::default();
        ending = qemu::boot(&spec, &mut g)?;
    }
    if spec.accel == Accel::Tcg {
        if let Some(from) = g.emulator_fault_at() {
            // The same code-patching race of multi-threaded TCG can hit later, when a static
            // key flips while another vCPU runs the code it patches: the kernel oopses on a
            // stale int3 and the guest panics mid-test. Boot once more and go on from the test
            // that was running; the first console log is kept.
            println!(
                "vmtest: kernel {tag}: \"Oops: int3\" during {from} (a code-patching race of \
                 multi-threaded TCG); booting once more from {from}"
            );
            let first = spec.log.with_extension("int3.log");
            let _ = fs::rename(&spec.log, &first);
            spec.from_test = Some(from);
            let mut again = GuestRun::default();
            ending = qemu::boot(&spec, &mut again)?;
            g = g.resumed_by(again);
        }
    }
    Ok((spec, g, ending))
}

/// Notes in `res` what went wrong with guest `tag` beyond its tests: a boot that timed out or
/// failed, a guest that stopped early, kernel trouble, failed module loads.
fn note_ending(tag: &str, spec: &BootSpec, g: &GuestRun, ending: &Ending, res: &mut KernelResult) {
    let vm_timeout = spec.timeout.as_secs();
    match ending {
        Ending::NoInit => res.problems.push(format!(
            "TIMEOUT: guest {tag} did not reach /init within {} s (last console line: {:?}; log {})",
            spec.init_timeout.as_secs(),
            g.last_line,
            spec.log.display()
        )),
        Ending::TimedOut => res.problems.push(format!(
            "TIMEOUT: guest {tag} did not power off within {vm_timeout} s{} (last console line: {:?})",
            g.current
                .as_ref()
                .map(|(n, _)| format!("; test {n:?} was running"))
                .unwrap_or_default(),
            g.last_line
        )),
        Ending::Exited { success: false, status } => {
            res.problems.push(format!("qemu exited with {status} (see {})", spec.log.display()))
        }
        Ending::Exited { .. } => {}
    }
    if g.init_after.is_some() && !g.done && matches!(ending, Ending::Exited { .. }) {
        res.problems.push(format!(
            "guest {tag} stopped before finishing its tests (last console line: {:?})",
            g.last_line
        ));
    }
    for p in &g.kernel_problems {
        res.problems.push(format!("kernel trouble in {tag}: {p}"));
    }
    for (m, ok, detail) in &g.modules {
        if !ok {
            res.problems
                .push(format!("modprobe {m} failed in {tag}: {detail}"));
        }
    }
}

/// Each of `p`'s tests' verdict from what the guest reported, into `res`; with `--from-test
/// NAME`, the ones before NAME (all, in a profile without it) are skipped.
fn judge_tests(p: &ProfileRun<'_>, g: &GuestRun, from: Option<&str>, res: &mut KernelResult) {
    let tag = &p.tag;
    let first = from.map_or(0, |f| {
        p.tests
            .iter()
            .position(|t| t.name == f)
            .unwrap_or(p.tests.len())
    });
    for (i, t) in p.tests.iter().enumerate() {
        if i < first {
            let why = format!("before --from-test {}", from.unwrap_or_default());
            res.tests.insert(t.name.clone(), Verdict::Skip(why));
            continue;
        }
        let v = match g.results.get(&t.name) {
            // Exit code 0 is not enough: the output must show what the line checked.
            Some(r) if r.pass => match checks::judge(&t.checks, &r.output) {
                Ok(shown) => {
                    println!("vmtest: {tag} {}: PASS ({shown}; {:.0} s)", t.name, r.secs);
                    Verdict::Pass
                }
                Err(why) => Verdict::Fail(format!("exit code 0, but {why}")),
            },
            Some(r) => Verdict::Fail(r.detail.clone()),
            None => Verdict::Fail("no result (guest stopped or timed out first)".into()),
        };
        res.tests.insert(t.name.clone(), v);
    }
}

/// Starts the host helpers of a boot profile, each under `sh -c` in its own process group,
/// and waits for their `ready` paths.
fn start_helpers(
    profile_def: &config::BootProfile,
    subst: &dyn Fn(&str) -> String,
    logs: &Path,
    profile: &str,
) -> Result<HelperGuard> {
    use std::os::unix::process::CommandExt;
    let mut helpers = HelperGuard(Vec::new());
    for (i, h) in profile_def.helpers.iter().enumerate() {
        let script = subst(&h.command);
        // One log pair per helper: PROFILE-helper.log, PROFILE-helper2.log, ...
        let n = if i == 0 {
            String::new()
        } else {
            (i + 1).to_string()
        };
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(&script)
            .stdin(Stdio::null())
            .stdout(fs::File::create(
                logs.join(format!("{profile}-helper{n}.log")),
            )?)
            .stderr(fs::File::create(
                logs.join(format!("{profile}-helper{n}.err")),
            )?)
            .process_group(0);
        nsfast_sys::child::die_with_parent(&mut cmd, nix::sys::signal::Signal::SIGKILL);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting helper {script:?} for boot profile {profile}"))?;
        helpers.0.push(child);
        if let Some(ready) = &h.ready {
            let p = PathBuf::from(subst(ready));
            let until = Instant::now() + Duration::from_secs(15);
            while !p.exists() {
                if let Some(status) = helpers
                    .0
                    .last_mut()
                    .and_then(|c| c.try_wait().ok().flatten())
                {
                    bail!(
                        "helper {script:?} exited ({status}) before creating {}",
                        p.display()
                    );
                }
                if Instant::now() > until {
                    bail!(
                        "helper {script:?} did not create {} within 15 s",
                        p.display()
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    Ok(helpers)
}

/// Kills each helper's process group (its own PID, which it leads) when dropped.
struct HelperGuard(Vec<std::process::Child>);

impl Drop for HelperGuard {
    fn drop(&mut self) {
        use nix::sys::signal::{killpg, Signal};
        use nix::unistd::Pid;
        for c in &mut self.0 {
            let _ = killpg(Pid::from_raw(c.id() as i32), Signal::SIGKILL);
            let _ = c.wait();
        }
    }
}

fn print_summary(
    suite: &GuestSuite,
    results: &[KernelResult],
    fetch: f64,
    build: f64,
    total: f64,
) -> bool {
    println!();
    println!("vmtest summary (fetch {fetch:.0} s, build {build:.0} s, total {total:.0} s)");
    println!(
        "{:<8} {:<48} {:<5} {:>6} {:>6} {:>4} {:>4} {:>4}  result",
        "kernel", "package", "accel", "boot", "time", "pass", "fail", "skip"
    );
    let (mut np, mut nf, mut ns) = (0usize, 0usize, 0usize);
    for r in results {
        let c = |f: fn(&Verdict) -> bool| r.tests.values().filter(|v| f(v)).count();
        let p = c(|v| matches!(v, Verdict::Pass));
        let f = c(|v| matches!(v, Verdict::Fail(_)));
        let s = c(|v| matches!(v, Verdict::Skip(_)));
        np += p;
        nf += f + r.problems.len();
        ns += s;
        println!(
            "{:<8} {:<48} {:<5} {:>6} {:>5.0}s {:>4} {:>4} {:>4}  {}",
            r.label,
            r.package.split(' ').next().unwrap_or(""),
            r.accel.map(|a| a.to_string()).unwrap_or_else(|| "-".into()),
            r.boot_secs
                .map(|b| format!("{b:.1}s"))
                .unwrap_or_else(|| "-".into()),
            r.secs,
            p,
            f,
            s,
            if r.passed() { "PASS" } else { "FAIL" }
        );
    }
    println!();
    print!("{:<24}", "test");
    for r in results {
        print!(" {:<8}", r.label);
    }
    println!();
    for t in &suite.tests {
        print!("{:<24}", t.name);
        for r in results {
            let cell = match r.tests.get(&t.name) {
                Some(Verdict::Pass) => "PASS",
                Some(Verdict::Fail(_)) => "FAIL",
                Some(Verdict::Skip(_)) => "skip",
                None => "-",
            };
            print!(" {cell:<8}");
        }
        println!();
    }
    let mut any_detail = false;
    for r in results {
        for (name, v) in &r.tests {
            match v {
                Verdict::Fail(d) => {
                    any_detail = true;
                    println!("FAIL {} {name}: {d}", r.label);
                }
                Verdict::Skip(d) => println!("skip {} {name}: {d}", r.label),
                Verdict::Pass => {}
            }
        }
        for p in &r.problems {
            any_detail = true;
            println!("FAIL {}: {p}", r.label);
        }
    }
    let ok = nf == 0;
    if any_detail {
        println!("vmtest: guest logs: build/vm/logs/<kernel>/");
    }
    println!("vmtest: {np} passed, {nf} failed, {ns} skipped");
    ok
}

#[cfg(test)]
mod tests {
    use super::{cost_order, package_name, select_test_targets};
    use crate::config::{parse_guest_suite, MajorMinor};

    #[test]
    fn only_the_test_targets_a_line_runs_are_built() {
        let suite = parse_guest_suite(
            "@bin nsfast\n@cargo-tests pa\n@cargo-tests pb\n@cargo-tests pc\n\
             a -- X=1 Y=/z ta --ignored\nb -- nsfast bench\nc -- la --test-threads=1\n",
            std::path::Path::new("t.txt"),
        )
        .unwrap();
        let meta = serde_json::json!({"packages": [
            {"name": "pa", "targets": [
                {"name": "pa_bin", "kind": ["bin"]},
                {"name": "nsfast", "kind": ["bin"]},
                {"name": "ta", "kind": ["test"]},
                {"name": "tb", "kind": ["test"]}]},
            {"name": "pb", "targets": [
                {"name": "la", "kind": ["lib"]},
                {"name": "tc", "kind": ["test"]}]},
            {"name": "pc", "targets": [{"name": "td", "kind": ["test"]}]}
        ]});
        let w = select_test_targets(&meta, &suite);
        assert_eq!(w.packages, ["pa", "pb"]);
        assert!(w.lib);
        assert_eq!(w.tests, ["ta"]);
        assert_eq!(
            w.names.iter().map(String::as_str).collect::<Vec<_>>(),
            ["la", "ta"]
        );
    }

    #[test]
    fn kernels_with_the_most_test_time_go_first() {
        let suite = parse_guest_suite(
            "a timeout=100 -- x\nb min=7.0 timeout=300 -- y\nc max=6.11 timeout=50 -- z\n",
            std::path::Path::new("t.txt"),
        )
        .unwrap();
        let v = [MajorMinor(6, 1), MajorMinor(6, 12), MajorMinor(7, 2)];
        // 6.1: 150, 6.12: 100, 7.2: 400.
        assert_eq!(cost_order(&suite, v.into_iter()), vec![2, 0, 1]);
        // Ties keep the matrix's order.
        let v = [MajorMinor(6, 12), MajorMinor(6, 13)];
        assert_eq!(cost_order(&suite, v.into_iter()), vec![0, 1]);
    }

    #[test]
    fn package_names_from_cargo_package_ids() {
        assert_eq!(
            package_name("path+file:///w/crates/sockmap#nsfast-sockmap@0.1.0"),
            "nsfast-sockmap"
        );
        assert_eq!(
            package_name("path+file:///w/crates/nsfast-sys#0.1.0"),
            "nsfast-sys"
        );
        assert_eq!(
            package_name("registry+https://github.com/rust-lang/crates.io-index#libc@0.2.1"),
            "libc"
        );
        assert_eq!(
            package_name("nsfast-pod 0.1.0 (path+file:///w/crates/pod)"),
            "nsfast-pod"
        );
    }
}
