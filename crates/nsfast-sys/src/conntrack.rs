//! Conntrack over ctnetlink (NETLINK_NETFILTER): dump IPv4 entries and delete them by tuple.
//! Works in the calling thread's network namespace; CAP_NET_ADMIN over that namespace is
//! enough (a rootless user namespace's root has it over its own namespaces).
//!
//! Only what nsfast needs: IPv4 tuples with protocol and ports, the zone, delete by original
//! tuple. Messages are built and parsed by hand (a dozen attribute types).

use std::io;
use std::net::Ipv4Addr;

use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;

/// Conntrack errors.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    /// The netlink socket could not be opened (no ctnetlink, or no permission).
    #[error("ctnetlink socket: {0}")]
    Socket(#[source] io::Error),
    /// The kernel refused a request.
    #[error("ctnetlink {op}: {source}")]
    Request {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    /// A reply could not be parsed.
    #[error("ctnetlink: malformed reply ({0})")]
    Malformed(&'static str),
}

/// One direction of a connection: addresses, protocol and ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tuple {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
}

/// An IPv4 conntrack entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub orig: Tuple,
    pub reply: Tuple,
    pub zone: u16,
}

impl Entry {
    /// True when the reply does not go back to the original source unchanged, i.e. the
    /// connection's source was rewritten (SNAT / MASQUERADE).
    pub fn is_src_nat(&self) -> bool {
        self.reply.dst != self.orig.src || self.reply.dport != self.orig.sport
    }
}

/// A ctnetlink socket in the namespace of the thread that opened it.
pub struct Conntrack {
    sock: Socket,
    seq: u32,
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

fn nested(ty: u16, f: impl FnOnce(&mut Vec<u8>)) -> (u16, Vec<u8>) {
    let mut inner = Vec::new();
    f(&mut inner);
    (ty | NLA_F_NESTED, inner)
}

fn encode_tuple(t: &Tuple) -> Vec<u8> {
    let mut out = Vec::new();
    let (ty, ip) = nested(CTA_TUPLE_IP, |b| {
        push_attr(b, CTA_IP_V4_SRC, &t.src.octets());
        push_attr(b, CTA_IP_V4_DST, &t.dst.octets());
    });
    push_attr(&mut out, ty, &ip);
    let (ty, proto) = nested(CTA_TUPLE_PROTO, |b| {
        push_attr(b, CTA_PROTO_NUM, &[t.proto]);
        push_attr(b, CTA_PROTO_SRC_PORT, &t.sport.to_be_bytes());
        push_attr(b, CTA_PROTO_DST_PORT, &t.dport.to_be_bytes());
    });
    push_attr(&mut out, ty, &proto);
    out
}

/// Iterates (type without flags, payload) over netlink attributes.
fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let ty = u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > b.len() {
            return None;
        }
        let payload = &b[4..len];
        let adv = (len + 3) & !3;
        b = if adv >= b.len() { &[] } else { &b[adv..] };
        Some((ty, payload))
    })
}

fn decode_tuple(b: &[u8]) -> Option<Tuple> {
    let mut t = Tuple {
        src: Ipv4Addr::UNSPECIFIED,
        dst: Ipv4Addr::UNSPECIFIED,
        proto: 0,
        sport: 0,
        dport: 0,
    };
    let mut v4 = false;
    for (ty, p) in attrs(b) {
        match ty {
            CTA_TUPLE_IP => {
                for (ty, p) in attrs(p) {
                    let a: [u8; 4] = match p.try_into() {
                        Ok(a) => a,
                        Err(_) => continue, // IPv6
                    };
                    match ty {
                        CTA_IP_V4_SRC => {
                            t.src = a.into();
                            v4 = true;
                        }
                        CTA_IP_V4_DST => t.dst = a.into(),
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for (ty, p) in attrs(p) {
                    match (ty, p.len()) {
                        (CTA_PROTO_NUM, 1) => t.proto = p[0],
                        (CTA_PROTO_SRC_PORT, 2) => t.sport = u16::from_be_bytes([p[0], p[1]]),
                        (CTA_PROTO_DST_PORT, 2) => t.dport = u16::from_be_bytes([p[0], p[1]]),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    v4.then_some(t)
}

fn decode_entry(b: &[u8]) -> Option<Entry> {
    let mut orig = None;
    let mut reply = None;
    let mut zone = 0;
    for (ty, p) in attrs(b) {
        match ty {
            CTA_TUPLE_ORIG => orig = decode_tuple(p),
            CTA_TUPLE_REPLY => reply = decode_tuple(p),
            CTA_ZONE if p.len() == 2 => zone = u16::from_be_bytes([p[0], p[1]]),
            _ => {}
        }
    }
    Some(Entry {
        orig: orig?,
        reply: reply?,
        zone,
    })
}

/// Walks one datagram of netlink messages answering request `seq`: calls `f` on each data
/// message's attributes. `Some` once the answer is complete (DONE, or the error/ACK),
/// `None` when more datagrams follow.
fn walk_batch(mut b: &[u8], seq: u32, f: &mut impl FnMut(&[u8])) -> Option<Result<(), io::Error>> {
    while b.len() >= 16 {
        let len = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let ty = u16::from_ne_bytes([b[4], b[5]]);
        let mseq = u32::from_ne_bytes([b[8], b[9], b[10], b[11]]);
        if len < 16 || len > b.len() {
            return Some(Err(io::Error::other("truncated netlink message")));
        }
        let payload = &b[16..len];
        b = &b[((len + 3) & !3).min(b.len())..];
        if mseq != seq {
            continue;
        }
        match ty {
            NLMSG_DONE => return Some(Ok(())),
            NLMSG_ERROR => {
                let code = payload
                    .get(..4)
                    .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                    .unwrap_or(-libc::EIO);
                // 0 is the ACK, a negative errno a refusal; anything else names no error.
                return Some(match code.checked_neg() {
                    Some(0) => Ok(()),
                    Some(errno) if errno > 0 => Err(io::Error::from_raw_os_error(errno)),
                    _ => Err(io::Error::other(format!(
                        "netlink error code {code} is not a negative errno"
                    ))),
                });
            }
            _ => {
                if payload.len() >= 4 {
                    f(&payload[4..]);
                }
            }
        }
    }
    None
}

/// Decodes one datagram of a dump answer to `seq` as [`Conntrack::dump`] does: the entries it
/// holds and whether the dump is complete (`Some`: DONE or an error). For the fuzzers.
#[doc(hidden)]
pub fn decode_dump_batch(b: &[u8], seq: u32) -> (Vec<Entry>, Option<Result<(), io::Error>>) {
    let mut out = Vec::new();
    let end = walk_batch(b, seq, &mut |a| {
        if let Some(e) = decode_entry(a) {
            out.push(e);
        }
    });
    (out, end)
}

/// Encodes `e` as the attributes of a ctnetlink entry message (for tests and fuzz seeds).
#[doc(hidden)]
pub fn encode_entry(e: &Entry) -> Vec<u8> {
    let mut out = Vec::new();
    push_attr(
        &mut out,
        CTA_TUPLE_ORIG | NLA_F_NESTED,
        &encode_tuple(&e.orig),
    );
    push_attr(
        &mut out,
        CTA_TUPLE_REPLY | NLA_F_NESTED,
        &encode_tuple(&e.reply),
    );
    if e.zone != 0 {
        push_attr(&mut out, CTA_ZONE, &e.zone.to_be_bytes());
    }
    out
}

impl Conntrack {
    /// Opens a ctnetlink socket in the calling thread's network namespace.
    pub fn open() -> Result<Self, ConntrackError> {
        let mut sock = Socket::new(NETLINK_NETFILTER).map_err(ConntrackError::Socket)?;
        sock.bind_auto().map_err(ConntrackError::Socket)?;
        sock.connect(&SocketAddr::new(0, 0))
            .map_err(ConntrackError::Socket)?;
        Ok(Self { sock, seq: 1 })
    }

    fn request(&mut self, msg_type: u16, flags: u16, body: &[u8]) -> Result<u32, io::Error> {
        self.seq = self.seq.wrapping_add(1);
        let mut buf = Vec::with_capacity(20 + body.len());
        let len = (16 + 4 + body.len()) as u32;
        buf.extend_from_slice(&len.to_ne_bytes());
        buf.extend_from_slice(&((NFNL_SUBSYS_CTNETLINK << 8) | msg_type).to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&self.seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes());
        // nfgenmsg: family AF_INET, version 0, res_id 0.
        buf.extend_from_slice(&[libc::AF_INET as u8, 0, 0, 0]);
        buf.extend_from_slice(body);
        self.sock.send(&buf, 0)?;
        Ok(self.seq)
    }

    /// Reads replies to `seq` until DONE (dump) or the ACK; calls `f` on each data message's
    /// attributes.
    fn replies(&mut self, seq: u32, mut f: impl FnMut(&[u8])) -> Result<(), io::Error> {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = loop {
                match self.sock.recv(&mut &mut buf[..], 0) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            };
            if let Some(r) = walk_batch(&buf[..n], seq, &mut f) {
                return r;
            }
        }
    }

    /// All IPv4 entries of this namespace.
    pub fn dump(&mut self) -> Result<Vec<Entry>, ConntrackError> {
        let req = |op| move |source| ConntrackError::Request { op, source };
        let seq = self
            .request(IPCTNL_MSG_CT_GET, NLM_F_REQUEST | NLM_F_DUMP, &[])
            .map_err(req("dump"))?;
        let mut out = Vec::new();
        self.replies(seq, |a| {
            if let Some(e) = decode_entry(a) {
                out.push(e);
            }
        })
        .map_err(req("dump"))?;
        Ok(out)
    }

    /// Deletes the entry with this original tuple and zone. Returns false when it was
    /// already gone.
    pub fn delete(&mut self, orig: &Tuple, zone: u16) -> Result<bool, ConntrackError> {
        let req = |source| ConntrackError::Request {
            op: "delete",
            source,
        };
        let mut body = Vec::new();
        push_attr(
            &mut body,
            CTA_TUPLE_ORIG | NLA_F_NESTED,
            &encode_tuple(orig),
        );
        if zone != 0 {
            push_attr(&mut body, CTA_ZONE, &zone.to_be_bytes());
        }
        let seq = self
            .request(IPCTNL_MSG_CT_DELETE, NLM_F_REQUEST | NLM_F_ACK, &body)
            .map_err(req)?;
        match self.replies(seq, |_| {}) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(req(e)),
        }
    }

    /// Deletes every entry for which `pred` is true; returns how many were deleted.
    pub fn delete_where(
        &mut self,
        mut pred: impl FnMut(&Entry) -> bool,
    ) -> Result<usize, ConntrackError> {
        let mut n = 0;
        for e in self.dump()? {
            if pred(&e) && self.delete(&e.orig, e.zone)? {
                n += 1;
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuple_round_trips_through_attributes() {
        let t = Tuple {
            src: Ipv4Addr::new(172, 30, 0, 2),
            dst: Ipv4Addr::new(10, 201, 0, 2),
            proto: 17,
            sport: 40000,
            dport: 51820,
        };
        assert_eq!(decode_tuple(&encode_tuple(&t)), Some(t));
        let mut entry = Vec::new();
        push_attr(&mut entry, CTA_TUPLE_ORIG | NLA_F_NESTED, &encode_tuple(&t));
        let r = Tuple {
            src: t.dst,
            dst: Ipv4Addr::new(10, 0, 2, 100),
            proto: 17,
            sport: 51820,
            dport: 40000,
        };
        push_attr(
            &mut entry,
            CTA_TUPLE_REPLY | NLA_F_NESTED,
            &encode_tuple(&r),
        );
        push_attr(&mut entry, CTA_ZONE, &7u16.to_be_bytes());
        let e = decode_entry(&entry).unwrap();
        assert_eq!(e.orig, t);
        assert_eq!(e.reply, r);
        assert_eq!(e.zone, 7);
        assert!(e.is_src_nat());
    }

    /// Found by fuzz/fuzz_targets/conntrack_dump.rs (fuzz/corpus/conntrack_dump/
    /// regress-error-code-i32-min): an NLMSG_ERROR whose code is i32::MIN panicked with
    /// "attempt to negate with overflow".
    #[test]
    fn error_code_that_is_no_errno_is_an_error() {
        let mut msg = Vec::new();
        msg.extend_from_slice(&20u32.to_ne_bytes());
        msg.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        msg.extend_from_slice(&5u16.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes()); // seq
        msg.extend_from_slice(&0u32.to_ne_bytes()); // pid
        msg.extend_from_slice(&i32::MIN.to_ne_bytes());
        let (entries, end) = decode_dump_batch(&msg, 0);
        assert!(entries.is_empty());
        let e = end.expect("an error ends the answer").unwrap_err();
        assert!(e.to_string().contains("-2147483648"), "{e}");
        // A positive code is no errno either; a real one still comes through.
        msg[16..20].copy_from_slice(&7i32.to_ne_bytes());
        let e = decode_dump_batch(&msg, 0).1.unwrap().unwrap_err();
        assert!(e.to_string().contains('7'), "{e}");
        msg[16..20].copy_from_slice(&(-libc::ENOENT).to_ne_bytes());
        let e = decode_dump_batch(&msg, 0).1.unwrap().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    }
}
