//! Byte sizes: a whole number with an optional unit, `65536`, `256K`, `4MiB`, `1g`.
//!
//! Units (any case): none or `B` (bytes), `K`/`KB`/`KiB` (1024), `M`/`MB`/`MiB` (1024²),
//! `G`/`GB`/`GiB` (1024³): every unit is a power of 1024, `KB` included. No sign, no fraction,
//! no space between number and unit; space around the whole value is ignored.

use super::{split_number, ArgError};

const WHAT: &str = "size";
const K: u64 = 1 << 10;
const M: u64 = 1 << 20;
const G: u64 = 1 << 30;

/// Parses a size in `min..=max` bytes; `flag` names the option (or variable) in the error.
pub fn parse_in(flag: &str, s: &str, min: u64, max: u64) -> Result<u64, ArgError> {
    let err = |reason: String| ArgError::new(flag, WHAT, s, reason);
    let t = s.trim();
    let (num, unit) = split_number(t, false);
    let n: u64 = num.parse().map_err(|_| {
        err("expected a whole number of bytes with an optional unit K, M or G (KiB, MiB, GiB), e.g. 256K".into())
    })?;
    let mult = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => K,
        "m" | "mb" | "mib" => M,
        "g" | "gb" | "gib" => G,
        _ => return Err(err(format!("unknown unit {unit:?} (use K, M or G)"))),
    };
    let v = n.checked_mul(mult).filter(|v| *v <= max);
    match v {
        None => Err(err(format!(
            "too large: at most {} ({max} bytes)",
            format(max)
        ))),
        Some(0) if min > 0 => Err(err("must be greater than 0".into())),
        Some(v) if v < min => Err(err(format!(
            "too small: at least {} ({min} bytes)",
            format(min)
        ))),
        Some(v) => Ok(v),
    }
}

/// Parses a size of at least one byte.
pub fn parse(flag: &str, s: &str) -> Result<u64, ArgError> {
    parse_in(flag, s, 1, u64::MAX)
}

/// A clap `value_parser` for `flag`: a size in `min..=max` bytes.
pub fn arg(
    flag: &'static str,
    min: u64,
    max: u64,
) -> impl Fn(&str) -> Result<u64, ArgError> + Clone + Send + Sync + 'static {
    move |s| parse_in(flag, s, min, max)
}

/// [`arg`] for a `u32` value (`max` at most `u32::MAX`).
pub fn arg_u32(
    flag: &'static str,
    min: u32,
    max: u32,
) -> impl Fn(&str) -> Result<u32, ArgError> + Clone + Send + Sync + 'static {
    // In range by `max`, so the conversion cannot fail.
    move |s| parse_in(flag, s, min.into(), max.into()).map(|v| v as u32)
}

/// A size the way [`parse`] reads it, in the largest unit that keeps it exact: `256K`, `4M`,
/// `1G`, `1400`.
pub fn format(v: u64) -> String {
    match v {
        0 => "0".into(),
        v if v.is_multiple_of(G) => format!("{}G", v / G),
        v if v.is_multiple_of(M) => format!("{}M", v / M),
        v if v.is_multiple_of(K) => format!("{}K", v / K),
        v => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sizes() {
        assert_eq!(parse("--buffer", "65536"), Ok(65536));
        assert_eq!(parse("--buffer", " 256K "), Ok(256 << 10));
        assert_eq!(parse("--buffer", "4MiB"), Ok(4 << 20));
        assert_eq!(parse("--buffer", "1g"), Ok(1 << 30));
        assert_eq!(parse("--buffer", "128kb"), Ok(128 << 10));
        assert_eq!(parse("--buffer", "7b"), Ok(7));
        assert_eq!(
            parse("--buffer", "0").unwrap_err().to_string(),
            "invalid size \"0\" for --buffer: must be greater than 0"
        );
        assert!(parse("--buffer", "12Q")
            .unwrap_err()
            .to_string()
            .contains("unknown unit \"Q\""));
        assert!(parse("--buffer", "-5")
            .unwrap_err()
            .to_string()
            .contains("\"-5\""));
        assert!(parse("--buffer", "1.5M").is_err());
        assert!(parse("--buffer", "1 M").is_err());
        assert!(parse("--buffer", "").is_err());
        assert!(parse("--buffer", "99999999999999999999G").is_err());
        assert!(parse("--buffer", "18446744073709551615G")
            .unwrap_err()
            .to_string()
            .contains("too large"));
        assert_eq!(
            parse_in("--udp-size", "70000", 1, 65507)
                .unwrap_err()
                .to_string(),
            "invalid size \"70000\" for --udp-size: too large: at most 65507 (65507 bytes)"
        );
        assert_eq!(
            parse_in("VPNRELAY_SOCKBUF", "1K", 4096, 1 << 30)
                .unwrap_err()
                .to_string(),
            "invalid size \"1K\" for VPNRELAY_SOCKBUF: too small: at least 4K (4096 bytes)"
        );
        assert_eq!(arg_u32("--stream-size", 1, 16 << 20)("1MiB"), Ok(1 << 20));
        for (v, s) in [
            (1400, "1400"),
            (256 << 10, "256K"),
            (4 << 20, "4M"),
            (1 << 30, "1G"),
        ] {
            assert_eq!(format(v), s);
        }
    }

    proptest! {
        // Printed, then read back: the same size.
        #[test]
        fn format_then_parse_is_identity(v in 1u64..=u64::MAX) {
            prop_assert_eq!(parse("x", &format(v)), Ok(v));
        }

        #[test]
        fn number_and_unit_round_trip(n in 1u64..=(1 << 30), unit in "(|b|k|K|kb|KiB|m|M|mb|MiB|g|G|gb|GiB)") {
            let mult = match unit.to_ascii_lowercase().chars().next() {
                Some('k') => K,
                Some('m') => M,
                Some('g') => G,
                _ => 1,
            };
            prop_assert_eq!(parse("x", &format!("{n}{unit}")), Ok(n * mult));
        }

        // Any text: a size within the limits, or an error naming the flag and the value;
        // never a panic.
        #[test]
        fn never_panics(s in prop_oneof!["\\PC{0,24}", "[0-9 ]{0,22}(k|m|g|kib|Q)?"], min in 0u64..10, max in 1u64..=u64::MAX) {
            match parse_in("--buffer", &s, min, max) {
                Ok(v) => prop_assert!(v >= min && v <= max),
                Err(e) => {
                    prop_assert_eq!(e.flag.as_str(), "--buffer");
                    prop_assert_eq!(&e.value, &s);
                }
            }
        }
    }
}
