//! Port lists such as `80,443,8000-8100`, with errors that name the bad value.

use std::collections::BTreeSet;

/// A malformed port list.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PortListError {
    /// An element is not a number.
    #[error("invalid port {value:?} in {flag}: must be a number 1-65535 or a range A-B")]
    NotANumber { flag: String, value: String },
    /// A number outside 1..=65535.
    #[error("invalid port \"{value}\" in {flag}: must be 1-65535")]
    OutOfRange { flag: String, value: String },
    /// A range whose start is after its end.
    #[error("invalid port range \"{value}\" in {flag}: start must not be greater than end")]
    BadRange { flag: String, value: String },
    /// The list is empty or has an empty element.
    #[error("empty port list element in {flag} ({value:?}): write e.g. 80,443,8000-8100")]
    Empty { flag: String, value: String },
}

/// A set of TCP/UDP ports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortList(BTreeSet<u16>);

impl PortList {
    /// Parses `LIST` given to `flag` (the flag name is used in error messages).
    pub fn parse(flag: &str, list: &str) -> Result<Self, PortListError> {
        let mut set = BTreeSet::new();
        if list.trim().is_empty() {
            return Err(PortListError::Empty {
                flag: flag.into(),
                value: list.into(),
            });
        }
        for part in list.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(PortListError::Empty {
                    flag: flag.into(),
                    value: list.into(),
                });
            }
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => {
                    // Name the whole element ("1-"), not its empty half.
                    let whole = |e: PortListError| match e {
                        PortListError::Empty { flag, .. } => PortListError::Empty {
                            flag,
                            value: part.into(),
                        },
                        e => e,
                    };
                    (
                        parse_one(flag, a.trim()).map_err(whole)?,
                        parse_one(flag, b.trim()).map_err(whole)?,
                    )
                }
                None => {
                    let p = parse_one(flag, part)?;
                    (p, p)
                }
            };
            if lo > hi {
                return Err(PortListError::BadRange {
                    flag: flag.into(),
                    value: part.into(),
                });
            }
            set.extend(lo..=hi);
        }
        Ok(Self(set))
    }

    pub fn contains(&self, port: u16) -> bool {
        self.0.contains(&port)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        self.0.iter().copied()
    }

    /// Compact text form, ranges folded: `80,443,8000-8100`.
    pub fn to_compact_string(&self) -> String {
        let mut out: Vec<String> = Vec::new();
        let mut it = self.0.iter().copied().peekable();
        while let Some(start) = it.next() {
            let mut end = start;
            // `checked_add` is None at 65535, and so is `peek()` at the end of the set:
            // compare only when there is a next port to compare with.
            while let (Some(next), Some(&peek)) = (end.checked_add(1), it.peek()) {
                if peek != next {
                    break;
                }
                end = next;
                it.next();
            }
            out.push(if start == end {
                start.to_string()
            } else {
                format!("{start}-{end}")
            });
        }
        out.join(",")
    }
}

fn parse_one(flag: &str, s: &str) -> Result<u16, PortListError> {
    if s.is_empty() {
        return Err(PortListError::Empty {
            flag: flag.into(),
            value: s.into(),
        });
    }
    let n: u64 = s.parse().map_err(|_| PortListError::NotANumber {
        flag: flag.into(),
        value: s.into(),
    })?;
    if n == 0 || n > 65535 {
        return Err(PortListError::OutOfRange {
            flag: flag.into(),
            value: s.into(),
        });
    }
    Ok(n as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists_and_ranges() {
        let p = PortList::parse("--ports", "80, 443,8000-8002").unwrap();
        assert_eq!(
            p.iter().collect::<Vec<_>>(),
            vec![80, 443, 8000, 8001, 8002]
        );
        assert_eq!(p.to_compact_string(), "80,443,8000-8002");
        assert_eq!(
            PortList::parse("--ports", "65535")
                .unwrap()
                .to_compact_string(),
            "65535"
        );
    }

    #[test]
    fn rejects_bad_values_naming_them() {
        let e = PortList::parse("--ports", "80,70000").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid port \"70000\" in --ports: must be 1-65535"
        );
        assert!(matches!(
            PortList::parse("--ports", "0"),
            Err(PortListError::OutOfRange { .. })
        ));
        assert!(matches!(
            PortList::parse("--ports", "http"),
            Err(PortListError::NotANumber { .. })
        ));
        assert!(matches!(
            PortList::parse("--ports", "90-80"),
            Err(PortListError::BadRange { .. })
        ));
        assert!(matches!(
            PortList::parse("--ports", "80,,81"),
            Err(PortListError::Empty { .. })
        ));
        assert!(matches!(
            PortList::parse("--ports", ""),
            Err(PortListError::Empty { .. })
        ));
        assert!(matches!(
            PortList::parse("--ports", "-5"),
            Err(PortListError::Empty { .. })
        ));
        assert_eq!(
            PortList::parse("--ports", "1-").unwrap_err().to_string(),
            "empty port list element in --ports (\"1-\"): write e.g. 80,443,8000-8100"
        );
    }
}
