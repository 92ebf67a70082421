//! `nsfast sockmap run` under systemd's protocols, with a test-owned listener instead of
//! systemd: READY=1 on `$NOTIFY_SOCKET` only once the programs are attached; journal logs
//! without timestamps; no cgroup given is refused (nothing created). Needs root.

use std::io::Read;
use std::os::fd::AsFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nsfast_lab::peer::KillOnDrop;
use nsfast_lab::require_root;
use nsfast_lab::world::TestCgroup;

/// The binary under test (`$NSFAST_BIN`, else the workspace's build).
use nsfast_lab::bins::nsfast as nsfast_bin;

#[test]
fn ready_arrives_only_after_the_programs_are_attached() {
    require_root();
    let cg = TestCgroup::new();
    let name = format!("nsfast-test-notify-{}", std::process::id());
    let listener =
        UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
    listener
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    // stderr is a pipe; JOURNAL_STREAM names it as systemd would name the journal stream.
    let (rd, wr) = nix::unistd::pipe().unwrap();
    let st = nix::sys::stat::fstat(wr.as_fd()).unwrap();
    let mut child = KillOnDrop::new(
        Command::new(nsfast_bin())
            .args(["sockmap", "run", "--allow-splice-hole", "--cgroup"])
            .arg(cg.path())
            .env("NOTIFY_SOCKET", format!("@{name}"))
            .env("JOURNAL_STREAM", format!("{}:{}", st.st_dev, st.st_ino))
            .stdout(Stdio::null())
            .stderr(Stdio::from(wr))
            .spawn()
            .expect("spawn nsfast sockmap run"),
    );
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut buf = [0u8; 512];
    let msg = loop {
        match listener.recv(&mut buf) {
            Ok(n) => break String::from_utf8_lossy(&buf[..n]).into_owned(),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if let Some(st) = child.child_mut().try_wait().unwrap() {
                    panic!("nsfast sockmap run exited ({st}) without READY=1");
                }
                assert!(Instant::now() < deadline, "no READY=1 within 30 s");
            }
            Err(e) => panic!("recv on the notify socket: {e}"),
        }
    };
    // At the moment READY arrives both programs are attached to the cgroup.
    let inst = nsfast_sockmap::instances()
        .unwrap()
        .into_iter()
        .find(|i| i.loader_pid == pid)
        .expect("an instance of this loader when READY=1 arrives");
    assert!(inst.attached, "READY=1 before attachment: {inst:?}");
    assert_eq!(inst.cgroup_path.as_deref(), Some(cg.path()));
    assert!(inst.sockops_prog_id.is_some(), "{inst:?}");
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg:?}");
    assert!(
        msg.contains(&format!("STATUS=attached to {}", cg.path().display())),
        "{msg:?}"
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.child_mut().wait().unwrap();
    assert!(status.success(), "{status}");
    // The child held the only write end (ours went into Stdio): read its log to EOF.
    let mut log = String::new();
    std::fs::File::from(rd).read_to_string(&mut log).unwrap();
    assert!(log.contains("attached sockops program"), "{log}");
    for l in log.lines() {
        assert!(!l.contains('\x1b'), "ANSI colour in journal output: {l:?}");
        assert!(
            !l.trim_start().starts_with(|c: char| c.is_ascii_digit()),
            "timestamp in journal output: {l:?}"
        );
    }
}

#[test]
fn run_without_a_cgroup_is_refused_and_creates_nothing() {
    require_root();
    let root = nsfast_sys::cgroup::cgroup2_mount().unwrap();
    let before: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    let mut child = KillOnDrop::new(
        Command::new(nsfast_bin())
            .args(["sockmap", "run"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.child_mut().try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            // Old behaviour: it attached to a default cgroup and ran. Stop it cleanly.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = child.child_mut().wait();
            panic!("`nsfast sockmap run` without --cgroup/--slice ran instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .child_mut()
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("--cgroup") && err.contains("--slice"), "{err}");
    let after: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    let new: Vec<_> = after.iter().filter(|n| !before.contains(n)).collect();
    assert!(
        !new.iter().any(|n| n.to_string_lossy() == "test.slice"),
        "created {new:?}"
    );

    let (ok, err) = {
        let o = Command::new(nsfast_bin())
            .args(["sockmap", "run", "--slice", "nsft-no-such-slice.slice"])
            .output()
            .unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    assert!(!ok);
    assert!(
        err.contains("slice nsft-no-such-slice.slice has no cgroup yet"),
        "{err}"
    );
    assert!(!root.join("nsft-no-such-slice.slice").exists());
}
