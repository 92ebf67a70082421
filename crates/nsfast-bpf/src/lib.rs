//! nsfast's BPF objects, compiled from `bpf/` by this crate's build script and embedded.
//!
//! Each constant holds one ELF object, 8-byte aligned as aya requires. Test objects
//! (`bpf/tests/`) are not here: crate nsfast-lab builds them (`nsfast_lab::bpf`).
//!
//! [`sockmap_abi`] mirrors the maps of [`SOCKMAP`]: both `nsfast sockmap` (crate
//! nsfast-sockmap) and the pod shortcut (crate nsfast-pod) load that object.

pub mod pod_abi;
pub mod relay_abi;
pub mod sockmap_abi;
pub mod sockmap_entries;
pub mod sockmap_kept;
pub mod sockmap_readers;

/// sockops + sk_msg programs and their maps (`bpf/sockmap.bpf.c`).
pub static SOCKMAP: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sockmap.bpf.o"));

/// Pod datapath: TCX (veth, wire) and netkit programs, endpoint table, counters
/// (`bpf/pod.bpf.c`).
pub static POD: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/pod.bpf.o"));

/// The vsock relay's kernel path: an sk_skb stream-verdict program that redirects each leg's
/// received data to the other leg's egress, its SOCKHASH, peer map and per-socket counters
/// (`bpf/relay.bpf.c`).
pub static RELAY: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/relay.bpf.o"));

/// The layout of one map of an object: key size, value size, entries, flags (as
/// `BPF_OBJ_GET_INFO_BY_FD` reports them for a created map).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapLayout {
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
}

/// The layout of every map `object` (one of the constants above) defines, by name; empty if
/// it does not parse.
pub fn map_layouts(object: &[u8]) -> std::collections::BTreeMap<String, MapLayout> {
    let Ok(obj) = aya_obj::Object::parse(object) else {
        return Default::default();
    };
    obj.maps
        .iter()
        .map(|(name, m)| {
            let l = MapLayout {
                key_size: m.key_size(),
                value_size: m.value_size(),
                max_entries: m.max_entries(),
                map_flags: m.map_flags(),
            };
            (name.clone(), l)
        })
        .collect()
}

/// SHA-256 over every object this crate embeds (name, length and bytes, in name order).
pub const OBJECTS_SHA256: &str = env!("NSFAST_BPF_SHA256");
