//! Settings, validated before anything is changed. Errors name the bad value and what is valid.

use std::time::Duration;

use nsfast_sys::args::{duration, ifname, size, ArgError};
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
/// Most refused flows of one client (bridge port) handed back at once; beyond that they are
/// dropped.
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
    /// A bad bridge name, size or duration (the flag or variable, the value, what is valid).
    #[error(transparent)]
    Arg(#[from] ArgError),
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
    /// Flows one client (bridge port, [`crate::client`]) may hold in the relay; more go to
    /// Docker's normal path.
    pub max_flows_per_client: usize,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Smallest and largest socket buffer request (`VPNRELAY_SOCKBUF`).
pub const MIN_SOCKBUF: u64 = 4096;
pub const MAX_SOCKBUF: u64 = 1 << 30;
/// Shortest and longest idle timeout (`VPNRELAY_IDLE_TIMEOUT`).
pub const MIN_IDLE: Duration = Duration::from_secs(1);
pub const MAX_IDLE: Duration = Duration::from_secs(86400);

/// Validates the bridge's interface name ([`nsfast_sys::args::ifname`]).
pub fn check_bridge(name: &str) -> Result<(), ConfigError> {
    Ok(ifname::check("<bridge>", name)?)
}

impl Config {
    /// Builds the configuration from the arguments and the environment.
    pub fn from_args(bridge: &str, ports: &str) -> Result<Self, ConfigError> {
        Self::from_lookup(bridge, ports, env)
    }

    /// [`Config::from_args`] with the environment read through `env` (empty values are unset).
    fn from_lookup(
        bridge: &str,
        ports: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let flag = |name: &str| env(name).is_some_and(|v| v != "0");
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
            // At most 1G, so it fits.
            Some(v) => size::parse_in("VPNRELAY_SOCKBUF", &v, MIN_SOCKBUF, MAX_SOCKBUF)? as usize,
        };
        let idle = match env("VPNRELAY_IDLE_TIMEOUT") {
            None => DEFAULT_IDLE,
            Some(v) => duration::parse_in("VPNRELAY_IDLE_TIMEOUT", &v, MIN_IDLE, MAX_IDLE)?,
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
        self.ports.ranges()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_come_from_the_environment() {
        let from = |sockbuf: Option<&str>, idle: Option<&str>| {
            let env = |k: &str| match k {
                "VPNRELAY_SOCKBUF" => sockbuf.map(String::from),
                "VPNRELAY_IDLE_TIMEOUT" => idle.map(String::from),
                _ => None,
            };
            Config::from_lookup("br0", "1", env)
                .map(|c| (c.sockbuf, c.idle))
                .map_err(|e| e.to_string())
        };
        assert_eq!(from(None, None), Ok((DEFAULT_SOCKBUF, DEFAULT_IDLE)));
        assert_eq!(
            from(Some("512KiB"), Some("4")),
            Ok((512 << 10, Duration::from_secs(4)))
        );
        assert_eq!(
            from(Some("16M"), Some("3m")),
            Ok((16 << 20, Duration::from_secs(180)))
        );
        let e = from(Some("lots"), None).unwrap_err();
        assert!(e.contains("\"lots\" for VPNRELAY_SOCKBUF"), "{e}");
        assert!(from(Some("1K"), None).unwrap_err().contains("at least 4K"));
        let e = from(None, Some("0")).unwrap_err();
        assert!(e.contains("\"0\" for VPNRELAY_IDLE_TIMEOUT: zero"), "{e}");
        assert!(from(None, Some("2d")).is_err());
        assert!(from(None, Some("25h")).unwrap_err().contains("too long"));
        assert!(from(None, Some("500ms"))
            .unwrap_err()
            .contains("at least 1s"));
        assert_eq!(
            from(None, Some("1.5")),
            Ok((DEFAULT_SOCKBUF, Duration::from_millis(1500)))
        );
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
