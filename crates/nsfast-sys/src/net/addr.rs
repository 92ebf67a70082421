//! Addresses and routes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::TryStreamExt;
use rtnetlink::RouteMessageBuilder;

use super::link::index_of;
use super::{nl, NetError, Netlink};

fn local_default_route(table: u32, lo: u32) -> netlink_packet_route::route::RouteMessage {
    use netlink_packet_route::route::{RouteScope, RouteType};
    RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(Ipv4Addr::UNSPECIFIED, 0)
        .kind(RouteType::Local)
        .scope(RouteScope::Host)
        .table_id(table)
        .output_interface(lo)
        .build()
}

/// One IPv4 route of [`Netlink::ipv4_routes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route4 {
    pub dst: Ipv4Addr,
    pub prefix: u8,
    pub gateway: Option<Ipv4Addr>,
    /// Who installed it (`RTPROT_*`: 2 kernel, 3 boot, 4 static, 12 BIRD).
    pub protocol: u8,
}

impl Netlink {
    /// Adds `addr/prefix` to link `name`. An IPv6 address is added without duplicate address
    /// detection (`IFA_F_NODAD`, as `ip addr add ... nodad`): every address nsfast assigns is
    /// unique by construction, and an address under DAD stays tentative (bind(2) fails with
    /// EADDRNOTAVAIL) until the kernel's DAD work has run, which on a loaded machine is after
    /// the command that added it returned.
    pub fn add_address(&self, name: &str, addr: IpAddr, prefix: u8) -> Result<(), NetError> {
        use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags};
        self.run(|h| async move {
            let idx = index_of(h, name).await?;
            let mut req = h.address().add(idx, addr, prefix);
            if addr.is_ipv6() {
                let m = req.message_mut();
                m.header.flags |= AddressHeaderFlags::Nodad;
                // The kernel takes IFA_FLAGS over the header's flags when both are there.
                match m.attributes.iter_mut().find_map(|a| match a {
                    AddressAttribute::Flags(f) => Some(f),
                    _ => None,
                }) {
                    Some(f) => *f |= AddressFlags::Nodad,
                    None => m
                        .attributes
                        .push(AddressAttribute::Flags(AddressFlags::Nodad)),
                }
            }
            req.execute()
                .await
                .map_err(nl(format!("add {addr}/{prefix} to {name}")))
        })
    }

    /// Every address (with prefix length) on link `name`, both families.
    pub fn link_addresses(&self, name: &str) -> Result<Vec<(IpAddr, u8)>, NetError> {
        use netlink_packet_route::address::AddressAttribute;
        self.run(|h| async move {
            let idx = index_of(h, name).await?;
            let mut out = Vec::new();
            let mut addrs = h.address().get().set_link_index_filter(idx).execute();
            while let Some(msg) = addrs
                .try_next()
                .await
                .map_err(nl(format!("list addresses of {name}")))?
            {
                for a in &msg.attributes {
                    if let AddressAttribute::Address(ip) = a {
                        out.push((*ip, msg.header.prefix_len));
                    }
                }
            }
            Ok(out)
        })
    }

    /// The IPv4 addresses (with prefix length) on link `name`.
    pub fn link_ipv4_addresses(&self, name: &str) -> Result<Vec<(Ipv4Addr, u8)>, NetError> {
        Ok(self
            .link_addresses(name)?
            .into_iter()
            .filter_map(|(ip, p)| match ip {
                IpAddr::V4(v4) => Some((v4, p)),
                IpAddr::V6(_) => None,
            })
            .collect())
    }

    /// The IPv6 addresses (with prefix length) on link `name`.
    pub fn link_ipv6_addresses(&self, name: &str) -> Result<Vec<(Ipv6Addr, u8)>, NetError> {
        Ok(self
            .link_addresses(name)?
            .into_iter()
            .filter_map(|(ip, p)| match ip {
                IpAddr::V6(v6) => Some((v6, p)),
                IpAddr::V4(_) => None,
            })
            .collect())
    }

    /// The IPv4 unicast routes of every table (`ip -4 route show table all`, without local
    /// and broadcast routes).
    pub fn ipv4_routes(&self) -> Result<Vec<Route4>, NetError> {
        use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteType};
        self.run(|h| async move {
            let mut dump = h
                .route()
                .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
                .execute();
            let mut out = Vec::new();
            while let Some(m) = dump.try_next().await.map_err(nl("dump IPv4 routes"))? {
                if m.header.kind != RouteType::Unicast {
                    continue;
                }
                let mut r = Route4 {
                    dst: Ipv4Addr::UNSPECIFIED,
                    prefix: m.header.destination_prefix_length,
                    gateway: None,
                    protocol: m.header.protocol.into(),
                };
                for a in m.attributes {
                    match a {
                        RouteAttribute::Destination(RouteAddress::Inet(d)) => r.dst = d,
                        RouteAttribute::Gateway(RouteAddress::Inet(g)) => r.gateway = Some(g),
                        _ => {}
                    }
                }
                out.push(r);
            }
            Ok(out)
        })
    }

    /// Adds a route to `dst/prefix`, via `gateway` and/or out of `dev`.
    pub fn add_route(
        &self,
        dst: IpAddr,
        prefix: u8,
        gateway: Option<IpAddr>,
        dev: Option<&str>,
    ) -> Result<(), NetError> {
        self.run(|h| async move {
            let oif = match dev {
                Some(d) => Some(index_of(h, d).await?),
                None => None,
            };
            let msg = match dst {
                IpAddr::V4(d) => {
                    let mut b =
                        RouteMessageBuilder::<Ipv4Addr>::new().destination_prefix(d, prefix);
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
                        RouteMessageBuilder::<Ipv6Addr>::new().destination_prefix(d, prefix);
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

    /// Adds a link-scope route (`ip route add DST/PREFIX dev DEV scope link`) for an on-link
    /// gateway that is outside the device's own subnets.
    pub fn add_link_route(&self, dst: Ipv4Addr, prefix: u8, dev: &str) -> Result<(), NetError> {
        use netlink_packet_route::route::RouteScope;
        self.run(|h| async move {
            let idx = index_of(h, dev).await?;
            let msg = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(dst, prefix)
                .output_interface(idx)
                .scope(RouteScope::Link)
                .build();
            h.route()
                .add(msg)
                .execute()
                .await
                .map_err(nl(format!("add route {dst}/{prefix} dev {dev}")))
        })
    }

    /// `ip route replace local 0.0.0.0/0 dev lo table <table>`: everything that looks the
    /// table up is delivered to local sockets.
    pub fn add_local_default_route(&self, table: u32) -> Result<(), NetError> {
        self.run(|h| async move {
            let lo = index_of(h, "lo").await?;
            h.route()
                .add(local_default_route(table, lo))
                .replace()
                .execute()
                .await
                .map_err(nl(format!("add local default route to table {table}")))
        })
    }

    /// Removes the route added by [`Netlink::add_local_default_route`]. Missing is not an
    /// error.
    pub fn delete_local_default_route(&self, table: u32) -> Result<(), NetError> {
        self.run(|h| async move {
            let lo = index_of(h, "lo").await?;
            match h
                .route()
                .del(local_default_route(table, lo))
                .execute()
                .await
            {
                Ok(()) => Ok(()),
                Err(rtnetlink::Error::NetlinkError(e))
                    if e.raw_code() == -libc::ESRCH || e.raw_code() == -libc::ENOENT =>
                {
                    Ok(())
                }
                Err(e) => Err(nl(format!("delete local default route from table {table}"))(e)),
            }
        })
    }
}
