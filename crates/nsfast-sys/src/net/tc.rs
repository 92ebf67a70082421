//! tc: clsact qdiscs and cls_bpf filters.
//!
//! Attaching a cls_bpf filter needs the program's fd and is done by aya (`SchedClassifier` with
//! `TcAttachOptions::Netlink`); finding, checking and removing filters and the clsact qdisc are
//! plain rtnetlink and live here.

use futures::TryStreamExt;
use rtnetlink::Handle;

use super::link::index_of;
use super::{is_code, nl, NetError, Netlink};

const CLSACT_HANDLE: u32 = 0xffff_0000;
/// `TC_H_CLSACT` (= `TC_H_INGRESS`), the parent of the clsact qdisc.
const TC_H_CLSACT: u32 = 0xffff_fff1;
/// Parent of clsact's ingress hook (`ffff:fff2`) and egress hook (`ffff:fff3`).
const CLSACT_INGRESS: u32 = 0xffff_fff2;
const CLSACT_EGRESS: u32 = 0xffff_fff3;
/// `ETH_P_ALL` in network byte order, the protocol aya's cls_bpf filters are made with.
const ETH_P_ALL_BE: u32 = (libc::ETH_P_ALL as u16).to_be() as u32;

/// One filter on a device's clsact ingress or egress hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcFilterInfo {
    /// Filter priority (`tc filter ... prio`).
    pub priority: u16,
    /// Filter handle (`major:minor` as a u32).
    pub handle: u32,
    /// Classifier kind, e.g. `bpf`.
    pub kind: String,
    /// cls_bpf: the name the program was attached under.
    pub bpf_name: Option<String>,
    /// cls_bpf: the attached program's id.
    pub bpf_id: Option<u32>,
}

fn tc_parent(ingress: bool) -> u32 {
    if ingress {
        CLSACT_INGRESS
    } else {
        CLSACT_EGRESS
    }
}

async fn filters_of(
    h: &Handle,
    ifname: &str,
    idx: u32,
    ingress: bool,
) -> Result<Vec<TcFilterInfo>, NetError> {
    use netlink_packet_route::tc::{TcAttribute, TcFilterBpfOption, TcOption};
    let mut req = h.traffic_filter(idx as i32).get();
    req = if ingress { req.ingress() } else { req.egress() };
    let mut s = req.execute();
    let mut out = Vec::new();
    loop {
        let msg = match s.try_next().await {
            Ok(Some(m)) => m,
            Ok(None) => break,
            // No clsact qdisc on the device: no hook, no filters.
            Err(e) if is_code(&e, &[libc::EINVAL, libc::ENOENT]) => break,
            Err(e) => return Err(nl(format!("list tc filters of {ifname}"))(e)),
        };
        if msg.header.index != idx as i32 {
            continue;
        }
        let mut f = TcFilterInfo {
            priority: (msg.header.info >> 16) as u16,
            handle: msg.header.handle.into(),
            kind: String::new(),
            bpf_name: None,
            bpf_id: None,
        };
        let mut has_options = false;
        for a in &msg.attributes {
            match a {
                TcAttribute::Kind(k) => f.kind = k.clone(),
                TcAttribute::Options(opts) => {
                    has_options = true;
                    for o in opts {
                        match o {
                            TcOption::Bpf(TcFilterBpfOption::ProgName(n)) => {
                                f.bpf_name = Some(n.clone())
                            }
                            TcOption::Bpf(TcFilterBpfOption::ProgId(i)) => f.bpf_id = Some(*i),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        // A dump also lists each classifier instance (prio/protocol) on its own, without a
        // handle or options: not a filter.
        if has_options || f.handle != 0 {
            out.push(f);
        }
    }
    Ok(out)
}

async fn tc_request(
    h: &Handle,
    msg: netlink_packet_route::RouteNetlinkMessage,
) -> Result<(), rtnetlink::Error> {
    use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_REQUEST};
    let mut req = NetlinkMessage::from(msg);
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK;
    let mut h = h.clone();
    let mut resp = h.request(req)?;
    while let Some(m) = futures::StreamExt::next(&mut resp).await {
        if let NetlinkPayload::Error(e) = m.payload {
            if e.code.is_some() {
                return Err(rtnetlink::Error::NetlinkError(e));
            }
        }
    }
    Ok(())
}

/// `ifname`'s index in the handle's namespace, or `None` when the device is gone or, with
/// `ifindex`, when a device of that name now has another index (not the one we attached to).
async fn current_index(
    h: &Handle,
    ifname: &str,
    ifindex: Option<u32>,
) -> Result<Option<u32>, NetError> {
    match index_of(h, ifname).await {
        Ok(i) if ifindex.is_some_and(|want| want != i) => Ok(None),
        Ok(i) => Ok(Some(i)),
        Err(NetError::NoSuchLink(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Sends a tc delete request: `Ok(true)` when deleted, `Ok(false)` when the object (or its
/// device) was already gone.
async fn tc_delete(
    h: &Handle,
    msg: netlink_packet_route::RouteNetlinkMessage,
    what: impl FnOnce() -> String,
) -> Result<bool, NetError> {
    match tc_request(h, msg).await {
        Ok(()) => Ok(true),
        Err(e) if is_code(&e, &[libc::ENOENT, libc::EINVAL, libc::ENODEV]) => Ok(false),
        Err(e) => Err(nl(what())(e)),
    }
}

impl Netlink {
    /// The filters on `ifname`'s clsact ingress (`ingress`) or egress hook (none without a
    /// clsact qdisc).
    pub fn tc_filters(&self, ifname: &str, ingress: bool) -> Result<Vec<TcFilterInfo>, NetError> {
        self.run(|h| async move {
            let idx = index_of(h, ifname).await?;
            filters_of(h, ifname, idx, ingress).await
        })
    }

    /// Whether `ifname` has a clsact qdisc.
    pub fn has_clsact(&self, ifname: &str) -> Result<bool, NetError> {
        use netlink_packet_route::tc::TcAttribute;
        self.run(|h| async move {
            let idx = index_of(h, ifname).await?;
            let mut s = h.qdisc().get().index(idx as i32).execute();
            while let Some(m) = s
                .try_next()
                .await
                .map_err(nl(format!("list qdiscs of {ifname}")))?
            {
                let kind_is_clsact = m
                    .attributes
                    .iter()
                    .any(|a| matches!(a, TcAttribute::Kind(k) if k == "clsact"));
                if m.header.index == idx as i32 && kind_is_clsact {
                    return Ok(true);
                }
            }
            Ok(false)
        })
    }

    /// Deletes the filter `priority`/`handle` from `ifname`'s clsact ingress (or egress) hook,
    /// if it is still there and, when `ifindex` is given, the device still has that index
    /// (a device of the same name made later is not touched). Returns whether it was deleted.
    pub fn tc_filter_delete(
        &self,
        ifname: &str,
        ifindex: Option<u32>,
        ingress: bool,
        priority: u16,
        handle: u32,
    ) -> Result<bool, NetError> {
        use netlink_packet_route::tc::TcMessage;
        self.run(|h| async move {
            let Some(idx) = current_index(h, ifname, ifindex).await? else {
                return Ok(false);
            };
            let mut m = TcMessage::with_index(idx as i32);
            m.header.parent = tc_parent(ingress).into();
            m.header.handle = handle.into();
            m.header.info = (u32::from(priority) << 16) | ETH_P_ALL_BE;
            let msg = netlink_packet_route::RouteNetlinkMessage::DelTrafficFilter(m);
            tc_delete(h, msg, || {
                format!("delete tc filter prio {priority} handle {handle:#x} of {ifname}")
            })
            .await
        })
    }

    /// Deletes `ifname`'s clsact qdisc (and with it every filter on both hooks), if the
    /// device (with index `ifindex`, when given) and the qdisc exist. Returns whether it was deleted.
    pub fn delete_clsact(&self, ifname: &str, ifindex: Option<u32>) -> Result<bool, NetError> {
        use netlink_packet_route::tc::{TcAttribute, TcMessage};
        self.run(|h| async move {
            let Some(idx) = current_index(h, ifname, ifindex).await? else {
                return Ok(false);
            };
            let mut m = TcMessage::with_index(idx as i32);
            m.header.parent = TC_H_CLSACT.into();
            m.header.handle = CLSACT_HANDLE.into();
            m.attributes.push(TcAttribute::Kind("clsact".into()));
            let msg = netlink_packet_route::RouteNetlinkMessage::DelQueueDiscipline(m);
            tc_delete(h, msg, || format!("delete clsact qdisc of {ifname}")).await
        })
    }
}
