//! A reusable pod topology for tests and `nsfast bench`: two "hosts" (network namespaces)
//! joined by a veth "wire", each with pods made by [`nsfast_pod::add()`]. Dropping it deletes
//! the pods (and with them their pins and state), then the hosts.
//!
//! ```text
//!   pod a0 10.251.1.10/24 ─┐                          ┌─ pod b0 10.251.2.10/24
//!   pod a1 10.251.1.11/24 ─┤ host A        wire       ├─ pod b1 10.251.2.11/24
//!                          └ wire0 10.250.0.1 ═══ 10.250.0.2 wire0 ┘ host B
//!   host A: 10.251.2.0/24 via 10.250.0.2     host B: 10.251.1.0/24 via 10.250.0.1
//! ```

use std::net::{IpAddr, Ipv4Addr};

use nsfast_sys::net::NetError;
use nsfast_sys::netns::NetNs;

use nsfast_pod::pod::{self, AddOptions, PodIp};
pub use nsfast_pod::pod::{AttachRequest, ModeRequest};
use nsfast_pod::PodError;
use nsfast_pod::PodRecord;

/// Uplink device name on both hosts.
pub const WIRE_IF: &str = "wire0";

/// Host `h`'s (0 = A, 1 = B) wire address.
pub fn host_ip(h: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 250, 0, 1 + h as u8)
}

/// Pod `i` of host `h`.
pub fn pod_ip(h: usize, i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 251, 1 + h as u8, 10 + i as u8)
}

/// Host namespaces `<prefix>-ha` / `<prefix>-hb` joined by the [`WIRE_IF`] wire (addresses
/// [`host_ip`]), each routing the other's pod subnet (10.251.<1 + h>.0/24) over it: the layout
/// this topology and [`crate::ptp`] share. One netlink handle per host.
pub fn two_hosts(prefix: &str) -> Result<[NetNs; 2], NetError> {
    let hosts = [
        NetNs::create(&format!("{prefix}-ha"))?,
        NetNs::create(&format!("{prefix}-hb"))?,
    ];
    let nl = [hosts[0].netlink()?, hosts[1].netlink()?];
    nl[0].create_veth_into(WIRE_IF, "wiretmp0", &nl[1], WIRE_IF)?;
    for (h, n) in nl.iter().enumerate() {
        n.add_address(WIRE_IF, IpAddr::V4(host_ip(h)), 24)?;
        let other = 1 - h;
        n.add_route(
            IpAddr::V4(Ipv4Addr::new(10, 251, 1 + other as u8, 0)),
            24,
            Some(IpAddr::V4(host_ip(other))),
            None,
        )?;
    }
    Ok(hosts)
}

/// The topology. Fields are public so benches can start processes in the namespaces.
#[derive(Debug)]
pub struct Topology {
    /// Host namespaces A and B.
    pub hosts: [NetNs; 2],
    /// Pods, host A's first.
    pub pods: Vec<TopoPod>,
}

/// One pod of the topology.
#[derive(Debug, Clone)]
pub struct TopoPod {
    pub host: usize,
    pub record: PodRecord,
}

impl TopoPod {
    pub fn ip(&self) -> Ipv4Addr {
        self.record.ip
    }
    /// Opens the pod's namespace.
    pub fn netns(&self) -> Result<NetNs, PodError> {
        Ok(NetNs::open(&self.record.netns)?)
    }
}

impl Topology {
    /// Builds hosts `<prefix>-ha` / `<prefix>-hb` and `pods_per_host` pods on each
    /// (`<prefix>-a0`, …), in `mode`. `prefix`: 1-30 of [a-z0-9-], unique per run.
    pub fn build(prefix: &str, mode: ModeRequest, pods_per_host: usize) -> Result<Self, PodError> {
        Self::build_with(prefix, mode, AttachRequest::Auto, pods_per_host)
    }

    /// [`Topology::build`] with the attach method of the veth and uplink programs chosen.
    pub fn build_with(
        prefix: &str,
        mode: ModeRequest,
        attach: AttachRequest,
        pods_per_host: usize,
    ) -> Result<Self, PodError> {
        let mut t = Topology {
            hosts: two_hosts(prefix)?,
            pods: Vec::new(),
        };
        for h in 0..2 {
            for i in 0..pods_per_host {
                let name = format!("{prefix}-{}{i}", ["a", "b"][h]);
                let mut o = AddOptions::new(
                    &name,
                    PodIp {
                        ip: pod_ip(h, i),
                        prefix: 24,
                    },
                );
                o.mode = mode;
                o.attach = attach;
                o.host = Some(t.hosts[h].name().to_string());
                o.uplinks = vec![WIRE_IF.into()];
                let added = pod::add(&o)?;
                t.pods.push(TopoPod {
                    host: h,
                    record: added.record,
                });
            }
        }
        Ok(t)
    }

    /// Host `h`'s namespace name (for `--host`).
    pub fn host_name(&self, h: usize) -> &str {
        self.hosts[h].name()
    }

    /// Pod `i` of host `h`.
    pub fn pod(&self, h: usize, i: usize) -> &TopoPod {
        self.pods
            .iter()
            .filter(|p| p.host == h)
            .nth(i)
            .expect("pod index")
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for p in self.pods.drain(..).rev() {
            let host = self.hosts[p.host].name().to_string();
            if let Err(e) = pod::del(&p.record.name, Some(&host)) {
                tracing::warn!("topology cleanup: pod {}: {e}", p.record.name);
            }
        }
        // Host namespaces (and the wire) go when `hosts` drops.
    }
}

/// The two-host pod world as a [`crate::topology::Topology`]: `pods_per_host` pods per host in
/// `mode`, attached by `attach`; built under the name prefix given as the context.
#[derive(Debug, Clone, Copy)]
pub struct PodsSpec {
    pub mode: ModeRequest,
    pub attach: AttachRequest,
    pub pods_per_host: usize,
}

impl crate::topology::Topology for PodsSpec {
    type Ctx = str;
    type Guard = Topology;
    type Error = PodError;

    fn name(&self) -> &str {
        "pods"
    }

    /// Tear-down order ([`Topology`]'s drop): pods in reverse order of creation (through
    /// `nsfast pod del`, which removes their filters, pins and records), then the host
    /// namespaces with the wire.
    fn build(&self, prefix: &str) -> Result<Topology, PodError> {
        Topology::build_with(prefix, self.mode, self.attach, self.pods_per_host)
    }
}
