//! IPAM delegation: run the plugin named by `ipam.type` from `CNI_PATH` with the same
//! environment (but our command) and the network configuration on stdin, as libcni's
//! `invoke.DelegateAdd/Del/Check` do.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::spec::{code, CniError, Env};

/// Finds `plugin` in the colon-separated `CNI_PATH`.
pub fn find(plugin: &str, env: &Env) -> Result<PathBuf, CniError> {
    let path = env.need("CNI_PATH", &env.path)?;
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(d).join(plugin))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            CniError::new(
                code::IO_FAILURE,
                format!("IPAM plugin {plugin:?} not found in CNI_PATH"),
                format!("CNI_PATH={path}; on Debian: apt-get install containernetworking-plugins (installs /usr/lib/cni/{plugin})"),
            )
        })
}

/// The versions the plugin at `bin` supports (its VERSION answer).
pub fn versions(bin: &std::path::Path) -> Result<Vec<String>, CniError> {
    let out = Command::new(bin)
        .env("CNI_COMMAND", "VERSION")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| io_err(bin, e))?;
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        CniError::new(
            code::IO_FAILURE,
            format!("{} VERSION: unreadable answer", bin.display()),
            e.to_string(),
        )
    })?;
    Ok(v["supportedVersions"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default())
}

fn io_err(bin: &std::path::Path, e: std::io::Error) -> CniError {
    CniError::new(
        code::IO_FAILURE,
        format!("cannot run IPAM plugin {}", bin.display()),
        e.to_string(),
    )
}

/// The version to speak to the IPAM plugin: ours if it supports it, else the highest 1.x /
/// 0.4.0 it has (results of 0.4.0-1.1.0 share their format).
pub fn pick_version(ours: &str, theirs: &[String]) -> Option<String> {
    if theirs.iter().any(|t| t == ours) {
        return Some(ours.to_string());
    }
    ["1.1.0", "1.0.0", "0.4.0"]
        .iter()
        .find(|v| theirs.iter().any(|t| t == *v))
        .map(|v| v.to_string())
}

/// A delegate: the IPAM binary and the version it is spoken to in.
#[derive(Debug, Clone)]
pub struct Delegate {
    pub bin: PathBuf,
    pub version: String,
    pub name: String,
}

impl Delegate {
    /// Finds `ipam.type` and agrees on a version.
    pub fn new(plugin: &str, our_version: &str, env: &Env) -> Result<Self, CniError> {
        let bin = find(plugin, env)?;
        let theirs = versions(&bin)?;
        let version = pick_version(our_version, &theirs).ok_or_else(|| {
            CniError::new(
                code::INCOMPATIBLE_VERSION,
                format!("IPAM plugin {plugin:?} speaks no version compatible with {our_version}"),
                format!("it supports {theirs:?}"),
            )
        })?;
        Ok(Self {
            bin,
            version,
            name: plugin.to_string(),
        })
    }

    /// Whether the delegate understands CNI 1.1 commands (STATUS, GC).
    pub fn speaks_1_1(&self) -> bool {
        self.version == "1.1.0"
    }

    /// Runs `command` with `conf` (cniVersion rewritten) on stdin and the environment `env`
    /// (container id / ifname overridable for GC). Returns its stdout JSON, if any.
    pub fn exec(
        &self,
        command: &str,
        env: &Env,
        container_id: &str,
        ifname: &str,
        conf: &Value,
    ) -> Result<Option<Value>, CniError> {
        let mut conf = conf.clone();
        conf["cniVersion"] = Value::String(self.version.clone());
        let mut cmd = Command::new(&self.bin);
        cmd.env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", container_id)
            .env("CNI_IFNAME", ifname)
            .env("CNI_NETNS", env.netns.as_deref().unwrap_or(""))
            .env("CNI_ARGS", env.args.as_deref().unwrap_or(""))
            .env("CNI_PATH", env.path.as_deref().unwrap_or(""))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| io_err(&self.bin, e))?;
        let body = serde_json::to_vec(&conf).expect("serialise config");
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(&body);
        }
        let out = child.wait_with_output().map_err(|e| io_err(&self.bin, e))?;
        let stdout: Option<Value> = if out.stdout.iter().all(u8::is_ascii_whitespace) {
            None
        } else {
            serde_json::from_slice(&out.stdout).ok()
        };
        if !out.status.success() {
            let (c, msg, details) = match &stdout {
                Some(v) => (
                    v["code"].as_u64().unwrap_or(code::IO_FAILURE as u64) as u32,
                    v["msg"].as_str().unwrap_or("failed").to_string(),
                    v["details"].as_str().unwrap_or("").to_string(),
                ),
                None => (
                    code::IO_FAILURE,
                    "failed".to_string(),
                    String::from_utf8_lossy(&out.stderr).trim().to_string(),
                ),
            };
            return Err(CniError::new(
                c,
                format!("IPAM {} {command}: {msg}", self.name),
                details,
            ));
        }
        Ok(stdout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_a_common_version() {
        let hl: Vec<String> = ["0.3.1", "0.4.0", "1.0.0"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(pick_version("1.1.0", &hl).as_deref(), Some("1.0.0"));
        assert_eq!(pick_version("1.0.0", &hl).as_deref(), Some("1.0.0"));
        assert_eq!(pick_version("1.1.0", &["0.2.0".to_string()]), None);
    }
}
