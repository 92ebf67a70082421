//! The machine-output contract (docs/json.md): every listing and status command prints JSON
//! with the global `-j` (before or after the subcommand), indented with `-p`, each document
//! carrying `schema_version`; the per-command `--json` flags work too; a closed stdout
//! (`| head -c1`) ends with exit 0 and nothing on stderr.
//!
//! Needs root for `sockmap status` and `pod` (a throwaway host namespace `nsfj<pid>h` and pod
//! `nsfj<pid>p`, removed even when an assertion fails). `vpnrelay status` runs as nobody
//! (vpnrelay refuses root) over a stats file in a throwaway runtime folder.

use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const NOBODY: u32 = 65534;

fn nsfast_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_nsfast"))
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("spawn")
}

fn nsfast(args: &[&str]) -> Output {
    run(Command::new(nsfast_bin()).args(args))
}

/// Runs `cmd` and parses its stdout as one JSON document carrying `schema_version` 1.
fn json_of(what: &str, o: Output) -> serde_json::Value {
    assert!(
        o.status.success(),
        "{what}: exit {:?}, stderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    let text = String::from_utf8(o.stdout).expect("utf-8");
    let v: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{what}: not one JSON document ({e}): {text}"));
    assert_eq!(v["schema_version"], 1, "{what}: no schema_version: {text}");
    v
}

/// Every spelling of JSON output for `args` (a subcommand path, then its options): `-j` before,
/// `-j` after, `--json` after (the per-command flag), and `-p` (indented, several lines).
/// Returns the `-j` document.
fn every_spelling(sub: &[&str], opts: &[&str]) -> serde_json::Value {
    let with = |pre: &[&str], post: &[&str]| -> Vec<String> {
        pre.iter()
            .chain(sub)
            .chain(opts)
            .chain(post)
            .map(|s| s.to_string())
            .collect()
    };
    let mut first = None;
    for (pre, post) in [
        (&["-j"][..], &[][..]),
        (&[], &["-j"]),
        (&[], &["--json"]),
        (&["--json"], &[]),
        (&["-p"], &[]),
        (&[], &["-p"]),
        (&["-j"], &["--pretty"]),
    ] {
        let args = with(pre, post);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = nsfast(&refs);
        let pretty = refs.iter().any(|a| *a == "-p" || *a == "--pretty");
        let lines = String::from_utf8_lossy(&o.stdout)
            .trim_end()
            .lines()
            .count();
        let v = json_of(&format!("nsfast {}", refs.join(" ")), o);
        if pretty {
            assert!(lines > 1, "nsfast {refs:?}: -p is not indented");
        } else {
            assert_eq!(lines, 1, "nsfast {refs:?}: -j is not one line");
        }
        first.get_or_insert(v);
    }
    first.unwrap()
}

/// Runs `cmd` with its stdout the write end of a pipe whose read end is already closed.
fn closed_stdout(cmd: &mut Command) -> (Option<i32>, String) {
    let (r, w): (OwnedFd, OwnedFd) = nix::unistd::pipe().expect("pipe");
    drop(r);
    let o = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::from(w))
        .stderr(Stdio::piped())
        .output()
        .expect("spawn");
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn assert_quiet_on_closed_stdout(what: &str, cmd: &mut Command) {
    let (code, stderr) = closed_stdout(cmd);
    assert_eq!(code, Some(0), "{what} on a closed stdout: stderr {stderr}");
    assert!(
        stderr.is_empty(),
        "{what} on a closed stdout: stderr {stderr}"
    );
}

#[test]
fn probe_json_every_spelling() {
    let v = every_spelling(&["probe"], &[]);
    assert!(
        v["features"].as_array().is_some_and(|f| !f.is_empty()),
        "{v}"
    );
    let v = json_of(
        "probe --require",
        nsfast(&["-j", "probe", "--require", "tcx"]),
    );
    assert_eq!(v["required"], serde_json::json!(["tcx"]));
}

#[test]
fn bench_list_json_every_spelling() {
    let v = every_spelling(&["bench"], &["--list"]);
    let tops = v["topologies"].as_array().expect("topologies");
    let host = tops.iter().find(|t| t["name"] == "host").expect("host");
    assert_eq!(host["available"], true, "{v}");
    // `bench --json FILE` still names a file: parsed, not taken for the global flag.
    let o = nsfast(&[
        "bench",
        "--json",
        "/nonexistent-dir/x.json",
        "--rounds",
        "0",
    ]);
    // (Exit 1 or, with clap-typed bench values, 2: either way about --rounds, not --json.)
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{o:?}");
    assert!(
        err.contains("rounds") && !err.contains("unexpected"),
        "{err}"
    );
}

/// A one-round bench run: `-j` prints its document on stdout instead of the table, and
/// `--json FILE` writes the same kind of document, both with `schema_version`.
#[test]
fn bench_run_document_carries_the_schema_version() {
    let run_args = [
        "--topologies",
        "host",
        "--workloads",
        "rr",
        "--rounds",
        "1",
        "--duration",
        "0.1",
        "--warmup",
        "0",
        "--no-progress",
    ];
    let mut args = vec!["-j", "bench"];
    args.extend(run_args);
    let v = json_of("nsfast -j bench (run)", nsfast(&args));
    assert_eq!(v["tool"], "nsfast bench", "{v}");
    assert!(v["summary"].is_array(), "{v}");
    let dir = std::env::temp_dir().join(format!("nsfj-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("b.json");
    let file_s = file.to_str().unwrap().to_string();
    let mut args = vec!["bench", "--json", &file_s];
    args.extend(run_args);
    let o = nsfast(&args);
    let text = std::fs::read_to_string(&file);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(o.status.success(), "{o:?}");
    let doc: serde_json::Value = serde_json::from_str(&text.unwrap()).unwrap();
    assert_eq!(doc["schema_version"], 1);
}

#[test]
fn sockmap_status_json_every_spelling() {
    let v = every_spelling(&["sockmap", "status"], &[]);
    assert!(v["instances"].is_array(), "{v}");
}

/// The throwaway host namespace and pod; removed on drop.
struct PodWorld {
    host: String,
    pod: String,
}

impl PodWorld {
    fn new() -> Self {
        let id = std::process::id();
        let w = PodWorld {
            host: format!("nsfj{id}h"),
            pod: format!("nsfj{id}p"),
        };
        let o = run(Command::new("ip").args(["netns", "add", &w.host]));
        assert!(o.status.success(), "ip netns add: {o:?}");
        w
    }
}

impl Drop for PodWorld {
    fn drop(&mut self) {
        let _ = nsfast(&["pod", "del", "--all", "--host", &self.host]);
        let _ = run(Command::new("ip").args(["netns", "del", &self.pod]));
        let _ = run(Command::new("ip").args(["netns", "del", &self.host]));
    }
}

#[test]
fn pod_list_add_and_del_json() {
    let w = PodWorld::new();
    let v = every_spelling(&["pod", "list"], &["--host", &w.host]);
    assert_eq!(v["pods"], serde_json::json!([]), "{v}");
    let added = json_of(
        "pod add -j",
        nsfast(&[
            "pod",
            "add",
            &w.pod,
            "--ip",
            "10.251.7.2/24",
            "--host",
            &w.host,
            "--mode",
            "veth",
            "-j",
        ]),
    );
    assert_eq!(added["record"]["name"], w.pod.as_str(), "{added}");
    let listed = json_of(
        "pod list",
        nsfast(&["-j", "pod", "list", "--host", &w.host]),
    );
    assert_eq!(listed["pods"][0]["name"], w.pod.as_str(), "{listed}");
    // Closing stdout early while a listing prints.
    assert_quiet_on_closed_stdout(
        "pod list -j",
        Command::new(nsfast_bin()).args(["pod", "list", "--host", &w.host, "-j"]),
    );
    // del -j: a record of what was removed.
    let gone = json_of(
        "pod del -j",
        nsfast(&["pod", "del", &w.pod, "--host", &w.host, "-j"]),
    );
    let d = gone["deleted"].as_array().expect("deleted");
    assert_eq!(d.len(), 1, "{gone}");
    assert_eq!(d[0]["name"], w.pod.as_str(), "{gone}");
    assert_eq!(d[0]["ip"], "10.251.7.2", "{gone}");
    assert_eq!(d[0]["ips"], serde_json::json!(["10.251.7.2/24"]), "{gone}");
    assert_eq!(
        added["record"]["ips"],
        serde_json::json!(["10.251.7.2/24"]),
        "{added}"
    );
    assert_eq!(
        listed["pods"][0]["ips"],
        serde_json::json!(["10.251.7.2/24"]),
        "{listed}"
    );
    let all = json_of(
        "pod del --all -p",
        nsfast(&["-p", "pod", "del", "--all", "--host", &w.host]),
    );
    assert_eq!(all["deleted"], serde_json::json!([]), "{all}");
}

#[test]
fn json_commands_end_quietly_on_a_closed_stdout() {
    for args in [
        &["-j", "probe"][..],
        &["probe", "-p"],
        &["-j", "bench", "--list"],
        &["bench", "--list", "-p"],
        &["sockmap", "status", "-j"],
        &["-p", "sockmap", "status"],
    ] {
        // Positive control: with an open stdout it prints something.
        assert!(!nsfast(args).stdout.is_empty(), "{args:?} printed nothing");
        assert_quiet_on_closed_stdout(
            &format!("nsfast {args:?}"),
            Command::new(nsfast_bin()).args(args),
        );
    }
}

/// A runtime folder owned by nobody with one relay's stats file in `vpnrelay/`.
struct RuntimeDir(PathBuf);

impl RuntimeDir {
    fn new(stats: &serde_json::Value) -> Self {
        let d = std::env::temp_dir().join(format!("nsfj-rt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let v = d.join("vpnrelay");
        std::fs::create_dir_all(&v).unwrap();
        let f = v.join("relay-br-json.stats");
        std::fs::write(&f, format!("{stats}\n")).unwrap();
        for (p, mode) in [(&d, 0o700), (&v, 0o700), (&f, 0o600)] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
            std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
        }
        RuntimeDir(d)
    }
}

impl Drop for RuntimeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn vpnrelay_as_nobody(rt: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid",
        &NOBODY.to_string(),
        "--regid",
        &NOBODY.to_string(),
        "--clear-groups",
        "--",
        env!("CARGO_BIN_EXE_vpnrelay"),
    ])
    .args(args)
    .env("XDG_RUNTIME_DIR", rt)
    .env_remove("RUST_LOG");
    c
}

#[test]
fn vpnrelay_status_json_and_table() {
    let stats = serde_json::json!({
        "schema_version": 1, "bridge": "br-json", "flows_open": 1, "flows_opened": 3,
        "refused_handed_back": 2, "refused_dropped": 0, "max_flows_per_client": 8,
        "up_bytes": 4096, "down_bytes": 8192, "flows": [], "handed_back": [],
    });
    let rt = RuntimeDir::new(&stats);
    for args in [
        &["status", "-j"][..],
        &["status", "--json"],
        &["status", "-p", "--bridge", "br-json"],
    ] {
        let mut o = run(&mut vpnrelay_as_nobody(&rt.0, args));
        if args.contains(&"--bridge") {
            // Asked about one bridge whose relay does not run: its status, then exit 1.
            assert_eq!(o.status.code(), Some(1), "{o:?}");
            o.status = std::process::ExitStatus::default();
        }
        let v = json_of(&format!("vpnrelay {args:?}"), o);
        let r = &v["relays"][0];
        assert_eq!(r["bridge"], "br-json", "{v}");
        assert_eq!(r["running"], false, "{v}");
        assert_eq!(r["stats"], stats, "{v}");
    }
    let o = run(&mut vpnrelay_as_nobody(&rt.0, &["status"]));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    assert!(
        table.contains("BRIDGE") && table.contains("br-json"),
        "{table}"
    );
    assert!(table.contains("stopped"), "{table}");
    assert_quiet_on_closed_stdout(
        "vpnrelay status -j",
        &mut vpnrelay_as_nobody(&rt.0, &["status", "-j"]),
    );
}
