//! Settings, validated before anything is changed. Errors name the bad value and what is valid.

use std::time::Duration;

use nsfast_sys::ports::PortList;

/// Default routing table and rule priority (`VPNRELAY_RULE`).
pub const DEFAULT_RULE: u32 = 4820;
/// Default socket buffer request (`VPNRELAY_SOCKBUF`): 16 MiB.
pub const DEFAULT_SOCKBUF: usize = 16 << 20;
/// Flow table size.
pub const MAX_FLOWS: usize = 64;
/// Default per-client flow quota (`--max-flows-per-client`, `VPNRELAY_MAX_FLOWS_PER_CLIENT`).
pub const DEFAULT_FLOWS_PER_CLIENT: usize = 8;
/// Most refused flows handed back to Docker's path at once (one `ip rule` each; every rule is
/// consulted by each routing lookup in the rootless namespace, so keep it small).
pub const MAX_HANDED_BACK: usize = 128;
/// Most refused flows of one client handed back at once; beyond that they are dropped.
pub const MAX_HANDED_BACK_PER_CLIENT: usize = 64;
/// Default idle timeout of a flow.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(180);
/// Most ports one relay listens on (one socket per port).
pub const MAX_PORTS: usize = 1024;

/// Configuration errors.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Ports(#[from] nsfast_sys::ports::PortListError),
    #[error("invalid bridge name {0:?}: must be 1-15 characters from [A-Za-z0-9_.-]")]
    Bridge(String),
    #[error("too many ports in <ports> ({0}): at most {MAX_PORTS}")]
    TooManyPorts(usize),
    #[error("invalid {name}={value:?}: {valid}")]
    Env {
        name: &'static str,
        value: String,
        valid: &'static str,
    },
}

/// Everything a relay needs to know.
#[derive(Debug, Clone)]
pub struct Config {
    pub bridge: String,
    pub ports: PortList,
    /// Routing table and rule priority.
    pub rule: u32,
    pub sockbuf: usize,
    pub no_gro: bool,
    pub no_gso: bool,
    pub idle: Duration,
    pub max_flows: usize,
    /// Flows one client address may hold in the relay; more go to Docker's normal path.
    pub max_flows_per_client: usize,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn flag(name: &str) -> bool {
    env(name).is_some_and(|v| v != "0")
}

/// Parses a size like `16777216`, `16M`, `16MiB`, `512k`.
pub fn parse_size(s: &str) -> Option<usize> {
    let t = s.trim();
    let digits = t.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &t[digits.len()..];
    let n: usize = digits.parse().ok()?;
    let mul = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        "g" | "gib" | "gb" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mul)
}

/// Validates an interface name as the kernel would accept it.
pub fn check_bridge(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Bridge(name.into()))
    }
}

impl Config {
    /// Builds the configuration from the arguments and the environment.
    pub fn from_args(bridge: &str, ports: &str) -> Result<Self, ConfigError> {
        check_bridge(bridge)?;
        let ports = PortList::parse("<ports>", ports)?;
        if ports.len() > MAX_PORTS {
            return Err(ConfigError::TooManyPorts(ports.len()));
        }
        let rule = match env("VPNRELAY_RULE") {
            None => DEFAULT_RULE,
            Some(v) => match v.trim().parse::<u32>() {
                Ok(n) if (1..=0x7fff_ffff).contains(&n) && ![253, 254, 255].contains(&n) => n,
                _ => {
                    return Err(ConfigError::Env {
                        name: "VPNRELAY_RULE",
                        value: v,
                        valid: "a table number and rule priority 1-2147483647, not 253-255 (default, main, local)",
                    })
                }
            },
        };
        let sockbuf = match env("VPNRELAY_SOCKBUF") {
            None => DEFAULT_SOCKBUF,
            Some(v) => match parse_size(&v) {
                Some(n) if (4096..=(1 << 30)).contains(&n) => n,
                _ => {
                    return Err(ConfigError::Env {
                        name: "VPNRELAY_SOCKBUF",
                        value: v,
                        valid: "bytes between 4096 and 1G, e.g. 16777216 or 16M",
                    })
                }
            },
        };
        let idle = match env("VPNRELAY_IDLE_TIMEOUT") {
            None => DEFAULT_IDLE,
            Some(v) => match v.trim().parse::<u64>() {
                Ok(n) if (1..=86400).contains(&n) => Duration::from_secs(n),
                _ => {
                    return Err(ConfigError::Env {
                        name: "VPNRELAY_IDLE_TIMEOUT",
                        value: v,
                        valid: "seconds 1-86400 (default 180)",
                    })
                }
            },
        };
        Ok(Self {
            bridge: bridge.into(),
            ports,
            rule,
            sockbuf,
            no_gro: flag("VPNRELAY_NO_GRO"),
            no_gso: flag("VPNRELAY_NO_GSO"),
            idle,
            max_flows: MAX_FLOWS,
            max_flows_per_client: DEFAULT_FLOWS_PER_CLIENT,
        })
    }

    /// Priority of the rules that hand a refused flow back to Docker's path (`from CLIENT
    /// sport P lookup main`): just before the relay's own rule.
    pub fn handback_priority(&self) -> u32 {
        self.rule.saturating_sub(1)
    }

    /// The port list as contiguous ranges (one `ip rule` each).
    pub fn port_ranges(&self) -> Vec<(u16, u16)> {
        let mut out: Vec<(u16, u16)> = Vec::new();
        for p in self.ports.iter() {
            match out.last_mut() {
                Some((_, end)) if end.checked_add(1) == Some(p) => *end = p,
                _ => out.push((p, p)),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_size("16M"), Some(16 << 20));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("512KiB"), Some(512 << 10));
        assert_eq!(parse_size("lots"), None);
    }

    #[test]
    fn rejects_bad_input_naming_it() {
        let e = Config::from_args("br-vpn", "0").unwrap_err().to_string();
        assert_eq!(e, "invalid port \"0\" in <ports>: must be 1-65535");
        let e = Config::from_args("br-vpn", "70000")
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"70000\""), "{e}");
        let e = Config::from_args("br-vpn", "51820,,1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("51820,,1"), "{e}");
        let e = Config::from_args("this-name-is-too-long", "1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("this-name-is-too-long"), "{e}");
        assert!(Config::from_args("br/x", "1").is_err());
    }

    #[test]
    fn folds_ranges() {
        let c = Config::from_args("br0", "51820,1194,51821,5000-5002").unwrap();
        assert_eq!(
            c.port_ranges(),
            vec![(1194, 1194), (5000, 5002), (51820, 51821)]
        );
    }
}
