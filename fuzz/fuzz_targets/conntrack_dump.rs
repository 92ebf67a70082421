//! The ctnetlink dump decoder: one datagram of netlink messages as `Conntrack::dump` reads it
//! (the sequence number it waits for is taken from the first message). Every entry decoded,
//! encoded again, decodes to itself.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nsfast_sys::conntrack::{decode_dump_batch, encode_entry};

fn message(seq: u32, attrs: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&(20 + attrs.len() as u32).to_ne_bytes());
    m.extend_from_slice(&(1u16 << 8).to_ne_bytes()); // IPCTNL_MSG_CT_NEW
    m.extend_from_slice(&0x2u16.to_ne_bytes()); // NLM_F_MULTI
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&[2, 0, 0, 0]); // nfgenmsg: AF_INET
    m.extend_from_slice(attrs);
    m
}

fuzz_target!(|data: &[u8]| {
    let seq = data
        .get(8..12)
        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .unwrap_or(0);
    let (entries, end) = decode_dump_batch(data, seq);
    if let Some(Err(e)) = end {
        let _ = e.to_string();
    }
    for e in entries {
        let _ = e.is_src_nat();
        let (again, end) = decode_dump_batch(&message(7, &encode_entry(&e)), 7);
        assert_eq!(again, vec![e]);
        assert!(end.is_none());
    }
});
