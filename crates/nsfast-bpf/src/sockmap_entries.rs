//! How many entries the maps that connections write hold now: each goes when its connection
//! closes, so with no connection open all are 0, and a count that keeps growing is a leak.

use aya::maps::{HashMap, Map, MapData};
use serde::Serialize;

use crate::sockmap_abi as abi;

/// Entries of the pairing and read-accounting maps of one shortcut instance.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MapEntries {
    /// `nsf_pending`: first ends waiting for their other end.
    pub pending: u64,
    /// `nsf_peers`: first ends that were claimed, to their peer.
    pub peers: u64,
    /// `nsf_rx`: receiving sockets' read accounting (both ends of a pair).
    pub rx: u64,
}

/// The loaded map with id `id` and its name (None if it is gone or has no name).
pub fn open_map(id: u32) -> Option<(String, Map)> {
    let data = MapData::from_id(id).ok()?;
    let name = data.info().ok()?.name_as_str()?.to_string();
    Some((name, Map::from_map_data(data).ok()?))
}

/// Whether `prog` is the sockops program of the instance whose SOCKHASH has id `sockhash_id`
/// (an instance's programs share its maps).
pub fn is_sockops_of(prog: &aya::programs::ProgramInfo, sockhash_id: u32) -> bool {
    prog.name_as_str() == Some(abi::PROG_SOCKOPS)
        && prog
            .map_ids()
            .ok()
            .flatten()
            .is_some_and(|ids| ids.contains(&sockhash_id))
}

/// The entries of the maps of `prog`, the instance's sockops program (None if a map could not
/// be read as the layout it should have).
pub fn of_program(prog: &aya::programs::ProgramInfo) -> Option<MapEntries> {
    let ids = prog.map_ids().ok()??;
    let mut e = MapEntries::default();
    for id in ids {
        let Some((name, map)) = open_map(id) else {
            continue;
        };
        match name.as_str() {
            abi::MAP_PENDING => {
                let m = HashMap::<MapData, abi::PairKey, abi::Pending>::try_from(map).ok()?;
                e.pending = m.keys().filter(|k| k.is_ok()).count() as u64;
            }
            abi::MAP_PEERS => {
                let m = HashMap::<MapData, u64, u64>::try_from(map).ok()?;
                e.peers = m.keys().filter(|k| k.is_ok()).count() as u64;
            }
            abi::MAP_RX => {
                let m = HashMap::<MapData, u64, [u64; 4]>::try_from(map).ok()?;
                e.rx = m.keys().filter(|k| k.is_ok()).count() as u64;
            }
            _ => {}
        }
    }
    Some(e)
}

/// The entries of the instance whose SOCKHASH is the map with id `sockhash_id`: its sockops
/// program is found among the loaded programs by that map.
pub fn of_sockhash(sockhash_id: u32) -> Option<MapEntries> {
    aya::programs::loaded_programs()
        .flatten()
        .find(|p| is_sockops_of(p, sockhash_id))
        .and_then(|p| of_program(&p))
}
