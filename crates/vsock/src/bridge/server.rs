//! The server: listeners per port and member transport, accept threads, admission under the
//! connection limits, one thread per bridged connection, connecting the target member.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nsfast_sys::vsock::{VsockAddr, VsockListener, VsockStream, VMADDR_CID_ANY, VMADDR_CID_HOST};
use tracing::warn;

use super::args::Transport;
use super::events::Event;
use super::policy::{list, Config};
use crate::conn::{self, Conn, SockOpts};
use crate::hybrid;
use crate::kernel::{KernelPath, Leg};
use crate::relay::{self, error_chain, DataPath};
use crate::unixsock::{BindError, BoundSocket};

/// Bridge options.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// At most this many bridged connections at once; more are refused (closed and reported).
    pub max_conns: usize,
    /// At most this many at once within one group (a connection counts in every group that
    /// holds both its ends), so one group cannot take the slots of the others.
    pub max_conns_per_group: usize,
    /// At most this many at once from one source CID, so one guest cannot take its group's.
    pub max_conns_per_cid: usize,
    /// A bridged connection that moved no byte either way for this long is closed (zero: never).
    pub idle_timeout: Duration,
    /// Bytes moved per call (splice pipe size or copy buffer).
    pub buffer: usize,
    pub sock: SockOpts,
    /// Limit for a hybrid target: its VMM's socket and the `OK` reply (AF_VSOCK targets use the
    /// kernel's vsock connect timeout).
    pub connect_timeout: Duration,
    /// `kernel` (experimental, like the relay's AF_VSOCK legs: docs/vsock.md): a connection
    /// whose two legs are AF_VSOCK (guest A's and guest B's) is joined in the kernel (sockmap
    /// redirect, crates/vsock/src/kernel.rs); the idle timeout is not applied to it. `splice`
    /// (the default) and `auto`: user space (`auto` never joins AF_VSOCK legs).
    pub path: DataPath,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            max_conns: 256,
            max_conns_per_group: 64,
            max_conns_per_cid: 32,
            idle_timeout: Duration::from_secs(3600),
            buffer: 256 << 10,
            sock: SockOpts::default(),
            connect_timeout: Duration::from_secs(10),
            path: DataPath::Splice,
        }
    }
}

/// Errors setting the bridge up.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error("listen on hybrid path {} (member {cid})", .path.display())]
    HybridListen {
        cid: u32,
        path: PathBuf,
        #[source]
        source: BindError,
    },
    #[error("listen on vsock port {port} (CID any)")]
    VsockListen {
        port: u32,
        #[source]
        source: io::Error,
    },
    #[error("--max-conns must be at least 1")]
    ZeroConns,
    #[error("--max-conns-per-group must be at least 1")]
    ZeroPerGroup,
    #[error("--max-conns-per-cid must be at least 1")]
    ZeroPerCid,
    #[error("--path kernel: {0}")]
    KernelPath(String),
}

enum Source {
    /// AF_VSOCK listener at CID_ANY:port.
    Vsock { l: VsockListener, port: u32 },
    /// A hybrid member's `PATH_port`.
    Hybrid { l: BoundSocket, cid: u32, port: u32 },
}

/// Open connections, counted against the limits.
#[derive(Default)]
struct Counts {
    total: usize,
    per_cid: BTreeMap<u32, usize>,
    /// Indexed like `Config::groups`.
    per_group: Vec<usize>,
}

/// One admitted connection's place in [`Counts`], given back when dropped (on every way its
/// thread ends, a panic in the report callback included).
struct Slot {
    bridge: Arc<Bridge>,
    src: u32,
    groups: Vec<usize>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.bridge.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_cid.get_mut(&self.src) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.per_cid.remove(&self.src);
            }
        }
        for &g in &self.groups {
            c.per_group[g] = c.per_group[g].saturating_sub(1);
        }
    }
}

/// An open bridge: every listener bound. [`Bridge::serve`] runs it.
pub struct Bridge {
    cfg: Config,
    opts: Options,
    sources: Vec<Source>,
    next_id: AtomicU64,
    counts: Mutex<Counts>,
    /// The kernel path, loaded once when `path` allows it and two members are AF_VSOCK.
    kernel: Option<KernelPath>,
}

/// The listening path for guest-initiated connections to `port` on a hybrid member.
pub fn hybrid_listen_path(path: &Path, port: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!("_{port}"));
    PathBuf::from(s)
}

impl Bridge {
    /// Binds every listener: per port, one AF_VSOCK listener at CID_ANY when any member is
    /// reached over vsock, and one UNIX listener `PATH_port` per hybrid member. Nothing is
    /// bound when any of them fails (the ones already bound are closed and their files removed).
    pub fn open(cfg: Config, opts: Options) -> Result<Self, BridgeError> {
        if opts.max_conns == 0 {
            return Err(BridgeError::ZeroConns);
        }
        if opts.max_conns_per_group == 0 {
            return Err(BridgeError::ZeroPerGroup);
        }
        if opts.max_conns_per_cid == 0 {
            return Err(BridgeError::ZeroPerCid);
        }
        let counts = Counts {
            per_group: vec![0; cfg.groups().len()],
            ..Counts::default()
        };
        let vsock_members = cfg
            .members()
            .values()
            .filter(|t| matches!(t, Transport::Vsock))
            .count();
        let kernel = match opts.path {
            // AF_VSOCK legs in the kernel path are experimental (docs/vsock.md): only on request.
            DataPath::Splice | DataPath::Auto => None,
            _ if vsock_members < 2 => {
                if opts.path == DataPath::Kernel {
                    return Err(BridgeError::KernelPath(
                        "the kernel path joins AF_VSOCK members only, and fewer than two are AF_VSOCK"
                            .into(),
                    ));
                }
                None
            }
            path => match KernelPath::load()
                .map_err(|e| error_chain(&e))
                .and_then(|k| k.pair_supported(Leg::Vsock, Leg::Vsock).map(|()| k))
            {
                Ok(k) => {
                    tracing::info!("kernel path loaded: AF_VSOCK <-> AF_VSOCK connections are joined with a sockmap redirect");
                    Some(k)
                }
                Err(why) if path == DataPath::Kernel => return Err(BridgeError::KernelPath(why)),
                Err(why) => {
                    tracing::info!("kernel path not used ({why}): bridging with splice");
                    None
                }
            },
        };
        let mut b = Self {
            cfg,
            opts,
            sources: Vec::new(),
            next_id: AtomicU64::new(0),
            counts: Mutex::new(counts),
            kernel,
        };
        let hybrids: Vec<(u32, PathBuf)> = b
            .cfg
            .members()
            .iter()
            .filter_map(|(&c, t)| match t {
                Transport::Hybrid(p) => Some((c, p.clone())),
                Transport::Vsock => None,
            })
            .collect();
        for &port in b.cfg.ports() {
            if b.cfg.uses_vsock() {
                let l = VsockListener::bind_with(
                    VsockAddr {
                        cid: VMADDR_CID_ANY,
                        port,
                    },
                    opts.sock.vsock_buffer,
                )
                .map_err(|source| BridgeError::VsockListen { port, source })?;
                b.sources.push(Source::Vsock { l, port });
            }
            for (cid, p) in &hybrids {
                let path = hybrid_listen_path(p, port);
                let l = BoundSocket::bind(&path).map_err(|source| BridgeError::HybridListen {
                    cid: *cid,
                    path: path.clone(),
                    source,
                })?;
                b.sources.push(Source::Hybrid { l, cid: *cid, port });
            }
        }
        Ok(b)
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// What is listening, one line each (for the startup log).
    pub fn listening(&self) -> Vec<String> {
        self.sources
            .iter()
            .map(|s| match s {
                Source::Vsock { port, .. } => format!("vsock CID any, port {port}"),
                Source::Hybrid { l, cid, .. } => {
                    format!("{} (member {cid})", l.path.display())
                }
            })
            .collect()
    }

    /// Removes the hybrid listening files, those still ours (on shutdown; also done on drop).
    pub fn remove_sockets(&self) {
        for s in &self.sources {
            if let Source::Hybrid { l, .. } = s {
                l.remove();
            }
        }
    }

    /// Admits a connection from `src` to `dst` under the limits, or says which one it hits.
    fn admit(self: &Arc<Self>, src: u32, dst: u32) -> Result<Slot, String> {
        let all = self.cfg.groups();
        let groups: Vec<usize> = (0..all.len())
            .filter(|&i| all[i].contains(&src) && all[i].contains(&dst))
            .collect();
        let o = &self.opts;
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let from_src = c.per_cid.get(&src).copied().unwrap_or(0);
        if from_src >= o.max_conns_per_cid {
            return Err(format!(
                "{src} has {from_src} connections open (--max-conns-per-cid {})",
                o.max_conns_per_cid
            ));
        }
        if let Some(&g) = groups
            .iter()
            .find(|&&g| c.per_group[g] >= o.max_conns_per_group)
        {
            return Err(format!(
                "group {} has {} connections open (--max-conns-per-group {})",
                list(&all[g]),
                c.per_group[g],
                o.max_conns_per_group
            ));
        }
        if c.total >= o.max_conns {
            return Err(format!("{} connections are open (--max-conns)", c.total));
        }
        c.total += 1;
        *c.per_cid.entry(src).or_default() += 1;
        for &g in &groups {
            c.per_group[g] += 1;
        }
        Ok(Slot {
            bridge: self.clone(),
            src,
            groups,
        })
    }

    /// Serves forever: one accept thread per listener, one thread per bridged connection.
    /// `report` gets every event. Returns only if a thread cannot be started.
    pub fn serve(self: &Arc<Self>, report: Arc<dyn Fn(&Event) + Send + Sync>) -> io::Result<()> {
        let mut handles = Vec::new();
        for i in 0..self.sources.len() {
            let b = self.clone();
            let report = report.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("accept-{i}"))
                    .spawn(move || b.accept_loop(i, report))?,
            );
        }
        for h in handles {
            let _ = h.join();
        }
        Ok(())
    }

    fn accept_loop(self: Arc<Self>, i: usize, report: Arc<dyn Fn(&Event) + Send + Sync>) {
        loop {
            let accepted = match &self.sources[i] {
                Source::Vsock { l, port } => l.accept().and_then(|(s, peer)| {
                    // The local CID is what the guest dialled (host or a sibling).
                    let local = s.local_addr()?;
                    Ok((OwnedFd::from(s), peer.cid, local.cid, *port))
                }),
                Source::Hybrid { l, cid, port } => l
                    .listener
                    .accept()
                    .map(|(s, _)| (OwnedFd::from(s), *cid, VMADDR_CID_HOST, *port)),
            };
            match accepted {
                Ok((fd, src, dialled, port)) => self.handle(fd, src, dialled, port, &report),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // EMFILE and the like: keep serving, without spinning.
                    warn!("accept on {}: {e}", self.listening()[i]);
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    fn handle(
        self: &Arc<Self>,
        fd: OwnedFd,
        src: u32,
        dialled: u32,
        port: u32,
        report: &Arc<dyn Fn(&Event) + Send + Sync>,
    ) {
        let deny = |reason: String| {
            report(&Event::Deny {
                src,
                dialled,
                port,
                reason,
            })
        };
        let dst = match self.cfg.route(src, dialled) {
            Ok(d) => d,
            Err(d) => return deny(d.to_string()),
        };
        let slot = match self.admit(src, dst) {
            Ok(s) => s,
            Err(why) => return deny(why),
        };
        let id = self.next_id.fetch_add(1, Ordering::SeqCst) + 1;
        let b = self.clone();
        let r = report.clone();
        // The slot moves into the thread (or is dropped with the closure if none starts).
        let spawned = std::thread::Builder::new()
            .name(format!("conn-{id}"))
            .spawn(move || b.bridge_one(slot, id, fd, src, dst, dialled, port, &*r));
        if let Err(e) = spawned {
            report(&Event::Fail {
                id,
                src,
                dst,
                port,
                error: format!("cannot start a thread: {e}"),
            });
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn bridge_one(
        &self,
        slot: Slot,
        id: u64,
        fd: OwnedFd,
        src: u32,
        dst: u32,
        dialled: u32,
        port: u32,
        report: &(dyn Fn(&Event) + Send + Sync),
    ) {
        // The slot is given back before the guest can see its connection end, so a guest that
        // reconnects at once after an EOF is never refused for the connection it just lost
        // (where the relay's own half-close comes first, at worst for an instant).
        let target = match self.connect_target(dst, port) {
            Ok(t) => t,
            Err(e) => {
                drop(slot);
                report(&Event::Fail {
                    id,
                    src,
                    dst,
                    port,
                    error: error_chain(&e),
                });
                // Closes the guest's connection.
                drop(fd);
                return;
            }
        };
        report(&Event::Open {
            id,
            src,
            dst,
            port,
            dialled,
        });
        let a = Conn::from_socket(fd, format!("{src}:{port}"));
        let b = Conn::from_socket(target, format!("{dst}:{port}"));
        let idle = Some(self.opts.idle_timeout).filter(|d| !d.is_zero());
        let start = std::time::Instant::now();
        let joined = self
            .kernel
            .as_ref()
            .filter(|_| Leg::of(&a) == Ok(Leg::Vsock) && Leg::of(&b) == Ok(Leg::Vsock))
            .map(|k| k.run(&a, &b));
        let s = match joined {
            Some(Ok(j)) => relay::ConnStats::joined(id, &a, &b, start, j),
            Some(Err(why)) if self.opts.path == DataPath::Kernel && !why.fallback_ok => {
                relay::ConnStats::refused(id, &a, &b, start, &why)
            }
            Some(Err(why)) => {
                tracing::debug!("connection {id}: not joined ({why}): bridging with splice");
                let mut st = relay::relay_with(id, a, b, self.opts.buffer, idle);
                st.bytes_a_to_b += why.pre[0];
                st.bytes_b_to_a += why.pre[1];
                st
            }
            None => relay::relay_with(id, a, b, self.opts.buffer, idle),
        };
        drop(slot);
        report(&Event::Close {
            id,
            src,
            dst,
            port,
            bytes_src_to_dst: s.bytes_a_to_b,
            bytes_dst_to_src: s.bytes_b_to_a,
            millis: s.millis,
            spliced: s.spliced,
            path: s.path,
            error: s.error,
        });
    }

    /// Connects to member `dst` on `port`.
    fn connect_target(&self, dst: u32, port: u32) -> Result<OwnedFd, TargetError> {
        match &self.cfg.members()[&dst] {
            Transport::Vsock => VsockStream::connect_with(
                VsockAddr { cid: dst, port },
                false,
                self.opts.sock.vsock_buffer,
            )
            .map(OwnedFd::from)
            .map_err(TargetError::Vsock),
            Transport::Hybrid(path) => {
                match conn::hybrid_connect(path, port, Some(self.opts.connect_timeout)) {
                    Ok(s) => Ok(s.into()),
                    Err(hybrid::HybridError::Connect(source)) => Err(TargetError::HybridIo {
                        path: path.clone(),
                        source,
                    }),
                    Err(source) => Err(TargetError::Hybrid {
                        path: path.clone(),
                        source,
                    }),
                }
            }
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.remove_sockets();
    }
}

/// Why a target could not be reached.
#[derive(Debug, thiserror::Error)]
enum TargetError {
    #[error("vsock connect")]
    Vsock(#[source] io::Error),
    #[error("connect to hybrid socket {}", .path.display())]
    HybridIo {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("hybrid handshake on {}", .path.display())]
    Hybrid {
        path: PathBuf,
        #[source]
        source: hybrid::HybridError,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_path_appends_the_port() {
        assert_eq!(
            hybrid_listen_path(Path::new("/run/vm/v.sock"), 5000),
            PathBuf::from("/run/vm/v.sock_5000")
        );
    }
}
