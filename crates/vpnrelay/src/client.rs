//! Who a flow belongs to, for the per-client quota (`--max-flows-per-client`).
//!
//! A client is the bridge port its datagrams enter on: the host-side veth of one container.
//! A container chooses its source addresses (CAP_NET_RAW, or `ip addr add` in its own
//! namespace) but not the port its frames arrive on. Locally delivered, a bridged datagram
//! names only the bridge (`IP_PKTINFO`), so the relay asks the bridge: a bridge-family
//! nf_tables rule copies the ingress port's index into the packet mark
//! ([`nsfast_sys::nftables`]) and the listeners read it (`SO_RCVMARK`). A mark that is not a
//! port of the relay's bridge (no mark, or one set by something else) counts as one shared
//! unknown port, never as a client of its own.
//!
//! Where the kernel cannot do that (`SO_RCVMARK` needs Linux 5.19; nf_tables with the
//! bridge family), the relay keys by source address, says so at start and in its stats
//! (`client_key: "address"`).

use std::net::Ipv4Addr;

/// What the relay's clients are told apart by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keying {
    /// The bridge port (packet mark set by the relay's bridge rule).
    Port,
    /// The source address (the kernel cannot report the port).
    Address,
}

impl Keying {
    /// As in the stats file (`client_key`).
    pub fn as_str(self) -> &'static str {
        match self {
            Keying::Port => "port",
            Keying::Address => "address",
        }
    }
}

/// The client a flow counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Client {
    /// The bridge port with this interface index.
    Port(u32),
    /// No port of the relay's bridge is known for the datagram: all such share one quota.
    UnknownPort,
    /// The source address ([`Keying::Address`]).
    Address(Ipv4Addr),
}

/// The client of a datagram from `src` carrying packet mark `mark`; `is_port` says whether
/// an interface index is a port of the relay's bridge.
pub fn of_datagram(
    keying: Keying,
    mark: Option<u32>,
    src: Ipv4Addr,
    is_port: impl FnOnce(u32) -> bool,
) -> Client {
    match keying {
        Keying::Address => Client::Address(src),
        Keying::Port => match mark {
            Some(m) if m != 0 && is_port(m) => Client::Port(m),
            _ => Client::UnknownPort,
        },
    }
}

/// Why a new flow is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The flow table is full.
    TableFull,
    /// The client holds its quota (this many flows).
    QuotaFull(usize),
}

/// Whether a new flow of `client` is refused, given the clients of the open flows.
pub fn refusal<'a>(
    open: impl IntoIterator<Item = &'a Client>,
    max_flows: usize,
    per_client: usize,
    client: &Client,
) -> Option<Refusal> {
    let (mut total, mut held) = (0, 0);
    for c in open {
        total += 1;
        held += usize::from(c == client);
    }
    if total >= max_flows {
        Some(Refusal::TableFull)
    } else if held >= per_client {
        Some(Refusal::QuotaFull(held))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> Ipv4Addr {
        Ipv4Addr::new(172, 30, 0, last)
    }

    #[test]
    fn a_port_is_one_client_whatever_the_source_says() {
        let ports = [7u32, 9];
        let is_port = |i| ports.contains(&i);
        let a: Vec<Client> = (10..18)
            .map(|i| of_datagram(Keying::Port, Some(7), ip(i), is_port))
            .collect();
        assert!(a.iter().all(|c| *c == Client::Port(7)), "{a:?}");
        // Another port, even with a source address port 7 used, is another client.
        assert_eq!(
            of_datagram(Keying::Port, Some(9), ip(10), is_port),
            Client::Port(9)
        );
    }

    #[test]
    fn no_mark_or_a_foreign_one_is_the_shared_unknown_port() {
        let is_port = |i| i == 7;
        for mark in [None, Some(0), Some(8), Some(u32::MAX)] {
            assert_eq!(
                of_datagram(Keying::Port, mark, ip(2), is_port),
                Client::UnknownPort,
                "{mark:?}"
            );
        }
    }

    #[test]
    fn address_keying_goes_by_source() {
        let never = |_| panic!("address keying does not look at ports");
        assert_eq!(
            of_datagram(Keying::Address, Some(7), ip(2), never),
            Client::Address(ip(2))
        );
        assert_ne!(
            of_datagram(Keying::Address, Some(7), ip(3), never),
            Client::Address(ip(2))
        );
    }

    /// The rootless test's case in miniature: eight flows from one port (eight source
    /// addresses) fill its quota; a ninth from it is refused, another port's is not.
    #[test]
    fn the_quota_counts_a_ports_flows_from_every_address() {
        let open: Vec<Client> = (10..18)
            .map(|i| of_datagram(Keying::Port, Some(7), ip(i), |_| true))
            .collect();
        let next_a = of_datagram(Keying::Port, Some(7), ip(18), |_| true);
        assert_eq!(refusal(&open, 64, 8, &next_a), Some(Refusal::QuotaFull(8)));
        assert_eq!(refusal(&open, 64, 8, &Client::Port(9)), None);
        assert_eq!(refusal(&open, 64, 9, &next_a), None);
        assert_eq!(
            refusal(&open, 8, 64, &Client::Port(9)),
            Some(Refusal::TableFull)
        );
        // Keyed by address the same flows are eight clients of one flow each.
        let by_addr: Vec<Client> = (10..18)
            .map(|i| of_datagram(Keying::Address, Some(7), ip(i), |_| true))
            .collect();
        assert_eq!(refusal(&by_addr, 64, 8, &Client::Address(ip(10))), None);
    }
}
