//! RootlessKit state files as vpnrelay reads them: `child_pid` (or dockerd's `docker.pid`)
//! and the PID in a relay's lock file.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nsfast_vpnrelay::state::parse_pid;

fuzz_target!(|data: &[u8]| {
    // fs::read_to_string refuses a file that is not UTF-8 (an error naming the file).
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(pid) = parse_pid(s) {
        assert!(pid > 0);
        assert_eq!(parse_pid(&format!("{pid}\n")), Some(pid));
    }
});
