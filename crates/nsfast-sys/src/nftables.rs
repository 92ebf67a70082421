//! nf_tables over nfnetlink (NETLINK_NETFILTER): one bridge-family table whose prerouting
//! chain sets each frame's packet mark to the index of the bridge port it entered on.
//! Works in the calling thread's network namespace; CAP_NET_ADMIN over that namespace is
//! enough (a rootless user namespace's root has it over its own namespaces).
//!
//! Why a packet mark: a frame that a bridge delivers locally reaches the IP stack with the
//! bridge as its device (`IP_PKTINFO`'s `ipi_ifindex`, `SO_BINDTODEVICE` and `ip rule iif`
//! all see the bridge, never the port). Only the bridge's own hooks still know the port
//! (`meta iif` in the bridge family's prerouting hook), and the mark they set travels with
//! the packet to the socket (`SO_RCVMARK`). A container cannot set it: the mark of a packet
//! that crosses into another network namespace over a veth is cleared.
//!
//! Only what vpnrelay needs, built by hand like [`crate::conntrack`]: no crate encodes
//! nf_tables messages without a C library (libnftnl) or the `nft` program.

use std::io;
use std::net::Ipv4Addr;
use std::time::Duration;

use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NFNL_MSG_BATCH_END: u16 = 17;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
const NFPROTO_BRIDGE: u8 = 7;

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLMSG_ERROR: u16 = 2;
const NLA_F_NESTED: u16 = 0x8000;

const NFTA_TABLE_NAME: u16 = 1;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
const NFTA_META_SREG: u16 = 3;
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFTA_BITWISE_SREG: u16 = 1;
const NFTA_BITWISE_DREG: u16 = 2;
const NFTA_BITWISE_LEN: u16 = 3;
const NFTA_BITWISE_MASK: u16 = 4;
const NFTA_BITWISE_XOR: u16 = 5;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;

const NFT_REG_1: u32 = 1;
const NFT_META_PROTOCOL: u32 = 1;
const NFT_META_MARK: u32 = 3;
const NFT_META_IIF: u32 = 4;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_CMP_EQ: u32 = 0;
const NF_BR_PRE_ROUTING: u32 = 0;
const NF_ACCEPT: u32 = 1;
/// The chain's priority: with the bridge's destination NAT (`NF_BR_PRI_NAT_DST_BRIDGED`), before
/// br_netfilter hands frames to the IP hooks (`NF_BR_PRI_BRNF`, 0).
pub const PORT_MARK_PRIORITY: i32 = -300;
/// The chain that marks frames.
pub const PORT_MARK_CHAIN: &str = "port-mark";

/// nf_tables errors.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// The netlink socket could not be opened (no nfnetlink, or no permission).
    #[error("nfnetlink socket: {0}")]
    Socket(#[source] io::Error),
    /// The kernel refused the batch (or did not answer).
    #[error("nf_tables {op}: {source}")]
    Request {
        op: &'static str,
        #[source]
        source: io::Error,
    },
}

fn push_attr(buf: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(payload);
    while !buf.len().is_multiple_of(4) {
        buf.push(0);
    }
}

fn push_nested(buf: &mut Vec<u8>, ty: u16, f: impl FnOnce(&mut Vec<u8>)) {
    let mut inner = Vec::new();
    f(&mut inner);
    push_attr(buf, ty | NLA_F_NESTED, &inner);
}

fn push_str(buf: &mut Vec<u8>, ty: u16, s: &str) {
    let mut b = s.as_bytes().to_vec();
    b.push(0);
    push_attr(buf, ty, &b);
}

fn push_be32(buf: &mut Vec<u8>, ty: u16, v: u32) {
    push_attr(buf, ty, &v.to_be_bytes());
}

fn push_data(buf: &mut Vec<u8>, ty: u16, value: &[u8]) {
    push_nested(buf, ty, |b| push_attr(b, NFTA_DATA_VALUE, value));
}

fn push_expr(list: &mut Vec<u8>, name: &str, f: impl FnOnce(&mut Vec<u8>)) {
    push_nested(list, NFTA_LIST_ELEM, |e| {
        push_str(e, NFTA_EXPR_NAME, name);
        push_nested(e, NFTA_EXPR_DATA, f);
    });
}

fn cmp_eq(list: &mut Vec<u8>, value: &[u8]) {
    push_expr(list, "cmp", |d| {
        push_be32(d, NFTA_CMP_SREG, NFT_REG_1);
        push_be32(d, NFTA_CMP_OP, NFT_CMP_EQ);
        push_data(d, NFTA_CMP_DATA, value);
    });
}

fn mask_of(prefix: u8) -> u32 {
    match prefix.min(32) {
        0 => 0,
        p => u32::MAX << (32 - u32::from(p)),
    }
}

/// The expressions of one rule: `meta protocol ip ip saddr NET/PREFIX meta mark set meta
/// iif` (without the address match when `subnet` is `None`).
fn port_mark_exprs(subnet: Option<(Ipv4Addr, u8)>) -> Vec<u8> {
    let mut list = Vec::new();
    if let Some((net, prefix)) = subnet {
        push_expr(&mut list, "meta", |d| {
            push_be32(d, NFTA_META_KEY, NFT_META_PROTOCOL);
            push_be32(d, NFTA_META_DREG, NFT_REG_1);
        });
        cmp_eq(&mut list, &(libc::ETH_P_IP as u16).to_be_bytes());
        push_expr(&mut list, "payload", |d| {
            push_be32(d, NFTA_PAYLOAD_DREG, NFT_REG_1);
            push_be32(d, NFTA_PAYLOAD_BASE, NFT_PAYLOAD_NETWORK_HEADER);
            push_be32(d, NFTA_PAYLOAD_OFFSET, 12); // the IPv4 source address
            push_be32(d, NFTA_PAYLOAD_LEN, 4);
        });
        let mask = mask_of(prefix);
        push_expr(&mut list, "bitwise", |d| {
            push_be32(d, NFTA_BITWISE_SREG, NFT_REG_1);
            push_be32(d, NFTA_BITWISE_DREG, NFT_REG_1);
            push_be32(d, NFTA_BITWISE_LEN, 4);
            push_data(d, NFTA_BITWISE_MASK, &mask.to_be_bytes());
            push_data(d, NFTA_BITWISE_XOR, &[0; 4]);
        });
        cmp_eq(&mut list, &(u32::from(net) & mask).to_be_bytes());
    }
    push_expr(&mut list, "meta", |d| {
        push_be32(d, NFTA_META_KEY, NFT_META_IIF);
        push_be32(d, NFTA_META_DREG, NFT_REG_1);
    });
    push_expr(&mut list, "meta", |d| {
        push_be32(d, NFTA_META_KEY, NFT_META_MARK);
        push_be32(d, NFTA_META_SREG, NFT_REG_1);
    });
    list
}

/// A batch of nf_tables messages under construction.
struct Batch {
    buf: Vec<u8>,
    seq: u32,
    /// Sequence numbers that ask for an answer.
    acked: Vec<u32>,
}

impl Batch {
    fn new(seq: u32) -> Self {
        let mut b = Batch {
            buf: Vec::new(),
            seq,
            acked: Vec::new(),
        };
        b.msg(NFNL_MSG_BATCH_BEGIN, 0, libc::AF_UNSPEC as u8, &[]);
        b
    }

    fn msg(&mut self, ty: u16, flags: u16, family: u8, body: &[u8]) {
        let (ty, res_id) = if ty == NFNL_MSG_BATCH_BEGIN || ty == NFNL_MSG_BATCH_END {
            (ty, NFNL_SUBSYS_NFTABLES)
        } else {
            ((NFNL_SUBSYS_NFTABLES << 8) | ty, 0)
        };
        let len = (16 + 4 + body.len()) as u32;
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf
            .extend_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
        self.buf.extend_from_slice(&self.seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        // nfgenmsg: family, version 0, res_id (big-endian).
        self.buf.push(family);
        self.buf.push(0);
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        self.buf.extend_from_slice(body);
        if flags & NLM_F_ACK != 0 {
            self.acked.push(self.seq);
        }
        self.seq = self.seq.wrapping_add(1);
    }

    /// A bridge-family message that the kernel answers.
    fn bridge(&mut self, ty: u16, flags: u16, body: &[u8]) {
        self.msg(ty, flags | NLM_F_ACK, NFPROTO_BRIDGE, body);
    }

    fn finish(mut self) -> (Vec<u8>, Vec<u32>, u32) {
        self.msg(NFNL_MSG_BATCH_END, 0, libc::AF_UNSPEC as u8, &[]);
        (self.buf, self.acked, self.seq)
    }
}

fn table_body(table: &str) -> Vec<u8> {
    let mut b = Vec::new();
    push_str(&mut b, NFTA_TABLE_NAME, table);
    b
}

/// Adds `table` and deletes it again: the table is gone afterwards whether it was there or
/// not (a plain delete of a missing table fails the whole batch with ENOENT).
fn drop_table(b: &mut Batch, table: &str) {
    b.bridge(NFT_MSG_NEWTABLE, NLM_F_CREATE, &table_body(table));
    b.bridge(NFT_MSG_DELTABLE, 0, &table_body(table));
}

/// The batch that (re)creates `table` with its port-mark chain: one rule per subnet, or one
/// rule for every frame when `subnets` is empty.
fn port_mark_batch(seq: u32, table: &str, subnets: &[(Ipv4Addr, u8)]) -> Batch {
    let mut b = Batch::new(seq);
    drop_table(&mut b, table);
    b.bridge(NFT_MSG_NEWTABLE, NLM_F_CREATE, &table_body(table));
    let mut chain = Vec::new();
    push_str(&mut chain, NFTA_CHAIN_TABLE, table);
    push_str(&mut chain, NFTA_CHAIN_NAME, PORT_MARK_CHAIN);
    push_nested(&mut chain, NFTA_CHAIN_HOOK, |h| {
        push_be32(h, NFTA_HOOK_HOOKNUM, NF_BR_PRE_ROUTING);
        push_attr(h, NFTA_HOOK_PRIORITY, &PORT_MARK_PRIORITY.to_be_bytes());
    });
    push_be32(&mut chain, NFTA_CHAIN_POLICY, NF_ACCEPT);
    push_str(&mut chain, NFTA_CHAIN_TYPE, "filter");
    b.bridge(NFT_MSG_NEWCHAIN, NLM_F_CREATE, &chain);
    let subnets: Vec<Option<(Ipv4Addr, u8)>> = if subnets.is_empty() {
        vec![None]
    } else {
        subnets.iter().copied().map(Some).collect()
    };
    for s in subnets {
        let mut rule = Vec::new();
        push_str(&mut rule, NFTA_RULE_TABLE, table);
        push_str(&mut rule, NFTA_RULE_CHAIN, PORT_MARK_CHAIN);
        push_attr(
            &mut rule,
            NFTA_RULE_EXPRESSIONS | NLA_F_NESTED,
            &port_mark_exprs(s),
        );
        b.bridge(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, &rule);
    }
    b
}

/// Reads the answers to `acked` from one datagram of netlink messages: removes each answered
/// sequence number; the first refusal is returned as an error.
fn take_answers(mut b: &[u8], acked: &mut Vec<u32>) -> io::Result<()> {
    while b.len() >= 16 {
        let len = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let ty = u16::from_ne_bytes([b[4], b[5]]);
        let seq = u32::from_ne_bytes([b[8], b[9], b[10], b[11]]);
        if len < 16 || len > b.len() {
            return Err(io::Error::other("truncated netlink message"));
        }
        let payload = &b[16..len];
        b = &b[((len + 3) & !3).min(b.len())..];
        if ty != NLMSG_ERROR || !acked.contains(&seq) {
            continue;
        }
        acked.retain(|&s| s != seq);
        let code = payload
            .get(..4)
            .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .unwrap_or(-libc::EIO);
        match code.checked_neg() {
            Some(0) => {}
            Some(errno) if errno > 0 => return Err(io::Error::from_raw_os_error(errno)),
            _ => {
                return Err(io::Error::other(format!(
                    "netlink error code {code} is not a negative errno"
                )))
            }
        }
    }
    Ok(())
}

/// An nfnetlink socket in the namespace of the thread that opened it.
pub struct Nftables {
    sock: Socket,
    seq: u32,
}

impl Nftables {
    /// Opens an nfnetlink socket in the calling thread's network namespace.
    pub fn open() -> Result<Self, NftError> {
        let mut sock = Socket::new(NETLINK_NETFILTER).map_err(NftError::Socket)?;
        sock.bind_auto().map_err(NftError::Socket)?;
        sock.connect(&SocketAddr::new(0, 0))
            .map_err(NftError::Socket)?;
        crate::udp::set_recv_timeout(std::os::fd::AsFd::as_fd(&sock), Duration::from_secs(10))
            .map_err(NftError::Socket)?;
        Ok(Self { sock, seq: 1 })
    }

    fn send(&mut self, op: &'static str, b: Batch) -> Result<(), NftError> {
        let err = |source| NftError::Request { op, source };
        let (buf, mut acked, next) = b.finish();
        self.seq = next;
        self.sock.send(&buf, 0).map_err(err)?;
        let mut rx = vec![0u8; 64 * 1024];
        let mut first_err = None;
        while !acked.is_empty() {
            let n = match self.sock.recv(&mut &mut rx[..], 0) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(err(first_err.unwrap_or(e))),
            };
            if let Err(e) = take_answers(&rx[..n], &mut acked) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), |e| Err(err(e)))
    }

    /// (Re)creates the bridge-family `table` whose prerouting chain sets the packet mark of
    /// every IPv4 frame from `subnets` (of every frame, when empty) to the index of the
    /// bridge port it entered on. The chain hooks every bridge of the namespace: `subnets`
    /// keeps it to one bridge's traffic.
    pub fn set_port_marks(
        &mut self,
        table: &str,
        subnets: &[(Ipv4Addr, u8)],
    ) -> Result<(), NftError> {
        let b = port_mark_batch(self.seq, table, subnets);
        self.send("add the port-mark table", b)
    }

    /// Deletes the bridge-family `table` if it is there.
    pub fn delete_table(&mut self, table: &str) -> Result<(), NftError> {
        let mut b = Batch::new(self.seq);
        drop_table(&mut b, table);
        self.send("delete the port-mark table", b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attributes of a buffer: (type with flags, payload).
    fn attrs(mut b: &[u8]) -> Vec<(u16, Vec<u8>)> {
        let mut out = Vec::new();
        while b.len() >= 4 {
            let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
            let ty = u16::from_ne_bytes([b[2], b[3]]);
            out.push((ty, b[4..len].to_vec()));
            b = &b[((len + 3) & !3).min(b.len())..];
        }
        out
    }

    fn expr_names(list: &[u8]) -> Vec<String> {
        attrs(list)
            .into_iter()
            .map(|(ty, elem)| {
                assert_eq!(ty, NFTA_LIST_ELEM | NLA_F_NESTED);
                let name = attrs(&elem)
                    .into_iter()
                    .find(|(t, _)| *t == NFTA_EXPR_NAME)
                    .unwrap()
                    .1;
                String::from_utf8(name.split(|&c| c == 0).next().unwrap().to_vec()).unwrap()
            })
            .collect()
    }

    #[test]
    fn a_subnet_rule_matches_ipv4_sources_then_copies_the_port_into_the_mark() {
        let list = port_mark_exprs(Some((Ipv4Addr::new(172, 30, 0, 1), 24)));
        assert_eq!(
            expr_names(&list),
            ["meta", "cmp", "payload", "bitwise", "cmp", "meta", "meta"]
        );
        // The network compared against is the masked address.
        let bytes = list.windows(4).any(|w| w == [172, 30, 0, 0]);
        assert!(bytes, "172.30.0.0 in the rule");
        assert_eq!(expr_names(&port_mark_exprs(None)), ["meta", "meta"]);
        assert_eq!(mask_of(24), 0xffff_ff00);
        assert_eq!(mask_of(0), 0);
        assert_eq!(mask_of(40), u32::MAX);
    }

    #[test]
    fn the_batch_is_framed_and_every_change_is_answered() {
        let b = port_mark_batch(100, "vpnrelay-br-vpn", &[(Ipv4Addr::new(10, 0, 0, 1), 16)]);
        let (buf, acked, next) = b.finish();
        // begin, new+delete table, new table, chain, one rule, end.
        assert_eq!(next, 107);
        assert_eq!(acked, [101, 102, 103, 104, 105]);
        let mut types = Vec::new();
        let mut rest = &buf[..];
        while !rest.is_empty() {
            let len = u32::from_ne_bytes(rest[..4].try_into().unwrap()) as usize;
            types.push(u16::from_ne_bytes([rest[4], rest[5]]));
            rest = &rest[len..];
        }
        let nft = |t: u16| (NFNL_SUBSYS_NFTABLES << 8) | t;
        assert_eq!(
            types,
            [
                NFNL_MSG_BATCH_BEGIN,
                nft(NFT_MSG_NEWTABLE),
                nft(NFT_MSG_DELTABLE),
                nft(NFT_MSG_NEWTABLE),
                nft(NFT_MSG_NEWCHAIN),
                nft(NFT_MSG_NEWRULE),
                NFNL_MSG_BATCH_END
            ]
        );
    }

    #[test]
    fn answers_are_matched_to_their_requests() {
        fn answer(seq: u32, code: i32) -> Vec<u8> {
            let mut m = Vec::new();
            m.extend_from_slice(&36u32.to_ne_bytes());
            m.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
            m.extend_from_slice(&0u16.to_ne_bytes());
            m.extend_from_slice(&seq.to_ne_bytes());
            m.extend_from_slice(&0u32.to_ne_bytes());
            m.extend_from_slice(&code.to_ne_bytes());
            m.extend_from_slice(&[0; 16]);
            m
        }
        let mut acked = vec![1, 2, 3];
        let mut d = answer(1, 0);
        d.extend(answer(9, -libc::EPERM)); // not ours
        d.extend(answer(2, 0));
        take_answers(&d, &mut acked).unwrap();
        assert_eq!(acked, [3]);
        let e = take_answers(&answer(3, -libc::EPERM), &mut acked).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
        assert!(acked.is_empty());
        assert!(take_answers(&[1, 2, 3], &mut vec![1]).is_ok());
    }
}
