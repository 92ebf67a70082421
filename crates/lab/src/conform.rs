//! The conformance cases of the shortcut (`nsfast-testpeer conform`): one socket behaviour per
//! case, run on one TCP connection whose two ends this process holds (the listening end made in
//! one network namespace, the connecting end in another, as two pods or two processes of an
//! accelerated cgroup would have them). Each case returns what the application observed, as a
//! JSON object; a test runs the same case on plain TCP and through each shortcut and compares
//! the objects, so an observation must be a property TCP guarantees, never a timing.
//!
//! Every case first exchanges a hello in both directions and reads it with `recv`, so both
//! directions are past the shortcut's gate (a direction redirects only into a receiver that
//! has been seen reading): what follows the hello is what the shortcut carries.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use nsfast_sys::netns::NetNs;

/// Every case, in the order the suite runs them.
pub const CASES: &[&str] = &[
    "read-variants",
    "peek",
    "waitall",
    "dontwait",
    "writev",
    "sendfile",
    "splice-only",
    "recv-then-splice",
    "zerocopy",
    "zerocopy-established",
    "fionread",
    "siocoutq",
    "rcvlowat",
    "poll",
    "epoll-lt",
    "epoll-et",
    "io-uring",
    "half-close",
    "blocking-read-at-fin",
    "rst",
    "oob",
    "ktls",
    "tcp-info",
];

/// How long the sender's bytes get to arrive before the receiver looks: ample on a loaded
/// 2-CPU host and in a TCG guest, where a loopback round trip takes a few ms.
const SETTLE: Duration = Duration::from_millis(200);

/// Runs `case` on a fresh connection to `listen` (made in `server_ns`, connected from
/// `client_ns`; `None`: this process's namespace) and returns its observations.
pub fn run(
    case: &str,
    listen: SocketAddr,
    server_ns: Option<&str>,
    client_ns: Option<&str>,
) -> Result<Value> {
    let l = in_ns(server_ns, move || {
        TcpListener::bind(listen).with_context(|| format!("bind {listen}"))
    })?;
    let addr = l.local_addr()?;
    // The zero-copy case turns SO_ZEROCOPY on before connecting, as a client does.
    let zerocopy_first = case == "zerocopy";
    let c = in_ns(client_ns, move || -> Result<TcpStream> {
        let dom = socket2::Domain::for_address(addr);
        let sock = socket2::Socket::new(dom, socket2::Type::STREAM, None)?;
        if zerocopy_first {
            nsfast_sys::zerocopy::enable(sock.as_fd())?;
        }
        sock.connect(&addr.into())
            .with_context(|| format!("connect {addr}"))?;
        Ok(sock.into())
    })?;
    let (s, _) = l.accept()?;
    for sock in [&c, &s] {
        sock.set_read_timeout(Some(Duration::from_secs(10)))?;
        sock.set_nodelay(true)?;
    }
    hello(&c, &s, case)?;
    let mut case_run = Case {
        c,
        s,
        obs: Map::new(),
    };
    case_run.run(case)?;
    Ok(Value::Object(case_run.obs))
}

/// `f` run in network namespace `ns` (a name or path; `None`: this thread's own).
fn in_ns<R: Send + 'static>(
    ns: Option<&str>,
    f: impl FnOnce() -> Result<R> + Send + 'static,
) -> Result<R> {
    match ns {
        None => f(),
        Some(n) => NetNs::open(n)
            .with_context(|| format!("open netns {n}"))?
            .run(f)
            .map_err(anyhow::Error::from)?,
    }
}

/// Both directions carry a hello, read with recv: both gates are open afterwards. The server
/// reads its hello as the case reads everything (splice, MSG_WAITALL) where the case is about
/// such a reader.
fn hello(c: &TcpStream, s: &TcpStream, case: &str) -> Result<()> {
    (&*c).write_all(b"hi")?;
    match case {
        "splice-only" => {
            let (pr, pw) = nix::unistd::pipe()?;
            let mut n = 0;
            while n < 2 {
                n += nix::fcntl::splice(
                    s.as_fd(),
                    None,
                    pw.as_fd(),
                    None,
                    2 - n,
                    nix::fcntl::SpliceFFlags::empty(),
                )?;
            }
            let mut b = [0u8; 2];
            nix::unistd::read(pr.as_fd(), &mut b)?;
        }
        "waitall" => {
            recv(s.as_fd(), 2, libc::MSG_WAITALL)?;
        }
        _ => {
            recv_exact(s, 2, "hello at the server")?;
        }
    }
    (&*s).write_all(b"ok")?;
    recv_exact(c, 2, "hello at the client")?;
    Ok(())
}

fn recv_exact(s: &TcpStream, n: usize, what: &str) -> Result<Vec<u8>> {
    let mut got = vec![0u8; n];
    (&*s)
        .read_exact(&mut got)
        .with_context(|| format!("reading {what}"))?;
    Ok(got)
}

/// The result of a call as an observation: the bytes (as text) or the errno's name.
fn bytes_or_err(r: std::io::Result<Vec<u8>>) -> Value {
    match r {
        Ok(b) => json!(String::from_utf8_lossy(&b)),
        Err(e) => json!(errno_name(&e)),
    }
}

pub(crate) fn errno_name(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => format!("{:?}", nix::errno::Errno::from_raw(n)),
        None => format!("{:?}", e.kind()),
    }
}

/// `recv(2)` with `flags` into a buffer of `len` bytes.
fn recv(fd: BorrowedFd<'_>, len: usize, flags: i32) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    // SAFETY: recv writes at most `len` bytes into `buf`, which is `len` bytes long; the fd is
    // borrowed and open for the call.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), len, flags) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// `send(2)` with `flags`.
fn send(fd: BorrowedFd<'_>, data: &[u8], flags: i32) -> std::io::Result<usize> {
    // SAFETY: send reads `data.len()` bytes from `data`; the fd is borrowed and open.
    let n = unsafe { libc::send(fd.as_raw_fd(), data.as_ptr().cast(), data.len(), flags) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// An `int` ioctl that reports a count (FIONREAD/SIOCINQ, SIOCOUTQ, SIOCATMARK).
fn ioctl_int(fd: BorrowedFd<'_>, req: libc::c_ulong) -> std::io::Result<i32> {
    let mut v: libc::c_int = 0;
    // SAFETY: these ioctls write one c_int through the pointer, which refers to `v`; the fd is
    // borrowed and open.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, &mut v) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(v)
}

fn setsockopt_int(fd: BorrowedFd<'_>, level: i32, name: i32, v: i32) -> std::io::Result<()> {
    // SAFETY: the option value is one c_int read from `v` with its size; the fd is open.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&v as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `poll(2)` for `events` on one fd: the returned events, 0 on timeout.
fn poll1(fd: BorrowedFd<'_>, events: i16, timeout_ms: i32) -> Result<i16> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: one pollfd, the array length passed is 1; the fd is open.
    let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    if r < 0 {
        bail!("poll: {}", std::io::Error::last_os_error());
    }
    Ok(p.revents)
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn sha(b: &[u8]) -> String {
    format!("{:x}", Sha256::digest(b))
}

struct Case {
    c: TcpStream,
    s: TcpStream,
    obs: Map<String, Value>,
}

impl Case {
    /// Records observation `k`.
    fn o(&mut self, k: &str, v: Value) {
        self.obs.insert(k.to_string(), v);
    }

    fn run(&mut self, case: &str) -> Result<()> {
        match case {
            "read-variants" => self.read_variants(),
            "peek" => self.peek(),
            "waitall" => self.waitall(),
            "dontwait" => self.dontwait(),
            "writev" => self.writev(),
            "sendfile" => self.sendfile(),
            "splice-only" => self.splice(false),
            "recv-then-splice" => self.splice(true),
            "zerocopy" => self.zerocopy(),
            "zerocopy-established" => self.zerocopy_established(),
            "fionread" => self.fionread(),
            "siocoutq" => self.siocoutq(),
            "rcvlowat" => self.rcvlowat(),
            "poll" => self.poll(),
            "epoll-lt" => self.epoll(false),
            "epoll-et" => self.epoll(true),
            "io-uring" => self.io_uring(),
            "half-close" => self.half_close(),
            "blocking-read-at-fin" => self.blocking_read_at_fin(),
            "rst" => self.rst(),
            "oob" => self.oob(),
            "ktls" => self.ktls(),
            "tcp-info" => self.tcp_info(),
            other => bail!("unknown case {other:?}: one of {}", CASES.join(", ")),
        }
    }

    fn sfd(&self) -> BorrowedFd<'_> {
        self.s.as_fd()
    }

    fn cfd(&self) -> BorrowedFd<'_> {
        self.c.as_fd()
    }

    /// read(2), recv(2) and readv(2) take bytes in order across the sender's writes.
    fn read_variants(&mut self) -> Result<()> {
        for w in [&b"abc"[..], b"defg", b"hij"] {
            (&self.c).write_all(w)?;
        }
        std::thread::sleep(SETTLE);
        let mut b4 = [0u8; 4];
        let n = (&self.s).read(&mut b4)?;
        self.o("read4", json!(String::from_utf8_lossy(&b4[..n])));
        self.o("recv2", bytes_or_err(recv(self.sfd(), 2, 0)));
        let (mut a, mut b) = ([0u8; 3], [0u8; 10]);
        let n = nix::sys::uio::readv(
            self.sfd(),
            &mut [
                std::io::IoSliceMut::new(&mut a),
                std::io::IoSliceMut::new(&mut b),
            ],
        )?;
        let mut got = a.to_vec();
        got.extend_from_slice(&b);
        got.truncate(n);
        self.o("readv", json!(String::from_utf8_lossy(&got)));
        self.o(
            "then",
            bytes_or_err(recv(self.sfd(), 16, libc::MSG_DONTWAIT)),
        );
        Ok(())
    }

    /// MSG_PEEK leaves the bytes queued; a later read returns them.
    fn peek(&mut self) -> Result<()> {
        (&self.c).write_all(b"hello ")?;
        (&self.c).write_all(b"world")?;
        std::thread::sleep(SETTLE);
        self.o("peek5", bytes_or_err(recv(self.sfd(), 5, libc::MSG_PEEK)));
        self.o("peek64", bytes_or_err(recv(self.sfd(), 64, libc::MSG_PEEK)));
        self.o("recv64", bytes_or_err(recv(self.sfd(), 64, 0)));
        self.o(
            "then",
            bytes_or_err(recv(self.sfd(), 16, libc::MSG_DONTWAIT)),
        );
        Ok(())
    }

    /// MSG_WAITALL returns the whole request although the sender writes it in pieces.
    fn waitall(&mut self) -> Result<()> {
        let c = self.c.try_clone()?;
        let t = std::thread::spawn(move || -> std::io::Result<()> {
            for i in 0..4u8 {
                std::thread::sleep(Duration::from_millis(50));
                (&c).write_all(&[b'a' + i; 25])?;
            }
            Ok(())
        });
        let r = recv(self.sfd(), 100, libc::MSG_WAITALL);
        t.join().expect("writer")?;
        self.o("len", json!(r.as_ref().map(|b| b.len()).ok()));
        self.o("sha", json!(r.as_ref().map(|b| sha(b)).ok()));
        Ok(())
    }

    /// MSG_DONTWAIT: EAGAIN on an empty queue, the bytes once they are there.
    fn dontwait(&mut self) -> Result<()> {
        self.o(
            "empty",
            bytes_or_err(recv(self.sfd(), 16, libc::MSG_DONTWAIT)),
        );
        (&self.c).write_all(b"0123456789")?;
        std::thread::sleep(SETTLE);
        self.o(
            "after",
            bytes_or_err(recv(self.sfd(), 64, libc::MSG_DONTWAIT)),
        );
        Ok(())
    }

    /// Reads the server end until `n` bytes arrived; returns their hash.
    fn read_n(&self, n: usize) -> Result<String> {
        let mut got = vec![0u8; n];
        (&self.s)
            .read_exact(&mut got)
            .context("reading the bytes")?;
        Ok(sha(&got))
    }

    /// writev(2) sends its buffers in order.
    fn writev(&mut self) -> Result<()> {
        let (a, b, c) = (pattern(1000, 1), pattern(70_000, 2), pattern(3, 3));
        let mut want = a.clone();
        want.extend_from_slice(&b);
        want.extend_from_slice(&c);
        let mut sent = 0;
        let iov = [
            std::io::IoSlice::new(&a),
            std::io::IoSlice::new(&b),
            std::io::IoSlice::new(&c),
        ];
        // One writev call; a short write is finished with write_all.
        sent += nix::sys::uio::writev(self.cfd(), &iov)?;
        (&self.c).write_all(&want[sent..])?;
        self.o("sha", json!(self.read_n(want.len())? == sha(&want)));
        Ok(())
    }

    /// sendfile(2) from a file: the receiver gets the file.
    fn sendfile(&mut self) -> Result<()> {
        let data = pattern(1 << 20, 9);
        let path = std::env::temp_dir().join(format!("nsfast-conform-{}", std::process::id()));
        std::fs::write(&path, &data)?;
        let f = std::fs::File::open(&path)?;
        let _ = std::fs::remove_file(&path);
        let c = self.c.try_clone()?;
        let t = std::thread::spawn(move || -> Result<usize> {
            let mut off: i64 = 0;
            let mut total = 0;
            while total < 1 << 20 {
                let n =
                    nix::sys::sendfile::sendfile(c.as_fd(), f.as_fd(), Some(&mut off), 1 << 20)?;
                if n == 0 {
                    break;
                }
                total += n;
            }
            Ok(total)
        });
        let got = self.read_n(data.len())?;
        let sent = t.join().expect("sendfile thread")?;
        self.o("sent", json!(sent));
        self.o("same", json!(got == sha(&data)));
        Ok(())
    }

    /// A reader that splices into a pipe (Go's io.Copy, HAProxy) gets every byte; with
    /// `recv_first` it has read with recv before (the hello) and then the first bytes.
    fn splice(&mut self, recv_first: bool) -> Result<()> {
        let data = pattern(256 << 10, 5);
        let mut head = 0;
        let mut got = Vec::with_capacity(data.len());
        if recv_first {
            (&self.c).write_all(&data[..1000])?;
            got.extend(recv_exact(&self.s, 1000, "the first bytes")?);
            head = 1000;
        }
        let c = self.c.try_clone()?;
        let rest = data[head..].to_vec();
        let t = std::thread::spawn(move || (&c).write_all(&rest));
        let (pr, pw) = nix::unistd::pipe()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.len() < data.len() && Instant::now() < deadline {
            if poll1(self.sfd(), libc::POLLIN, 100)? == 0 {
                continue;
            }
            let n = match nix::fcntl::splice(
                self.sfd(),
                None,
                pw.as_fd(),
                None,
                64 << 10,
                nix::fcntl::SpliceFFlags::SPLICE_F_NONBLOCK,
            ) {
                Ok(0) => break,
                Ok(n) => n,
                Err(nix::errno::Errno::EAGAIN) => continue,
                Err(e) => {
                    // A refused splice (the guard's EINVAL): read(2) instead, as Go and
                    // HAProxy do.
                    self.o("fell_back_to_read_on", json!(format!("{e:?}")));
                    let mut b = vec![0u8; 64 << 10];
                    let n = (&self.s).read(&mut b)?;
                    got.extend_from_slice(&b[..n]);
                    continue;
                }
            };
            let mut b = vec![0u8; n];
            nix::unistd::read(pr.as_fd(), &mut b)?;
            got.extend_from_slice(&b);
        }
        t.join().expect("writer")?;
        self.o("got", json!(got.len()));
        self.o("same", json!(sha(&got) == sha(&data)));
        Ok(())
    }

    /// SO_ZEROCOPY turned on for a connection that is already carrying bytes: what it
    /// answers, and with it on, the sends complete.
    fn zerocopy_established(&mut self) -> Result<()> {
        match nsfast_sys::zerocopy::enable(self.cfd()) {
            Ok(()) => {
                self.o("enable", json!("ok"));
                self.zerocopy()
            }
            Err(e) => {
                self.o("enable", json!(errno_name(&e)));
                Ok(())
            }
        }
    }

    /// MSG_ZEROCOPY sends (SO_ZEROCOPY turned on before connecting) complete: their
    /// notifications arrive on the error queue.
    fn zerocopy(&mut self) -> Result<()> {
        // Kept until the completions arrived: the kernel may read it until then.
        let data = std::sync::Arc::new(pattern(64 << 10, 7));
        let keep = data.clone();
        let c = self.c.try_clone()?;
        let t = std::thread::spawn(move || -> std::io::Result<usize> {
            let mut calls = 0;
            for _ in 0..4 {
                let mut off = 0;
                while off < data.len() {
                    match send(c.as_fd(), &data[off..], libc::MSG_ZEROCOPY) {
                        Ok(n) => {
                            off += n;
                            calls += 1;
                        }
                        Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                            std::thread::sleep(Duration::from_millis(5))
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            Ok(calls)
        });
        let got = self.read_n(4 * (64 << 10))?;
        let calls = t.join().expect("sender")?;
        let mut done = 0u64;
        let deadline = Instant::now() + Duration::from_secs(3);
        while done < calls as u64 && Instant::now() < deadline {
            let mut v = Vec::new();
            poll1(self.cfd(), 0, 100)?;
            nsfast_sys::zerocopy::read_completions(self.cfd(), &mut v)?;
            done += v
                .iter()
                .map(|c| u64::from(c.hi.wrapping_sub(c.lo)) + 1)
                .sum::<u64>();
        }
        let want = sha(&keep.repeat(4));
        drop(keep);
        self.o("same", json!(got == want));
        self.o("all_sends_completed", json!(done == calls as u64));
        Ok(())
    }

    /// FIONREAD (SIOCINQ) counts the bytes queued for reading.
    fn fionread(&mut self) -> Result<()> {
        (&self.c).write_all(&pattern(1000, 1))?;
        std::thread::sleep(SETTLE);
        self.o("queued", json!(ioctl_int(self.sfd(), libc::FIONREAD)?));
        recv_exact(&self.s, 400, "400 bytes")?;
        self.o("after_400", json!(ioctl_int(self.sfd(), libc::FIONREAD)?));
        recv_exact(&self.s, 600, "600 bytes")?;
        self.o("after_all", json!(ioctl_int(self.sfd(), libc::FIONREAD)?));
        Ok(())
    }

    /// SIOCOUTQ: nothing is left unacknowledged once the receiver has read everything.
    fn siocoutq(&mut self) -> Result<()> {
        (&self.c).write_all(&pattern(100_000, 1))?;
        self.read_n(100_000)?;
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut q = ioctl_int(self.cfd(), libc::TIOCOUTQ)?;
        while q != 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            q = ioctl_int(self.cfd(), libc::TIOCOUTQ)?;
        }
        self.o("outq_after_read", json!(q));
        Ok(())
    }

    /// SO_RCVLOWAT: poll and read wait for that many bytes.
    fn rcvlowat(&mut self) -> Result<()> {
        setsockopt_int(self.sfd(), libc::SOL_SOCKET, libc::SO_RCVLOWAT, 100)?;
        (&self.c).write_all(&[1u8; 50])?;
        std::thread::sleep(SETTLE);
        self.o(
            "readable_at_50",
            json!(poll1(self.sfd(), libc::POLLIN, 100)? & libc::POLLIN != 0),
        );
        (&self.c).write_all(&[2u8; 60])?;
        std::thread::sleep(SETTLE);
        self.o(
            "readable_at_110",
            json!(poll1(self.sfd(), libc::POLLIN, 1000)? & libc::POLLIN != 0),
        );
        self.o(
            "read",
            json!(recv(self.sfd(), 256, libc::MSG_DONTWAIT)
                .map(|b| b.len())
                .ok()),
        );
        Ok(())
    }

    /// poll: not readable before the bytes, readable after, writable throughout.
    fn poll(&mut self) -> Result<()> {
        let ev = libc::POLLIN | libc::POLLOUT;
        self.o("before", json!(poll1(self.sfd(), ev, 100)?));
        (&self.c).write_all(b"x")?;
        std::thread::sleep(SETTLE);
        self.o("after", json!(poll1(self.sfd(), ev, 100)?));
        recv_exact(&self.s, 1, "the byte")?;
        self.o("drained", json!(poll1(self.sfd(), ev, 100)?));
        Ok(())
    }

    /// epoll, level- or edge-triggered: which waits report the receiver readable.
    fn epoll(&mut self, edge: bool) -> Result<()> {
        use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
        let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        let mut flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP;
        if edge {
            flags |= EpollFlags::EPOLLET;
        }
        ep.add(self.sfd(), EpollEvent::new(flags, 1))?;
        let wait = || -> Result<Value> {
            let mut evs = [EpollEvent::empty(); 4];
            let n = ep.wait(&mut evs, EpollTimeout::from(100u16))?;
            Ok(json!(evs[..n]
                .iter()
                .map(|e| e.events().bits())
                .collect::<Vec<_>>()))
        };
        let empty = wait()?;
        (&self.c).write_all(b"abc")?;
        std::thread::sleep(SETTLE);
        let first = wait()?;
        let again = wait()?;
        (&self.c).write_all(b"def")?;
        std::thread::sleep(SETTLE);
        let more = wait()?;
        recv_exact(&self.s, 6, "six bytes")?;
        let drained = wait()?;
        self.c.shutdown(std::net::Shutdown::Write)?;
        std::thread::sleep(SETTLE);
        let fin = wait()?;
        for (k, v) in [
            ("empty", empty),
            ("first", first),
            ("again", again),
            ("more", more),
            ("drained", drained),
            ("fin", fin),
        ] {
            self.o(k, v);
        }
        Ok(())
    }

    /// io_uring send and recv carry the bytes as send(2) and recv(2) do.
    fn io_uring(&mut self) -> Result<()> {
        use io_uring::{opcode, types, IoUring};
        let mut ring = match IoUring::new(8) {
            Ok(r) => r,
            Err(e) => {
                self.o("ring", json!(errno_name(&e)));
                return Ok(());
            }
        };
        let data = pattern(100_000, 4);
        let mut buf = vec![0u8; data.len()];
        let mut got = Vec::new();
        let send = opcode::Send::new(
            types::Fd(self.c.as_raw_fd()),
            data.as_ptr(),
            data.len() as u32,
        )
        .build()
        .user_data(1);
        // SAFETY: `data` outlives the submission: the loop below waits for its completion
        // before `data` is dropped.
        unsafe { ring.submission().push(&send) }.context("submission queue full")?;
        let mut sent_done = false;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut sent = 0;
        while (!sent_done || got.len() < sent) && Instant::now() < deadline {
            if sent_done || got.len() < data.len() {
                let recv = opcode::Recv::new(
                    types::Fd(self.s.as_raw_fd()),
                    buf.as_mut_ptr(),
                    buf.len() as u32,
                )
                .build()
                .user_data(2);
                // SAFETY: `buf` outlives the submission: it is completed (waited for below)
                // before the next one is pushed and before `buf` is dropped.
                unsafe { ring.submission().push(&recv) }.context("submission queue full")?;
            }
            let mut recv_done = false;
            while !recv_done {
                ring.submit_and_wait(1)?;
                let cqes: Vec<_> = ring.completion().collect();
                for cqe in cqes {
                    match cqe.user_data() {
                        1 => {
                            if cqe.result() < 0 {
                                bail!("io_uring send: errno {}", -cqe.result());
                            }
                            sent = cqe.result() as usize;
                            sent_done = true;
                        }
                        _ => {
                            if cqe.result() < 0 {
                                bail!("io_uring recv: errno {}", -cqe.result());
                            }
                            got.extend_from_slice(&buf[..cqe.result() as usize]);
                            recv_done = true;
                        }
                    }
                }
            }
        }
        // A send may be short (as send(2)): the bytes it took arrived, in order.
        self.o("same", json!(sent > 0 && sha(&got) == sha(&data[..sent])));
        Ok(())
    }

    /// Half-close both ways: each side reads the other's bytes, then end of file.
    fn half_close(&mut self) -> Result<()> {
        (&self.c).write_all(b"request")?;
        self.c.shutdown(std::net::Shutdown::Write)?;
        let mut req = Vec::new();
        (&self.s).read_to_end(&mut req)?;
        (&self.s).write_all(b"response")?;
        self.s.shutdown(std::net::Shutdown::Write)?;
        let mut resp = Vec::new();
        (&self.c).read_to_end(&mut resp)?;
        self.o("server_got", json!(String::from_utf8_lossy(&req)));
        self.o("client_got", json!(String::from_utf8_lossy(&resp)));
        Ok(())
    }

    /// A blocking read that waits when the peer closes its side returns 0 (end of file).
    fn blocking_read_at_fin(&mut self) -> Result<()> {
        let c = self.c.try_clone()?;
        let t = std::thread::spawn(move || {
            std::thread::sleep(SETTLE);
            c.shutdown(std::net::Shutdown::Write)
        });
        let mut b = [0u8; 16];
        let r = (&self.s).read(&mut b);
        t.join().expect("closer")?;
        self.o(
            "read",
            match r {
                Ok(n) => json!(n),
                Err(e) => json!(errno_name(&e)),
            },
        );
        Ok(())
    }

    /// A reset (SO_LINGER 0): bytes that arrived before it are read, then ECONNRESET.
    fn rst(&mut self) -> Result<()> {
        (&self.c).write_all(b"before")?;
        std::thread::sleep(SETTLE);
        socket2::SockRef::from(&self.c).set_linger(Some(Duration::ZERO))?;
        // Closing the client's only handle sends the reset.
        let c = std::mem::replace(&mut self.c, self.s.try_clone()?);
        drop(c);
        std::thread::sleep(SETTLE);
        self.o("first", bytes_or_err(recv(self.sfd(), 64, 0)));
        self.o("second", bytes_or_err(recv(self.sfd(), 64, 0)));
        Ok(())
    }

    /// MSG_OOB: the urgent byte is read with MSG_OOB, the others in line.
    fn oob(&mut self) -> Result<()> {
        send(self.cfd(), b"ab", 0)?;
        send(self.cfd(), b"!", libc::MSG_OOB)?;
        send(self.cfd(), b"cd", 0)?;
        std::thread::sleep(SETTLE);
        self.o("urgent", bytes_or_err(recv(self.sfd(), 1, libc::MSG_OOB)));
        let mut got = Vec::new();
        while let Ok(b) = recv(self.sfd(), 64, libc::MSG_DONTWAIT) {
            if b.is_empty() {
                break;
            }
            got.extend(b);
        }
        self.o("inline", json!(String::from_utf8_lossy(&got)));
        Ok(())
    }

    /// kTLS (TCP_ULP "tls", AES-GCM-128 keys set on both ends): the receiver decrypts what
    /// the sender encrypted.
    fn ktls(&mut self) -> Result<()> {
        let ulp = |fd: BorrowedFd<'_>| -> std::io::Result<()> {
            // SAFETY: the option value is the 4 bytes of "tls" with their length; fd is open.
            let r = unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_TCP,
                    libc::TCP_ULP,
                    b"tls".as_ptr().cast(),
                    3,
                )
            };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        };
        if let Err(e) = ulp(self.cfd()) {
            self.o("ulp", json!(errno_name(&e)));
            return Ok(());
        }
        if let Err(e) = ulp(self.sfd()) {
            self.o("server_ulp", json!(errno_name(&e)));
            return Ok(());
        }
        let info = libc::tls12_crypto_info_aes_gcm_128 {
            info: libc::tls_crypto_info {
                version: libc::TLS_1_2_VERSION,
                cipher_type: libc::TLS_CIPHER_AES_GCM_128,
            },
            iv: [1; 8],
            key: [2; 16],
            salt: [3; 4],
            rec_seq: [0; 8],
        };
        let set = |fd: BorrowedFd<'_>, dir: i32| -> std::io::Result<()> {
            // SAFETY: the option value is `info`, a tls12_crypto_info_aes_gcm_128, passed
            // with its size; fd is open.
            let r = unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_TLS,
                    dir,
                    (&info as *const libc::tls12_crypto_info_aes_gcm_128).cast(),
                    std::mem::size_of_val(&info) as libc::socklen_t,
                )
            };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        };
        // A refused step is what the application sees (it would fall back to TLS in user
        // space), so it is the observation, not the peer's failure.
        if let Err(e) = set(self.cfd(), libc::TLS_TX) {
            self.o("tls_tx", json!(errno_name(&e)));
            return Ok(());
        }
        if let Err(e) = set(self.sfd(), libc::TLS_RX) {
            self.o("tls_rx", json!(errno_name(&e)));
            return Ok(());
        }
        let data = pattern(100_000, 8);
        let c = self.c.try_clone()?;
        let d = data.clone();
        let t = std::thread::spawn(move || (&c).write_all(&d));
        let got = self.read_n(data.len());
        t.join().expect("writer")?;
        self.o("same", json!(got.ok() == Some(sha(&data))));
        Ok(())
    }

    /// TCP_INFO's byte counters count the bytes the connection carried.
    fn tcp_info(&mut self) -> Result<()> {
        let n = 200_000usize;
        (&self.c).write_all(&pattern(n, 6))?;
        self.read_n(n)?;
        std::thread::sleep(SETTLE);
        // linux/tcp.h's struct tcp_info: tcpi_bytes_acked at byte 120, tcpi_bytes_received
        // at 128 (both since Linux 4.1; libc's tcp_info stops before them).
        let info = |fd: BorrowedFd<'_>| -> std::io::Result<(u64, u64)> {
            let mut b = [0u8; 256];
            let mut len = b.len() as libc::socklen_t;
            // SAFETY: getsockopt writes at most `len` bytes into `b`, which is that long.
            let r = unsafe {
                libc::getsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_TCP,
                    libc::TCP_INFO,
                    b.as_mut_ptr().cast(),
                    &mut len,
                )
            };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().expect("8 bytes"));
            Ok((at(120), at(128)))
        };
        let ci = info(self.cfd())?;
        let si = info(self.sfd())?;
        // The hello is 2 bytes each way before the case's bytes.
        self.o("client_bytes_acked_covers", json!(ci.0 >= (n + 2) as u64));
        self.o(
            "server_bytes_received_covers",
            json!(si.1 >= (n + 2) as u64),
        );
        Ok(())
    }
}
