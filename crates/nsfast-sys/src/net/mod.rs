//! rtnetlink with a synchronous face, through a [`Netlink`] handle bound to one network
//! namespace: [`NetNs::netlink`] (or [`Netlink::current`]) opens one netlink socket inside
//! the namespace and one current-thread tokio runtime, and every call on the handle reuses
//! both. A socket keeps the namespace it was made in, so the namespace is entered only to
//! make the socket (on a short-lived thread), never per call. Open one handle per namespace
//! for a whole operation (a `pod add`, a relay's lifetime). Nothing here is on a data path.
//!
//! The calls, by concern:
//! - [`link`]  — find, create (veth, netkit), rename, move, set up and delete links; netkit probe.
//! - [`addr`]  — addresses and routes.
//! - [`rule`]  — `ip rule` port rules and the local default route they steer to.
//! - [`tc`]    — clsact qdiscs and cls_bpf filters: list, check, delete.
//! - [`neigh`] — neighbour entries.
//!
//! Dependency direction: `net` builds on [`crate::netns`]; `netns` knows nothing of `net`.

use std::fs::File;
use std::future::Future;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};

use rtnetlink::Handle;

use crate::netns::{NetNs, NetnsError};

pub mod addr;
pub mod link;
pub mod neigh;
pub mod rule;
pub mod tc;

pub use addr::Route4;
pub use link::{netkit_trial, probe_netkit, NetkitMode};
pub use rule::PortRule;
pub use tc::TcFilterInfo;

/// rtnetlink errors; each names the object involved.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("netlink: {what}")]
    Netlink {
        what: String,
        #[source]
        source: rtnetlink::Error,
    },
    #[error("no link named {0:?} in this namespace")]
    NoSuchLink(String),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("netlink runtime: {0}")]
    Io(#[from] std::io::Error),
}

pub(crate) fn nl(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetError {
    let what = what.into();
    move |source| NetError::Netlink { what, source }
}

pub(crate) fn is_code(e: &rtnetlink::Error, codes: &[i32]) -> bool {
    matches!(e, rtnetlink::Error::NetlinkError(m) if codes.iter().any(|c| m.raw_code() == -c))
}

/// Netlink connections opened by this process so far (every [`Netlink`] is one). For tests
/// that check an operation opens one connection per namespace it touches.
pub fn connections_opened() -> usize {
    OPENED.load(Ordering::SeqCst)
}

static OPENED: AtomicUsize = AtomicUsize::new(0);

/// One rtnetlink connection whose socket lives in one network namespace, with the
/// current-thread runtime that drives it. Calls block the calling thread; do not call them
/// from inside an async runtime.
pub struct Netlink {
    handle: Handle,
    /// The namespace the socket lives in (to move links into it).
    ns: OwnedFd,
    ns_name: String,
    conn: tokio::task::JoinHandle<()>,
    rt: tokio::runtime::Runtime,
}

impl std::fmt::Debug for Netlink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Netlink")
            .field("netns", &self.ns_name)
            .finish_non_exhaustive()
    }
}

type Conn = (
    rtnetlink::proto::Connection<netlink_packet_route::RouteNetlinkMessage>,
    Handle,
);

fn runtime() -> Result<tokio::runtime::Runtime, NetError> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?)
}

/// Makes the netlink socket on the calling thread (so in its namespace), registered with `rt`.
fn connect(rt: &tokio::runtime::Runtime) -> std::io::Result<Conn> {
    let _ctx = rt.enter();
    let (conn, handle, _) = rtnetlink::new_connection()?;
    Ok((conn, handle))
}

impl NetNs {
    /// A netlink handle bound to this namespace: one socket made inside it, reused by every
    /// call on the handle.
    pub fn netlink(&self) -> Result<Netlink, NetError> {
        Netlink::open(self)
    }
}

impl Netlink {
    /// A handle bound to `ns` (see [`NetNs::netlink`]).
    pub fn open(ns: &NetNs) -> Result<Self, NetError> {
        let rt = runtime()?;
        let conn = ns.run(|| connect(&rt))??;
        let fd = ns.as_fd().try_clone_to_owned()?;
        Ok(Self::assemble(rt, conn, fd, ns.name().to_string()))
    }

    /// A handle bound to the calling thread's namespace (no thread is spawned).
    pub fn current() -> Result<Self, NetError> {
        let rt = runtime()?;
        let conn = connect(&rt)?;
        let fd = OwnedFd::from(File::open("/proc/thread-self/ns/net")?);
        Ok(Self::assemble(rt, conn, fd, "current".into()))
    }

    /// `Some(ns)`: [`Netlink::open`]; `None`: [`Netlink::current`].
    pub fn of(ns: Option<&NetNs>) -> Result<Self, NetError> {
        match ns {
            Some(ns) => Self::open(ns),
            None => Self::current(),
        }
    }

    fn assemble(
        rt: tokio::runtime::Runtime,
        (conn, handle): Conn,
        ns: OwnedFd,
        ns_name: String,
    ) -> Self {
        OPENED.fetch_add(1, Ordering::SeqCst);
        let conn = rt.spawn(conn);
        Self {
            handle,
            ns,
            ns_name,
            conn,
            rt,
        }
    }

    /// The namespace's name (or path) as it was opened, `current` for [`Netlink::current`].
    pub fn netns_name(&self) -> &str {
        &self.ns_name
    }

    /// The namespace file descriptor (for `IFLA_NET_NS_FD`).
    pub(crate) fn netns_fd(&self) -> RawFd {
        self.ns.as_raw_fd()
    }

    /// Runs `f` with the handle on the handle's runtime, which also drives the connection.
    pub(crate) fn run<'a, F, Fut, R>(&'a self, f: F) -> Result<R, NetError>
    where
        F: FnOnce(&'a Handle) -> Fut,
        Fut: Future<Output = Result<R, NetError>> + 'a,
    {
        self.rt.block_on(f(&self.handle))
    }
}

impl Drop for Netlink {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

/// Writes a sysctl (`net.ipv4.ip_forward` style key) inside `ns` (not netlink: a file under
/// /proc/sys, written from a thread inside the namespace).
pub fn set_sysctl(ns: Option<&NetNs>, key: &str, value: &str) -> Result<(), NetError> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    let work = || std::fs::write(&path, value);
    match ns {
        Some(ns) => ns.run(work)??,
        None => work()?,
    }
    Ok(())
}
