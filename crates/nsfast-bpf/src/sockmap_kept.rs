//! The log of connection ends that kept TCP (`nsf_kept`, `nsf_kept_head` of [`crate::SOCKMAP`]).
//!
//! The programs write one event per connection end and reason (a socket option or read the
//! shortcut cannot honour, a splice reader) into a ring of [`abi::KEPT_SLOTS`] slots, with the
//! process that caused it. `nsfast sockmap run` logs each event once as it polls; the status
//! commands show the ring's contents.

use std::borrow::Borrow;
use std::net::SocketAddr;

use aya::maps::{Array, Map, MapData, MapError};
use serde::Serialize;

use crate::sockmap_abi::{self as abi, KeptEvent, KeptReason};

/// One connection end that kept TCP, decoded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeptConn {
    /// The event's number (counting from 0 since the programs were loaded).
    pub seq: u64,
    /// What the application did: `SO_RCVLOWAT`, `SO_ZEROCOPY`, `TCP_ULP`, `MSG_WAITALL`,
    /// `MSG_OOB` or `splice` (an unknown code as `reason <n>`).
    pub reason: String,
    pub pid: u32,
    pub comm: String,
    pub client: SocketAddr,
    pub server: SocketAddr,
    /// The socket's cookie.
    pub cookie: u64,
}

impl KeptConn {
    fn from_event(e: &KeptEvent) -> Self {
        let (client, server) = e.endpoints();
        KeptConn {
            seq: e.seq - 1,
            reason: KeptReason::from_raw(e.reason)
                .map(|r| r.as_str().to_string())
                .unwrap_or_else(|| format!("reason {}", e.reason)),
            pid: e.pid,
            comm: e.comm_str(),
            client,
            server,
            cookie: e.cookie,
        }
    }
}

impl std::fmt::Display for KeptConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "connection {} -> {} keeps TCP: {} by pid {} ({})",
            self.client, self.server, self.reason, self.pid, self.comm
        )
    }
}

/// What [`KeptLog::since`] found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct KeptBatch {
    /// Complete events, oldest first.
    pub events: Vec<KeptConn>,
    /// Events overwritten before they were read.
    pub lost: u64,
    /// The number to pass to the next call.
    pub next: u64,
}

/// Picks events numbered `from..head` from the ring's slots: those overwritten (more than
/// [`abi::KEPT_SLOTS`] behind `head`) count as lost, one still being written is skipped.
pub fn collect(slots: &[KeptEvent], head: u64, from: u64) -> KeptBatch {
    let n_slots = slots.len() as u64;
    let oldest = head.saturating_sub(n_slots).max(from);
    let mut events = Vec::new();
    if n_slots > 0 {
        for n in oldest..head {
            let e = &slots[(n % n_slots) as usize];
            if e.seq == n + 1 {
                events.push(KeptConn::from_event(e));
            }
        }
    }
    KeptBatch {
        events,
        lost: oldest.saturating_sub(from),
        next: head.max(from),
    }
}

/// The two maps, opened.
pub struct KeptLog<T> {
    events: Array<T, KeptEvent>,
    head: Array<T, u64>,
}

impl KeptLog<MapData> {
    /// From the maps named [`abi::MAP_KEPT`] and [`abi::MAP_KEPT_HEAD`].
    pub fn new(events: Map, head: Map) -> Result<Self, MapError> {
        Ok(KeptLog {
            events: Array::try_from(events)?,
            head: Array::try_from(head)?,
        })
    }
}

impl<T: Borrow<MapData>> KeptLog<T> {
    /// From already typed maps (borrowed from a loaded object, for instance).
    pub fn from_arrays(events: Array<T, KeptEvent>, head: Array<T, u64>) -> Self {
        KeptLog { events, head }
    }

    /// Events numbered `from` and later (0: everything the ring still holds).
    pub fn since(&self, from: u64) -> Result<KeptBatch, MapError> {
        let head = self.head.get(&0, 0)?;
        let mut slots = Vec::with_capacity(abi::KEPT_SLOTS as usize);
        for i in 0..abi::KEPT_SLOTS {
            slots.push(self.events.get(&i, 0)?);
        }
        Ok(collect(&slots, head, from))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(head: u64) -> Vec<KeptEvent> {
        let mut slots = vec![KeptEvent::default(); 4];
        for n in head.saturating_sub(4)..head {
            let e = &mut slots[(n % 4) as usize];
            e.seq = n + 1;
            e.pid = n as u32;
            e.reason = 1;
        }
        slots
    }

    #[test]
    fn reads_each_event_once_in_order() {
        let slots = ring(3);
        let b = collect(&slots, 3, 0);
        assert_eq!(
            b.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        assert_eq!((b.lost, b.next), (0, 3));
        let again = collect(&slots, 3, b.next);
        assert!(again.events.is_empty());
        assert_eq!(again.next, 3);
    }

    #[test]
    fn overwritten_events_count_as_lost() {
        let slots = ring(10);
        let b = collect(&slots, 10, 2);
        assert_eq!(
            b.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [6, 7, 8, 9]
        );
        assert_eq!((b.lost, b.next), (4, 10));
        assert_eq!(b.events[0].reason, "SO_RCVLOWAT");
    }

    #[test]
    fn an_event_being_written_is_skipped() {
        let mut slots = ring(4);
        slots[3].seq = 0;
        let b = collect(&slots, 4, 0);
        assert_eq!(
            b.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [0, 1, 2]
        );
    }

    #[test]
    fn displays_what_an_operator_needs() {
        let mut e = KeptEvent {
            seq: 1,
            pid: 42,
            reason: 4,
            key: abi::expected_key(
                "10.0.0.1:5000".parse().unwrap(),
                "10.0.0.2:80".parse().unwrap(),
                0,
                0,
            ),
            ..Default::default()
        };
        e.comm[..5].copy_from_slice(b"nginx");
        assert_eq!(
            KeptConn::from_event(&e).to_string(),
            "connection 10.0.0.1:5000 -> 10.0.0.2:80 keeps TCP: MSG_WAITALL by pid 42 (nginx)"
        );
    }
}
