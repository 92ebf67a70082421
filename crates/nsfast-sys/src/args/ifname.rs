//! Network interface names (`CNI_IFNAME`, `nsfast pod add --ifname/--uplink`, vpnrelay's
//! bridge), checked before the kernel or a file path sees them.
//!
//! The rule: 1-15 bytes (`IFNAMSIZ` - 1) of `A-Z a-z 0-9 _ . -`, and not `.` or `..`. It is a
//! subset of what the kernel's `dev_valid_name()` accepts (no `/`, `:`, whitespace, `.`/`..`,
//! shorter than `IFNAMSIZ`), so a name that passes here is never refused by the kernel for its
//! spelling; it also keeps names safe as a path component (vpnrelay's lock and stats files)
//! and as a command-line word.

use super::ArgError;

/// The kernel's `IFNAMSIZ`, the terminating NUL included.
pub const IFNAMSIZ: usize = 16;

const WHAT: &str = "interface name";
const VALID: &str = "must be 1-15 characters from A-Z a-z 0-9 _ . - and not \".\" or \"..\"";

/// Checks `name` given to `flag`.
pub fn check(flag: &str, name: &str) -> Result<(), ArgError> {
    let ok = !name.is_empty()
        && name.len() < IFNAMSIZ
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ArgError::new(flag, WHAT, name, VALID))
    }
}

/// [`check`], returning the name.
pub fn parse(flag: &str, name: &str) -> Result<String, ArgError> {
    check(flag, name).map(|()| name.to_string())
}

/// A clap `value_parser` for `flag`.
pub fn arg(
    flag: &'static str,
) -> impl Fn(&str) -> Result<String, ArgError> + Clone + Send + Sync + 'static {
    move |s| parse(flag, s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The kernel's `dev_valid_name()` (net/core/dev.c), on the bytes of `name`; `isspace` is
    /// the kernel's, which also counts 0xa0.
    fn dev_valid_name(name: &[u8]) -> bool {
        let space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | 0xa0);
        !name.is_empty()
            && !name.contains(&0)
            && name.len() < IFNAMSIZ
            && name != b"."
            && name != b".."
            && !name.iter().any(|&b| b == b'/' || b == b':' || space(b))
    }

    #[test]
    fn names() {
        for ok in [
            "eth0",
            "br-1a2b3c4d5e6f",
            "docker0",
            "eth0.100",
            "a",
            "x_y",
            "...",
            "abcdefghijklmno",
        ] {
            assert_eq!(check("--ifname", ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a:b",
            "a b",
            "a\tb",
            "abcdefghijklmnop",
            "é",
            "a\0",
            "a@b",
            "a\n",
        ] {
            let e = check("CNI_IFNAME", bad).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("invalid interface name {bad:?} for CNI_IFNAME: {VALID}")
            );
        }
        assert_eq!(parse("--ifname", "eth1").unwrap(), "eth1");
    }

    proptest! {
        // Whatever passes, the kernel accepts; and every name of the allowed characters and
        // length passes.
        #[test]
        fn accepted_names_are_valid_for_the_kernel(s in prop_oneof!["\\PC{0,20}", "[a-z0-9./: \t-]{0,18}"]) {
            if check("x", &s).is_ok() {
                prop_assert!(dev_valid_name(s.as_bytes()), "{:?}", s);
            }
        }

        #[test]
        fn allowed_names_pass(s in "[A-Za-z0-9_.-]{1,15}") {
            prop_assert_eq!(check("x", &s).is_ok(), s != "." && s != "..");
        }
    }
}
