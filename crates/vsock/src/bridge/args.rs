//! Command-line values of the bridge: `--ports`, `--group`, `--vm` (and what a member's
//! transport is). Each bad value is one error naming the flag, the value and what is valid.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::Serialize;

use crate::addr::UNIX_PATH_MAX;

/// Lowest CID a guest can have (0 hypervisor, 1 local, 2 host).
pub const MIN_GUEST_CID: u32 = 3;
/// Highest usable port and CID (`u32::MAX` is `VMADDR_PORT_ANY` / `VMADDR_CID_ANY`).
pub const MAX_VALUE: u32 = u32::MAX - 1;
/// At most this many ports in `--ports` (each is a listener per member transport).
pub const MAX_PORTS: usize = 1024;

/// A bad `--ports`, `--group` or `--vm` value: names the flag, the value and what is valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {value:?} in {flag}: {reason}")]
pub struct ArgError {
    pub flag: &'static str,
    pub what: &'static str,
    pub value: String,
    pub reason: String,
}

fn arg_err(
    flag: &'static str,
    what: &'static str,
    value: &str,
    reason: impl Into<String>,
) -> ArgError {
    ArgError {
        flag,
        what,
        value: value.into(),
        reason: reason.into(),
    }
}

fn port(s: &str) -> Result<u32, ArgError> {
    let why = format!("vsock ports here are 1-{MAX_VALUE}");
    let v: u64 = s
        .trim()
        .parse()
        .map_err(|_| arg_err("--ports", "port", s, format!("not a number ({why})")))?;
    if v == 0 || v > u64::from(MAX_VALUE) {
        return Err(arg_err(
            "--ports",
            "port",
            s,
            format!("out of range ({why})"),
        ));
    }
    Ok(v as u32)
}

/// Parses a port list such as `5000,6000-6010` into sorted, distinct ports.
/// Valid: ports 1-4294967294, ranges `A-B` with A <= B, at most [`MAX_PORTS`] ports in all,
/// no port twice.
pub fn parse_ports(s: &str) -> Result<Vec<u32>, ArgError> {
    let mut set = BTreeSet::new();
    if s.trim().is_empty() {
        return Err(arg_err(
            "--ports",
            "list",
            s,
            "empty: give ports such as 5000,6000-6010",
        ));
    }
    for item in s.split(',') {
        let (a, b) = match item.split_once('-') {
            Some((a, b)) => (port(a)?, port(b)?),
            None => {
                let p = port(item)?;
                (p, p)
            }
        };
        if a > b {
            return Err(arg_err(
                "--ports",
                "range",
                item,
                "its start is above its end",
            ));
        }
        if u64::from(b - a) + 1 + set.len() as u64 > MAX_PORTS as u64 {
            return Err(arg_err(
                "--ports",
                "list",
                s,
                format!("more than {MAX_PORTS} ports"),
            ));
        }
        for p in a..=b {
            if !set.insert(p) {
                return Err(arg_err(
                    "--ports",
                    "list",
                    s,
                    format!("port {p} is listed twice"),
                ));
            }
        }
    }
    Ok(set.into_iter().collect())
}

fn guest_cid(flag: &'static str, s: &str) -> Result<u32, ArgError> {
    let why = format!("guest CIDs are {MIN_GUEST_CID}-{MAX_VALUE}");
    let v: u64 = s
        .trim()
        .parse()
        .map_err(|_| arg_err(flag, "CID", s, format!("not a number ({why})")))?;
    if v < u64::from(MIN_GUEST_CID) || v > u64::from(MAX_VALUE) {
        return Err(arg_err(flag, "CID", s, format!("out of range ({why})")));
    }
    Ok(v as u32)
}

/// Parses one `--group CID,CID[,...]`: guest CIDs (3-4294967294), none twice. A group of one
/// CID is allowed: that VM is known to the bridge but reaches nobody (every connection from it
/// is denied and reported).
pub fn parse_group(s: &str) -> Result<Vec<u32>, ArgError> {
    let mut g = Vec::new();
    for c in s.split(',') {
        let cid = guest_cid("--group", c)?;
        if g.contains(&cid) {
            return Err(arg_err(
                "--group",
                "group",
                s,
                format!("CID {cid} is listed twice"),
            ));
        }
        g.push(cid);
    }
    Ok(g)
}

/// How the bridge reaches a member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// AF_VSOCK on the host (vhost-vsock).
    Vsock,
    /// Hybrid vsock through the VMM's UNIX socket at this path.
    Hybrid(PathBuf),
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Vsock => write!(f, "vsock"),
            Transport::Hybrid(p) => write!(f, "hybrid:{}", p.display()),
        }
    }
}

/// Parses one `--vm CID=vsock` or `--vm CID=hybrid:PATH`.
pub fn parse_vm(s: &str) -> Result<(u32, Transport), ArgError> {
    let forms = "expected CID=vsock or CID=hybrid:PATH";
    let Some((c, t)) = s.split_once('=') else {
        return Err(arg_err("--vm", "member", s, forms));
    };
    let cid = guest_cid("--vm", c)?;
    let t = if t == "vsock" {
        Transport::Vsock
    } else if let Some(p) = t.strip_prefix("hybrid:") {
        if p.is_empty() {
            return Err(arg_err("--vm", "member", s, "empty hybrid path"));
        }
        if p.contains('\0') {
            return Err(arg_err("--vm", "member", s, "path contains a NUL byte"));
        }
        if p.len() > UNIX_PATH_MAX {
            return Err(arg_err(
                "--vm",
                "member",
                s,
                format!(
                    "path is {} bytes long: UNIX socket paths are at most {UNIX_PATH_MAX}",
                    p.len()
                ),
            ));
        }
        Transport::Hybrid(PathBuf::from(p))
    } else {
        return Err(arg_err("--vm", "member", s, forms));
    };
    Ok((cid, t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ports_parse_lists_and_ranges() {
        assert_eq!(parse_ports("5000").unwrap(), vec![5000]);
        assert_eq!(
            parse_ports("6002,5000,6000-6001").unwrap(),
            vec![5000, 6000, 6001, 6002]
        );
        assert_eq!(parse_ports("1,4294967294").unwrap(), vec![1, 4294967294]);
        assert_eq!(parse_ports(" 7 - 8 ").unwrap(), vec![7, 8]);
    }

    #[test]
    fn bad_ports_name_the_value_and_what_is_valid() {
        let e = parse_ports("5000,70000x").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid port \"70000x\" in --ports: not a number (vsock ports here are 1-4294967294)"
        );
        let e = parse_ports("0").unwrap_err();
        assert!(e
            .to_string()
            .contains("out of range (vsock ports here are 1-4294967294)"));
        assert!(parse_ports("4294967295").is_err());
        let e = parse_ports("6010-6000").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid range \"6010-6000\" in --ports: its start is above its end"
        );
        assert!(parse_ports("5000,5000")
            .unwrap_err()
            .to_string()
            .contains("port 5000 is listed twice"));
        assert!(parse_ports("1-2000")
            .unwrap_err()
            .to_string()
            .contains("more than 1024 ports"));
        assert!(parse_ports("").is_err());
        assert!(parse_ports("5,").is_err());
        assert!(parse_ports("1-2-3").is_err());
        // The whole u32 range never allocates or loops for long.
        assert!(parse_ports("1-4294967294").is_err());
    }

    #[test]
    fn groups_and_vms_parse() {
        assert_eq!(parse_group("3,4,10").unwrap(), vec![3, 4, 10]);
        assert_eq!(parse_group("3").unwrap(), vec![3]);
        assert_eq!(
            parse_group("3,2").unwrap_err().to_string(),
            "invalid CID \"2\" in --group: out of range (guest CIDs are 3-4294967294)"
        );
        assert!(parse_group("3,3")
            .unwrap_err()
            .to_string()
            .contains("CID 3 is listed twice"));
        assert!(parse_group("3,x").is_err());
        assert!(parse_group("4294967295").is_err());
        assert_eq!(parse_vm("3=vsock").unwrap(), (3, Transport::Vsock));
        assert_eq!(
            parse_vm("4=hybrid:/run/fc/v.sock").unwrap(),
            (4, Transport::Hybrid("/run/fc/v.sock".into()))
        );
        assert_eq!(
            parse_vm("4=tcp:1").unwrap_err().to_string(),
            "invalid member \"4=tcp:1\" in --vm: expected CID=vsock or CID=hybrid:PATH"
        );
        assert!(parse_vm("4=hybrid:").is_err());
        assert!(parse_vm("1=vsock").is_err());
        assert!(parse_vm(&format!("4=hybrid:/{}", "a".repeat(200))).is_err());
    }

    proptest! {
        // Whatever the text, the port parser returns sorted distinct ports in range or an
        // error naming --ports; it never panics.
        #[test]
        fn ports_parser_never_panics(s in "[0-9,\\- x]{0,40}") {
            match parse_ports(&s) {
                Ok(v) => {
                    prop_assert!(!v.is_empty() && v.len() <= MAX_PORTS);
                    prop_assert!(v.windows(2).all(|w| w[0] < w[1]));
                    prop_assert!(v.iter().all(|&p| (1..=MAX_VALUE).contains(&p)));
                }
                Err(e) => prop_assert_eq!(e.flag, "--ports"),
            }
        }

        #[test]
        fn ports_parser_round_trips(ps in proptest::collection::btree_set(1u32..=MAX_VALUE, 1..20)) {
            let s = ps.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
            prop_assert_eq!(parse_ports(&s).unwrap(), ps.into_iter().collect::<Vec<_>>());
        }

        #[test]
        fn group_and_vm_parsers_never_panic(s in "\\PC{0,40}") {
            if let Ok(g) = parse_group(&s) {
                prop_assert!(g.iter().all(|c| (MIN_GUEST_CID..=MAX_VALUE).contains(c)));
            }
            if let Ok((c, _)) = parse_vm(&s) {
                prop_assert!(c >= MIN_GUEST_CID);
            }
        }
    }
}
