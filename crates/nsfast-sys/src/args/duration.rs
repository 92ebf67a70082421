//! Durations: a number with an optional unit `ms`, `s` (the default), `m`/`min` or `h`, e.g.
//! `10`, `0.5`, `500ms`, `2m`, `1h` (any case). A fraction is allowed (`0.5`, `1.5m`) as long
//! as the result is a whole number of milliseconds. No sign, exponent or inner space.

use std::time::Duration;

use super::{split_number, ArgError};

const WHAT: &str = "duration";

/// Parses a duration of at most `max`; zero only when `zero_ok` (where it means "off").
/// `flag` names the option (or variable) in the error.
pub fn parse(flag: &str, s: &str, max: Duration, zero_ok: bool) -> Result<Duration, ArgError> {
    let min = if zero_ok {
        Duration::ZERO
    } else {
        Duration::from_millis(1)
    };
    parse_in(flag, s, min, max)
}

/// Parses a duration in `min..=max` (`min` zero: 0 means "off").
pub fn parse_in(flag: &str, s: &str, min: Duration, max: Duration) -> Result<Duration, ArgError> {
    let zero_ok = min.is_zero();
    let valid = format!(
        "expected a number with an optional unit ms, s (the default), m or h, e.g. 10s, 0.5 or 500ms; {}at most {}",
        match min.as_millis() {
            0 => "0 for off, ".to_string(),
            1 => "above 0, ".to_string(),
            _ => format!("at least {}, ", format(min)),
        },
        format(max)
    );
    let err = |why: &str| ArgError::new(flag, WHAT, s, format!("{why} ({valid})"));
    let t = s.trim();
    let (num, unit) = split_number(t, true);
    let unit_ms: u128 = match unit.to_ascii_lowercase().as_str() {
        "ms" => 1,
        "" | "s" => 1000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        _ => return Err(err(&format!("unknown unit {unit:?}"))),
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if (int.is_empty() && frac.is_empty())
        || num.ends_with('.')
        || int.len() > 30
        || frac.len() > 30
    {
        return Err(err("not a number"));
    }
    let digits = |d: &str| -> Result<u128, ArgError> {
        if d.is_empty() {
            Ok(0)
        } else {
            d.parse().map_err(|_| err("not a number"))
        }
    };
    let (int, frac_n) = (digits(int)?, digits(frac)?);
    let scale = 10u128.pow(frac.len() as u32);
    // Milliseconds times `scale`; an overflow is far beyond any limit.
    let scaled = int
        .checked_mul(unit_ms)
        .and_then(|v| v.checked_mul(scale))
        .and_then(|v| v.checked_add(frac_n.checked_mul(unit_ms)?))
        .ok_or_else(|| err("too long"))?;
    if !scaled.is_multiple_of(scale) {
        return Err(err("finer than a millisecond"));
    }
    let ms = scaled / scale;
    if ms > max.as_millis() {
        return Err(err("too long"));
    }
    if ms == 0 && !zero_ok {
        return Err(err("zero"));
    }
    if ms < min.as_millis() {
        return Err(err("too short"));
    }
    u64::try_from(ms)
        .map(Duration::from_millis)
        .map_err(|_| err("too long"))
}

/// A clap `value_parser` for `flag`: a duration of at most `max`, zero only when `zero_ok`.
pub fn arg(
    flag: &'static str,
    max: Duration,
    zero_ok: bool,
) -> impl Fn(&str) -> Result<Duration, ArgError> + Clone + Send + Sync + 'static {
    move |s| parse(flag, s, max, zero_ok)
}

/// [`arg`] for a duration in `min..=max`.
pub fn arg_in(
    flag: &'static str,
    min: Duration,
    max: Duration,
) -> impl Fn(&str) -> Result<Duration, ArgError> + Clone + Send + Sync + 'static {
    move |s| parse_in(flag, s, min, max)
}

/// A duration the way [`parse`] reads it, in whole milliseconds: `1s`, `500ms`, `1500ms`,
/// `2m`, `1h`.
pub fn format(d: Duration) -> String {
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
    use proptest::prelude::*;

    const H: Duration = Duration::from_secs(3600);

    #[test]
    fn durations() {
        let p = |s| parse("--connect-timeout", s, H, false);
        assert_eq!(p("10"), Ok(Duration::from_secs(10)));
        assert_eq!(p("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(p(" 10S "), Ok(Duration::from_secs(10)));
        assert_eq!(p("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(p("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(p(".25s"), Ok(Duration::from_millis(250)));
        assert_eq!(p("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(p("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(p("2min"), Ok(Duration::from_secs(120)));
        assert_eq!(p("1h"), Ok(H));
        let e = |s| p(s).unwrap_err().to_string();
        assert!(e("0").contains("zero"));
        assert!(e("0.0").contains("zero"));
        assert!(e("2h").contains("too long"));
        assert!(e("3600.001").contains("too long"));
        assert!(e("1.5ms").contains("finer than a millisecond"));
        assert!(e("0.0001").contains("finer than a millisecond"));
        assert!(p("99999999999999999999").is_err());
        assert!(e("18446744073709551615h").contains("too long"));
        assert!(e("5x").contains("unknown unit \"x\""));
        assert!(e("-1").contains("\"-1\" for --connect-timeout"));
        for bad in ["", ".", "1.", "1..2", "1e3", "inf", "NaN", "1 s", "+1"] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            e("2h"),
            "invalid duration \"2h\" for --connect-timeout: too long (expected a number with an optional unit ms, s (the default), m or h, e.g. 10s, 0.5 or 500ms; above 0, at most 1h)"
        );
        assert_eq!(parse("--idle-timeout", "0", H, true), Ok(Duration::ZERO));
        let one = Duration::from_secs(1);
        assert_eq!(
            parse_in("x", "1.5", one, H),
            Ok(Duration::from_millis(1500))
        );
        let e = parse_in("VPNRELAY_IDLE_TIMEOUT", "500ms", one, H).unwrap_err();
        assert!(
            e.reason.starts_with("too short (") && e.reason.contains("at least 1s"),
            "{e}"
        );
        assert!(parse_in("x", "0", one, H)
            .unwrap_err()
            .reason
            .starts_with("zero"));
        for d in ["1s", "500ms", "1500ms", "2m", "1h", "0s"] {
            assert_eq!(format(parse("x", d, H, true).unwrap()), d);
        }
    }

    proptest! {
        // Printed, then read back: the same duration.
        #[test]
        fn format_then_parse_is_identity(ms in 0u64..=(400 * 86_400_000)) {
            let d = Duration::from_millis(ms);
            prop_assert_eq!(parse("x", &format(d), Duration::from_secs(400 * 86_400), true), Ok(d));
        }

        // Any text: a duration within the limit, printed back to the same value, or an error
        // naming the flag; never a panic (overflowing numbers and units included).
        #[test]
        fn never_panics(
            s in prop_oneof!["\\PC{0,24}", "[0-9 .]{0,22}(ms|s|m|min|h|H|x)?"],
            zero_ok: bool,
        ) {
            let max = Duration::from_secs(86400);
            match parse("--idle-timeout", &s, max, zero_ok) {
                Ok(d) => {
                    prop_assert!(d <= max && (zero_ok || !d.is_zero()));
                    prop_assert_eq!(parse("x", &format(d), max, true), Ok(d));
                }
                Err(e) => {
                    prop_assert_eq!(e.flag.as_str(), "--idle-timeout");
                    prop_assert!(e.to_string().contains("--idle-timeout"));
                }
            }
        }
    }
}
