//! Byte sizes: `nsfast vsock --buffer/--bytes` (`256K`, `4MiB`) and `VPNRELAY_SOCKBUF`.
//! A size that parses, printed as a number, parses to the same value.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    match nsfast_vsock::size::parse_size("--buffer", s) {
        Ok(v) => {
            assert!(v > 0);
            assert_eq!(
                nsfast_vsock::size::parse_size("--buffer", &v.to_string()),
                Ok(v)
            );
        }
        Err(e) => assert!(e.contains("--buffer"), "{e}"),
    }
    if let Some(v) = nsfast_vpnrelay::config::parse_size(s) {
        assert_eq!(nsfast_vpnrelay::config::parse_size(&v.to_string()), Some(v));
    }
});
