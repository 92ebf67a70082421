//! What a topology build needs ([`BuildCtx`]) and makes ([`Built`]), and the helpers every
//! builder uses: the leaf the registry ([`crate::topology`]) and its adapters
//! (`sockmap_hook`, `rootless_hook`, `vsock_hook`) share, so no adapter imports the registry.

use std::any::Any;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use nsfast_sys::cgroup::{Cgroup, CgroupError};
use nsfast_sys::net::NetError;
use nsfast_sys::netns::{NetNs, NetnsError};

use nsfast_lab::cleanup::{remove_cgroup_retry, remove_cgroup_tree};
pub use nsfast_lab::tenant::Tenant;

/// Errors while building a topology; each names the topology.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("topology {topology}: {source}")]
    Netns {
        topology: &'static str,
        #[source]
        source: NetnsError,
    },
    #[error("topology {topology}: {source}")]
    Net {
        topology: &'static str,
        #[source]
        source: NetError,
    },
    #[error("topology {topology}: {source}")]
    Cgroup {
        topology: &'static str,
        #[source]
        source: CgroupError,
    },
    #[error("topology {topology}: {what}")]
    Other {
        topology: &'static str,
        what: String,
    },
}

/// What a topology's probe may depend on besides the machine: the run's options.
#[derive(Debug, Clone, Default)]
pub struct ProbeCtx {
    /// The existing user the rootless topologies run as (`--tenant`); without one they are
    /// skipped, as nsfast bench never creates users.
    pub tenant: Option<Tenant>,
}

/// What a topology build needs to know about the run.
#[derive(Debug, Clone)]
pub struct BuildCtx {
    /// Prefix for every namespace and cgroup of this run, such as `nsfb1234` (`nsfast_lab::name::run_prefix`).
    pub prefix: String,
    /// The run's cgroup directory (created by [`RunCgroup::create`]).
    pub cgroup_root: PathBuf,
    /// How to start helper workers (the vsock-relay topology's relay); `None`: such
    /// topologies cannot be built.
    pub launcher: Option<crate::proc::Launcher>,
    /// The rootless topologies' tenant (`--tenant`, see [`ProbeCtx::tenant`]).
    pub tenant: Option<Tenant>,
}

/// One side of a built topology.
#[derive(Debug)]
pub struct Endpoint {
    /// Index into [`Built::namespaces`].
    pub ns: usize,
    pub cgroup: Cgroup,
}

/// Where a vsock topology's server listens and its client connects (over CID 1, the local
/// loopback): the same port directly, or a relay's port in front of the server's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VsockPath {
    pub server_port: u32,
    pub client_port: u32,
    /// The process in between (relay or socat), if any: before each measurement the runner
    /// gives it the server's CPU placement (its new per-connection threads and children
    /// inherit it).
    pub helper_pid: Option<u32>,
}

/// The transport of a floor topology ([`crate::floor`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Floor {
    Pipe,
    Unix,
}

/// A built topology. Dropping it tears it down: extras (e.g. BPF attachments) first, then
/// cgroups, then namespaces (which takes their links with them).
pub struct Built {
    pub name: &'static str,
    pub namespaces: Vec<NetNs>,
    pub client: Endpoint,
    pub server: Endpoint,
    /// The address the server listens on and the client connects to.
    pub server_ip: IpAddr,
    /// The port the server listens on (0: any free port).
    pub server_port: u16,
    /// The topology's cgroup directory (parent of the client and server cgroups).
    pub cgroup_dir: PathBuf,
    /// vsock topologies: the ports the server listens on and the client connects to (CID 1);
    /// `server_ip`/`server_port` are then unused.
    pub vsock: Option<VsockPath>,
    /// The floors (`pipe`, `unix`): no IP at all; `server_ip`/`server_port` are then unused.
    pub floor: Option<Floor>,
    /// The fast path's counters, read around every sample ([`crate::evidence`]); `None`
    /// for topologies that claim no fast path.
    pub fast_path: Option<crate::evidence::FastPath>,
    /// Things to keep alive while the topology exists (dropped first).
    pub extras: Vec<Box<dyn Any>>,
    /// A note printed with the results (e.g. what was attached).
    pub note: Option<String>,
}

impl Built {
    /// Whether `w` can run here: everything on IP topologies, streams only on vsock ones and
    /// the floors, and one connection only on a pipe (no `crr`).
    pub fn supports(&self, w: crate::spec::Workload) -> bool {
        match self.floor {
            Some(Floor::Pipe) => !w.is_udp() && w != crate::spec::Workload::Crr,
            Some(Floor::Unix) => !w.is_udp(),
            None => self.vsock.is_none() || !w.is_udp(),
        }
    }

    pub fn client_ns(&self) -> &NetNs {
        &self.namespaces[self.client.ns]
    }

    pub fn server_ns(&self) -> &NetNs {
        &self.namespaces[self.server.ns]
    }
}

impl Drop for Built {
    fn drop(&mut self) {
        self.extras.clear();
        for cg in [&self.client.cgroup, &self.server.cgroup] {
            if let Err(e) = remove_cgroup_retry(cg.path()) {
                tracing::warn!("cleanup of cgroup {}: {e}", cg.path().display());
            }
        }
        if let Err(e) = remove_cgroup_retry(&self.cgroup_dir) {
            tracing::warn!("cleanup of cgroup {}: {e}", self.cgroup_dir.display());
        }
        // NetNs handles delete their namespaces when dropped.
        self.namespaces.clear();
    }
}

/// The run's cgroup directory `<cgroup2>/<prefix>`; removed (with any children) on drop.
#[derive(Debug)]
pub struct RunCgroup {
    path: PathBuf,
}

impl RunCgroup {
    pub fn create(prefix: &str) -> Result<Self, CgroupError> {
        let cg = Cgroup::create_under_root(prefix)?;
        Ok(Self {
            path: cg.path().to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        if let Err(e) = remove_cgroup_tree(&self.path) {
            tracing::warn!("cleanup of cgroup {}: {e}", self.path.display());
        }
    }
}

pub(crate) fn ns(topology: &'static str, name: String) -> Result<NetNs, TopologyError> {
    NetNs::create(&name).map_err(|source| TopologyError::Netns { topology, source })
}

pub(crate) fn cgroups(
    ctx: &BuildCtx,
    topology: &'static str,
) -> Result<(PathBuf, Cgroup, Cgroup), TopologyError> {
    let cg = |source| TopologyError::Cgroup { topology, source };
    let dir = Cgroup::create(ctx.cgroup_root.join(topology)).map_err(cg)?;
    let client = Cgroup::create(dir.path().join("client")).map_err(cg)?;
    let server = Cgroup::create(dir.path().join("server")).map_err(cg)?;
    Ok((dir.path().to_path_buf(), client, server))
}

pub(crate) fn other(topology: &'static str, what: impl Into<String>) -> TopologyError {
    TopologyError::Other {
        topology,
        what: what.into(),
    }
}
