//! The exit-code contract of the shipped binaries (docs/json.md, "Exit codes"): 0 ok, 1
//! failure, 2 bad usage, for `nsfast`, `vpnrelay` and `nsfast-cni`; a bad value exits 2 with
//! one error naming the value and what is valid; a permission error of a process that is
//! not root says "needs root (CAP_BPF, CAP_NET_ADMIN)" and exits 1.
//!
//! The commands run as nobody (`setpriv`), so none of them can change anything: every bad
//! value is refused before any work, and the unprivileged runs are refused by the kernel.
//! Needs root for `setpriv` (and `vpnrelay`, which refuses root, always runs as nobody).
//! `$NSFAST_SHIPPED_BIN_DIR` points the test at other builds of the binaries.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

const NOBODY: &str = "65534";

fn bin(name: &str) -> PathBuf {
    if let Some(d) = std::env::var_os("NSFAST_SHIPPED_BIN_DIR") {
        return PathBuf::from(d).join(name);
    }
    match name {
        "nsfast" => PathBuf::from(env!("CARGO_BIN_EXE_nsfast")),
        "vpnrelay" => PathBuf::from(env!("CARGO_BIN_EXE_vpnrelay")),
        _ => nsfast_lab::bins::fresh(name),
    }
}

/// Runs `name args` as nobody, with no variables of ours in its environment.
fn as_nobody(name: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    nsfast_lab::require_root();
    let rt = std::env::temp_dir();
    let mut c = Command::new("setpriv");
    c.args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups", "--"])
        .arg(bin(name))
        .args(args)
        .env_remove("RUST_LOG")
        .env("XDG_RUNTIME_DIR", &rt)
        .envs(env.iter().copied())
        .stdin(Stdio::null());
    c.output().expect("spawn setpriv")
}

/// Asserts exit `code` and that stderr holds every one of `needles`; returns stderr.
fn expect(what: &str, o: &Output, code: i32, needles: &[&str]) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(
        o.status.code(),
        Some(code),
        "{what}: exit {:?}, want {code}; stderr:\n{err}",
        o.status.code()
    );
    for n in needles {
        assert!(err.contains(n), "{what}: stderr lacks {n:?}:\n{err}");
    }
    err
}

/// Where cgroup2 is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on hybrid hosts).
fn cgroup2_mount() -> String {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(2) == Some(&"cgroup2"))
        .map(|f| f[1].to_string())
        .expect("a cgroup2 mount")
}

#[test]
fn bad_values_exit_2_naming_the_value_and_what_is_valid() {
    let cases: &[(&str, &[&str], &[&str])] = &[
        (
            "nsfast",
            &["pod", "add", "p1", "--ip", "10.244.1.300/24"],
            &["10.244.1.300/24", "e.g. 10.244.1.5/24"],
        ),
        (
            "nsfast",
            &[
                "pod",
                "add",
                "p1",
                "--ip",
                "10.244.1.5/24",
                "--mode",
                "bogus",
            ],
            &["bogus", "netkit-l2", "veth", "auto"],
        ),
        (
            "nsfast",
            &["pod", "add", "Bad_Name", "--ip", "10.244.1.5/24"],
            &["Bad_Name", "1-40 characters from [a-z0-9-]"],
        ),
        (
            "nsfast",
            &["pod", "del", "Bad_Name"],
            &["Bad_Name", "1-40 characters from [a-z0-9-]"],
        ),
        (
            "nsfast",
            &[
                "pod",
                "add",
                "p1",
                "--ip",
                "10.244.1.5/24",
                "--ip",
                "10.244.1.6/24",
            ],
            &["a second IPv4 address", "10.244.1.6/24"],
        ),
        (
            "nsfast",
            &[
                "pod",
                "add",
                "p1",
                "--ip",
                "10.244.1.5/24",
                "--label",
                "app=we b",
            ],
            &["app=we b", "not a label value"],
        ),
        (
            "nsfast",
            &[
                "pod",
                "add",
                "p1",
                "--ip",
                "10.244.1.5/24",
                "--named-port",
                "http=0",
            ],
            &["http=0", "1-65535"],
        ),
        (
            "nsfast",
            &["policy", "namespace", "Shop", "--label", "a=b"],
            &["Shop", "DNS label"],
        ),
        (
            "nsfast",
            &["policy", "delete", "Bad_Name"],
            &["Bad_Name", "DNS subdomain"],
        ),
        (
            "nsfast",
            &["policy", "apply", "-f", "/nonexistent/policy.yaml"],
            &["/nonexistent/policy.yaml"],
        ),
        (
            "nsfast",
            &["sockmap", "run", "--slice", "myapp"],
            &["myapp", "ends in .slice"],
        ),
        (
            "nsfast",
            &[
                "vsock",
                "relay",
                "tcp-listen:1",
                "tcp:127.0.0.1:2",
                "--path",
                "fast",
            ],
            &["fast", "auto", "kernel", "splice"],
        ),
        (
            "vpnrelay",
            &["supervise", "br0", "70000"],
            &["70000", "1-65535"],
        ),
        (
            "vpnrelay",
            &["transparent", "br0", "0"],
            &["\"0\"", "1-65535"],
        ),
        (
            "vpnrelay",
            &["cleanup", "bad/bridge", "51820"],
            &["bad/bridge", "1-15 characters"],
        ),
    ];
    let mut failures = Vec::new();
    for (name, args, needles) in cases {
        let what = format!("{name} {}", args.join(" "));
        let o = as_nobody(name, args, &[]);
        if let Err(e) = std::panic::catch_unwind(|| expect(&what, &o, 2, needles)) {
            failures.push(
                e.downcast_ref::<String>()
                    .cloned()
                    .unwrap_or_else(|| what.clone()),
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn a_bad_variable_of_vpnrelay_exits_2() {
    let o = as_nobody(
        "vpnrelay",
        &["transparent", "br0", "51820"],
        &[("VPNRELAY_RULE", "abc")],
    );
    expect(
        "VPNRELAY_RULE=abc vpnrelay transparent",
        &o,
        2,
        &["abc", "--rule"],
    );
}

#[test]
fn permission_errors_as_nobody_say_root_is_needed_and_exit_1() {
    // Each of these would change the initial namespace as root: as nobody the kernel refuses.
    let cgroup2 = cgroup2_mount();
    let cases: &[&[&str]] = &[
        &["pod", "add", "nsfexit", "--ip", "10.244.200.5/24"],
        &["sockmap", "run", "--cgroup", &cgroup2],
        &["sockmap", "status"],
        &["pod", "shortcut", "enable"],
    ];
    let mut failures = Vec::new();
    for args in cases {
        let what = format!("nsfast {}", args.join(" "));
        let o = as_nobody("nsfast", args, &[]);
        let r = std::panic::catch_unwind(|| {
            let err = expect(
                &what,
                &o,
                1,
                &["nsfast: error: needs root (CAP_BPF, CAP_NET_ADMIN)"],
            );
            assert_eq!(
                err.trim_end().lines().count(),
                1,
                "{what}: one line:\n{err}"
            );
        });
        if let Err(e) = r {
            failures.push(
                e.downcast_ref::<String>()
                    .cloned()
                    .unwrap_or_else(|| what.clone()),
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn ok_runs_exit_0() {
    for (name, args) in [
        ("nsfast", &["--help"][..]),
        ("nsfast", &["probe"]),
        ("vpnrelay", &["--help"]),
    ] {
        let o = as_nobody(name, args, &[]);
        expect(&format!("{name} {}", args.join(" ")), &o, 0, &[]);
    }
}

/// The CNI plugin answers with the spec's error object on stdout either way; its exit status
/// follows the same contract: 2 when the runtime's input is bad, 1 for a failure.
#[test]
fn cni_bad_input_exits_2_with_the_error_object() {
    let env = |cmd: &str| {
        vec![
            ("CNI_COMMAND", cmd.to_string()),
            ("CNI_CONTAINERID", "exitcodes".to_string()),
            ("CNI_NETNS", "/proc/self/ns/net".to_string()),
            ("CNI_IFNAME", "eth0".to_string()),
            ("CNI_PATH", "/nonexistent".to_string()),
        ]
    };
    for (cmd, stdin, code) in [
        ("ADD", "not json", 6),
        (
            "BOGUS",
            r#"{"cniVersion":"1.1.0","name":"n","type":"nsfast-cni"}"#,
            4,
        ),
    ] {
        let mut c = Command::new(bin("nsfast-cni"));
        c.envs(env(cmd))
            .env_remove("RUST_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("spawn nsfast-cni");
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let o = child.wait_with_output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        let v: serde_json::Value = serde_json::from_str(out.trim())
            .unwrap_or_else(|e| panic!("CNI_COMMAND={cmd}: not an error object ({e}): {out}"));
        assert_eq!(v["code"], code, "CNI_COMMAND={cmd}: {out}");
        assert_eq!(
            o.status.code(),
            Some(2),
            "CNI_COMMAND={cmd}: exit {:?}: {out}",
            o.status.code()
        );
    }
}

/// `--mode` and the other fixed sets are typed values: help and completions list them.
#[test]
fn value_sets_are_listed_in_help() {
    for (args, values) in [
        (
            &["pod", "add", "-h"][..],
            "[possible values: auto, netkit, netkit-l2, veth]",
        ),
        (
            &["vsock", "relay", "-h"],
            "[possible values: auto, kernel, splice]",
        ),
        (
            &["vsock", "ns", "create", "-h"],
            "[possible values: global, local]",
        ),
    ] {
        let o = Command::new(bin("nsfast")).args(args).output().unwrap();
        // Words only: the help wraps lines at the terminal's width.
        let text = String::from_utf8_lossy(&o.stdout);
        let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            words.contains(values),
            "nsfast {args:?}: no {values}:\n{text}"
        );
    }
}
