//! Neighbour entries.

use std::net::IpAddr;

use super::link::index_of;
use super::{nl, NetError, Netlink};

impl Netlink {
    /// Adds a permanent neighbour entry `ip -> mac` on link `dev` (replacing an existing one).
    pub fn add_neighbour(&self, dev: &str, ip: IpAddr, mac: [u8; 6]) -> Result<(), NetError> {
        self.run(|h| async move {
            let idx = index_of(h, dev).await?;
            h.neighbours()
                .add(idx, ip)
                .link_layer_address(&mac)
                .replace()
                .execute()
                .await
                .map_err(nl(format!("add neighbour {ip} on {dev}")))
        })
    }
}
