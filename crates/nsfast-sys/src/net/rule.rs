//! `ip rule` port rules steering protocol traffic to a routing table.

use futures::TryStreamExt;
use rtnetlink::Handle;

use super::{nl, NetError, Netlink};

/// One `ip rule` steering protocol traffic that enters on a link to a routing table:
/// `iif <iif> ipproto <proto> dport <start>-<end> lookup <table> priority <priority>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRule {
    pub iif: String,
    pub ip_proto: u8,
    pub dport: (u16, u16),
    pub table: u32,
    pub priority: u32,
    /// Only packets from this address (`from A/32`) and source port (`sport P`), when set.
    pub from: Option<std::net::SocketAddrV4>,
}

fn rule_matches(msg: &netlink_packet_route::rule::RuleMessage, r: &PortRule) -> bool {
    use netlink_packet_route::rule::RuleAttribute as A;
    let mut table = u32::from(msg.header.table);
    let mut prio = 0;
    let mut iif = None;
    for a in &msg.attributes {
        match a {
            A::Table(t) => table = *t,
            A::Priority(p) => prio = *p,
            A::Iifname(n) => iif = Some(n.as_str()),
            _ => {}
        }
    }
    table == r.table && prio == r.priority && iif == Some(r.iif.as_str())
}

/// The rule's `from A/32 sport P`, if it has both.
fn rule_from(msg: &netlink_packet_route::rule::RuleMessage) -> Option<std::net::SocketAddrV4> {
    use netlink_packet_route::rule::RuleAttribute as A;
    let mut src = None;
    let mut sport = None;
    for a in &msg.attributes {
        match a {
            A::Source(std::net::IpAddr::V4(ip)) if msg.header.src_len == 32 => src = Some(*ip),
            A::SourcePortRange(r) if r.start == r.end => sport = Some(r.start),
            _ => {}
        }
    }
    Some(std::net::SocketAddrV4::new(src?, sport?))
}

/// The IPv4 rules with this iif, table and priority (whatever their ports).
async fn port_rules(
    h: &Handle,
    iif: &str,
    table: u32,
    priority: u32,
) -> Result<Vec<netlink_packet_route::rule::RuleMessage>, NetError> {
    let probe = PortRule {
        iif: iif.to_string(),
        ip_proto: 0,
        dport: (0, 0),
        table,
        priority,
        from: None,
    };
    let mut found = Vec::new();
    let mut rules = h.rule().get(rtnetlink::IpVersion::V4).execute();
    while let Some(msg) = rules.try_next().await.map_err(nl("list rules"))? {
        if rule_matches(&msg, &probe) {
            found.push(msg);
        }
    }
    Ok(found)
}

impl Netlink {
    /// Adds an IPv4 `PortRule` (an existing identical rule is an error from the kernel:
    /// EEXIST, which is reported as success).
    pub fn add_port_rule(&self, r: &PortRule) -> Result<(), NetError> {
        use netlink_packet_route::rule::{RuleAttribute, RulePortRange};
        self.run(|h| async move {
            let mut req = h
                .rule()
                .add()
                .v4()
                .input_interface(r.iif.clone())
                .table_id(r.table)
                .priority(r.priority)
                // Without an explicit action the kernel treats the rule as FR_ACT_UNSPEC and
                // fails every lookup through it (EINVAL): packets are dropped, not routed.
                .action(netlink_packet_route::rule::RuleAction::ToTable);
            let attrs = &mut req.message_mut().attributes;
            attrs.push(RuleAttribute::IpProtocol(
                netlink_packet_route::IpProtocol::from(r.ip_proto),
            ));
            attrs.push(RuleAttribute::DestinationPortRange(RulePortRange {
                start: r.dport.0,
                end: r.dport.1,
            }));
            if let Some(from) = r.from {
                req.message_mut().header.src_len = 32;
                let attrs = &mut req.message_mut().attributes;
                attrs.push(RuleAttribute::Source((*from.ip()).into()));
                attrs.push(RuleAttribute::SourcePortRange(RulePortRange {
                    start: from.port(),
                    end: from.port(),
                }));
            }
            match req.execute().await {
                Ok(()) => Ok(()),
                Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::EEXIST => Ok(()),
                Err(e) => Err(nl(format!(
                    "add rule iif {} dport {}-{} table {}",
                    r.iif, r.dport.0, r.dport.1, r.table
                ))(e)),
            }
        })
    }

    /// Deletes every IPv4 rule with this iif, table and priority (whatever its ports).
    /// Returns how many were deleted.
    pub fn delete_port_rules(
        &self,
        iif: &str,
        table: u32,
        priority: u32,
    ) -> Result<usize, NetError> {
        self.run(|h| async move {
            let found = port_rules(h, iif, table, priority).await?;
            let n = found.len();
            for msg in found {
                match h.rule().del(msg).execute().await {
                    Ok(()) => {}
                    Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENOENT => {}
                    Err(e) => return Err(nl(format!("delete rule iif {iif} table {table}"))(e)),
                }
            }
            Ok(n)
        })
    }

    /// Deletes the IPv4 rules with this iif, table and priority whose `from A/32 sport P` is
    /// `from` (rules added with [`PortRule::from`]). Returns how many were deleted.
    pub fn delete_port_rules_from(
        &self,
        iif: &str,
        table: u32,
        priority: u32,
        from: std::net::SocketAddrV4,
    ) -> Result<usize, NetError> {
        self.run(|h| async move {
            let found = port_rules(h, iif, table, priority).await?;
            let mut n = 0;
            for msg in found.into_iter().filter(|m| rule_from(m) == Some(from)) {
                match h.rule().del(msg).execute().await {
                    Ok(()) => n += 1,
                    Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENOENT => {}
                    Err(e) => return Err(nl(format!("delete rule iif {iif} from {from}"))(e)),
                }
            }
            Ok(n)
        })
    }

    /// Counts IPv4 rules with this iif, table and priority.
    pub fn count_port_rules(
        &self,
        iif: &str,
        table: u32,
        priority: u32,
    ) -> Result<usize, NetError> {
        self.run(|h| async move { Ok(port_rules(h, iif, table, priority).await?.len()) })
    }

    /// Counts IPv4 rules (any selector) that look up `table`.
    pub fn count_any_rules_to_table(&self, table: u32) -> Result<usize, NetError> {
        use netlink_packet_route::rule::RuleAttribute as A;
        self.run(|h| async move {
            let mut n = 0;
            let mut rules = h.rule().get(rtnetlink::IpVersion::V4).execute();
            while let Some(msg) = rules.try_next().await.map_err(nl("list rules"))? {
                let mut t = u32::from(msg.header.table);
                for a in &msg.attributes {
                    if let A::Table(x) = a {
                        t = *x;
                    }
                }
                if t == table {
                    n += 1;
                }
            }
            Ok(n)
        })
    }
}
