//! Byte sizes and durations (`nsfast_sys::args`): `nsfast vsock --buffer/--bytes` (`256K`,
//! `4MiB`), `nsfast bench --stream-size`, `VPNRELAY_SOCKBUF`, `--idle-timeout`,
//! `VPNRELAY_IDLE_TIMEOUT`. A value that parses, printed back, parses to the same value.
#![no_main]
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use nsfast_sys::args::{duration, size};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    match size::parse("--buffer", s) {
        Ok(v) => {
            assert!(v > 0);
            assert_eq!(size::parse("--buffer", &v.to_string()), Ok(v));
            assert_eq!(size::parse("--buffer", &size::format(v)), Ok(v));
        }
        Err(e) => assert!(e.to_string().contains("--buffer"), "{e}"),
    }
    let max = Duration::from_secs(86400);
    match duration::parse("--idle-timeout", s, max, true) {
        Ok(d) => {
            assert!(d <= max);
            assert_eq!(duration::parse("x", &duration::format(d), max, true), Ok(d));
        }
        Err(e) => assert!(e.to_string().contains("--idle-timeout"), "{e}"),
    }
});
