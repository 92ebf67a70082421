//! socat-style addresses (`nsfast vsock relay A B`): an address that parses prints as text
//! that parses to the same address.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nsfast_vsock::Address;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    match s.parse::<Address>() {
        Ok(a) => {
            let shown = a.to_string();
            let again: Address = shown.parse().unwrap_or_else(|e| {
                panic!("{s:?} parsed as {a:?}, printed as {shown:?}, which does not parse: {e}")
            });
            assert_eq!(again, a, "{s:?} printed as {shown:?}");
            let _ = (a.is_listen(), a.is_vsock());
        }
        Err(e) => {
            // The error names the text it could not use.
            assert_eq!(e.input, s);
            let _ = e.to_string();
        }
    }
});
