//! Command-line values of the bridge: `--group`, `--vm` (and what a member's transport is);
//! `--ports` is read by the shared port-list parser, `nsfast_sys::ports::parse_list`. Each bad value is one error naming the flag, the value and what is valid.

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
