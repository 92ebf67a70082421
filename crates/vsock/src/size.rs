//! Byte sizes such as `65536`, `256K`, `4M`, `1GiB`, and durations such as `10`, `500ms`,
//! `2m`.

use std::time::Duration;

/// Parses a size; `flag` names the option in the error.
pub fn parse_size(flag: &str, s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid size {s:?} for {flag}: expected a number with an optional K, M or G suffix, e.g. 256K"))?;
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => {
            return Err(format!(
                "invalid size {s:?} for {flag}: unknown unit {unit:?} (use K, M or G)"
            ))
        }
    };
    let v = n
        .checked_mul(mult)
        .ok_or_else(|| format!("invalid size {s:?} for {flag}: too large"))?;
    if v == 0 {
        return Err(format!(
            "invalid size {s:?} for {flag}: must be greater than 0"
        ));
    }
    Ok(v)
}

/// Parses a duration: a whole number with an optional unit `ms`, `s` (the default), `m` or
/// `h`, e.g. `10`, `500ms`, `2m`; `flag` names the option in the error. At most `max`; zero
/// only when `zero_ok` (where it means "off").
pub fn parse_duration(
    flag: &str,
    s: &str,
    max: Duration,
    zero_ok: bool,
) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let valid = format!(
        "expected a whole number with an optional unit ms, s, m or h, e.g. 10s or 500ms, {}at most {}",
        if zero_ok { "0 for off, " } else { "above 0, " },
        fmt_duration(max)
    );
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?} for {flag}: {valid}"))?;
    let ms: u64 = match unit.to_ascii_lowercase().as_str() {
        "ms" => 1,
        "" | "s" => 1000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        _ => {
            return Err(format!(
                "invalid duration {s:?} for {flag}: unknown unit {unit:?} ({valid})"
            ))
        }
    };
    let d = n
        .checked_mul(ms)
        .map(Duration::from_millis)
        .filter(|d| *d <= max)
        .ok_or_else(|| format!("invalid duration {s:?} for {flag}: too long ({valid})"))?;
    if d.is_zero() && !zero_ok {
        return Err(format!("invalid duration {s:?} for {flag}: zero ({valid})"));
    }
    Ok(d)
}

/// A duration the way [`parse_duration`] reads it: `1s`, `500ms`, `1500ms`, `2m`.
pub fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(3_600_000) && ms > 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let h = Duration::from_secs(3600);
        let p = |s| parse_duration("--connect-timeout", s, h, false);
        assert_eq!(p("10"), Ok(Duration::from_secs(10)));
        assert_eq!(p("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(p("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(p("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(p("1h"), Ok(h));
        assert!(p("0").unwrap_err().contains("zero"));
        assert!(p("2h").unwrap_err().contains("too long"));
        assert!(p("99999999999999999999").is_err());
        assert!(p("18446744073709551615h").unwrap_err().contains("too long"));
        assert!(p("5x").unwrap_err().contains("unknown unit \"x\""));
        assert!(p("-1")
            .unwrap_err()
            .contains("\"-1\" for --connect-timeout"));
        assert_eq!(
            parse_duration("--idle-timeout", "0", h, true),
            Ok(Duration::ZERO)
        );
        for d in ["1s", "500ms", "1500ms", "2m", "1h", "0s"] {
            assert_eq!(fmt_duration(parse_duration("x", d, h, true).unwrap()), d);
        }
    }

    proptest::proptest! {
        // Any text: a duration within the limit, printed back to the same value, or an error
        // naming the flag; never a panic (overflowing numbers and units included).
        #[test]
        fn duration_parser_never_panics(
            s in proptest::prop_oneof!["\\PC{0,24}", "[0-9 ]{0,22}(ms|s|m|min|h|H|x)?"],
            zero_ok: bool,
        ) {
            let max = Duration::from_secs(86400);
            match parse_duration("--idle-timeout", &s, max, zero_ok) {
                Ok(d) => {
                    proptest::prop_assert!(d <= max && (zero_ok || !d.is_zero()));
                    proptest::prop_assert_eq!(
                        parse_duration("x", &fmt_duration(d), max, true),
                        Ok(d)
                    );
                }
                Err(e) => proptest::prop_assert!(e.contains("--idle-timeout")),
            }
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("--buffer", "65536"), Ok(65536));
        assert_eq!(parse_size("--buffer", "256K"), Ok(256 << 10));
        assert_eq!(parse_size("--buffer", "4MiB"), Ok(4 << 20));
        assert_eq!(parse_size("--buffer", "1g"), Ok(1 << 30));
        assert!(parse_size("--buffer", "0")
            .unwrap_err()
            .contains("greater than 0"));
        assert!(parse_size("--buffer", "12Q")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_size("--buffer", "-5").unwrap_err().contains("\"-5\""));
        assert!(parse_size("--buffer", "99999999999999999999G").is_err());
    }
}
