//! Pod records (`/run/nsfast/pod/<host>/<pod>.json`) and uplink tc-filter records: what parses
//! is written back (as `write_record` does) and reads again as the same record.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nsfast_pod::state::{parse_record, TcFilter};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = parse_record(data) {
        let body = serde_json::to_vec_pretty(&r).expect("a record serialises");
        assert_eq!(parse_record(&body).expect("a written record reads"), r);
    }
    if let Ok(f) = serde_json::from_slice::<TcFilter>(data) {
        let body = serde_json::to_vec(&f).expect("a filter serialises");
        assert_eq!(serde_json::from_slice::<TcFilter>(&body).unwrap(), f);
    }
});
