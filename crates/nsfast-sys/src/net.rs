//! rtnetlink helpers with a synchronous face: each call opens a netlink socket inside the
//! requested namespace (on a helper thread), does its work on a current-thread tokio runtime
//! and returns. Cheap enough for setup paths; nothing here is on a data path.

use std::future::Future;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd};

use futures::TryStreamExt;
use rtnetlink::packet_route::link::NetkitMode;
use rtnetlink::{Handle, LinkNetkit, LinkUnspec, LinkVeth, RouteMessageBuilder};

use crate::netns::{NetNs, NetnsError};

/// rtnetlink errors; each names the object involved.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("netlink: {what}: {source}")]
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

fn nl(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetError {
    let what = what.into();
    move |source| NetError::Netlink { what, source }
}

/// Runs `f` with an rtnetlink handle bound to `ns` (or the caller's namespace).
pub fn with_handle<F, Fut, R>(ns: Option<&NetNs>, f: F) -> Result<R, NetError>
where
    F: FnOnce(Handle) -> Fut + Send,
    Fut: Future<Output = Result<R, NetError>>,
    R: Send,
{
    let work = move || -> Result<R, NetError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        rt.block_on(async move {
            let (conn, handle, _) = rtnetlink::new_connection()?;
            let task = tokio::spawn(conn);
            let r = f(handle).await;
            task.abort();
            r
        })
    };
    match ns {
        Some(ns) => ns.run(work)?,
        None => std::thread::scope(|s| s.spawn(work).join()).unwrap_or_else(|_| {
            Err(NetError::Io(std::io::Error::other(
                "netlink thread panicked",
            )))
        }),
    }
}

async fn index_of(handle: &Handle, name: &str) -> Result<u32, NetError> {
    let mut links = handle.link().get().match_name(name.to_string()).execute();
    match links.try_next().await {
        Ok(Some(msg)) => Ok(msg.header.index),
        Ok(None) => Err(NetError::NoSuchLink(name.into())),
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => {
            Err(NetError::NoSuchLink(name.into()))
        }
        Err(e) => Err(nl(format!("get link {name}"))(e)),
    }
}

/// The ifindex of `name` in `ns`.
pub fn link_index(ns: Option<&NetNs>, name: &str) -> Result<u32, NetError> {
    with_handle(ns, |h| async move { index_of(&h, name).await })
}

/// Sets link `name` up.
pub fn link_up(ns: Option<&NetNs>, name: &str) -> Result<(), NetError> {
    with_handle(ns, |h| async move {
        let idx = index_of(&h, name).await?;
        h.link()
            .set(LinkUnspec::new_with_index(idx).up().build())
            .execute()
            .await
            .map_err(nl(format!("set {name} up")))
    })
}

/// Creates a veth pair `name_a` (in `ns_a`) <-> `name_b` (in `ns_b`), both up.
pub fn create_veth(ns_a: &NetNs, name_a: &str, ns_b: &NetNs, name_b: &str) -> Result<(), NetError> {
    let fd_b = ns_b.as_fd().as_raw_fd();
    with_handle(Some(ns_a), |h| async move {
        h.link()
            .add(LinkVeth::new(name_a, name_b).build())
            .execute()
            .await
            .map_err(nl(format!("add veth {name_a}/{name_b}")))?;
        let idx_b = index_of(&h, name_b).await?;
        h.link()
            .set(LinkUnspec::new_with_index(idx_b).setns_by_fd(fd_b).build())
            .execute()
            .await
            .map_err(nl(format!("move {name_b} to its namespace")))?;
        let idx_a = index_of(&h, name_a).await?;
        h.link()
            .set(LinkUnspec::new_with_index(idx_a).up().build())
            .execute()
            .await
            .map_err(nl(format!("set {name_a} up")))
    })?;
    link_up(Some(ns_b), name_b)
}

/// Creates a netkit pair `name` <-> `peer` inside `ns` (L3 mode when `l3`), both left down.
pub fn create_netkit(ns: Option<&NetNs>, name: &str, peer: &str, l3: bool) -> Result<(), NetError> {
    let mode = if l3 { NetkitMode::L3 } else { NetkitMode::L2 };
    with_handle(ns, |h| async move {
        h.link()
            .add(LinkNetkit::new(name, peer, mode).build())
            .execute()
            .await
            .map_err(nl(format!("add netkit {name}/{peer}")))
    })
}

/// Deletes link `name` (and, for a veth, its peer). Missing is not an error.
pub fn delete_link(ns: Option<&NetNs>, name: &str) -> Result<(), NetError> {
    with_handle(ns, |h| async move {
        match index_of(&h, name).await {
            Ok(idx) => h
                .link()
                .del(idx)
                .execute()
                .await
                .map_err(nl(format!("delete {name}"))),
            Err(NetError::NoSuchLink(_)) => Ok(()),
            Err(e) => Err(e),
        }
    })
}

/// Adds `addr/prefix` to link `name`.
pub fn add_address(
    ns: Option<&NetNs>,
    name: &str,
    addr: IpAddr,
    prefix: u8,
) -> Result<(), NetError> {
    with_handle(ns, |h| async move {
        let idx = index_of(&h, name).await?;
        h.address()
            .add(idx, addr, prefix)
            .execute()
            .await
            .map_err(nl(format!("add {addr}/{prefix} to {name}")))
    })
}

/// Adds a route to `dst/prefix`, via `gateway` and/or out of `dev`.
pub fn add_route(
    ns: Option<&NetNs>,
    dst: IpAddr,
    prefix: u8,
    gateway: Option<IpAddr>,
    dev: Option<&str>,
) -> Result<(), NetError> {
    with_handle(ns, |h| async move {
        let oif = match dev {
            Some(d) => Some(index_of(&h, d).await?),
            None => None,
        };
        let msg = match dst {
            IpAddr::V4(d) => {
                let mut b =
                    RouteMessageBuilder::<std::net::Ipv4Addr>::new().destination_prefix(d, prefix);
                if let Some(IpAddr::V4(g)) = gateway {
                    b = b.gateway(g);
                }
                if let Some(i) = oif {
                    b = b.output_interface(i);
                }
                b.build()
            }
            IpAddr::V6(d) => {
                let mut b =
                    RouteMessageBuilder::<std::net::Ipv6Addr>::new().destination_prefix(d, prefix);
                if let Some(IpAddr::V6(g)) = gateway {
                    b = b.gateway(g);
                }
                if let Some(i) = oif {
                    b = b.output_interface(i);
                }
                b.build()
            }
        };
        h.route()
            .add(msg)
            .execute()
            .await
            .map_err(nl(format!("add route {dst}/{prefix}")))
    })
}

/// Writes a sysctl (`net.ipv4.ip_forward` style key) inside `ns`.
pub fn set_sysctl(ns: Option<&NetNs>, key: &str, value: &str) -> Result<(), NetError> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    let work = || std::fs::write(&path, value);
    match ns {
        Some(ns) => ns.run(work)??,
        None => work()?,
    }
    Ok(())
}
