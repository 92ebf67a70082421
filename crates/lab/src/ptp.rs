//! Pods made by the reference `ptp` plugin (with `host-local` IPAM), on the same two-host
//! layout as `nsfast_pod::topology` — the `cni-ptp` baseline of `nsfast bench`. Dropping it
//! DELs every pod through ptp, then removes the namespaces and the IPAM store.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::pods::two_hosts;
use nsfast_sys::netns::NetNs;
use serde_json::{json, Value};

use nsfast_cni::spec::{code, CniError};

/// One ptp pod.
#[derive(Debug)]
pub struct PtpPod {
    pub host: usize,
    pub netns: NetNs,
    pub ip: Ipv4Addr,
    container_id: String,
}

/// Two hosts joined by a veth wire, pods made by ptp on each.
#[derive(Debug)]
pub struct PtpTopology {
    /// Pods first in drop order: they must be DELeted before the hosts go.
    pub pods: Vec<PtpPod>,
    pub hosts: [NetNs; 2],
    cni_path: String,
    data_dir: PathBuf,
    network: String,
}

fn io(what: &str, e: impl std::fmt::Display) -> CniError {
    CniError::new(code::IO_FAILURE, what.to_string(), e.to_string())
}

impl PtpTopology {
    /// Builds hosts `<prefix>-ha`/`-hb`, a wire (10.250.0.1/.2), routes between the pod
    /// subnets (10.251.1.0/24 on A, 10.251.2.0/24 on B), and `pods_per_host` ptp pods on each.
    /// `cni_path`: where `ptp` and `host-local` are (Debian: /usr/lib/cni).
    pub fn build(prefix: &str, pods_per_host: usize, cni_path: &str) -> Result<Self, CniError> {
        let ns = |n: String| NetNs::create(&n).map_err(|e| io("create namespace", e));
        let hosts = two_hosts(prefix).map_err(|e| io("build the hosts and their wire", e))?;
        let data_dir = std::env::temp_dir().join(format!("{prefix}-ipam"));
        std::fs::create_dir_all(&data_dir).map_err(|e| io("create IPAM store", e))?;
        let mut t = Self {
            pods: Vec::new(),
            hosts,
            cni_path: cni_path.to_string(),
            data_dir,
            network: format!("{prefix}-ptp"),
        };
        for h in 0..2 {
            for i in 0..pods_per_host {
                let netns = ns(format!("{prefix}-p{}{i}", ["a", "b"][h]))?;
                let container_id = format!("{prefix}-{h}-{i}");
                let r = t.ptp("ADD", h, &container_id, netns.path())?;
                let ip = r["ips"][0]["address"]
                    .as_str()
                    .and_then(|a| a.split('/').next())
                    .and_then(|a| a.parse().ok())
                    .ok_or_else(|| io("ptp result without an address", &r))?;
                t.pods.push(PtpPod {
                    host: h,
                    netns,
                    ip,
                    container_id,
                });
            }
        }
        Ok(t)
    }

    fn conf(&self, h: usize) -> Value {
        json!({
            "cniVersion": "1.0.0",
            "name": self.network,
            "type": "ptp",
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": format!("10.251.{}.0/24", 1 + h)}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": self.data_dir.join(format!("host{h}")).display().to_string(),
            }
        })
    }

    fn ptp(&self, cmd: &str, h: usize, container: &str, netns: &Path) -> Result<Value, CniError> {
        let mut c = Command::new(Path::new(&self.cni_path).join("ptp"));
        c.env("CNI_COMMAND", cmd)
            .env("CNI_CONTAINERID", container)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", &self.cni_path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        self.hosts[h].configure_command(&mut c, None);
        let mut child = c.spawn().map_err(|e| io("run ptp", e))?;
        if let Some(mut i) = child.stdin.take() {
            let _ = i.write_all(self.conf(h).to_string().as_bytes());
        }
        let out = child.wait_with_output().map_err(|e| io("run ptp", e))?;
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if !out.status.success() {
            return Err(io(&format!("ptp {cmd}"), &v));
        }
        Ok(v)
    }

    /// Pod `i` of host `h`.
    pub fn pod(&self, h: usize, i: usize) -> &PtpPod {
        self.pods
            .iter()
            .filter(|p| p.host == h)
            .nth(i)
            .expect("pod index")
    }
}

impl Drop for PtpTopology {
    fn drop(&mut self) {
        for p in &self.pods {
            if let Err(e) = self.ptp("DEL", p.host, &p.container_id, p.netns.path()) {
                tracing::warn!("ptp DEL {}: {e} ({})", p.container_id, e.details);
            }
        }
        self.pods.clear();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// The reference-ptp world as a [`crate::topology::Topology`]: `pods_per_host` ptp pods per
/// host with the plugins in `cni_path`; built under the name prefix given as the context.
#[derive(Debug, Clone, Copy)]
pub struct PtpSpec<'a> {
    pub pods_per_host: usize,
    pub cni_path: &'a str,
}

impl crate::topology::Topology for PtpSpec<'_> {
    type Ctx = str;
    type Guard = PtpTopology;
    type Error = CniError;

    fn name(&self) -> &str {
        "cni-ptp"
    }

    fn probe(&self) -> Result<(), String> {
        for p in ["ptp", "host-local"] {
            let f = Path::new(self.cni_path).join(p);
            if !f.is_file() {
                return Err(format!(
                    "{} not found (install containernetworking-plugins)",
                    f.display()
                ));
            }
        }
        Ok(())
    }

    /// Tear-down order ([`PtpTopology`]'s drop): ptp DEL for every pod, the IPAM store, then
    /// the namespaces.
    fn build(&self, prefix: &str) -> Result<PtpTopology, CniError> {
        PtpTopology::build(prefix, self.pods_per_host, self.cni_path)
    }
}
