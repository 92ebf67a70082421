//! Moving bytes both ways between two connections, with half-close: when one side's data ends,
//! the other side gets shutdown(SHUT_WR) (not a full close), so it can still answer.
//! Between two sockets the bytes move with splice(2) through a pipe, without copies through
//! user space; anything splice refuses falls back to read/write with a large buffer.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{fcntl, splice, FcntlArg, OFlag, SpliceFFlags};
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::TimeVal;
use nix::unistd::{pipe2, write};
use serde::Serialize;
use tracing::{debug, info, warn};

use crate::addr::Address;
use crate::conn::{self, Conn, ConnError, Listener, SockOpts};
use crate::idle::{self, timed_out, Activity};
use crate::kernel::{Joined, KernelPath, Leg, Refusal};
use crate::zerocopy::{self, ZcStats, ZeroCopy};

/// Which data path a relayed connection takes (`--path`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataPath {
    /// The kernel path where the legs and the kernel allow it, else splice (the reason is
    /// logged once).
    #[default]
    Auto,
    /// The kernel path or an error.
    Kernel,
    /// splice through a pipe (read/write where splice is refused), never the kernel path.
    Splice,
}

impl std::str::FromStr for DataPath {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(DataPath::Auto),
            "kernel" => Ok(DataPath::Kernel),
            "splice" => Ok(DataPath::Splice),
            _ => Err(format!("invalid path {s:?}: use auto, kernel or splice")),
        }
    }
}

/// Relay options.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// The data path (`--path`).
    pub path: DataPath,
    /// Serve every connection of a listening first address (each in its own thread).
    pub fork: bool,
    /// With `fork`: at most this many connections at once. One accepted while all are busy
    /// is closed at once, with a log line (it does not wait in the listen backlog).
    pub max_children: usize,
    /// With `fork`: at most this many connections at once from one source (the peer's IP,
    /// vsock CID or UNIX uid); more are closed at once, with a log line. None: no limit.
    pub max_per_source: Option<usize>,
    /// Close a connection that moved no byte either way for this long. The user-space path
    /// watches it, so with it set `auto` never joins connections in the kernel path and
    /// `kernel` is refused. None: never.
    pub idle_timeout: Option<Duration>,
    /// Most bytes moved per call (pipe size and largest splice request, or copy buffer).
    pub buffer: usize,
    /// Socket-level options.
    pub sock: SockOpts,
    /// MSG_ZEROCOPY on the user-space path's AF_VSOCK sends (`--zerocopy`).
    pub zerocopy: ZeroCopy,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            path: DataPath::Auto,
            fork: false,
            max_children: 64,
            max_per_source: None,
            idle_timeout: None,
            buffer: 256 << 10,
            sock: SockOpts::default(),
            zerocopy: ZeroCopy::Auto,
        }
    }
}

/// What one relayed connection moved.
#[derive(Debug, Clone, Serialize)]
pub struct ConnStats {
    pub id: u64,
    pub a: String,
    pub b: String,
    pub bytes_a_to_b: u64,
    pub bytes_b_to_a: u64,
    pub millis: u64,
    pub spliced: bool,
    /// `kernel` (sockmap redirect between the legs), `splice` or `copy` (read/write).
    pub path: &'static str,
    /// Bytes this process moved with its own read/write/splice calls (both ways); 0 for a
    /// connection the kernel path carried to its end.
    pub user_bytes: u64,
    /// How the user-space path sent to AF_VSOCK legs: `zerocopy` (MSG_ZEROCOPY, either way)
    /// or `copy` (everything else, the kernel path included).
    pub send: &'static str,
    /// The zero-copy sends' counts (both ways), with `send` = `zerocopy`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zerocopy: Option<ZcStats>,
    pub error: Option<String>,
}

impl ConnStats {
    /// A connection the kernel path carried (relay and bridge).
    pub(crate) fn joined(id: u64, a: &Conn, b: &Conn, start: Instant, j: Joined) -> Self {
        Self::kernel(
            id,
            a,
            b,
            start,
            [j.a_to_b, j.b_to_a],
            j.user_a_to_b + j.user_b_to_a,
            j.error,
        )
    }

    /// A connection `--path kernel` refused to join and did not relay: both legs are aborted
    /// (relay and bridge).
    pub(crate) fn refused(id: u64, a: &Conn, b: &Conn, start: Instant, why: &Refusal) -> Self {
        a.abort();
        b.abort();
        let error = Some(format!("--path kernel: {why}"));
        Self::kernel(id, a, b, start, why.pre, why.pre[0] + why.pre[1], error)
    }

    fn kernel(
        id: u64,
        a: &Conn,
        b: &Conn,
        start: Instant,
        bytes: [u64; 2],
        user_bytes: u64,
        error: Option<String>,
    ) -> Self {
        ConnStats {
            id,
            a: a.label.clone(),
            b: b.label.clone(),
            bytes_a_to_b: bytes[0],
            bytes_b_to_a: bytes[1],
            millis: start.elapsed().as_millis() as u64,
            spliced: false,
            path: "kernel",
            user_bytes,
            send: "copy",
            zerocopy: None,
            error,
        }
    }
}

/// Relay errors.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Conn(#[from] ConnError),
    #[error("--fork needs a listening first address (got {0})")]
    ForkNeedsListener(String),
    #[error("with --fork the second address must connect, not listen (got {0})")]
    ForkSecondListens(String),
    #[error("--max-children must be at least 1")]
    ZeroChildren,
    #[error("--max-per-source must be at least 1")]
    ZeroPerSource,
    #[error("{0}")]
    ZeroCopy(String),
    #[error("--path kernel: {0}")]
    KernelPath(String),
    #[error("accept on {addr}")]
    Accept {
        addr: String,
        #[source]
        source: io::Error,
    },
}

/// A pipe for splice, as large as `size` allows (best effort: capped by fs.pipe-max-size for
/// unprivileged users; the default 64 KiB pipe still works).
fn pipe(size: usize) -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = pipe2(OFlag::O_CLOEXEC)?;
    let _ = fcntl(
        &w,
        FcntlArg::F_SETPIPE_SZ(size.min(i32::MAX as usize) as i32),
    );
    Ok((r, w))
}

/// Copies src → dst until EOF, then half-closes dst. Returns (bytes, spliced).
///
/// Between two sockets the bytes go socket → pipe → socket with splice(2) in this one thread.
/// (Not a reader and a writer thread sharing the pipe: splice from a socket holds the pipe's
/// mutex while it waits for data, so the writer could not forward a request already in the
/// pipe — request/response traffic stalled; see docs/vsock.md.) A source that refuses splice
/// (EINVAL/ENOSYS before any byte) is copied with read/write instead.
pub fn pump(src: &Conn, dst: &Conn, buffer: usize) -> io::Result<(u64, bool)> {
    let p = pump_with(src, dst, buffer, None, None);
    p.result.map(|()| (p.bytes, p.spliced))
}

/// What one direction of a connection moved, and how it ended. The count is kept when the
/// direction ends with an error: a reset after 1 GiB still reports the 1 GiB.
struct Pumped {
    bytes: u64,
    /// The direction was spliced (not copied through a buffer).
    spliced: bool,
    result: io::Result<()>,
}

fn pump_with(
    src: &Conn,
    dst: &Conn,
    buffer: usize,
    act: Option<&Activity>,
    zc: Option<&mut Option<ZcStats>>,
) -> Pumped {
    let mut bytes = 0u64;
    let mut spliced = false;
    let result = pump_into(src, dst, buffer, act, zc, &mut bytes, &mut spliced);
    Pumped {
        bytes,
        spliced,
        result,
    }
}

fn pump_into(
    src: &Conn,
    dst: &Conn,
    buffer: usize,
    act: Option<&Activity>,
    zc: Option<&mut Option<ZcStats>>,
    total: &mut u64,
    spliced: &mut bool,
) -> io::Result<()> {
    if let Some(out) = zc.filter(|_| dst.is_vsock()) {
        let tick = act.map_or(Duration::from_secs(1), |a| idle_tick(a.idle));
        let mut st = ZcStats::default();
        let r = zerocopy::pump(src, dst, total, &mut st, act, tick);
        *out = Some(st);
        return r;
    }
    if src.is_socket() && dst.is_socket() {
        *spliced = true;
        match splice_loop(src.reader(), dst.writer(), buffer, total, act) {
            Ok(()) => {}
            Err(e)
                if *total == 0
                    && matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) =>
            {
                debug!(
                    "splice not supported between {} and {}: {e}; copying",
                    src.label, dst.label
                );
                *spliced = false;
                copy_loop(src.reader(), dst.writer(), buffer, total, act)?;
            }
            Err(e) => return Err(e),
        }
    } else {
        copy_loop(src.reader(), dst.writer(), buffer, total, act)?;
    }
    dst.shutdown_write()
}

fn splice_loop(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    buffer: usize,
    total: &mut u64,
    act: Option<&Activity>,
) -> io::Result<()> {
    let (pr, pw) = pipe(buffer)?;
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_MORE;
    let mut chunk = SPLICE_MIN.min(buffer);
    loop {
        let n = match splice(src, None, &pw, None, chunk, flags) {
            Ok(n) => n,
            Err(Errno::EINTR) => continue,
            Err(e) => {
                timed_out(e, act)?;
                continue;
            }
        };
        if n == 0 {
            return Ok(());
        }
        if let Some(a) = act {
            a.touch();
        }
        chunk = next_chunk(chunk, n, buffer);
        let mut left = n;
        while left > 0 {
            match splice(&pr, None, dst, None, left, flags) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "splice wrote nothing",
                    ))
                }
                Ok(m) => {
                    left -= m;
                    if let Some(a) = act {
                        a.touch();
                    }
                }
                Err(Errno::EINTR) => {}
                Err(e) => timed_out(e, act)?,
            }
        }
        *total += n as u64;
    }
}

/// The smallest splice request: one page.
const SPLICE_MIN: usize = 4096;

/// The next splice request size: double it when the last one came back full (bulk data is
/// waiting), halve it when it came back less than a quarter full (small messages), within
/// [one page, `buffer`]. A socket without its own splice_read (AF_VSOCK among them) is read
/// through copy_splice_read, which allocates pages for the whole request before it reads:
/// asking for 256 KiB to move a 1-byte request cost 64 page allocations per message.
fn next_chunk(chunk: usize, got: usize, buffer: usize) -> usize {
    let min = SPLICE_MIN.min(buffer);
    if got >= chunk {
        (chunk * 2).min(buffer)
    } else if got < chunk / 4 {
        (chunk / 2).max(min)
    } else {
        chunk
    }
}

fn copy_loop(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    buffer: usize,
    total: &mut u64,
    act: Option<&Activity>,
) -> io::Result<()> {
    let mut buf = vec![0u8; buffer];
    loop {
        let n = idle::read(src, &mut buf, act)?;
        if n == 0 {
            return Ok(());
        }
        if let Some(a) = act {
            a.touch();
        }
        let mut off = 0;
        while off < n {
            match write(dst, &buf[off..n]) {
                Ok(m) => {
                    off += m;
                    if let Some(a) = act {
                        a.touch();
                    }
                }
                Err(Errno::EINTR) => {}
                Err(e) => timed_out(e, act)?,
            }
        }
        *total += n as u64;
    }
}

/// Relays between `a` and `b` until both directions have ended.
pub fn relay(id: u64, a: Conn, b: Conn, buffer: usize) -> ConnStats {
    relay_with(id, a, b, buffer, None)
}

/// The read/write timeout that lets the pumps notice an idle connection: a quarter of the
/// idle timeout (so it is noticed within 1.25 times of it), within [10 ms, 5 s].
fn idle_tick(idle: Duration) -> Duration {
    (idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(5))
}

/// [`relay`], and with `idle` set, the connection is torn down (an error in the stats) once no
/// byte moved either way for that long. Enforced on sockets (SO_RCVTIMEO / SO_SNDTIMEO).
pub fn relay_with(id: u64, a: Conn, b: Conn, buffer: usize, idle: Option<Duration>) -> ConnStats {
    relay_zc(id, a, b, buffer, idle, false)
}

/// [`relay_with`], with `zc` MSG_ZEROCOPY on the sends to AF_VSOCK legs ([`zerocopy`]).
pub fn relay_zc(
    id: u64,
    a: Conn,
    b: Conn,
    buffer: usize,
    idle: Option<Duration>,
    zc: bool,
) -> ConnStats {
    let start = Instant::now();
    let act = idle.filter(|d| !d.is_zero()).map(|idle| Activity {
        start,
        last_ms: AtomicU64::new(0),
        idle,
    });
    if let Some(act) = &act {
        let t = idle_tick(act.idle);
        let tv = TimeVal::new(t.as_secs() as _, t.subsec_micros() as _);
        for c in [&a, &b] {
            if c.is_socket() {
                let _ = setsockopt(&c.reader(), sockopt::ReceiveTimeout, &tv);
                let _ = setsockopt(&c.reader(), sockopt::SendTimeout, &tv);
            }
        }
    }
    let act = act.as_ref();
    let (mut zc_ab, mut zc_ba) = (None, None);
    let (r_ab, r_ba) = std::thread::scope(|s| {
        let zab = zc.then_some(&mut zc_ab);
        let h = s.spawn(|| {
            let r = pump_with(&a, &b, buffer, act, zab);
            if r.result.is_err() {
                a.abort();
                b.abort();
            }
            r
        });
        let r_ba = pump_with(&b, &a, buffer, act, zc.then_some(&mut zc_ba));
        if r_ba.result.is_err() {
            a.abort();
            b.abort();
        }
        let r_ab = h.join().unwrap_or_else(|_| Pumped {
            bytes: 0,
            spliced: false,
            result: Err(io::Error::other("relay thread panicked")),
        });
        (r_ab, r_ba)
    });
    let zc_stats = match (zc_ab, zc_ba) {
        (None, None) => None,
        (x, y) => {
            let mut t: ZcStats = x.unwrap_or_default();
            t.add(&y.unwrap_or_default());
            Some(t)
        }
    };
    let error = match (&r_ab.result, &r_ba.result) {
        (Err(e), _) => Some(format!("{} -> {}: {e}", a.label, b.label)),
        (_, Err(e)) => Some(format!("{} -> {}: {e}", b.label, a.label)),
        _ => None,
    };
    let (ab, s1) = (r_ab.bytes, r_ab.spliced);
    let (ba, s2) = (r_ba.bytes, r_ba.spliced);
    ConnStats {
        id,
        a: a.label.clone(),
        b: b.label.clone(),
        bytes_a_to_b: ab,
        bytes_b_to_a: ba,
        millis: start.elapsed().as_millis() as u64,
        spliced: s1 || s2,
        path: if s1 || s2 { "splice" } else { "copy" },
        user_bytes: ab + ba,
        send: if zc_stats.is_some() {
            "zerocopy"
        } else {
            "copy"
        },
        zerocopy: zc_stats,
        error,
    }
}

/// Opens the second address for one connection of the first.
fn open_second(b: &Address, opts: &Options) -> Result<Conn, RelayError> {
    if b.is_listen() {
        let l = Listener::open(b, opts.sock)?;
        return l.accept().map_err(|source| RelayError::Accept {
            addr: b.to_string(),
            source,
        });
    }
    Ok(conn::connect(b, opts.sock)?)
}

/// How many connections are open, in all and per source.
#[derive(Default)]
struct Counts {
    total: usize,
    per_source: std::collections::HashMap<String, usize>,
}

/// A `--max-children` (and `--max-per-source`) slot, given back when dropped: on every way a
/// connection's thread ends, a panic included.
struct Slot<'a> {
    counts: &'a Mutex<Counts>,
    source: Option<String>,
}

impl<'a> Slot<'a> {
    /// Takes a slot if one is free, else says which limit is reached. Never waits: a
    /// connection that cannot be served now is closed rather than left unanswered.
    fn try_take(
        counts: &'a Mutex<Counts>,
        max: usize,
        per_source: Option<usize>,
        source: Option<&str>,
    ) -> Result<Self, String> {
        let mut c = counts.lock().unwrap_or_else(|e| e.into_inner());
        if c.total >= max {
            return Err(format!("all {max} --max-children slots are busy"));
        }
        let source = match (per_source, source) {
            (Some(limit), Some(src)) => {
                let n = c.per_source.get(src).copied().unwrap_or(0);
                if n >= limit {
                    return Err(format!(
                        "{src} has {n} connections open (--max-per-source {limit})"
                    ));
                }
                *c.per_source.entry(src.to_string()).or_default() += 1;
                Some(src.to_string())
            }
            _ => None,
        };
        c.total += 1;
        Ok(Slot { counts, source })
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(src) = &self.source {
            if let Some(n) = c.per_source.get_mut(src) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    c.per_source.remove(src);
                }
            }
        }
    }
}

/// A relay whose first address is open (listening, for a listening address), so that a
/// listening file can be removed from another thread on SIGINT/SIGTERM while [`Relay::serve`]
/// runs.
pub struct Relay {
    a: Address,
    b: Address,
    opts: Options,
    listener: Option<Listener>,
    /// The loaded kernel path (one per process), when `--path` allows it and it loaded.
    kernel: Option<KernelPath>,
    /// Set once the fallback reason of a connection was logged.
    fallback_logged: AtomicBool,
    /// MSG_ZEROCOPY on the user-space path's AF_VSOCK sends (`--zerocopy`, decided at open).
    zc: bool,
}

/// Whether an address's connections are stream sockets the kernel path can take.
fn kernel_leg(a: &Address) -> Option<Leg> {
    match a {
        Address::Tcp { .. } | Address::TcpListen { .. } => Some(Leg::Tcp),
        Address::VsockConnect { .. } | Address::VsockListen { .. } => Some(Leg::Vsock),
        _ => None,
    }
}

/// Loads the kernel path if `path` and the two addresses allow it. `Ok(None)`: the splice path
/// (with `auto`, the reason logged once); `Err`: `--path kernel` cannot be honoured.
fn kernel_for(a: &Address, b: &Address, path: DataPath) -> Result<Option<KernelPath>, RelayError> {
    if path == DataPath::Splice {
        return Ok(None);
    }
    let why = match (kernel_leg(a), kernel_leg(b)) {
        // AF_VSOCK legs in the kernel path are experimental (docs/vsock.md, "The kernel path":
        // slower than the splice relay for bulk in the 7.2 guest, and a joined vsock source
        // has no flow control): `auto` joins only TCP <-> TCP; `--path kernel` still joins
        // vsock legs, as an experiment.
        (Some(la), Some(lb))
            if path == DataPath::Auto && (la == Leg::Vsock || lb == Leg::Vsock) =>
        {
            "AF_VSOCK legs join only with --path kernel (experimental, docs/vsock.md)".to_string()
        }
        (Some(la), Some(lb)) => match KernelPath::load() {
            Ok(k) => match k.pair_supported(la, lb) {
                Ok(()) => return Ok(Some(k)),
                Err(e) => e,
            },
            Err(e) => error_chain(&e),
        },
        _ => {
            let which = if kernel_leg(a).is_none() { a } else { b };
            format!(
                "{which} is not a TCP or AF_VSOCK stream address (the kernel path joins only those)"
            )
        }
    };
    if path == DataPath::Kernel {
        return Err(RelayError::KernelPath(why));
    }
    info!("kernel path not used ({why}): relaying with splice");
    Ok(None)
}

impl Relay {
    /// Checks the options and opens the first address if it listens (a stale UNIX socket file
    /// there is replaced, a live one refused).
    pub fn open(a: &Address, b: &Address, opts: &Options) -> Result<Self, RelayError> {
        if opts.fork {
            if !a.is_listen() {
                return Err(RelayError::ForkNeedsListener(a.to_string()));
            }
            if b.is_listen() {
                return Err(RelayError::ForkSecondListens(b.to_string()));
            }
            if opts.max_children == 0 {
                return Err(RelayError::ZeroChildren);
            }
            if opts.max_per_source == Some(0) {
                return Err(RelayError::ZeroPerSource);
            }
        }
        // Zero-copy sends are the user-space path's: with `--path kernel` a clear refusal
        // (before, the kernel path silently won and --zerocopy on did nothing).
        if opts.path == DataPath::Kernel && opts.zerocopy == ZeroCopy::On {
            return Err(RelayError::KernelPath(
                "--zerocopy on applies to the user-space path's sends; use --path auto or splice with it".into(),
            ));
        }
        // Before anything is opened: `--zerocopy on` on an old kernel changes nothing.
        let (zc, why) =
            zerocopy::decide(opts.zerocopy, nsfast_sys::kernel::KernelVersion::current())
                .map_err(RelayError::ZeroCopy)?;
        if let Some(why) =
            why.filter(|_| kernel_leg(a) == Some(Leg::Vsock) || kernel_leg(b) == Some(Leg::Vsock))
        {
            info!("zero-copy sends not used: {why}");
        }
        let listener = if a.is_listen() {
            let l = Listener::open(a, opts.sock)?;
            info!("listening on {a}, relaying to {b}");
            Some(l)
        } else {
            None
        };
        // A joined connection moves no byte through this process, so nothing here could see
        // it go idle: with an idle timeout, `auto` keeps every connection in user space.
        let path = match (opts.idle_timeout, opts.path) {
            (Some(_), DataPath::Kernel) => {
                return Err(RelayError::KernelPath(
                    "--idle-timeout needs the user-space path (a joined connection cannot be watched); use --path auto or splice with it".into(),
                ))
            }
            (Some(_), DataPath::Auto) => {
                info!("kernel path not used (--idle-timeout is set): relaying with splice");
                DataPath::Splice
            }
            (_, p) => p,
        };
        let kernel = kernel_for(a, b, path)?;
        if kernel.is_some() {
            info!("kernel path loaded: connections are joined with a sockmap redirect");
        }
        Ok(Self {
            a: a.clone(),
            b: b.clone(),
            opts: *opts,
            listener,
            kernel,
            fallback_logged: AtomicBool::new(false),
            zc,
        })
    }

    /// Sockets in the kernel path's map now (None without the kernel path).
    pub fn kernel_sockets(&self) -> Option<usize> {
        self.kernel.as_ref().map(|k| k.sockets())
    }

    /// Relays one connection: the kernel path if loaded and it takes the pair, else splice.
    fn relay_conn(&self, id: u64, a: Conn, b: Conn) -> ConnStats {
        let Some(k) = &self.kernel else {
            return relay_zc(id, a, b, self.opts.buffer, self.opts.idle_timeout, self.zc);
        };
        let start = Instant::now();
        match k.run(&a, &b) {
            Ok(j) => ConnStats::joined(id, &a, &b, start, j),
            Err(why) if self.opts.path == DataPath::Kernel && !why.fallback_ok => {
                ConnStats::refused(id, &a, &b, start, &why)
            }
            Err(why) => {
                if why.fallback_ok {
                    debug!("connection {id}: not joined ({why}): relaying with splice");
                } else if !self.fallback_logged.swap(true, Ordering::Relaxed) {
                    info!("connection {id}: kernel path not used ({why}): relaying with splice (logged once)");
                } else {
                    debug!("connection {id}: kernel path not used ({why})");
                }
                let mut st = relay_zc(id, a, b, self.opts.buffer, self.opts.idle_timeout, self.zc);
                // What the join attempt forwarded before it was refused.
                st.bytes_a_to_b += why.pre[0];
                st.bytes_b_to_a += why.pre[1];
                st.user_bytes += why.pre[0] + why.pre[1];
                st
            }
        }
    }

    /// Whether the first address listens (then serve runs until an accept fails, with
    /// `fork` forever).
    pub fn listens(&self) -> bool {
        self.listener.is_some()
    }

    /// Removes the listening socket file (if any, and if still ours).
    pub fn remove_socket(&self) {
        if let Some(l) = &self.listener {
            l.remove_socket();
        }
    }

    /// Serves: one connection, or with `fork` every connection, each in its own thread;
    /// `report` is called for every finished connection.
    pub fn serve(&self, report: &(dyn Fn(&ConnStats) + Sync)) -> Result<(), RelayError> {
        let (a, b, opts) = (&self.a, &self.b, &self.opts);
        let Some(listener) = &self.listener else {
            let ca = conn::connect(a, opts.sock)?;
            let cb = open_second(b, opts)?;
            report(&self.relay_conn(1, ca, cb));
            return Ok(());
        };
        let accept = || {
            listener.accept().map_err(|source| RelayError::Accept {
                addr: a.to_string(),
                source,
            })
        };
        if !opts.fork {
            let ca = accept()?;
            let cb = open_second(b, opts)?;
            report(&self.relay_conn(1, ca, cb));
            return Ok(());
        }
        let counts = Mutex::new(Counts::default());
        std::thread::scope(|s| -> Result<(), RelayError> {
            let mut id = 0u64;
            loop {
                let ca = match listener.accept() {
                    Ok(c) => c,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(source) => {
                        return Err(RelayError::Accept {
                            addr: a.to_string(),
                            source,
                        })
                    }
                };
                // Accepted first, then admitted: a connection over a limit is closed at once
                // (the client sees its end) instead of waiting in the backlog behind
                // connections that may never end.
                let slot = match Slot::try_take(
                    &counts,
                    opts.max_children,
                    opts.max_per_source,
                    ca.source.as_deref(),
                ) {
                    Ok(s) => s,
                    Err(why) => {
                        warn!("connection from {} closed at once: {why}", ca.label);
                        continue;
                    }
                };
                id += 1;
                s.spawn(move || {
                    let start = Instant::now();
                    let mut slot = Some(slot);
                    let st = match conn::connect(b, opts.sock) {
                        Ok(cb) => self.relay_conn(id, ca, cb),
                        // A failing peer (refused connection, bad or missing hybrid reply)
                        // ends this connection only, never the relay.
                        Err(e) => {
                            warn!("connection {id} from {}: {e}", ca.label);
                            let label = ca.label.clone();
                            // The slot is free before the client sees its connection end
                            // (so a client that retries at once finds it), and that end
                            // comes before the report.
                            drop(slot.take());
                            drop(ca);
                            ConnStats {
                                id,
                                a: label,
                                b: b.to_string(),
                                bytes_a_to_b: 0,
                                bytes_b_to_a: 0,
                                millis: start.elapsed().as_millis() as u64,
                                spliced: false,
                                path: "copy",
                                user_bytes: 0,
                                send: "copy",
                                zerocopy: None,
                                error: Some(error_chain(&e)),
                            }
                        }
                    };
                    // The slot is free again before the report (which may be slow, or panic),
                    // as soon as possible after the client has seen its connection end.
                    drop(slot);
                    report(&st);
                });
            }
        })
    }
}

/// Runs a relay between addresses `a` and `b`; `report` is called for every finished
/// connection. Without `fork` it serves one connection and returns.
pub fn run(
    a: &Address,
    b: &Address,
    opts: &Options,
    report: &(dyn Fn(&ConnStats) + Sync),
) -> Result<(), RelayError> {
    Relay::open(a, b, opts)?.serve(report)
}

/// An error with its causes, `a: b: c`.
pub(crate) use nsfast_sys::report::error_chain;

#[cfg(test)]
mod chunk_tests {
    use super::*;

    #[test]
    fn splice_requests_grow_with_bulk_and_shrink_with_small_messages() {
        let buf = 256 << 10;
        let mut c = SPLICE_MIN;
        for _ in 0..10 {
            c = next_chunk(c, c, buf);
        }
        assert_eq!(c, buf, "full reads grow the request up to the buffer");
        for _ in 0..10 {
            c = next_chunk(c, 1, buf);
        }
        assert_eq!(c, SPLICE_MIN, "1-byte messages shrink it to one page");
        assert_eq!(
            next_chunk(64 << 10, 20 << 10, buf),
            64 << 10,
            "steady in between"
        );
        assert_eq!(next_chunk(4096, 4096, 1024), 1024, "never above the buffer");
        assert_eq!(
            next_chunk(1024, 1, 1024),
            1024,
            "nor below it when it is under a page"
        );
    }
}

#[cfg(test)]
mod slot_tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::sync::atomic::AtomicUsize;

    // A report callback that panics on every connection (as a println! on a closed stdout
    // did) must not keep the connection's --max-children slot: with one child, the relay
    // serves connection after connection.
    #[test]
    fn a_panicking_report_gives_its_slot_back() {
        let d = std::env::temp_dir().join(format!("nsft-slot-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let (front, back) = (d.join("front"), d.join("back"));
        let l = UnixListener::bind(&back).unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let mut s = s.unwrap();
                let mut v = Vec::new();
                s.read_to_end(&mut v).unwrap();
                s.write_all(&v).unwrap();
            }
        });
        let a: Address = format!("unix-listen:{}", front.display()).parse().unwrap();
        let b: Address = format!("unix:{}", back.display()).parse().unwrap();
        let opts = Options {
            fork: true,
            max_children: 1,
            ..Options::default()
        };
        let r = Relay::open(&a, &b, &opts).unwrap();
        static REPORTS: AtomicUsize = AtomicUsize::new(0);
        std::thread::spawn(move || {
            let _ = r.serve(&|_| {
                REPORTS.fetch_add(1, Ordering::SeqCst);
                panic!("report failed");
            });
        });
        for i in 0..4usize {
            let mut c = UnixStream::connect(&front).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            c.write_all(b"hello").unwrap();
            c.shutdown(std::net::Shutdown::Write).unwrap();
            let mut v = Vec::new();
            c.read_to_end(&mut v)
                .unwrap_or_else(|e| panic!("connection {i}: {e} (slot kept by a panic?)"));
            assert_eq!(v, b"hello", "connection {i}");
            // The report comes after the slot is given back: once it has run, the next
            // connection must find the slot free (one arriving before is closed at once).
            let t0 = Instant::now();
            while REPORTS.load(Ordering::SeqCst) <= i {
                assert!(t0.elapsed() < Duration::from_secs(20), "no report {i}");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
