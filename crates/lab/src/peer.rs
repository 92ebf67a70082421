//! `nsfast-testpeer`: the traffic program of nsfast's integration tests. Every mode prints one
//! JSON object on stdout when it finishes and exits non-zero (with the reason on stderr) on any
//! error or timeout, so a test can never hang or pass silently.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::stream::ByteStream;

#[derive(Parser, Debug)]
#[command(
    name = "nsfast-testpeer",
    about = "Traffic peer for nsfast's integration tests"
)]
pub struct Args {
    /// Give up (exit 1) after this many seconds.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    #[command(subcommand)]
    pub mode: Mode,
}

#[derive(Subcommand, Debug)]
pub enum Mode {
    /// Accept one connection; send BYTES of stream SEED while receiving until EOF.
    BidirServer {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        bytes: u64,
        #[arg(long)]
        seed: u64,
    },
    /// Connect; send BYTES of stream SEED while receiving until EOF.
    BidirClient {
        #[arg(long)]
        connect: SocketAddr,
        #[arg(long)]
        bytes: u64,
        #[arg(long)]
        seed: u64,
        /// After connecting, send nothing until this file exists (lets a test act between
        /// the connection and its data, then say so by creating the file).
        #[arg(long)]
        start_when: Option<std::path::PathBuf>,
        /// Send at most this many bytes per second (0: unlimited).
        #[arg(long, default_value_t = 0)]
        rate: u64,
    },
    /// Echo every connection until COUNT connections have finished (0: forever).
    EchoServer {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long, default_value_t = 0)]
        count: u64,
    },
    /// Open CONNS connections at once (one after another with --sequential, as a TCP_CRR
    /// client does); each sends SIZE checksummed bytes and checks the echo.
    Many {
        #[arg(long)]
        connect: SocketAddr,
        #[arg(long)]
        conns: u64,
        #[arg(long)]
        size: usize,
        #[arg(long)]
        sequential: bool,
    },
    /// ROUNDS round trips of SIZE bytes against an echo server, checking every reply.
    Pingpong {
        #[arg(long)]
        connect: SocketAddr,
        #[arg(long)]
        rounds: u64,
        #[arg(long, default_value_t = 64)]
        size: usize,
    },
    /// One connection to an echo server: ROUNDS round trips of SIZE bytes, then nothing until
    /// a line (or end of file) on standard input, then ROUNDS more; every reply checked.
    /// Prints "idle" on standard error when the first round trips are done.
    IdleClient {
        #[arg(long)]
        connect: SocketAddr,
        #[arg(long)]
        rounds: u64,
        #[arg(long, default_value_t = 1000)]
        size: usize,
    },
    /// Accept one connection, read until EOF, reply with the SHA-256 of what was read, close.
    HalfcloseServer {
        #[arg(long)]
        listen: SocketAddr,
    },
    /// Send BYTES, shutdown(SHUT_WR), read the reply until EOF and check it.
    HalfcloseClient {
        #[arg(long)]
        connect: SocketAddr,
        #[arg(long)]
        bytes: u64,
    },
    /// Accept one connection; wait until BYTES are queued, report FIONREAD, then read them.
    FionreadServer {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        bytes: usize,
    },
    /// Serve one connection: read RECV_FIRST bytes with read(2), the rest with splice(2) into a
    /// pipe (as HAProxy, Go's io.Copy and splice relays do) until EOF, falling back to read(2)
    /// when splice says EINVAL (reported in `failed`); report the byte count and SHA-256.
    SpliceServer {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long, default_value_t = 0)]
        recv_first: u64,
    },
    /// Serve one connection: read READ_FIRST bytes, then nothing for HOLD_MS, then read until
    /// EOF; report the byte count and SHA-256.
    HoldServer {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long, default_value_t = 0)]
        read_first: u64,
        #[arg(long)]
        hold_ms: u64,
    },
    /// Connect, send BYTES (ByteStream seed 5) as fast as the socket takes them, shut down the
    /// write side and wait for EOF; report in `value` how many bytes the socket had taken after
    /// FOR_MS (0: not measured), in `detail` the SHA-256 of all.
    StreamClient {
        #[arg(long)]
        connect: SocketAddr,
        #[arg(long)]
        bytes: u64,
        #[arg(long, default_value_t = 0)]
        for_ms: u64,
    },
    /// Connect to FIRST (an echo server) and ping-pong ROUNDS messages; disconnect the socket
    /// (connect(AF_UNSPEC)) and connect it again, to THEN (an echo server); turn SO_ZEROCOPY
    /// on and ping-pong again. `detail`: what SO_ZEROCOPY answered ("ok" or the errno).
    ReconnectClient {
        #[arg(long)]
        first: SocketAddr,
        #[arg(long)]
        then: SocketAddr,
        #[arg(long, default_value_t = 20)]
        rounds: u64,
    },
    /// Connect and send BYTES, then wait for the server to close.
    SendClient {
        #[arg(long)]
        connect: SocketAddr,
        #[arg(long)]
        bytes: u64,
    },
    /// Serve COUNT connections (0: forever): send TAG, then BYTES of stream, then close.
    TagServer {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        tag: String,
        #[arg(long, default_value_t = 4096)]
        bytes: u64,
        #[arg(long, default_value_t = 0)]
        count: u64,
    },
    /// ITERATIONS connections from the fixed source BIND; each must read exactly TAG + BYTES.
    TagClient {
        #[arg(long)]
        connect: SocketAddr,
        #[arg(long)]
        bind: SocketAddr,
        #[arg(long)]
        expect: String,
        #[arg(long, default_value_t = 4096)]
        bytes: u64,
        #[arg(long)]
        iterations: u64,
    },
    /// Run conformance CASE (`nsfast_lab::conform`) on one connection to LISTEN, listening in
    /// SERVER_NETNS and connecting from CLIENT_NETNS (default: this process's namespace);
    /// prints `{"case": CASE, "obs": {...}}`.
    Conform {
        #[arg(long)]
        case: String,
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        server_netns: Option<String>,
        #[arg(long)]
        client_netns: Option<String>,
    },
}

/// Result of the bidirectional modes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BidirReport {
    pub sent: u64,
    pub sent_sha256: String,
    pub received: u64,
    pub received_sha256: String,
}

/// Generic result: counters by name.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    #[serde(default)]
    pub ok: u64,
    #[serde(default)]
    pub failed: u64,
    #[serde(default)]
    pub value: u64,
    #[serde(default)]
    pub elapsed_ms: u64,
    #[serde(default)]
    pub detail: String,
}

pub fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let timeout = Duration::from_secs(args.timeout);
    match rt.block_on(async { tokio::time::timeout(timeout, run(args.mode)).await }) {
        Ok(Ok(json)) => {
            println!("{json}");
            std::process::ExitCode::SUCCESS
        }
        Ok(Err(e)) => {
            eprintln!("nsfast-testpeer: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!(
                "nsfast-testpeer: error: timed out after {} s",
                timeout.as_secs()
            );
            std::process::ExitCode::FAILURE
        }
    }
}

async fn listen(addr: SocketAddr) -> Result<TcpListener> {
    let s = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    s.set_reuseaddr(true)?;
    s.bind(addr).with_context(|| format!("bind {addr}"))?;
    Ok(s.listen(4096)?)
}

async fn connect(addr: SocketAddr) -> Result<TcpStream> {
    TcpStream::connect(addr)
        .await
        .with_context(|| format!("connect {addr}"))
}

/// Runs one mode; each mode is one function below, returning its JSON report.
async fn run(mode: Mode) -> Result<String> {
    match mode {
        Mode::BidirServer {
            listen: a,
            bytes,
            seed,
        } => bidir_server(a, bytes, seed).await,
        Mode::BidirClient {
            connect: a,
            bytes,
            seed,
            start_when,
            rate,
        } => bidir_client(a, bytes, seed, start_when.as_deref(), rate).await,
        Mode::EchoServer { listen: a, count } => echo_server(a, count).await,
        Mode::Many {
            connect: a,
            conns,
            size,
            sequential,
        } => many(a, conns, size, sequential).await,
        Mode::IdleClient {
            connect: a,
            rounds,
            size,
        } => idle_client(a, rounds, size).await,
        Mode::Pingpong {
            connect: a,
            rounds,
            size,
        } => pingpong(a, rounds, size).await,
        Mode::HalfcloseServer { listen: a } => halfclose_server(a).await,
        Mode::HalfcloseClient { connect: a, bytes } => halfclose_client(a, bytes).await,
        Mode::FionreadServer { listen: a, bytes } => fionread_server(a, bytes).await,
        Mode::SendClient { connect: a, bytes } => send_client(a, bytes).await,
        Mode::ReconnectClient {
            first,
            then,
            rounds,
        } => tokio::task::spawn_blocking(move || reconnect_client(first, then, rounds)).await?,
        Mode::SpliceServer {
            listen: a,
            recv_first,
        } => {
            let l = listen(a).await?.into_std()?;
            tokio::task::spawn_blocking(move || splice_server(l, recv_first)).await?
        }
        Mode::HoldServer {
            listen: a,
            read_first,
            hold_ms,
        } => {
            let l = listen(a).await?.into_std()?;
            tokio::task::spawn_blocking(move || hold_server(l, read_first, hold_ms)).await?
        }
        Mode::StreamClient {
            connect: a,
            bytes,
            for_ms,
        } => tokio::task::spawn_blocking(move || stream_client(a, bytes, for_ms)).await?,
        Mode::TagServer {
            listen: a,
            tag,
            bytes,
            count,
        } => tag_server(a, tag, bytes, count).await,
        Mode::TagClient {
            connect: a,
            bind,
            expect,
            bytes,
            iterations,
        } => tag_client(a, bind, expect, bytes, iterations).await,
        Mode::Conform {
            case,
            listen: a,
            server_netns,
            client_netns,
        } => tokio::task::spawn_blocking(move || {
            let obs =
                crate::conform::run(&case, a, server_netns.as_deref(), client_netns.as_deref())?;
            Ok(serde_json::json!({ "case": case, "obs": obs }).to_string())
        })
        .await
        .context("conformance case")?,
    }
}

/// `bidir-server`: Accept one connection; send BYTES of stream SEED while receiving until EOF.
async fn bidir_server(a: SocketAddr, bytes: u64, seed: u64) -> Result<String> {
    let l = listen(a).await?;
    let (s, _) = l.accept().await?;
    Ok(serde_json::to_string(&bidir(s, bytes, seed, 0).await?)?)
}

/// `bidir-client`: Connect; send BYTES of stream SEED while receiving until EOF.
async fn bidir_client(
    a: SocketAddr,
    bytes: u64,
    seed: u64,
    start_when: Option<&Path>,
    rate: u64,
) -> Result<String> {
    let s = connect(a).await?;
    if let Some(p) = start_when {
        // Bounded by the peer's --timeout, like everything it does.
        while !p.exists() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    Ok(serde_json::to_string(&bidir(s, bytes, seed, rate).await?)?)
}

/// `echo-server`: Echo every connection until COUNT connections have finished (0: forever).
async fn echo_server(a: SocketAddr, count: u64) -> Result<String> {
    let l = listen(a).await?;
    let mut tasks = tokio::task::JoinSet::new();
    let mut accepted = 0u64;
    let mut done = 0u64;
    let mut failed = 0u64;
    loop {
        if count != 0 && accepted == count {
            break;
        }
        tokio::select! {
            r = l.accept() => {
                let (s, _) = r?;
                accepted += 1;
                tasks.spawn(echo(s));
            }
            Some(r) = tasks.join_next(), if !tasks.is_empty() => {
                match r { Ok(Ok(())) => done += 1, _ => failed += 1 }
            }
        }
    }
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(Ok(())) => done += 1,
            _ => failed += 1,
        }
    }
    Ok(serde_json::to_string(&Report {
        ok: done,
        failed,
        ..Default::default()
    })?)
}

/// `many`: Open CONNS connections at once, or each after the one before has closed
/// (`sequential`); each sends SIZE checksummed bytes and checks the echo.
async fn many(a: SocketAddr, conns: u64, size: usize, sequential: bool) -> Result<String> {
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..conns {
        if sequential {
            let r = many_one(a, i, size).await;
            tasks.spawn(async move { r });
            continue;
        }
        tasks.spawn(async move { many_one(a, i, size).await });
    }
    let (mut ok, mut failed, mut detail) = (0, 0, String::new());
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(Ok(())) => ok += 1,
            Ok(Err(e)) => {
                failed += 1;
                if detail.is_empty() {
                    detail = format!("{e:#}");
                }
            }
            Err(e) => {
                failed += 1;
                detail = e.to_string();
            }
        }
    }
    Ok(serde_json::to_string(&Report {
        ok,
        failed,
        elapsed_ms: start.elapsed().as_millis() as u64,
        detail,
        ..Default::default()
    })?)
}

/// Round trips against an echo server: messages of one size from one ByteStream, each reply
/// awaited (a stall of 5 s fails) and checked.
struct RoundTrips {
    out: Vec<u8>,
    back: Vec<u8>,
    stream: ByteStream,
}

impl RoundTrips {
    fn new(size: usize, seed: u64) -> Self {
        RoundTrips {
            out: vec![0u8; size],
            back: vec![0u8; size],
            stream: ByteStream::new(seed),
        }
    }

    /// `rounds` round trips on `s`; an error names the round, after `what`.
    async fn run(&mut self, s: &mut TcpStream, rounds: u64, what: &str) -> Result<()> {
        for r in 0..rounds {
            self.stream.fill(&mut self.out);
            s.write_all(&self.out).await?;
            tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut self.back))
                .await
                .with_context(|| format!("{what}round {r}: no reply within 5 s (stall)"))??;
            if self.back != self.out {
                bail!("{what}round {r}: reply differs from request");
            }
        }
        Ok(())
    }
}

/// `pingpong`: ROUNDS round trips of SIZE bytes against an echo server, checking every reply.
async fn pingpong(a: SocketAddr, rounds: u64, size: usize) -> Result<String> {
    let mut s = connect(a).await?;
    s.set_nodelay(true)?;
    let mut rt = RoundTrips::new(size, 7);
    let start = Instant::now();
    rt.run(&mut s, rounds, "").await?;
    Ok(serde_json::to_string(&Report {
        ok: rounds,
        elapsed_ms: start.elapsed().as_millis() as u64,
        ..Default::default()
    })?)
}

/// `idle-client`: round trips, an idle stretch until standard input says go, round trips.
async fn idle_client(a: SocketAddr, rounds: u64, size: usize) -> Result<String> {
    let mut s = connect(a).await?;
    s.set_nodelay(true)?;
    let mut rt = RoundTrips::new(size, 11);
    let start = Instant::now();
    rt.run(&mut s, rounds, "before the idle stretch, ").await?;
    eprintln!("idle");
    let mut line = String::new();
    tokio::task::spawn_blocking(move || std::io::stdin().read_line(&mut line))
        .await?
        .context("read standard input")?;
    rt.run(&mut s, rounds, "after the idle stretch, ").await?;
    Ok(serde_json::to_string(&Report {
        ok: 2 * rounds,
        elapsed_ms: start.elapsed().as_millis() as u64,
        ..Default::default()
    })?)
}

/// `halfclose-server`: Accept one connection, read until EOF, reply with the SHA-256 of what was read, close.
async fn halfclose_server(a: SocketAddr) -> Result<String> {
    let l = listen(a).await?;
    let (mut s, _) = l.accept().await?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0u64;
    loop {
        let r = s.read(&mut buf).await?;
        if r == 0 {
            break;
        }
        n += r as u64;
        h.update(&buf[..r]);
    }
    let reply = format!("{n} {}", hex(&h.finalize()));
    s.write_all(reply.as_bytes()).await?;
    s.shutdown().await?;
    Ok(serde_json::to_string(&Report {
        value: n,
        detail: reply,
        ..Default::default()
    })?)
}

/// `halfclose-client`: Send BYTES, shutdown(SHUT_WR), read the reply until EOF and check it.
async fn halfclose_client(a: SocketAddr, bytes: u64) -> Result<String> {
    let mut s = connect(a).await?;
    let mut stream = ByteStream::new(11);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        stream.fill(&mut buf[..n]);
        h.update(&buf[..n]);
        s.write_all(&buf[..n]).await?;
        left -= n as u64;
    }
    s.shutdown().await?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).await?;
    let want = format!("{bytes} {}", hex(&h.finalize()));
    if reply != want {
        bail!("half-close reply {reply:?}, expected {want:?}");
    }
    Ok(serde_json::to_string(&Report {
        ok: 1,
        value: bytes,
        detail: reply,
        ..Default::default()
    })?)
}

/// `fionread-server`: Accept one connection; wait until BYTES are queued, report FIONREAD, then read them.
async fn fionread_server(a: SocketAddr, bytes: usize) -> Result<String> {
    let l = listen(a).await?;
    let (mut s, _) = l.accept().await?;
    // The hi/ok exchange first (see TAG_HELLO): the bytes after it take the shortcut.
    let mut word = [0u8; 2];
    s.read_exact(&mut word).await.context("reading hi")?;
    s.write_all(TAG_ACK).await?;
    // Wait until all bytes are queued, then read FIONREAD before consuming anything.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut queued;
    loop {
        s.readable().await?;
        queued = fionread(&s)?;
        if queued >= bytes || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut buf = vec![0u8; bytes];
    s.read_exact(&mut buf).await?;
    let after = fionread(&s)?;
    Ok(serde_json::to_string(&Report {
        value: queued as u64,
        ok: u64::from(after == 0),
        detail: format!("fionread before read {queued}, after {after}"),
        ..Default::default()
    })?)
}

/// `send-client`: Connect, say hi and wait for ok (see TAG_HELLO), send BYTES, then wait for
/// the server to close.
/// `reconnect-client`: one socket, two connections (see [`Mode::ReconnectClient`]).
fn reconnect_client(first: SocketAddr, then: SocketAddr, rounds: u64) -> Result<String> {
    use std::io::{Read, Write};
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(first),
        socket2::Type::STREAM,
        None,
    )?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    sock.set_tcp_nodelay(true)?;
    let pingpong = |mut s: &socket2::Socket, what: &str| -> Result<()> {
        let mut b = [0u8; 16];
        for i in 0..rounds {
            let m = format!("{what} {i:>8}");
            s.write_all(m.as_bytes())?;
            s.read_exact(&mut b[..m.len()])
                .with_context(|| format!("{what}: echo of round {i}"))?;
            if &b[..m.len()] != m.as_bytes() {
                bail!("{what}: round {i} echoed {:?}", &b[..m.len()]);
            }
        }
        Ok(())
    };
    sock.connect(&first.into())
        .with_context(|| format!("connect {first}"))?;
    pingpong(&sock, "first")?;
    let unspec = libc::sockaddr {
        sa_family: libc::AF_UNSPEC as libc::sa_family_t,
        sa_data: [0; 14],
    };
    // SAFETY: `unspec` is a valid sockaddr that lives across the call, and its size is passed;
    // the fd is open (owned by `sock`).
    let r = unsafe {
        libc::connect(
            sock.as_raw_fd(),
            &unspec,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error()).context("connect(AF_UNSPEC)");
    }
    sock.connect(&then.into())
        .with_context(|| format!("connect {then} again"))?;
    let zerocopy = match nsfast_sys::zerocopy::enable(std::os::fd::AsFd::as_fd(&sock)) {
        Ok(()) => "ok".to_string(),
        Err(e) => crate::conform::errno_name(&e),
    };
    pingpong(&sock, "then")?;
    Ok(serde_json::to_string(&Report {
        ok: 1,
        detail: zerocopy,
        ..Default::default()
    })?)
}

async fn send_client(a: SocketAddr, bytes: u64) -> Result<String> {
    let mut s = connect(a).await?;
    s.write_all(TAG_HELLO).await?;
    let mut word = [0u8; 2];
    s.read_exact(&mut word).await.context("reading ok")?;
    let mut buf = vec![0u8; bytes as usize];
    ByteStream::new(3).fill(&mut buf);
    s.write_all(&buf).await?;
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await?;
    Ok(serde_json::to_string(&Report {
        ok: 1,
        value: bytes,
        ..Default::default()
    })?)
}

/// The exchange before `tag-server` sends its payload: the client says "hi", the server answers
/// "ok", the client says "go". Each end has then read everything sent to it, so the payload
/// takes the shortcut (which redirects only into a receiver seen reading it all).
const TAG_HELLO: &[u8; 2] = b"hi";
const TAG_ACK: &[u8; 2] = b"ok";
const TAG_GO: &[u8; 2] = b"go";

/// `tag-server`: Serve COUNT connections (0: forever): after the hi/ok/go exchange send TAG,
/// then BYTES of stream, then close.
async fn tag_server(a: SocketAddr, tag: String, bytes: u64, count: u64) -> Result<String> {
    let l = listen(a).await?;
    let mut served = 0u64;
    while count == 0 || served < count {
        let (mut s, _) = l.accept().await?;
        let mut word = [0u8; 2];
        s.read_exact(&mut word).await.context("reading hi")?;
        anyhow::ensure!(&word == TAG_HELLO, "expected {TAG_HELLO:?}, got {word:?}");
        s.write_all(TAG_ACK).await?;
        s.read_exact(&mut word).await.context("reading go")?;
        anyhow::ensure!(&word == TAG_GO, "expected {TAG_GO:?}, got {word:?}");
        let tag = tag.clone();
        // Serve inline: the client connects from one fixed port, one at a time.
        let mut payload = tag.into_bytes();
        let mut body = vec![0u8; bytes as usize];
        ByteStream::new(served).fill(&mut body);
        payload.extend_from_slice(&body);
        s.write_all(&payload).await?;
        s.shutdown().await?;
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink).await;
        served += 1;
    }
    Ok(serde_json::to_string(&Report {
        ok: served,
        ..Default::default()
    })?)
}

/// `tag-client`: ITERATIONS connections from the fixed source BIND; each must read exactly TAG + BYTES.
async fn tag_client(
    a: SocketAddr,
    bind: SocketAddr,
    expect: String,
    bytes: u64,
    iterations: u64,
) -> Result<String> {
    let mut wrong = 0u64;
    let mut detail = String::new();
    for i in 0..iterations {
        let sock =
            socket2::Socket::new(socket2::Domain::for_address(a), socket2::Type::STREAM, None)?;
        sock.set_reuse_address(true)?;
        sock.bind(&bind.into())
            .with_context(|| format!("bind {bind}"))?;
        sock.set_nonblocking(true)?;
        let std_sock: std::net::TcpStream = sock.into();
        let s = TcpSocket::from_std_stream(std_sock);
        let mut s = s
            .connect(a)
            .await
            .with_context(|| format!("iteration {i}: connect {a}"))?;
        s.write_all(TAG_HELLO).await?;
        let mut word = [0u8; 2];
        s.read_exact(&mut word)
            .await
            .with_context(|| format!("iteration {i}: reading ok"))?;
        anyhow::ensure!(
            &word == TAG_ACK,
            "iteration {i}: expected {TAG_ACK:?}, got {word:?}"
        );
        s.write_all(TAG_GO).await?;
        let mut got = Vec::new();
        s.read_to_end(&mut got).await?;
        let want_len = expect.len() + bytes as usize;
        if !got.starts_with(expect.as_bytes()) || got.len() != want_len {
            wrong += 1;
            if detail.is_empty() {
                detail = format!(
                            "iteration {i}: got {} bytes starting {:?}, expected {want_len} starting {expect:?}",
                            got.len(),
                            String::from_utf8_lossy(&got[..got.len().min(expect.len())])
                        );
            }
        }
        // Close with RST (linger 0) so the same 4-tuple can be used again at once.
        let std_s = s.into_std()?;
        socket2::SockRef::from(&std_s).set_linger(Some(Duration::ZERO))?;
        drop(std_s);
    }
    Ok(serde_json::to_string(&Report {
        ok: iterations - wrong,
        failed: wrong,
        detail,
        ..Default::default()
    })?)
}

async fn bidir(s: TcpStream, bytes: u64, seed: u64, rate: u64) -> Result<BidirReport> {
    let (mut r, mut w) = s.into_split();
    let sender = tokio::spawn(async move {
        let mut stream = ByteStream::new(seed);
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        let mut left = bytes;
        let start = Instant::now();
        let mut sent = 0u64;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            stream.fill(&mut buf[..n]);
            h.update(&buf[..n]);
            w.write_all(&buf[..n]).await.context("send")?;
            left -= n as u64;
            sent += n as u64;
            if rate > 0 {
                let due = Duration::from_secs_f64(sent as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
            }
        }
        w.shutdown().await.context("shutdown(SHUT_WR)")?;
        anyhow::Ok((bytes, hex(&h.finalize())))
    });
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut received = 0u64;
    loop {
        let n = r.read(&mut buf).await.context("receive")?;
        if n == 0 {
            break;
        }
        received += n as u64;
        h.update(&buf[..n]);
    }
    let (sent, sent_sha256) = sender.await??;
    Ok(BidirReport {
        sent,
        sent_sha256,
        received,
        received_sha256: hex(&h.finalize()),
    })
}

async fn echo(mut s: TcpStream) -> Result<()> {
    s.set_nodelay(true)?;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            s.shutdown().await?;
            return Ok(());
        }
        s.write_all(&buf[..n]).await?;
    }
}

async fn many_one(a: SocketAddr, i: u64, size: usize) -> Result<()> {
    let mut s = connect(a).await?;
    // A message that carries its own checksum: [len u64][payload][sha256(payload)].
    let mut payload = vec![0u8; size];
    ByteStream::new(1000 + i).fill(&mut payload);
    let sum = Sha256::digest(&payload);
    let mut msg = (size as u64).to_le_bytes().to_vec();
    msg.extend_from_slice(&payload);
    msg.extend_from_slice(&sum);
    s.write_all(&msg).await?;
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back)
        .await
        .with_context(|| format!("connection {i}: echo"))?;
    let n = u64::from_le_bytes(back[..8].try_into().unwrap()) as usize;
    if n != size || Sha256::digest(&back[8..8 + n])[..] != back[8 + n..] || back != msg {
        bail!("connection {i}: echoed message fails its checksum");
    }
    s.shutdown().await?;
    Ok(())
}

fn fionread(s: &TcpStream) -> Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, which refers to `n`; the fd is
    // a live socket owned by `s`.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut n) };
    if r != 0 {
        return Err(std::io::Error::last_os_error()).context("ioctl(FIONREAD)");
    }
    Ok(n as usize)
}

/// Accepts one connection on a (blocking) std listener.
fn accept_blocking(l: std::net::TcpListener) -> Result<std::net::TcpStream> {
    l.set_nonblocking(false)?;
    let (s, _) = l.accept()?;
    s.set_nonblocking(false)?;
    Ok(s)
}

/// Reads up to `limit` bytes (u64::MAX: until EOF) from `r` through `buf` into `h`; returns how
/// many it read (fewer only at EOF).
fn read_hashing(
    r: &mut impl std::io::Read,
    h: &mut Sha256,
    buf: &mut [u8],
    limit: u64,
) -> Result<u64> {
    let mut n = 0u64;
    while n < limit {
        let want = (limit - n).min(buf.len() as u64) as usize;
        let k = r.read(&mut buf[..want])?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok(n)
}

/// `splice-server`: see [`Mode::SpliceServer`].
fn splice_server(l: std::net::TcpListener, recv_first: u64) -> Result<String> {
    let mut s = accept_blocking(l)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut n = read_hashing(&mut s, &mut h, &mut buf, recv_first)?;
    let (rd, wr) = nix::unistd::pipe()?;
    let mut rd = std::fs::File::from(rd);
    let mut spliced = 0u64;
    let mut refused = false;
    loop {
        let r = match nix::fcntl::splice(
            &s,
            None,
            &wr,
            None,
            1 << 16,
            nix::fcntl::SpliceFFlags::empty(),
        ) {
            // "This file cannot splice": read the rest, as Go's io.Copy and HAProxy do.
            Err(nix::errno::Errno::EINVAL) => {
                refused = true;
                break;
            }
            r => r.context("splice(socket -> pipe)")? as u64,
        };
        if r == 0 {
            break;
        }
        read_hashing(&mut rd, &mut h, &mut buf, r)?;
        n += r;
        spliced += r;
    }
    if refused {
        n += read_hashing(&mut s, &mut h, &mut buf, u64::MAX)?;
    }
    Ok(serde_json::to_string(&Report {
        ok: 1,
        value: n,
        failed: u64::from(refused),
        detail: format!("{} spliced {spliced}", hex(&h.finalize())),
        ..Default::default()
    })?)
}

/// `hold-server`: see [`Mode::HoldServer`].
fn hold_server(l: std::net::TcpListener, read_first: u64, hold_ms: u64) -> Result<String> {
    let mut s = accept_blocking(l)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut n = read_hashing(&mut s, &mut h, &mut buf, read_first)?;
    std::thread::sleep(Duration::from_millis(hold_ms));
    n += read_hashing(&mut s, &mut h, &mut buf, u64::MAX)?;
    Ok(serde_json::to_string(&Report {
        ok: 1,
        value: n,
        detail: hex(&h.finalize()),
        ..Default::default()
    })?)
}

/// The ByteStream seed of what `stream-client` sends.
const STREAM_CLIENT_SEED: u64 = 5;

/// SHA-256 of the first `bytes` that `stream-client` sends.
pub fn stream_client_sha256(bytes: u64) -> String {
    crate::stream::sha256_of(STREAM_CLIENT_SEED, bytes)
}

/// `stream-client`: see [`Mode::StreamClient`].
fn stream_client(a: SocketAddr, bytes: u64, for_ms: u64) -> Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(a).with_context(|| format!("connect {a}"))?;
    let mut stream = ByteStream::new(STREAM_CLIENT_SEED);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let (mut left, mut pending) = (bytes, 0..0);
    let start = Instant::now();
    let mut taken_at_mark = None;
    if for_ms > 0 {
        s.set_nonblocking(true)?;
    }
    while left > 0 || !pending.is_empty() {
        if pending.is_empty() {
            let n = left.min(buf.len() as u64) as usize;
            stream.fill(&mut buf[..n]);
            h.update(&buf[..n]);
            left -= n as u64;
            pending = 0..n;
        }
        match s.write(&buf[pending.clone()]) {
            Ok(k) => pending.start += k,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if start.elapsed() >= Duration::from_millis(for_ms) && taken_at_mark.is_none() {
                    taken_at_mark = Some(bytes - left - pending.len() as u64);
                    s.set_nonblocking(false)?;
                } else {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            Err(e) => return Err(e).context("write"),
        }
    }
    s.shutdown(std::net::Shutdown::Write)?;
    // Wait for EOF polling a non-blocking socket, as event-driven programs do: a blocking
    // read of a socket in the sockmap can return EAGAIN when a FIN without data wakes it
    // (tcp_bpf_recvmsg; docs/sockmap.md, "What keeps TCP, and why").
    s.set_nonblocking(true)?;
    let mut rest = [0u8; 4096];
    loop {
        match s.read(&mut rest) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => return Err(e).context("read until EOF"),
        }
    }
    Ok(serde_json::to_string(&Report {
        ok: 1,
        value: taken_at_mark.unwrap_or(0),
        detail: hex(&h.finalize()),
        ..Default::default()
    })?)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A child process that is killed (SIGKILL) and reaped if still running when dropped, so a
/// failing test never leaves processes behind.
#[derive(Debug)]
pub struct KillOnDrop(Option<Child>);

impl KillOnDrop {
    pub fn new(child: Child) -> Self {
        Self(Some(child))
    }

    pub fn id(&self) -> u32 {
        self.0.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Takes the child out; the caller is now responsible for it.
    pub fn take(mut self) -> Child {
        self.0.take().expect("child present")
    }

    pub fn child_mut(&mut self) -> &mut Child {
        self.0.as_mut().expect("child present")
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            if c.try_wait().ok().flatten().is_none() {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

/// Starts the peer binary at `bin` with `args` inside `ns` and (optionally) a cgroup.
pub fn spawn(
    bin: &Path,
    ns: &nsfast_sys::netns::NetNs,
    cgroup_procs: Option<&Path>,
    args: &[String],
) -> KillOnDrop {
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    ns.configure_command(&mut cmd, cgroup_procs);
    KillOnDrop::new(
        cmd.spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display())),
    )
}

/// A sender against a receiver that stops reading: a `hold-server` at `addr` in `server` reads
/// `read_first` bytes (so a shortcut starts redirecting) and then nothing for 4 s, while a
/// `stream-client` in `client` offers `bytes` for 2.5 s, both in `cgroup_procs`. Checks that
/// the sender had no more taken than `read_first`, `queue_limit` and what TCP itself buffers
/// at each end, and that the receiver got the stream byte-exact (`stats` names the shortcut's
/// counters in a failure); returns what the sender had taken.
#[allow(clippy::too_many_arguments)]
pub fn assert_stopped_reader_holds_sender_back(
    server: &nsfast_sys::netns::NetNs,
    client: &nsfast_sys::netns::NetNs,
    cgroup_procs: Option<&Path>,
    addr: SocketAddr,
    bytes: u64,
    read_first: u64,
    queue_limit: u64,
    stats: impl Fn() -> String,
) -> u64 {
    let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let bin = crate::bins::testpeer();
    let s = spawn(
        &bin,
        server,
        cgroup_procs,
        &args(&[
            "--timeout",
            "60",
            "hold-server",
            "--listen",
            &addr.to_string(),
            "--read-first",
            &read_first.to_string(),
            "--hold-ms",
            "4000",
        ]),
    );
    wait_listening(server, addr);
    let c = spawn(
        &bin,
        client,
        cgroup_procs,
        &args(&[
            "--timeout",
            "60",
            "stream-client",
            "--connect",
            &addr.to_string(),
            "--bytes",
            &bytes.to_string(),
            "--for-ms",
            "2500",
        ]),
    );
    let cr: Report = finish(c, "stream client");
    let sr: Report = finish(s, "hold server");
    eprintln!(
        "sender had {} bytes taken after 2.5 s against a receiver that stopped reading",
        cr.value
    );
    // What TCP itself buffers: its send and receive buffers, at most tcp_wmem[2] + tcp_rmem[2].
    let bound = read_first + queue_limit + 2 * crate::tcp_buffers_max();
    assert!(
        cr.value > 0 && cr.value <= bound,
        "{} bytes taken, bound {bound}: {}",
        cr.value,
        stats()
    );
    assert_eq!(sr.value, bytes);
    assert_eq!(
        sr.detail,
        stream_client_sha256(bytes),
        "the receiver got other bytes"
    );
    assert_eq!(cr.detail, sr.detail);
    cr.value
}

/// Waits for a peer and parses its JSON report; panics with its stderr if it failed.
pub fn finish<T: for<'de> Deserialize<'de>>(peer: KillOnDrop, what: &str) -> T {
    let out = peer.take().wait_with_output().expect("wait for peer");
    if !out.status.success() {
        panic!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{what}: bad report {:?}: {e}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Waits for a peer and returns (success, stdout, stderr).
pub fn finish_raw(peer: KillOnDrop) -> (bool, String, String) {
    let out = peer.take().wait_with_output().expect("wait for peer");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits (bounded) until a TCP socket in `ns` connected to `remote` is ESTABLISHED
/// (/proc/net/tcp of the namespace, state 01).
pub fn wait_established(ns: &nsfast_sys::netns::NetNs, remote: SocketAddr) {
    let std::net::IpAddr::V4(ip) = remote.ip() else {
        panic!("wait_established: IPv4 only, got {remote}");
    };
    // /proc/net/tcp prints the address as the u32 in host order, in hex.
    let want = format!(
        "{:08X}:{:04X}",
        u32::from_ne_bytes(ip.octets()),
        remote.port()
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found = ns
            .run(|| {
                std::fs::read_to_string("/proc/thread-self/net/tcp").is_ok_and(|t| {
                    t.lines().skip(1).any(|l| {
                        let cols: Vec<&str> = l.split_whitespace().collect();
                        cols.len() > 3 && cols[2] == want && cols[3] == "01"
                    })
                })
            })
            .unwrap_or(false);
        if found {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no ESTABLISHED connection to {remote} after 20 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until something listens on `addr` inside `ns` (connect succeeds), up to 10 s.
pub fn wait_listening(ns: &nsfast_sys::netns::NetNs, addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ok = ns
            .run(|| {
                // Probe via /proc/net/tcp{,6}: a LISTEN socket on the port (no connection, so
                // the server's accept count is not disturbed).
                let port = format!(":{:04X} ", addr.port());
                ["/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"]
                    .iter()
                    .any(|f| {
                        std::fs::read_to_string(f).is_ok_and(|t| {
                            t.lines().skip(1).any(|l| {
                                let cols: Vec<&str> = l.split_whitespace().collect();
                                cols.len() > 3
                                    && format!("{} ", cols[1]).ends_with(&port)
                                    && cols[3] == "0A"
                            })
                        })
                    })
            })
            .unwrap_or(false);
        if ok {
            return;
        }
        if Instant::now() > deadline {
            panic!("nothing listens on {addr} after 10 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
