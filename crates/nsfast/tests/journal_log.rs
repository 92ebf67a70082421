//! Log lines under systemd: when stderr is the journal (`$JOURNAL_STREAM` names it, as
//! systemd sets it for a service), each line carries its syslog priority, so `journalctl -p
//! warning` finds warnings; `NSFAST_LOG_FORMAT=json` writes one JSON object per line. The
//! relay's failed connection is the warning: loopback TCP only, no privileges.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
    let mut s = loop {
        match TcpStream::connect(("127.0.0.1", listen)) {
            Ok(s) => break s,
            Err(e) => {
                assert!(Instant::now() < deadline, "the relay never listened: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
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
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
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
