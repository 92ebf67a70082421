//! RootlessKit state files as vpnrelay reads them: `child_pid` (or dockerd's `docker.pid`),
//! and the `Uid:` line of the child's `/proc/<pid>/status`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nsfast_vpnrelay::state::{parse_pid, parse_status_uids, PID_MAX};

fuzz_target!(|data: &[u8]| {
    match parse_pid(data) {
        Ok(pid) => {
            assert!((1..=PID_MAX).contains(&pid), "{pid}");
            assert_eq!(parse_pid(format!("{pid}\n").as_bytes()), Ok(pid));
        }
        // The error shows what was found, cut short.
        Err(e) => assert!(e.len() < 512, "{e}"),
    }
    if let Some(uids) = parse_status_uids(data) {
        let line = format!("Uid:\t{}\t{}\t{}\t{}\n", uids[0], uids[1], uids[2], uids[3]);
        assert_eq!(parse_status_uids(line.as_bytes()), Some(uids));
    }
});
