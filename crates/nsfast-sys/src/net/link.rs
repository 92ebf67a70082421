//! Links: find them, create veth and netkit pairs across namespaces, rename, set up, delete;
//! the netkit probe.

use futures::TryStreamExt;
use rtnetlink::{Handle, LinkUnspec, LinkVeth};

use super::{nl, NetError, Netlink};

/// The ifindex of `name` in the handle's namespace.
pub(super) async fn index_of(handle: &Handle, name: &str) -> Result<u32, NetError> {
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

async fn set_up(h: &Handle, idx: u32, name: &str) -> Result<(), NetError> {
    h.link()
        .set(LinkUnspec::new_with_index(idx).up().build())
        .execute()
        .await
        .map_err(nl(format!("set {name} up")))
}

async fn mac_of(handle: &Handle, name: &str) -> Result<[u8; 6], NetError> {
    use netlink_packet_route::link::LinkAttribute;
    let mut links = handle.link().get().match_name(name.to_string()).execute();
    let msg = match links.try_next().await {
        Ok(Some(msg)) => msg,
        Ok(None) => return Err(NetError::NoSuchLink(name.into())),
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => {
            return Err(NetError::NoSuchLink(name.into()))
        }
        Err(e) => return Err(nl(format!("get link {name}"))(e)),
    };
    for a in msg.attributes {
        if let LinkAttribute::Address(a) = a {
            if a.len() == 6 {
                let mut m = [0u8; 6];
                m.copy_from_slice(&a);
                return Ok(m);
            }
        }
    }
    // L3 devices (netkit L3, tun) have no MAC.
    Ok([0u8; 6])
}

/// Netkit device mode (`IFLA_NETKIT_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetkitMode {
    /// Ethernet headers, ARP (`NETKIT_L2`).
    L2,
    /// IP only, no ARP (`NETKIT_L3`).
    L3,
}

impl Netlink {
    /// The ifindex of `name`.
    pub fn link_index(&self, name: &str) -> Result<u32, NetError> {
        self.run(|h| index_of(h, name))
    }

    /// Link number `index`: its name and the index of its master (a bridge port's bridge),
    /// or `None` when there is no such link.
    pub fn link_by_index(&self, index: u32) -> Result<Option<(String, Option<u32>)>, NetError> {
        use netlink_packet_route::link::LinkAttribute;
        self.run(|h| async move {
            let mut links = h.link().get().match_index(index).execute();
            let msg = match links.try_next().await {
                Ok(Some(msg)) => msg,
                Ok(None) => return Ok(None),
                Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => {
                    return Ok(None)
                }
                Err(e) => return Err(nl(format!("get link {index}"))(e)),
            };
            let (mut name, mut master) = (None, None);
            for a in msg.attributes {
                match a {
                    LinkAttribute::IfName(n) => name = Some(n),
                    LinkAttribute::Controller(m) => master = Some(m),
                    _ => {}
                }
            }
            Ok(name.map(|n| (n, master)))
        })
    }

    /// Whether link `name` exists.
    pub fn link_exists(&self, name: &str) -> Result<bool, NetError> {
        match self.link_index(name) {
            Ok(_) => Ok(true),
            Err(NetError::NoSuchLink(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The MAC address of link `name` (all zero for a device without one).
    pub fn link_mac(&self, name: &str) -> Result<[u8; 6], NetError> {
        self.run(|h| mac_of(h, name))
    }

    /// Sets link `name` up.
    pub fn link_up(&self, name: &str) -> Result<(), NetError> {
        self.run(|h| async move {
            let idx = index_of(h, name).await?;
            set_up(h, idx, name).await
        })
    }

    /// Renames link `old` to `new` (the link must be down).
    pub fn rename_link(&self, old: &str, new: &str) -> Result<(), NetError> {
        self.run(|h| async move {
            let idx = index_of(h, old).await?;
            h.link()
                .set(
                    LinkUnspec::new_with_index(idx)
                        .name(new.to_string())
                        .build(),
                )
                .execute()
                .await
                .map_err(nl(format!("rename {old} to {new}")))
        })
    }

    /// Creates a bridge `name` here, up (a shared L2 segment: throwaway worlds join several
    /// namespaces to it with veth pairs and [`Netlink::set_controller`]).
    pub fn create_bridge(&self, name: &str) -> Result<(), NetError> {
        self.run(|h| async move {
            h.link()
                .add(rtnetlink::LinkBridge::new(name).up().build())
                .execute()
                .await
                .map_err(nl(format!("add bridge {name}")))
        })
    }

    /// Makes link `port` a port of bridge `bridge` (`ip link set PORT master BRIDGE`) and sets
    /// it up.
    pub fn set_controller(&self, port: &str, bridge: &str) -> Result<(), NetError> {
        self.run(|h| async move {
            let (p, b) = (index_of(h, port).await?, index_of(h, bridge).await?);
            h.link()
                .set(LinkUnspec::new_with_index(p).controller(b).up().build())
                .execute()
                .await
                .map_err(nl(format!("set {port} master {bridge}")))
        })
    }

    /// Deletes link `name` (and, for a veth, its peer). Missing is not an error.
    pub fn delete_link(&self, name: &str) -> Result<(), NetError> {
        self.run(|h| async move {
            match index_of(h, name).await {
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

    /// Creates a veth pair `name_a` (here) <-> `name_b` (in `b`'s namespace, which may be
    /// this one), both up.
    pub fn create_veth(&self, name_a: &str, b: &Netlink, name_b: &str) -> Result<(), NetError> {
        self.create_pair_into(
            LinkVeth::new(name_a, name_b).build(),
            name_a,
            name_b,
            b,
            name_b,
        )
    }

    /// Creates a veth pair whose `host_name` end stays here and whose other end ends up in
    /// `pod`'s namespace named `pod_name` (it is created under the temporary name `tmp_name`,
    /// so `pod_name` may exist here, e.g. `eth0`). Both ends are up. On error nothing is left.
    pub fn create_veth_into(
        &self,
        host_name: &str,
        tmp_name: &str,
        pod: &Netlink,
        pod_name: &str,
    ) -> Result<(), NetError> {
        self.create_pair_into(
            LinkVeth::new(host_name, tmp_name).build(),
            host_name,
            tmp_name,
            pod,
            pod_name,
        )
    }

    /// Creates a netkit pair: `primary` stays here with policy forward, `peer` is moved into
    /// `pod`'s namespace and renamed `pod_name`, with policy blackhole (drop until a program
    /// is attached to `BPF_NETKIT_PEER`), as Cilium does. Both ends are set up. Fails with
    /// `EOPNOTSUPP` on kernels without netkit.
    pub fn create_netkit(
        &self,
        primary: &str,
        peer: &str,
        pod: &Netlink,
        pod_name: &str,
        mode: NetkitMode,
    ) -> Result<(), NetError> {
        use rtnetlink::packet_route::link::{NetkitMode as M, NetkitPolicy};
        let m = match mode {
            NetkitMode::L2 => M::L2,
            NetkitMode::L3 => M::L3,
        };
        self.create_pair_into(
            rtnetlink::LinkNetkit::new(primary, peer, m)
                .policy(NetkitPolicy::Pass)
                .peer_policy(NetkitPolicy::Drop)
                .build(),
            primary,
            peer,
            pod,
            pod_name,
        )
    }

    /// Adds the pair described by `msg` here (ends `host_name` and `tmp_name`), moves
    /// `tmp_name` into `pod`'s namespace, renames it `pod_name` there and sets both ends up.
    /// On error the pair is deleted again. Shared by veth and netkit pairs.
    fn create_pair_into(
        &self,
        msg: rtnetlink::packet_route::link::LinkMessage,
        host_name: &str,
        tmp_name: &str,
        pod: &Netlink,
        pod_name: &str,
    ) -> Result<(), NetError> {
        let fd_pod = pod.netns_fd();
        let r = self
            .run(|h| async move {
                h.link()
                    .add(msg)
                    .execute()
                    .await
                    .map_err(nl(format!("add {host_name}/{tmp_name}")))?;
                let idx_b = index_of(h, tmp_name).await?;
                h.link()
                    .set(
                        LinkUnspec::new_with_index(idx_b)
                            .setns_by_fd(fd_pod)
                            .build(),
                    )
                    .execute()
                    .await
                    .map_err(nl(format!("move {tmp_name} to its namespace")))?;
                let idx_a = index_of(h, host_name).await?;
                set_up(h, idx_a, host_name).await
            })
            .and_then(|()| {
                if tmp_name != pod_name {
                    pod.rename_link(tmp_name, pod_name)?;
                }
                pod.link_up(pod_name)
            });
        if r.is_err() {
            let _ = self.delete_link(host_name);
        }
        r
    }
}

/// Whether the running kernel can create netkit devices. The probe runs in a private,
/// unnamed network namespace made on a short-lived thread, so nothing visible changes.
pub fn probe_netkit() -> Result<bool, NetError> {
    match netkit_trial() {
        Ok(()) => Ok(true),
        Err(NetError::Netlink {
            source: rtnetlink::Error::NetlinkError(e),
            ..
        }) if e.raw_code() == -libc::EOPNOTSUPP || e.raw_code() == -libc::EINVAL => Ok(false),
        Err(e) => Err(e),
    }
}

/// Creates an L3 netkit pair in a private throwaway network namespace that dies with its
/// thread (and the one netlink socket made in it); returns the kernel's answer as is.
pub fn netkit_trial() -> Result<(), NetError> {
    std::thread::scope(|s| {
        s.spawn(|| -> Result<(), NetError> {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| NetError::Io(std::io::Error::from(e)))?;
            // The socket is made on this thread, so in the throwaway namespace.
            let nl_ = Netlink::current()?;
            nl_.run(|h| async move {
                h.link()
                    .add(
                        rtnetlink::LinkNetkit::new(
                            "nsfprobe0",
                            "nsfprobe1",
                            rtnetlink::packet_route::link::NetkitMode::L3,
                        )
                        .build(),
                    )
                    .execute()
                    .await
                    .map_err(nl("add netkit nsfprobe0/nsfprobe1"))
            })
        })
        .join()
    })
    .unwrap_or_else(|_| Err(NetError::Io(std::io::Error::other("probe thread panicked"))))
}
