//! Port lists such as `80,443,8000-8100`, with errors that name the bad value: one parser for
//! TCP/UDP ports ([`PortList`], `u16`, sockmap and vpnrelay) and vsock ports ([`parse_list`]
//! with `u32` limits, the vsock bridge).
//!
//! The rule: comma-separated elements, each a port or a range `A-B` with `A <= B` (space
//! around elements and numbers is ignored); every port within `min..=max`; no port twice (also
//! not through overlapping ranges); at most `max_count` ports in all where the caller limits
//! it. An empty list or element is an error.

use std::collections::BTreeSet;

/// A malformed port list.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum PortListError {
    /// An element is not a number.
    #[error("invalid port {value:?} in {flag}: must be a number {min}-{max} or a range A-B")]
    NotANumber {
        flag: String,
        value: String,
        min: u64,
        max: u64,
    },
    /// A number outside `min..=max`.
    #[error("invalid port \"{value}\" in {flag}: must be {min}-{max}")]
    OutOfRange {
        flag: String,
        value: String,
        min: u64,
        max: u64,
    },
    /// A range whose start is after its end.
    #[error("invalid range \"{value}\" in {flag}: its start is above its end")]
    BadRange { flag: String, value: String },
    /// The list is empty or has an empty element.
    #[error("empty port list element in {flag} ({value:?}): write e.g. 80,443,8000-8100")]
    Empty { flag: String, value: String },
    /// A port listed twice (directly or by overlapping ranges).
    #[error("invalid port list {value:?} in {flag}: port {port} is listed twice")]
    Duplicate {
        flag: String,
        value: String,
        port: u64,
    },
    /// More ports than the caller allows.
    #[error("invalid port list {value:?} in {flag}: more than {max_count} ports")]
    TooMany {
        flag: String,
        value: String,
        max_count: usize,
    },
}

impl PortListError {
    /// The option the list was given to.
    pub fn flag(&self) -> &str {
        match self {
            Self::NotANumber { flag, .. }
            | Self::OutOfRange { flag, .. }
            | Self::BadRange { flag, .. }
            | Self::Empty { flag, .. }
            | Self::Duplicate { flag, .. }
            | Self::TooMany { flag, .. } => flag,
        }
    }
}

/// Parses `list` given to `flag` into sorted, distinct ports in `min..=max` (see the module
/// rule); at most `max_count` ports when given. Never allocates more than that.
pub fn parse_list<T>(
    flag: &str,
    list: &str,
    min: T,
    max: T,
    max_count: Option<usize>,
) -> Result<Vec<T>, PortListError>
where
    T: Copy + Into<u64> + TryFrom<u64>,
{
    let (min, max) = (min.into(), max.into());
    let empty = |value: &str| PortListError::Empty {
        flag: flag.into(),
        value: value.into(),
    };
    let one = |s: &str, element: &str| -> Result<u64, PortListError> {
        let s = s.trim();
        if s.is_empty() {
            // Name the whole element ("1-"), not its empty half.
            return Err(empty(element));
        }
        let n: u64 = s.parse().map_err(|_| PortListError::NotANumber {
            flag: flag.into(),
            value: s.into(),
            min,
            max,
        })?;
        if n < min || n > max {
            return Err(PortListError::OutOfRange {
                flag: flag.into(),
                value: s.into(),
                min,
                max,
            });
        }
        Ok(n)
    };
    if list.trim().is_empty() {
        return Err(empty(list));
    }
    let mut set = BTreeSet::new();
    for part in list.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(empty(list));
        }
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (one(a, part)?, one(b, part)?),
            None => {
                let p = one(part, part)?;
                (p, p)
            }
        };
        if lo > hi {
            return Err(PortListError::BadRange {
                flag: flag.into(),
                value: part.into(),
            });
        }
        if let Some(&port) = set.range(lo..=hi).next() {
            return Err(PortListError::Duplicate {
                flag: flag.into(),
                value: list.into(),
                port,
            });
        }
        if let Some(max_count) = max_count {
            if (hi - lo).saturating_add(1).saturating_add(set.len() as u64) > max_count as u64 {
                return Err(PortListError::TooMany {
                    flag: flag.into(),
                    value: list.into(),
                    max_count,
                });
            }
        }
        set.extend(lo..=hi);
    }
    // Every port is within min..=max of T.
    Ok(set
        .into_iter()
        .filter_map(|p| T::try_from(p).ok())
        .collect())
}

/// Contiguous runs of sorted distinct ports: `[(80, 80), (8000, 8100)]`.
pub fn ranges<T>(sorted: impl IntoIterator<Item = T>) -> Vec<(T, T)>
where
    T: Copy + Into<u64>,
{
    let mut out: Vec<(T, T)> = Vec::new();
    for p in sorted {
        match out.last_mut() {
            Some((_, end)) if (*end).into() + 1 == p.into() => *end = p,
            _ => out.push((p, p)),
        }
    }
    out
}

/// A set of TCP/UDP ports, 1-65535.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortList(BTreeSet<u16>);

impl PortList {
    /// Parses `LIST` given to `flag` (the flag name is used in error messages).
    pub fn parse(flag: &str, list: &str) -> Result<Self, PortListError> {
        parse_list(flag, list, 1u16, u16::MAX, None).map(|v| Self(v.into_iter().collect()))
    }

    /// A clap `value_parser` for `flag`.
    pub fn arg(
        flag: &'static str,
    ) -> impl Fn(&str) -> Result<Self, PortListError> + Clone + Send + Sync + 'static {
        move |s| Self::parse(flag, s)
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

    /// Contiguous ranges, in order: `[(80, 80), (8000, 8100)]`.
    pub fn ranges(&self) -> Vec<(u16, u16)> {
        ranges(self.iter())
    }

    /// Compact text form, ranges folded: `80,443,8000-8100`; [`PortList::parse`] reads it back.
    pub fn to_compact_string(&self) -> String {
        self.ranges()
            .into_iter()
            .map(|(a, b)| {
                if a == b {
                    a.to_string()
                } else {
                    format!("{a}-{b}")
                }
            })
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const VSOCK_MAX: u32 = u32::MAX - 1;

    fn vsock(s: &str) -> Result<Vec<u32>, PortListError> {
        parse_list("--ports", s, 1, VSOCK_MAX, Some(1024))
    }

    #[test]
    fn parses_lists_and_ranges() {
        let p = PortList::parse("--ports", "80, 443,8000-8002").unwrap();
        assert_eq!(
            p.iter().collect::<Vec<_>>(),
            vec![80, 443, 8000, 8001, 8002]
        );
        assert_eq!(p.to_compact_string(), "80,443,8000-8002");
        assert_eq!(p.ranges(), vec![(80, 80), (443, 443), (8000, 8002)]);
        assert_eq!(
            PortList::parse("--ports", "65535")
                .unwrap()
                .to_compact_string(),
            "65535"
        );
        assert_eq!(PortList::parse("--ports", "1-65535").unwrap().len(), 65535);
        assert_eq!(vsock("5000").unwrap(), vec![5000]);
        assert_eq!(
            vsock("6002,5000,6000-6001").unwrap(),
            vec![5000, 6000, 6001, 6002]
        );
        assert_eq!(vsock("1,4294967294").unwrap(), vec![1, 4294967294]);
        assert_eq!(vsock(" 7 - 8 ").unwrap(), vec![7, 8]);
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
        assert_eq!(
            PortList::parse("--exclude-ports", "http")
                .unwrap_err()
                .to_string(),
            "invalid port \"http\" in --exclude-ports: must be a number 1-65535 or a range A-B"
        );
        assert_eq!(
            PortList::parse("--ports", "90-80").unwrap_err().to_string(),
            "invalid range \"90-80\" in --ports: its start is above its end"
        );
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
        assert_eq!(
            PortList::parse("--ports", "80,8000-8100,8080")
                .unwrap_err()
                .to_string(),
            "invalid port list \"80,8000-8100,8080\" in --ports: port 8080 is listed twice"
        );
        assert_eq!(
            vsock("5000,70000x").unwrap_err().to_string(),
            "invalid port \"70000x\" in --ports: must be a number 1-4294967294 or a range A-B"
        );
        assert_eq!(
            vsock("0").unwrap_err().to_string(),
            "invalid port \"0\" in --ports: must be 1-4294967294"
        );
        assert!(vsock("4294967295").is_err());
        assert!(vsock("5000,5000")
            .unwrap_err()
            .to_string()
            .contains("port 5000 is listed twice"));
        assert!(vsock("1-2000")
            .unwrap_err()
            .to_string()
            .contains("more than 1024 ports"));
        assert!(vsock("").is_err());
        assert!(vsock("5,").is_err());
        assert!(vsock("1-2-3").is_err());
        // The whole u32 range never allocates or loops for long.
        assert!(vsock("1-4294967294").is_err());
    }

    proptest! {
        // Whatever the text, the parser returns sorted distinct ports in range or an error
        // naming the flag; it never panics.
        #[test]
        fn never_panics(s in "[0-9,\\- x]{0,40}") {
            match vsock(&s) {
                Ok(v) => {
                    prop_assert!(!v.is_empty() && v.len() <= 1024);
                    prop_assert!(v.windows(2).all(|w| w[0] < w[1]));
                    prop_assert!(v.iter().all(|&p| (1..=VSOCK_MAX).contains(&p)));
                }
                Err(e) => prop_assert_eq!(e.flag(), "--ports"),
            }
            if let Ok(p) = PortList::parse("--ports", &s) {
                prop_assert_eq!(PortList::parse("--ports", &p.to_compact_string()), Ok(p));
            }
        }

        // Printed (as a list, or folded into ranges), then read back: the same ports.
        #[test]
        fn format_then_parse_is_identity(ps in proptest::collection::btree_set(1u32..=VSOCK_MAX, 1..20)) {
            let s = ps.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
            prop_assert_eq!(vsock(&s).unwrap(), ps.iter().copied().collect::<Vec<_>>());
        }

        #[test]
        fn compact_form_round_trips(ps in proptest::collection::btree_set(1u16..=u16::MAX, 1..200)) {
            let p = PortList(ps);
            prop_assert_eq!(PortList::parse("--ports", &p.to_compact_string()), Ok(p));
        }
    }
}
