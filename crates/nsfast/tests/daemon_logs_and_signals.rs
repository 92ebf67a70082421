//! The daemons' logs and signals, on `nsfast vsock relay` over loopback TCP (no privileges).
//! Under systemd (stderr is the journal: `$JOURNAL_STREAM` names it, as systemd sets it for a
//! service) each line carries its syslog priority, so `journalctl -p warning` finds warnings;
//! `NSFAST_LOG_FORMAT=json` writes one JSON object per line; the relay's failed connection is
//! the warning. A daemon stops on SIGTERM or SIGINT only: SIGHUP (a terminal's hang-up,
//! `systemctl reload`) is logged and changes nothing, since stopping would exit 0 and
//! `Restart=on-failure` would not restart it (`sockmap run`: integration-test sockmap.rs).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A loopback port nothing listens on (bound, then closed).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs a relay from a free port to a closed one with stderr in a file (`journal`: named by
/// `$JOURNAL_STREAM`, as systemd does for a service) and connects to it once. With `fork` the
/// relay logs the failed connection and goes on (it is ended by SIGTERM once the line is
/// there); without, the failure ends it with an error (exit 1). Returns the log and the exit
/// code.
fn relay_log(journal: bool, format: Option<&str>, fork: bool) -> (String, Option<i32>) {
    let log = std::env::temp_dir().join(format!(
        "nsfast-journal-{}-{journal}-{fork}-{}.log",
        std::process::id(),
        format.unwrap_or("text")
    ));
    struct Gone(PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _gone = Gone(log.clone());
    let f = std::fs::File::create(&log).unwrap();
    let m = f.metadata().unwrap();
    let (listen, dead) = (free_port(), free_port());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nsfast"));
    cmd.args([
        "vsock",
        "relay",
        &format!("tcp-listen:{listen},bind=127.0.0.1"),
        &format!("tcp:127.0.0.1:{dead}"),
    ])
    .env_remove("JOURNAL_STREAM")
    .env_remove("RUST_LOG")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(f);
    if fork {
        cmd.arg("--fork");
    }
    if journal {
        cmd.env("JOURNAL_STREAM", format!("{}:{}", m.dev(), m.ino()));
    }
    match format {
        Some(v) => cmd.env("NSFAST_LOG_FORMAT", v),
        None => cmd.env_remove("NSFAST_LOG_FORMAT"),
    };
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut s = connect_when_listening(listen, deadline);
    let _ = s.write_all(b"x");
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    if fork {
        while !std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .any(|l| l.contains("connection 1"))
        {
            assert!(Instant::now() < deadline, "no line of connection 1");
            std::thread::sleep(Duration::from_millis(20));
        }
        // Ours, ended by its PID.
        kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    }
    let st = child.wait().unwrap();
    (std::fs::read_to_string(&log).unwrap(), st.code())
}

/// An error line when the journal is stderr: `<3>`.
#[test]
fn under_the_journal_an_error_line_has_priority_error() {
    let (text, code) = relay_log(true, None, false);
    assert_eq!(code, Some(1), "{text}");
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "{text}");
    assert!(errors[0].starts_with("<3>"), "{text}");
}

#[test]
fn under_the_journal_every_line_carries_its_priority() {
    let (text, code) = relay_log(true, None, true);
    assert_eq!(code, Some(0), "{text}");
    let warn = text
        .lines()
        .find(|l| l.contains("connection 1"))
        .unwrap_or_else(|| panic!("no connection line: {text}"));
    assert!(warn.starts_with("<4>"), "{text}");
    let info = text
        .lines()
        .find(|l| l.contains("listening"))
        .unwrap_or_else(|| panic!("no listening line: {text}"));
    assert!(info.starts_with("<6>"), "{text}");
    for l in text.lines().filter(|l| !l.is_empty()) {
        assert!(l.starts_with('<'), "a line without its priority: {l:?}");
    }
}

#[test]
fn elsewhere_lines_have_no_priority_and_json_is_one_object_per_line() {
    let (text, _) = relay_log(false, None, true);
    assert!(text.contains("connection 1"), "{text}");
    assert!(!text.lines().any(|l| l.starts_with('<')), "{text}");
    let (text, _) = relay_log(false, Some("json"), true);
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    assert!(
        lines.iter().any(|v| v["level"] == "WARN"
            && v["fields"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("connection 1")),
        "{text}"
    );
}

/// A connection to the relay on loopback `port`, once it listens (bounded by `deadline`).
fn connect_when_listening(port: u16, deadline: Instant) -> TcpStream {
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => return s,
            Err(e) => {
                assert!(Instant::now() < deadline, "the relay does not listen: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// One round trip through the relay to the echo server behind it.
fn round_trip(port: u16, deadline: Instant) {
    let mut s = connect_when_listening(port, deadline);
    s.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping");
}

#[test]
fn a_relay_keeps_serving_after_sighup_and_stops_on_sigterm() {
    let echo = TcpListener::bind("127.0.0.1:0").unwrap();
    let echo_port = echo.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in echo.incoming().flatten() {
            std::thread::spawn(move || {
                let mut c = c;
                let mut b = [0u8; 64];
                while let Ok(n) = c.read(&mut b) {
                    if n == 0 || c.write_all(&b[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    let listen = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_nsfast"))
        .args([
            "vsock",
            "relay",
            &format!("tcp-listen:{listen},bind=127.0.0.1"),
            &format!("tcp:127.0.0.1:{echo_port}"),
            "--fork",
        ])
        .env("RUST_LOG", "info")
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = Pid::from_raw(child.id() as i32);
    let deadline = Instant::now() + Duration::from_secs(30);
    round_trip(listen, deadline);
    kill(pid, Signal::SIGHUP).unwrap();
    // Still serving after the hang-up; the round trip also orders it after the signal's
    // handling as far as the relay's log shows (read below, after it ends).
    round_trip(listen, deadline);
    assert!(
        child.try_wait().unwrap().is_none(),
        "the relay ended on SIGHUP"
    );
    kill(pid, Signal::SIGTERM).unwrap();
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{log}");
    assert!(log.contains("received SIGHUP: nothing to reload"), "{log}");
    assert!(log.contains("received SIGTERM"), "{log}");
}
