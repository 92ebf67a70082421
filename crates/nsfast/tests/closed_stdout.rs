//! A closed stdout (`nsfast ... | head -c1`, the reader gone) ends quietly with exit 0: never a
//! panic (`println!` panics with exit 101 on EPIPE). Each command runs with its stdout the write
//! end of a pipe whose read end is already closed, so its first write fails with EPIPE.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn bin(name: &str) -> PathBuf {
    match name {
        "nsfast" => PathBuf::from(env!("CARGO_BIN_EXE_nsfast")),
        "vpnrelay" => PathBuf::from(env!("CARGO_BIN_EXE_vpnrelay")),
        _ => unreachable!("{name}"),
    }
}

/// Runs `name args` with a closed stdout; returns (exit code, stderr).
fn run_closed(name: &str, args: &[&str]) -> (Option<i32>, String) {
    let (r, w): (OwnedFd, OwnedFd) = nix::unistd::pipe().expect("pipe");
    drop(r);
    let out = Command::new(bin(name))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(w))
        .stderr(Stdio::piped())
        .output()
        .expect("spawn");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Positive control: the same command with an open stdout prints something (so the closed
/// case really had something to write).
fn prints_something(name: &str, args: &[&str]) -> bool {
    let out = Command::new(bin(name))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("spawn");
    !out.stdout.is_empty()
}

#[test]
fn listing_and_status_commands_end_quietly_on_a_closed_stdout() {
    let cases: &[(&str, &[&str])] = &[
        ("nsfast", &["sockmap", "status", "--json"]),
        ("nsfast", &["sockmap", "status"]),
        ("nsfast", &["bench", "--list"]),
        ("nsfast", &["probe", "--json"]),
        ("nsfast", &["probe"]),
        ("nsfast", &["metrics"]),
        ("nsfast", &["--help"]),
        ("vpnrelay", &["--help"]),
    ];
    for (name, args) in cases {
        assert!(
            prints_something(name, args),
            "{name} {args:?} printed nothing with an open stdout"
        );
        let (code, stderr) = run_closed(name, args);
        assert!(
            !stderr.contains("panicked"),
            "{name} {args:?} panicked on a closed stdout: {stderr}"
        );
        assert_eq!(
            code,
            Some(0),
            "{name} {args:?} on a closed stdout: exit {code:?}, stderr: {stderr}"
        );
    }
}
