//! The README's output samples, run for real. Each output block that follows a
//! `<!-- checked: NAME ... -->` comment in README.md is the snapshot of what the test `NAME`
//! runs in a throwaway world, matched by snapbox: `[..]` stands for the part of a line that
//! differs per run (ids, pids, ports, the kernel release), `...` for lines left out. The
//! world's throwaway names (cgroup, host namespace, pod, socket path) are written back as the
//! README's (`myapp`, `demo-host`, `demo`, `/tmp/app.sock`) before the match. Run as root
//! (`make test`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nsfast_lab::bins::nsfast as nsfast_bin;
use nsfast_lab::peer::KillOnDrop;
use nsfast_lab::require_root;
use nsfast_lab::world::TestCgroup;
use nsfast_sys::netns::NetNs;

/// The block after `<!-- checked: NAME` in README.md.
fn readme_block(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let text = std::fs::read_to_string(&path).expect("read README.md");
    let marker = format!("<!-- checked: {name} ");
    let at = text
        .find(&marker)
        .unwrap_or_else(|| panic!("README.md has no {marker:?}"));
    let rest = &text[at..];
    let start = rest
        .find("\n```\n")
        .expect("an output block after the marker")
        + 5;
    let end = rest[start..].find("\n```").expect("the block's end");
    format!("{}\n", &rest[start..start + end])
}

/// `actual` against README's block `name`, after `names` (throwaway, README's) are replaced.
/// A table's columns are padded to its widest cell, and a throwaway name is longer than the
/// README's: runs of spaces are compared as one.
fn check(name: &str, actual: &str, names: &[(&str, &str)]) {
    let mut a = actual.to_string();
    for (from, to) in names {
        a = a.replace(from, to);
    }
    let squeeze = |s: &str| -> String {
        s.lines()
            .map(|l| {
                l.split(' ')
                    .filter(|w| !w.is_empty())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .map(|l| format!("{l}\n"))
            .collect()
    };
    snapbox::assert_data_eq!(squeeze(&a), squeeze(&readme_block(name)));
}

fn run_ok(args: &[&str]) -> String {
    let o = Command::new(nsfast_bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run nsfast");
    assert!(
        o.status.success(),
        "nsfast {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn probe() {
    require_root();
    check("probe", &run_ok(&["probe"]), &[]);
}

#[test]
fn sockmap_status() {
    require_root();
    let cg = TestCgroup::new();
    let mut run = KillOnDrop::new(
        Command::new(nsfast_bin())
            .args(["sockmap", "run", "--allow-splice-hole", "--cgroup"])
            .arg(cg.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = run.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !nsfast_sockmap::instances()
        .unwrap()
        .iter()
        .any(|i| i.loader_pid == pid && i.attached)
    {
        assert!(Instant::now() < deadline, "sockmap run not attached");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Other instances may be loaded (other tests, other runs): only this one's lines.
    let out = run_ok(&["sockmap", "status"]);
    let head = format!("cgroup {} ", cg.path().display());
    let mut mine = String::new();
    let mut inside = false;
    for l in out.lines() {
        if l.starts_with("cgroup ") {
            inside = l.starts_with(&head);
        }
        if inside {
            mine.push_str(l);
            mine.push('\n');
        }
    }
    let cg_path = cg.path().display().to_string();
    let mount = cg.path().parent().unwrap().display().to_string();
    check(
        "sockmap-status",
        &mine,
        &[
            (&cg_path, "/sys/fs/cgroup/unified/myapp"),
            (&mount, "/sys/fs/cgroup/unified"),
        ],
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let _ = run.child_mut().wait();
}

/// Deletes the pod when the test ends (also on panic), before the host namespace goes.
struct Pod<'a> {
    name: &'a str,
    host: &'a str,
}

impl Drop for Pod<'_> {
    fn drop(&mut self) {
        let _ = nsfast_pod::del(self.name, Some(self.host));
    }
}

#[test]
fn pod_add_and_list() {
    require_root();
    let host_ns = NetNs::create(&nsfast_lab::name::unique("h")).unwrap();
    let host = host_ns.name().to_string();
    let pod = nsfast_lab::name::unique("demo");
    let _guard = Pod {
        name: &pod,
        host: &host,
    };
    let names = [(host.as_str(), "demo-host"), (pod.as_str(), "demo")];
    let added = run_ok(&[
        "pod",
        "add",
        &pod,
        "--ip",
        "10.244.1.5/24,fd00:10:244::5/64",
        "--host",
        &host,
    ]);
    check("pod-add", &added, &names);
    // (The pod's kernel sends IPv6 chatter, router solicitations and MLD reports, as soon as
    // its interface is up, and the pod programs drop it as `pod_not_ipv4`: whether that came
    // before the listing is the machine's timing, so README shows that count as [..].)
    let listed = run_ok(&["pod", "list", "--host", &host]);
    check("pod-list", &listed, &names);
}

/// A folder of this test's own, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn relay_json() {
    require_root();
    let ns = NetNs::create(&nsfast_lab::name::unique("relay")).unwrap();
    let dir = Scratch(std::env::temp_dir().join(nsfast_lab::name::unique("relay")));
    std::fs::create_dir_all(&dir.0).unwrap();
    let sock = dir.0.join("app.sock");
    // An echo server on the UNIX side, for one connection.
    let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let echo = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).unwrap();
        s.write_all(&buf).unwrap();
    });
    let mut cmd = Command::new(nsfast_bin());
    cmd.args(["vsock", "relay", "tcp-listen:18471,bind=127.0.0.1"])
        .arg(format!("unix:{}", sock.display()))
        .arg("--json")
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    ns.configure_command(&mut cmd, None);
    let relay = KillOnDrop::new(cmd.spawn().unwrap());
    let addr: std::net::SocketAddr = "127.0.0.1:18471".parse().unwrap();
    nsfast_lab::peer::wait_listening(&ns, addr);
    let got = ns
        .run(|| {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.write_all(b"hello\n").unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            got
        })
        .unwrap();
    assert_eq!(got, b"hello\n");
    echo.join().unwrap();
    // Without --fork the relay serves one connection and exits.
    let out = relay.take().wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    // The log lines without their timestamps, then the JSON line.
    let mut text = String::new();
    for l in String::from_utf8_lossy(&out.stderr).lines() {
        let l = l.split_once(' ').map(|(_, r)| r.trim_start()).unwrap_or(l);
        text.push_str(l);
        text.push('\n');
    }
    text.push_str(&String::from_utf8_lossy(&out.stdout));
    let sock = sock.display().to_string();
    check("relay-json", &text, &[(&sock, "/tmp/app.sock")]);
}

/// The EXAMPLES of `--help` and the man pages that only read: each is still an example of
/// its command (in that command's `--help`) and runs here with exit 0 (and, but for
/// `--require`, some output). The others change the system or name hosts and VMs this
/// machine lacks; a unit test parses every example with the real parser.
#[test]
fn read_only_examples_run() {
    require_root();
    for (command, example, prints) in [
        (&["probe"][..], "nsfast probe", true),
        (&["probe"], "nsfast probe -j", true),
        (
            &["probe"],
            "nsfast probe --require tcx,bpf_redirect_peer",
            false,
        ),
        (&["sockmap", "status"], "nsfast sockmap status", true),
        (&["sockmap", "status"], "nsfast sockmap status -p", true),
        (&["pod", "list"], "nsfast pod list", true),
        (
            &["pod", "shortcut", "status"],
            "nsfast pod shortcut status",
            true,
        ),
        (
            &["pod", "shortcut", "status"],
            "nsfast pod shortcut status -j",
            true,
        ),
        (&["metrics"], "nsfast metrics", true),
    ] {
        let mut help_args = command.to_vec();
        help_args.push("--help");
        let help = run_ok(&help_args);
        assert!(
            help.contains(&format!("\n    {example}\n")),
            "{example:?} is no example of nsfast {command:?}:\n{help}"
        );
        let words: Vec<&str> = example.split(' ').skip(1).collect();
        let out = run_ok(&words);
        assert!(!prints || !out.is_empty(), "{example:?} printed nothing");
    }
}
