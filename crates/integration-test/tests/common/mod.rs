//! Helpers the nsfast CLI integration tests share (`mod common;` in each test file): running
//! the nsfast binary under test and waiting on a condition. Each test binary uses a subset.
#![allow(dead_code)]

use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The binary under test (`$NSFAST_BIN`, else the workspace's build).
pub use nsfast_lab::bins::nsfast as nsfast_bin;

/// Runs nsfast with `args` and extra environment `env` (`RUST_LOG=warn`; never a crash
/// point inherited from the test's environment).
pub fn nsfast_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(nsfast_bin());
    c.args(args)
        .env("RUST_LOG", "warn")
        .env_remove(nsfast_pod::pod::CRASH_ENV)
        .env_remove("NSFAST_ALLOW_SPLICE_HOLE");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run nsfast")
}

/// Runs nsfast with `args` and `stdin` as its standard input (as [`nsfast_env`] does).
pub fn nsfast_stdin(args: &[&str], stdin: &str) -> Output {
    nsfast_stdin_env(args, stdin, &[])
}

/// [`nsfast_stdin`] with more environment variables.
pub fn nsfast_stdin_env(args: &[&str], stdin: &str, env: &[(&str, &str)]) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut cmd = Command::new(nsfast_bin());
    cmd.args(args)
        .env("RUST_LOG", "warn")
        .env_remove(nsfast_pod::pod::CRASH_ENV)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut c = cmd.spawn().expect("run nsfast");
    c.stdin
        .take()
        .expect("nsfast's stdin")
        .write_all(stdin.as_bytes())
        .expect("write nsfast's stdin");
    c.wait_with_output().expect("wait for nsfast")
}

/// Runs nsfast with `args`.
pub fn nsfast(args: &[&str]) -> Output {
    nsfast_env(args, &[])
}

/// Runs nsfast with `args`, asserts success and returns its stdout.
pub fn nsfast_ok(args: &[&str]) -> String {
    let o = nsfast(args);
    assert!(o.status.success(), "nsfast {args:?}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Status, stdout and stderr of a run, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "status {:?}; stdout: {}; stderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `NSFAST_TEST_POD_MODE` (veth, netkit, netkit-l2), veth by default.
pub fn pod_mode_str() -> String {
    std::env::var("NSFAST_TEST_POD_MODE").unwrap_or_else(|_| "veth".into())
}

/// Polls `cond` every 5 ms until it holds; panics naming `what` after `timeout`.
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs `nft ARGS` in namespace `ns`, asserting success; its stdout.
pub fn nft_in(ns: &nsfast_sys::netns::NetNs, args: &[&str]) -> String {
    let out = ns
        .run(|| Command::new("nft").args(args).output())
        .unwrap()
        .unwrap_or_else(|e| panic!("run nft (nftables installed?): {e}"));
    assert!(
        out.status.success(),
        "nft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Host `host`'s pod datapath counters (`nsfast pod list -j --host HOST`, its `counters`).
pub fn pod_counters(host: &str) -> serde_json::Value {
    let out = nsfast(&["pod", "list", "-j", "--host", host]);
    assert!(out.status.success(), "pod list: {}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("list json");
    v["counters"].clone()
}

/// Counter `k` of `v` (as [`pod_counters`] returns them); a missing one fails the test.
pub fn counter(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("counter {k} missing in {v}"))
}
