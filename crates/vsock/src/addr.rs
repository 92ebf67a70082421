//! socat-style addresses. Every error names the text it could not use and lists what is valid.

use std::path::PathBuf;
use std::str::FromStr;

/// `VMADDR_CID_ANY` / `VMADDR_PORT_ANY`: reserved, not usable as a peer's CID or a port.
pub const ANY: u32 = u32::MAX;
/// Longest UNIX socket path (sun_path minus the terminating NUL).
pub const UNIX_PATH_MAX: usize = 107;

pub const FORMS: &str = "vsock-listen:PORT[,cid=CID], vsock-connect:CID:PORT[,to-host], \
tcp-listen:PORT[,bind=ADDR], tcp:HOST:PORT, unix-listen:PATH, unix:PATH, hybrid:PATH:PORT, \
hybrid-listen:PATH[:PORT], stdio";

/// One end of a relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// Accept vsock connections on PORT (bound to CID, default any).
    VsockListen { port: u32, cid: Option<u32> },
    /// Connect to CID:PORT; `to_host` sets VMADDR_FLAG_TO_HOST (sibling VMs through the host).
    VsockConnect { cid: u32, port: u32, to_host: bool },
    /// Accept TCP connections on PORT (bound to `bind`, default all addresses).
    TcpListen {
        port: u16,
        bind: Option<std::net::IpAddr>,
    },
    /// Connect to HOST:PORT.
    Tcp { host: String, port: u16 },
    /// Accept connections on a UNIX socket.
    UnixListen { path: PathBuf },
    /// Connect to a UNIX socket.
    Unix { path: PathBuf },
    /// Host side of hybrid vsock: connect to the VMM's socket, `CONNECT PORT`.
    Hybrid { path: PathBuf, port: u32 },
    /// Guest-initiated hybrid vsock: the VMM connects to this UNIX socket (`PATH_PORT`).
    HybridListen { path: PathBuf },
    /// Standard input and output.
    Stdio,
}

/// A malformed address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid address {input:?}: {reason}")]
pub struct AddressError {
    pub input: String,
    pub reason: String,
}

fn err(input: &str, reason: impl Into<String>) -> AddressError {
    AddressError {
        input: input.into(),
        reason: reason.into(),
    }
}

fn vsock_port(input: &str, s: &str) -> Result<u32, AddressError> {
    let v: u64 = s.parse().map_err(|_| {
        err(
            input,
            format!("port {s:?} is not a number (vsock ports are 0-4294967294)"),
        )
    })?;
    if v >= u64::from(ANY) {
        return Err(err(
            input,
            format!("port {s} out of range: vsock ports are 0-4294967294"),
        ));
    }
    Ok(v as u32)
}

fn cid(input: &str, s: &str) -> Result<u32, AddressError> {
    let v: u64 = s.parse().map_err(|_| {
        err(
            input,
            format!("CID {s:?} is not a number (CIDs are 0-4294967294)"),
        )
    })?;
    if v >= u64::from(ANY) {
        return Err(err(
            input,
            format!("CID {s} out of range: CIDs are 0-4294967294"),
        ));
    }
    Ok(v as u32)
}

fn tcp_port(input: &str, s: &str) -> Result<u16, AddressError> {
    match s.parse::<u32>() {
        Ok(v) if (1..=65535).contains(&v) => Ok(v as u16),
        Ok(v) => Err(err(
            input,
            format!("TCP port {v} out of range: must be 1-65535"),
        )),
        Err(_) => Err(err(
            input,
            format!("TCP port {s:?} is not a number (1-65535)"),
        )),
    }
}

fn unix_path(input: &str, s: &str) -> Result<PathBuf, AddressError> {
    if s.is_empty() {
        return Err(err(input, "empty path"));
    }
    if s.len() > UNIX_PATH_MAX {
        return Err(err(
            input,
            format!(
                "path is {} bytes long: UNIX socket paths are at most {UNIX_PATH_MAX}",
                s.len()
            ),
        ));
    }
    if s.contains('\0') {
        return Err(err(input, "path contains a NUL byte"));
    }
    Ok(PathBuf::from(s))
}

/// An address split at its first `:` and its options' `,`: `KIND:MAIN[,OPT,...]`.
struct Parts<'a> {
    input: &'a str,
    main: &'a str,
    options: Vec<&'a str>,
}

impl<'a> Parts<'a> {
    /// `input` without `stdio`: its kind (lowercase) and parts.
    fn split(input: &'a str) -> Result<(String, Self), AddressError> {
        let Some((kind, rest)) = input.split_once(':') else {
            return Err(err(input, format!("expected one of {FORMS}")));
        };
        let (main, opts) = match rest.split_once(',') {
            Some((m, o)) => (m, Some(o)),
            None => (rest, None),
        };
        let options: Vec<&str> = opts.map(|o| o.split(',').collect()).unwrap_or_default();
        let parts = Self {
            input,
            main,
            options,
        };
        Ok((kind.to_ascii_lowercase(), parts))
    }

    fn err(&self, reason: impl Into<String>) -> AddressError {
        err(self.input, reason)
    }

    /// For address types that take no options.
    fn no_opts(&self, what: &str) -> Result<(), AddressError> {
        if self.options.is_empty() {
            Ok(())
        } else {
            Err(self.err(format!(
                "{what} takes no options (got {:?})",
                self.options.join(",")
            )))
        }
    }
}

impl FromStr for Address {
    type Err = AddressError;

    fn from_str(input: &str) -> Result<Self, AddressError> {
        if input == "stdio" || input == "-" || input.eq_ignore_ascii_case("stdio") {
            return Ok(Address::Stdio);
        }
        let (kind, parts) = Parts::split(input)?;
        match kind.as_str() {
            "vsock-listen" => vsock_listen(&parts),
            "vsock-connect" => vsock_connect(&parts),
            "tcp-listen" => tcp_listen(&parts),
            "tcp" | "tcp-connect" => tcp_connect(&parts),
            "unix-listen" => {
                parts.no_opts("unix-listen")?;
                Ok(Address::UnixListen {
                    path: unix_path(input, parts.main)?,
                })
            }
            "unix" | "unix-connect" => {
                parts.no_opts("unix")?;
                Ok(Address::Unix {
                    path: unix_path(input, parts.main)?,
                })
            }
            "hybrid" => hybrid_connect(&parts),
            "hybrid-listen" => hybrid_listen(&parts),
            other => Err(err(
                input,
                format!("unknown address type {other:?}: expected one of {FORMS}"),
            )),
        }
    }
}

/// `vsock-listen:PORT[,cid=CID]`
fn vsock_listen(a: &Parts) -> Result<Address, AddressError> {
    let port = vsock_port(a.input, a.main)?;
    let mut c = None;
    for o in &a.options {
        match o.split_once('=') {
            Some(("cid", v)) => c = Some(cid(a.input, v)?),
            _ => return Err(a.err(format!("unknown option {o:?}: vsock-listen takes cid=CID"))),
        }
    }
    Ok(Address::VsockListen { port, cid: c })
}

/// `vsock-connect:CID:PORT[,to-host]`
fn vsock_connect(a: &Parts) -> Result<Address, AddressError> {
    let Some((c, p)) = a.main.split_once(':') else {
        return Err(a.err("expected vsock-connect:CID:PORT"));
    };
    let mut to_host = false;
    for &o in &a.options {
        match o {
            "to-host" => to_host = true,
            _ => return Err(a.err(format!("unknown option {o:?}: vsock-connect takes to-host"))),
        }
    }
    Ok(Address::VsockConnect {
        cid: cid(a.input, c)?,
        port: vsock_port(a.input, p)?,
        to_host,
    })
}

/// `tcp-listen:PORT[,bind=ADDR]`
fn tcp_listen(a: &Parts) -> Result<Address, AddressError> {
    let port = tcp_port(a.input, a.main)?;
    let mut bind = None;
    for o in &a.options {
        match o.split_once('=') {
            Some(("bind", v)) => {
                bind = Some(
                    v.trim_matches(|c| c == '[' || c == ']')
                        .parse()
                        .map_err(|_| a.err(format!("bind address {v:?} is not an IP address")))?,
                )
            }
            _ => return Err(a.err(format!("unknown option {o:?}: tcp-listen takes bind=ADDR"))),
        }
    }
    Ok(Address::TcpListen { port, bind })
}

/// `tcp:HOST:PORT` (`[v6]` brackets allowed)
fn tcp_connect(a: &Parts) -> Result<Address, AddressError> {
    a.no_opts("tcp")?;
    let Some((h, p)) = a.main.rsplit_once(':') else {
        return Err(a.err("expected tcp:HOST:PORT"));
    };
    let host = h.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(a.err("empty host in tcp:HOST:PORT"));
    }
    Ok(Address::Tcp {
        host: host.to_string(),
        port: tcp_port(a.input, p)?,
    })
}

/// `hybrid:PATH:PORT`
fn hybrid_connect(a: &Parts) -> Result<Address, AddressError> {
    a.no_opts("hybrid")?;
    let Some((p, port)) = a.main.rsplit_once(':') else {
        return Err(a.err("expected hybrid:PATH:PORT"));
    };
    Ok(Address::Hybrid {
        path: unix_path(a.input, p)?,
        port: vsock_port(a.input, port)?,
    })
}

/// `hybrid-listen:PATH[:PORT]`
fn hybrid_listen(a: &Parts) -> Result<Address, AddressError> {
    a.no_opts("hybrid-listen")?;
    // hybrid-listen:PATH:PORT listens on PATH_PORT, as the VMM expects;
    // hybrid-listen:PATH uses PATH as given.
    let path = match a.main.rsplit_once(':') {
        Some((p, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            let port = vsock_port(a.input, port)?;
            format!("{p}_{port}")
        }
        _ => a.main.to_string(),
    };
    Ok(Address::HybridListen {
        path: unix_path(a.input, &path)?,
    })
}

impl Address {
    /// Whether this address waits for a peer (accepts) rather than connecting.
    pub fn is_listen(&self) -> bool {
        matches!(
            self,
            Address::VsockListen { .. }
                | Address::TcpListen { .. }
                | Address::UnixListen { .. }
                | Address::HybridListen { .. }
        )
    }

    /// Whether opening this address creates an AF_VSOCK socket.
    pub fn is_vsock(&self) -> bool {
        matches!(
            self,
            Address::VsockListen { .. } | Address::VsockConnect { .. }
        )
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::VsockListen { port, cid: None } => write!(f, "vsock-listen:{port}"),
            Address::VsockListen { port, cid: Some(c) } => write!(f, "vsock-listen:{port},cid={c}"),
            Address::VsockConnect { cid, port, to_host } => {
                write!(
                    f,
                    "vsock-connect:{cid}:{port}{}",
                    if *to_host { ",to-host" } else { "" }
                )
            }
            Address::TcpListen { port, bind: None } => write!(f, "tcp-listen:{port}"),
            Address::TcpListen {
                port,
                bind: Some(b),
            } => write!(f, "tcp-listen:{port},bind={b}"),
            Address::Tcp { host, port } if host.contains(':') => write!(f, "tcp:[{host}]:{port}"),
            Address::Tcp { host, port } => write!(f, "tcp:{host}:{port}"),
            Address::UnixListen { path } => write!(f, "unix-listen:{}", path.display()),
            Address::Unix { path } => write!(f, "unix:{}", path.display()),
            Address::Hybrid { path, port } => write!(f, "hybrid:{}:{port}", path.display()),
            Address::HybridListen { path } => write!(f, "hybrid-listen:{}", path.display()),
            Address::Stdio => write!(f, "stdio"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(s: &str) -> Address {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn parses_every_form() {
        assert_eq!(
            p("vsock-listen:1234"),
            Address::VsockListen {
                port: 1234,
                cid: None
            }
        );
        assert_eq!(
            p("vsock-listen:1234,cid=3"),
            Address::VsockListen {
                port: 1234,
                cid: Some(3)
            }
        );
        assert_eq!(
            p("vsock-connect:2:5000"),
            Address::VsockConnect {
                cid: 2,
                port: 5000,
                to_host: false
            }
        );
        assert_eq!(
            p("VSOCK-CONNECT:4:5000,to-host"),
            Address::VsockConnect {
                cid: 4,
                port: 5000,
                to_host: true
            }
        );
        assert_eq!(
            p("tcp-listen:8080"),
            Address::TcpListen {
                port: 8080,
                bind: None
            }
        );
        assert_eq!(
            p("tcp-listen:8080,bind=127.0.0.1"),
            Address::TcpListen {
                port: 8080,
                bind: Some("127.0.0.1".parse().unwrap())
            }
        );
        assert_eq!(
            p("tcp:localhost:80"),
            Address::Tcp {
                host: "localhost".into(),
                port: 80
            }
        );
        assert_eq!(
            p("tcp:[::1]:80"),
            Address::Tcp {
                host: "::1".into(),
                port: 80
            }
        );
        assert_eq!(
            p("unix-listen:/run/x.sock"),
            Address::UnixListen {
                path: "/run/x.sock".into()
            }
        );
        assert_eq!(
            p("unix:/run/x.sock"),
            Address::Unix {
                path: "/run/x.sock".into()
            }
        );
        assert_eq!(
            p("hybrid:/run/fc.vsock:52"),
            Address::Hybrid {
                path: "/run/fc.vsock".into(),
                port: 52
            }
        );
        assert_eq!(
            p("hybrid-listen:/run/fc.vsock:52"),
            Address::HybridListen {
                path: "/run/fc.vsock_52".into()
            }
        );
        assert_eq!(
            p("hybrid-listen:/run/fc.vsock_52"),
            Address::HybridListen {
                path: "/run/fc.vsock_52".into()
            }
        );
        assert_eq!(p("stdio"), Address::Stdio);
        assert_eq!(p("-"), Address::Stdio);
    }

    #[test]
    fn rejects_bad_input_naming_it() {
        let e = "vsock-connect:4294967295:1".parse::<Address>().unwrap_err();
        assert!(e.to_string().contains("CID 4294967295 out of range"), "{e}");
        let e = "vsock-listen:99999999999".parse::<Address>().unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
        let e = "tcp:host:70000".parse::<Address>().unwrap_err();
        assert!(
            e.to_string()
                .contains("TCP port 70000 out of range: must be 1-65535"),
            "{e}"
        );
        let e = "tcp-listen:0".parse::<Address>().unwrap_err();
        assert!(e.to_string().contains("1-65535"), "{e}");
        let e = "udp:1.2.3.4:5".parse::<Address>().unwrap_err();
        assert!(
            e.to_string().contains("unknown address type \"udp\""),
            "{e}"
        );
        let e = "vsock-connect:2:5,to-guest".parse::<Address>().unwrap_err();
        assert!(e.to_string().contains("unknown option \"to-guest\""), "{e}");
        let e = format!("unix:/{}", "a".repeat(200))
            .parse::<Address>()
            .unwrap_err();
        assert!(e.to_string().contains("at most 107"), "{e}");
        assert!("nonsense".parse::<Address>().is_err());
        assert!("hybrid:/x".parse::<Address>().is_err());
        assert!("vsock-connect:abc:1".parse::<Address>().is_err());
        assert!("tcp::80".parse::<Address>().is_err());
    }

    proptest! {
        // The parser never panics, whatever it is given.
        #[test]
        fn parser_never_panics(s in "\\PC{0,80}") {
            let _ = s.parse::<Address>();
        }

        // Structured inputs round-trip through Display.
        #[test]
        fn valid_addresses_round_trip(cid in 0u32..u32::MAX, port in 0u32..u32::MAX, tcp in 1u16..=65535,
                                      to_host in any::<bool>(), name in "[a-z0-9_./-]{1,40}") {
            let addrs = [
                Address::VsockConnect { cid, port, to_host },
                Address::VsockListen { port, cid: Some(cid) },
                Address::Tcp { host: "10.0.0.1".into(), port: tcp },
                Address::Hybrid { path: PathBuf::from(format!("/{name}")), port },
                Address::Unix { path: PathBuf::from(format!("/{name}")) },
            ];
            for a in addrs {
                let back: Address = a.to_string().parse().unwrap();
                prop_assert_eq!(back, a);
            }
        }
    }
}
