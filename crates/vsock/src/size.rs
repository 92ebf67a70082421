//! Byte sizes such as `65536`, `256K`, `4M`, `1GiB`.

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

#[cfg(test)]
mod tests {
    use super::*;

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
