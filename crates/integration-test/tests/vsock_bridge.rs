//! Host tests of `nsfast vsock bridge` with hybrid-vsock members only: every member is a
//! scripted stand-in for a VMM's UNIX socket (what Firecracker / vhost-device-vsock
//! `--uds-path` offer), so no AF_VSOCK socket is opened on this host. The real check with two
//! QEMU guests is the VM harness line `vsock-bridge` (crates/integration-test/tests/vsock_guest.rs,
//! `bridge_*`). No root needed: only UNIX sockets in a temp directory.
//!
//! Stand-ins: a guest's connection to the host's port P is the test connecting to `PATH_P`
//! (as the VMM would); the bridge reaching a guest is an accept on `PATH` that must read
//! `CONNECT P\n` and answers `OK P\n`, then plays the guest's listener.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nsfast_lab::peer::KillOnDrop;
use nsfast_lab::stream::{bidir, check_pair};
use nsfast_lab::world::unique;

const MIB: u64 = 1 << 20;

/// The binary under test (`$NSFAST_BIN`, else the workspace's build).
use nsfast_lab::bins::nsfast as nsfast_bin;

/// A temp directory, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new() -> Self {
        let d = std::env::temp_dir().join(unique("br"));
        std::fs::create_dir_all(&d).unwrap();
        Self(d)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    fn files(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running bridge with its `--json` events on a channel.
struct Bridge {
    child: KillOnDrop,
    events: mpsc::Receiver<serde_json::Value>,
    stderr: std::thread::JoinHandle<String>,
}

fn bridge(args: &[String]) -> Bridge {
    let mut child = KillOnDrop::new(
        Command::new(nsfast_bin())
            .args(["vsock", "bridge", "--json"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn nsfast vsock bridge"),
    );
    let out = child.child_mut().stdout.take().unwrap();
    let err = child.child_mut().stderr.take().unwrap();
    let (tx, events) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            let v: serde_json::Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON: {line:?}: {e}"));
            if tx.send(v).is_err() {
                break;
            }
        }
    });
    // The log lines are kept for the test and echoed (shown when a test fails).
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            eprintln!("bridge: {line}");
            s.push_str(&line);
            s.push('\n');
        }
        s
    });
    let b = Bridge {
        child,
        events,
        stderr,
    };
    let first = b.next_event();
    assert_eq!(first["event"], "listening", "{first}");
    b
}

impl Bridge {
    fn next_event(&self) -> serde_json::Value {
        match self.events.recv_timeout(Duration::from_secs(30)) {
            Ok(e) => e,
            Err(e) => {
                let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                std::thread::sleep(Duration::from_millis(200));
                panic!("no bridge event within 30 s ({e}); see the bridge's log above");
            }
        }
    }

    /// The next event of one kind (skipping others).
    fn wait(&self, kind: &str) -> serde_json::Value {
        loop {
            let e = self.next_event();
            if e["event"] == kind {
                return e;
            }
        }
    }

    /// Stops with SIGTERM; returns stderr (the log lines).
    fn stop(self) -> String {
        let mut c = self.child.take();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(c.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let st = c.wait().unwrap();
        let log = self.stderr.join().unwrap();
        assert!(st.success(), "bridge exit {st}: {log}");
        log
    }
}

/// A VMM's hybrid socket at `path`: accepts one host connection, checks `CONNECT port`,
/// answers OK, and hands the stream (now the guest listener's end) back.
fn vmm_accept(l: &UnixListener, port: u32) -> UnixStream {
    let (mut s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while s.read(&mut b).unwrap() == 1 && b[0] != b'\n' {
        line.push(b[0]);
    }
    assert_eq!(
        String::from_utf8_lossy(&line),
        format!("CONNECT {port}"),
        "the bridge must dial the guest with CONNECT <same port>"
    );
    s.write_all(format!("OK {port}\n").as_bytes()).unwrap();
    s
}

/// The guest of member `path` connects to the host's `port`: the VMM connects to PATH_port.
fn guest_dials_host(path: &Path, port: u32) -> UnixStream {
    let p = PathBuf::from(format!("{}_{port}", path.display()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !p.exists() {
        assert!(Instant::now() < deadline, "{} never appeared", p.display());
        std::thread::sleep(Duration::from_millis(10));
    }
    UnixStream::connect(&p).unwrap()
}

/// No connection is waiting on `l` (nobody dialled this member).
fn assert_untouched(l: &UnixListener, who: &str) {
    l.set_nonblocking(true).unwrap();
    match l.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("{who} was dialled: {other:?}"),
    }
    l.set_nonblocking(false).unwrap();
}

/// Reads until EOF or error; returns what arrived (a denied connection gets nothing).
fn read_all(mut s: UnixStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut v = Vec::new();
    let _ = s.read_to_end(&mut v);
    v
}

fn vm(cid: u32, path: &Path) -> [String; 2] {
    ["--vm".into(), format!("{cid}=hybrid:{}", path.display())]
}

#[test]
fn siblings_in_one_group_reach_each_other_both_ways_with_half_close() {
    let d = Dir::new();
    let (a, b) = (d.path("a.vsock"), d.path("b.vsock"));
    let (la, lb) = (
        UnixListener::bind(&a).unwrap(),
        UnixListener::bind(&b).unwrap(),
    );
    let mut args: Vec<String> = vec!["--group".into(), "3,4".into()];
    args.extend(vm(3, &a));
    args.extend(vm(4, &b));
    args.extend(["--ports".into(), "5000,6000-6001".into()]);
    let br = bridge(&args);
    let bytes = 64 * MIB;

    // 3 dials the host's port 5000 and lands on 4's port 5000.
    let peer = std::thread::spawn(move || {
        let s = vmm_accept(&lb, 5000);
        (bidir(s, bytes, 2), lb)
    });
    let c = bidir(guest_dials_host(&a, 5000), bytes, 1);
    let (p, lb) = peer.join().unwrap();
    check_pair(&c, &p, bytes);
    let open = br.wait("open");
    assert_eq!(
        (&open["src"], &open["dst"], &open["port"], &open["dialled"]),
        (&3.into(), &4.into(), &5000.into(), &2.into())
    );
    let close = br.wait("close");
    assert_eq!(close["bytes_src_to_dst"], bytes);
    assert_eq!(close["bytes_dst_to_src"], bytes);
    assert_eq!(close["spliced"], true);
    assert!(close["error"].is_null(), "{close}");

    // And back: 4 dials the host's port 6001 and lands on 3's port 6001.
    let peer = std::thread::spawn(move || {
        let s = vmm_accept(&la, 6001);
        (bidir(s, bytes, 4), la)
    });
    let c = bidir(guest_dials_host(&b, 6001), bytes, 3);
    let (p, la) = peer.join().unwrap();
    check_pair(&c, &p, bytes);
    let open = br.wait("open");
    assert_eq!((&open["src"], &open["dst"]), (&4.into(), &3.into()));

    // Half-close, one direction at a time: the guest sends a request and half-closes; the
    // sibling reads it to EOF and only then answers on the same connection.
    let peer = std::thread::spawn(move || {
        let mut s = vmm_accept(&lb, 6000);
        let mut req = Vec::new();
        s.read_to_end(&mut req).unwrap();
        s.write_all(&[b"reply to ".as_slice(), &req].concat())
            .unwrap();
    });
    let mut s = guest_dials_host(&a, 6000);
    s.write_all(b"request").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(read_all(s), b"reply to request");
    peer.join().unwrap();

    assert_untouched(&la, "member 3");
    let log = br.stop();
    assert!(log.contains("bridge 3:5000 -> 4:5000"), "{log}");
    assert!(log.contains("bridge 4:6001 -> 3:6001"), "{log}");
    // SIGTERM removed every listening file; the members' own sockets stay.
    assert_eq!(d.files(), vec!["a.vsock", "b.vsock"]);
}

/// Every member's VMM as a tagged stand-in: it answers any `CONNECT 5000`, writes
/// "<cid> here" and closes, and reports the CID on `dialled`. A connection routed to the wrong
/// member therefore carries bytes at once, and the set of members ever dialled is known.
fn tagged_vmm(l: UnixListener, cid: u32, dialled: mpsc::Sender<u32>) {
    std::thread::spawn(move || loop {
        let mut s = vmm_accept(&l, 5000);
        let _ = dialled.send(cid);
        let _ = s.write_all(format!("{cid} here").as_bytes());
    });
}

#[test]
fn other_groups_isolated_and_ambiguous_dials_are_denied_and_logged() {
    let d = Dir::new();
    let p: Vec<PathBuf> = (3..=10).map(|c| d.path(&format!("m{c}"))).collect();
    let (dialled_tx, dialled) = mpsc::channel();
    for (i, x) in p.iter().enumerate() {
        tagged_vmm(
            UnixListener::bind(x).unwrap(),
            i as u32 + 3,
            dialled_tx.clone(),
        );
    }
    let mut args: Vec<String> = ["--group", "3,4", "--group", "5,6", "--group", "7"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(["--group".into(), "8,9,10".into()]);
    for (i, x) in p.iter().enumerate() {
        args.extend(vm(i as u32 + 3, x));
    }
    // A loopback port that was free a moment ago, for the metrics endpoint.
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    args.extend(["--ports".into(), "5000".into()]);
    args.extend(["--metrics-listen".into(), metrics_port.to_string()]);
    let br = bridge(&args);

    // The positive control: 5 and 3 share no group, and 5 reaches its own partner 6 (never 3
    // or 4) — the same check that must see nothing below sees bytes here.
    assert_eq!(read_all(guest_dials_host(&p[2], 5000)), b"6 here");
    let open = br.next_event();
    assert_eq!((&open["event"], &open["dst"]), (&"open".into(), &6.into()));
    assert_eq!(br.next_event()["event"], "close");

    // 7 is alone in its group: denied, closed without a byte, and the very next event is that
    // denial with its reason.
    assert_eq!(read_all(guest_dials_host(&p[4], 5000)), b"");
    let e = br.next_event();
    assert_eq!(e["event"], "deny", "{e}");
    assert_eq!(
        (&e["src"], &e["dialled"], &e["port"]),
        (&7.into(), &2.into(), &5000.into())
    );
    assert_eq!(
        e["reason"],
        "7 dialled the host, but no group of 7 has another member"
    );

    // 8 dials the host in a group of three: ambiguous, denied with what to do instead.
    assert_eq!(read_all(guest_dials_host(&p[5], 5000)), b"");
    let e = br.next_event();
    assert_eq!((&e["event"], &e["src"]), (&"deny".into(), &8.into()), "{e}");
    let why = e["reason"].as_str().unwrap();
    assert!(
        why.contains("2 other members (9,10)") && why.contains("VMADDR_FLAG_TO_HOST"),
        "{why}"
    );

    // The metrics count what the events said: one bridged (and closed) connection, two
    // denials.
    let mut m = std::net::TcpStream::connect(("127.0.0.1", metrics_port)).unwrap();
    m.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut page = String::new();
    m.read_to_string(&mut page).unwrap();
    for line in [
        "nsfast_vsock_bridge_connections_opened_total 1\n",
        "nsfast_vsock_bridge_connections_denied_total 2\n",
        "nsfast_vsock_bridge_connections_open 0\n",
        "nsfast_vsock_bridge_connections_closed_total{path=\"splice\"} 1\n",
    ] {
        assert!(page.contains(line), "no {line:?} in {page}");
    }
    let log = br.stop();
    // Only 6 was ever dialled.
    assert_eq!(dialled.try_iter().collect::<Vec<u32>>(), vec![6]);
    assert!(
        log.contains(
            "denied 7:5000 -> 2:5000: 7 dialled the host, but no group of 7 has another member"
        ),
        "{log}"
    );
    assert!(log.contains("denied 8:5000 -> 2:5000"), "{log}");
    // The lone member was warned about at the start.
    assert!(
        log.contains("--group 7 has one member: every connection from or to VM 7 is denied"),
        "{log}"
    );
}

#[test]
fn unreachable_targets_and_the_connection_cap_end_one_connection_only() {
    let d = Dir::new();
    let (a, b) = (d.path("a"), d.path("b"));
    let lb = UnixListener::bind(&b).unwrap();
    let mut args: Vec<String> = vec!["--group".into(), "3,4".into()];
    args.extend(vm(3, &a));
    args.extend(vm(4, &b));
    args.extend(["--ports", "7", "--max-conns", "1", "--connect-timeout", "2"].map(String::from));
    let br = bridge(&args);

    // The VMM closes without a word (nothing listens in the guest): the guest's connection
    // ends; a VMM that never answers: the same after --connect-timeout.
    let t = std::thread::spawn({
        let lb = lb.try_clone().unwrap();
        move || {
            // As vhost-device-vsock does: read the request, then close.
            let (s, _) = lb.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line).unwrap();
            assert_eq!(line, "CONNECT 7\n");
            drop(s);
            let (s, _) = lb.accept().unwrap();
            std::thread::sleep(Duration::from_secs(4));
            drop(s);
        }
    });
    assert_eq!(read_all(guest_dials_host(&a, 7)), b"");
    let e = br.wait("fail");
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("nothing listens on vsock port 7"),
        "{e}"
    );
    let t0 = Instant::now();
    assert_eq!(read_all(guest_dials_host(&a, 7)), b"");
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "--connect-timeout not applied"
    );
    br.wait("fail");
    t.join().unwrap();

    // With --max-conns 1, a second connection while one is open is refused.
    let t = std::thread::spawn(move || {
        let mut s = vmm_accept(&lb, 7);
        let mut v = Vec::new();
        s.read_to_end(&mut v).unwrap();
        v
    });
    let mut first = guest_dials_host(&a, 7);
    br.wait("open");
    assert_eq!(read_all(guest_dials_host(&a, 7)), b"");
    let e = br.wait("deny");
    assert!(e["reason"].as_str().unwrap().contains("--max-conns"), "{e}");
    first.write_all(b"still fine").unwrap();
    first.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(t.join().unwrap(), b"still fine");
    br.wait("close");

    // Member 3's VMM socket never existed: dialling 3 fails, the bridge keeps serving.
    assert_eq!(read_all(guest_dials_host(&b, 7)), b"");
    let e = br.wait("fail");
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("connect to hybrid socket"),
        "{e}"
    );
    br.stop();
}

#[test]
fn stale_listening_files_are_replaced_and_a_live_one_is_refused() {
    let d = Dir::new();
    let a = d.path("a");
    // A stale PATH_PORT from a killed bridge: a socket file nobody accepts on.
    drop(UnixListener::bind(d.path("a_9")).unwrap());
    let args: Vec<String> = ["--group", "3,4", "--ports", "9"]
        .iter()
        .map(|s| s.to_string())
        .chain(vm(3, &a))
        .chain(vm(4, &d.path("b")))
        .collect();
    let br = bridge(&args);
    // A second bridge for the same member finds the live listener and refuses to start.
    let out = Command::new(nsfast_bin())
        .args(["vsock", "bridge"])
        .args(&args)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("a_9 exists and a process is listening on it"),
        "{err}"
    );
    // Finding that out did not connect to the running bridge (no event there).
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        br.events.try_recv().is_err(),
        "the check woke the running bridge"
    );
    br.stop();
    assert!(d.files().is_empty(), "{:?}", d.files());
}

/// A member's VMM that answers every `CONNECT port` and hands each stream to `tx`.
fn vmm_serve(l: UnixListener, port: u32) -> mpsc::Receiver<UnixStream> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || loop {
        let s = vmm_accept(&l, port);
        if tx.send(s).is_err() {
            break;
        }
    });
    rx
}

#[test]
fn one_guest_at_its_limits_does_not_lock_another_group_out() {
    let d = Dir::new();
    let p: Vec<PathBuf> = (3..=6).map(|c| d.path(&format!("m{c}"))).collect();
    let mut l: Vec<Option<UnixListener>> = p
        .iter()
        .map(|x| Some(UnixListener::bind(x).unwrap()))
        .collect();
    let mut args: Vec<String> = ["--group", "3,4", "--group", "5,6", "--ports", "7"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for (i, x) in p.iter().enumerate() {
        args.extend(vm(i as u32 + 3, x));
    }
    args.extend(
        [
            "--max-conns",
            "16",
            "--max-conns-per-group",
            "3",
            "--max-conns-per-cid",
            "2",
        ]
        .map(String::from),
    );
    let br = bridge(&args);
    let at3 = vmm_serve(l[0].take().unwrap(), 7);
    let at4 = vmm_serve(l[1].take().unwrap(), 7);
    let at6 = vmm_serve(l[3].take().unwrap(), 7);
    let recv = |rx: &mpsc::Receiver<UnixStream>| rx.recv_timeout(Duration::from_secs(30)).unwrap();

    // Guest 3 takes its two connections and holds them.
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(guest_dials_host(&p[0], 7));
        held.push(recv(&at4));
        assert_eq!(br.wait("open")["src"], 3);
    }
    // A third one from 3 is over its own limit.
    assert_eq!(read_all(guest_dials_host(&p[0], 7)), b"");
    let e = br.wait("deny");
    assert_eq!(e["src"], 3);
    let why = e["reason"].as_str().unwrap();
    assert!(
        why.contains("3 has 2 connections open (--max-conns-per-cid 2)"),
        "{why}"
    );
    // 4 may still open one (its group has room for a third) ...
    held.push(guest_dials_host(&p[1], 7));
    held.push(recv(&at3));
    assert_eq!(br.wait("open")["src"], 4);
    // ... and then the group {3,4} is full, though 4 itself holds only one.
    assert_eq!(read_all(guest_dials_host(&p[1], 7)), b"");
    let e = br.wait("deny");
    assert_eq!(e["src"], 4);
    let why = e["reason"].as_str().unwrap();
    assert!(
        why.contains("group 3,4 has 3 connections open (--max-conns-per-group 3)"),
        "{why}"
    );
    // The other group is not locked out: 5 reaches 6 and bytes flow both ways.
    let mut g5 = guest_dials_host(&p[2], 7);
    let mut g6 = recv(&at6);
    assert_eq!(br.wait("open")["src"], 5);
    g5.write_all(b"5 to 6").unwrap();
    g5.shutdown(std::net::Shutdown::Write).unwrap();
    let mut got = [0u8; 6];
    g6.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"5 to 6");
    g6.write_all(b"6 to 5").unwrap();
    drop(g6);
    assert_eq!(read_all(g5), b"6 to 5");
    br.wait("close");
    // When 3 gives one connection back, it may open one again.
    drop(held.remove(0));
    drop(held.remove(0));
    assert_eq!(br.wait("close")["src"], 3);
    let _again = guest_dials_host(&p[0], 7);
    let _peer = recv(&at4);
    assert_eq!(br.wait("open")["src"], 3);
    assert_untouched(l[2].as_ref().unwrap(), "member 5");
    drop(held);
    br.stop();
}

#[test]
fn idle_connections_are_closed_after_the_idle_timeout() {
    let d = Dir::new();
    let (a, b) = (d.path("a"), d.path("b"));
    let lb = UnixListener::bind(&b).unwrap();
    let mut args: Vec<String> = vec!["--group".into(), "3,4".into()];
    args.extend(vm(3, &a));
    args.extend(vm(4, &b));
    args.extend(["--ports", "7", "--idle-timeout", "1s"].map(String::from));
    let br = bridge(&args);
    let at4 = vmm_serve(lb, 7);
    let recv = || at4.recv_timeout(Duration::from_secs(30)).unwrap();

    // An idle connection: one byte each way, then nothing.
    let mut idle = guest_dials_host(&a, 7);
    let mut idle_peer = recv();
    let idle_id = br.wait("open")["id"].clone();
    idle.write_all(b"x").unwrap();
    let mut one = [0u8; 1];
    idle_peer.read_exact(&mut one).unwrap();
    idle_peer.write_all(b"y").unwrap();
    idle.read_exact(&mut one).unwrap();
    let t0 = Instant::now();

    // The positive control, at the same time on the same bridge: a connection that talks
    // every 100 ms for 2.5 s (longer than the timeout) stays open.
    let busy = guest_dials_host(&a, 7);
    let busy_peer = recv();
    let busy_id = br.wait("open")["id"].clone();
    let talker = std::thread::spawn(move || {
        let mut busy = busy;
        let mut busy_peer = busy_peer;
        let until = Instant::now() + Duration::from_millis(2500);
        let mut n = 0u64;
        while Instant::now() < until {
            busy.write_all(b"tick").unwrap();
            let mut t = [0u8; 4];
            busy_peer.read_exact(&mut t).unwrap();
            busy_peer.write_all(b"tock").unwrap();
            busy.read_exact(&mut t).unwrap();
            n += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
        busy.shutdown(std::net::Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        busy_peer.read_to_end(&mut rest).unwrap();
        drop(busy_peer);
        assert_eq!(read_all(busy), b"");
        n
    });

    // The idle one ends at both ends, after the timeout and well before the test's limits.
    assert_eq!(read_all(idle), b"");
    let mut rest = Vec::new();
    idle_peer.read_to_end(&mut rest).unwrap();
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(6),
        "idle connection closed after {took:?}"
    );
    let close = br.wait("close");
    assert_eq!(close["id"], idle_id, "{close}");
    assert!(
        close["error"]
            .as_str()
            .is_some_and(|e| e.contains("idle for 1s")),
        "{close}"
    );
    assert!(talker.join().unwrap() >= 5);
    let close = br.wait("close");
    assert_eq!(close["id"], busy_id, "{close}");
    assert!(close["error"].is_null(), "{close}");
    br.stop();
}

#[test]
fn json_with_stdout_closed_serves_more_connections_than_max_conns() {
    let d = Dir::new();
    let (a, b) = (d.path("a"), d.path("b"));
    let at4 = vmm_serve(UnixListener::bind(&b).unwrap(), 7);
    let mut child = KillOnDrop::new(
        Command::new(nsfast_bin())
            .args([
                "vsock", "bridge", "--json", "--group", "3,4", "--ports", "7",
            ])
            .args(vm(3, &a))
            .args(vm(4, &b))
            .args(["--max-conns", "1"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // Nobody reads the bridge's stdout: every JSON event hits a closed pipe.
    drop(child.child_mut().stdout.take());
    // The log lines on stderr say when each connection is closed (and its slot given back).
    let (tx, log) = mpsc::channel::<String>();
    let err = child.child_mut().stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("bridge: {l}");
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let wait_log = |what: &str| loop {
        let l = log
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no log line with {what:?} within 30 s"));
        if l.contains(what) {
            return;
        }
    };
    for i in 0..4u8 {
        let mut g = guest_dials_host(&a, 7);
        let mut peer = at4
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("connection {i} never reached 4"));
        g.write_all(&[i]).unwrap();
        g.shutdown(std::net::Shutdown::Write).unwrap();
        let mut got = Vec::new();
        peer.read_to_end(&mut got).unwrap();
        assert_eq!(got, [i], "connection {i}");
        drop(peer);
        assert_eq!(read_all(g), b"");
        wait_log(&format!("closed 3:7 -> 4:7 (conn {})", i + 1));
    }
    assert!(
        child.child_mut().try_wait().unwrap().is_none(),
        "the bridge exited"
    );
}

#[test]
fn bad_arguments_are_refused_with_the_value_named_and_nothing_created() {
    let d = Dir::new();
    // Both members hybrid in every case, so that even a wrongly accepted line would open no
    // AF_VSOCK socket on this host.
    let x = format!("3=hybrid:{}", d.path("x").display());
    let y = format!("4=hybrid:{}", d.path("y").display());
    let run = |args: &[&str]| {
        let out = Command::new(nsfast_bin())
            .args(["vsock", "bridge", "--vm", &y])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = run(&["--group", "3,4", "--ports", "5000,0", "--vm", &x]);
    assert!(
        e.contains("invalid port \"0\" in --ports: must be 1-4294967294"),
        "{e}"
    );
    let e = run(&["--group", "3,4", "--ports", "6010-6000", "--vm", &x]);
    assert!(e.contains("invalid range \"6010-6000\" in --ports"), "{e}");
    let e = run(&["--group", "3,4", "--ports", "5", "--ports", "5", "--vm", &x]);
    assert!(e.contains("port 5 is listed twice"), "{e}");
    let e = run(&["--group", "2,4", "--ports", "5", "--vm", &x]);
    assert!(
        e.contains("invalid CID \"2\" in --group: out of range (guest CIDs are 3-4294967294)"),
        "{e}"
    );
    let e = run(&[
        "--group", "3,4", "--ports", "5", "--vm", &x, "--vm", "5=vsock",
    ]);
    assert!(e.contains("--vm 5=vsock: CID 5 is in no --group"), "{e}");
    let e = run(&["--group", "3,4", "--ports", "5", "--vm", "3=tcp:1"]);
    let e2 = run(&["--group", "3,4", "--ports", "5", "--vm", &x, "--vm", &x]);
    assert!(e2.contains("--vm given twice for CID 3"), "{e2}");
    assert!(e.contains("expected CID=vsock or CID=hybrid:PATH"), "{e}");
    let e = run(&["--ports", "5", "--vm", &x]);
    assert!(e.contains("--group"), "{e}");
    let e = run(&["--group", "3,4", "--vm", &x]);
    assert!(e.contains("--ports"), "{e}");
    let e = run(&[
        "--group",
        "3,4",
        "--ports",
        "5",
        "--max-conns",
        "0",
        "--vm",
        &x,
    ]);
    assert!(e.contains("--max-conns must be at least 1"), "{e}");
    assert!(d.files().is_empty(), "{:?}", d.files());
}
