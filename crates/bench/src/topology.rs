//! Topologies: where the client and the server live and how packets get between them. Each is
//! built in throwaway namespaces and cgroups named with the run's prefix (`nsfb-<pid>`), and
//! torn down when its [`Built`] is dropped.
//!
//! [`registry`] is the registration point: one [`TopologyDef`] per topology, in the order they
//! are run. A later part of nsfast adds its path (bpf host routing, netkit, slirp4netns,
//! vpnrelay) by filling in its entry's `probe` and `build`; `slirp4netns` and `vpnrelay` come
//! from [`crate::rootless_hook`].

use std::any::Any;
use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use nsfast_sys::cgroup::{Cgroup, CgroupError};
use nsfast_sys::net::{self, NetError};
use nsfast_sys::netns::{NetNs, NetnsError};

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

/// What a topology build needs to know about the run.
#[derive(Debug, Clone)]
pub struct BuildCtx {
    /// Prefix for every namespace and cgroup of this run, such as `nsfb-1234`.
    pub prefix: String,
    /// The run's cgroup directory (created by [`RunCgroup::create`]).
    pub cgroup_root: PathBuf,
    /// How to start helper workers (the vsock-relay topology's relay); `None`: such
    /// topologies cannot be built.
    pub launcher: Option<crate::proc::Launcher>,
}

/// A topology that can be built.
pub struct TopologyDef {
    pub name: &'static str,
    pub about: &'static str,
    /// `Err(reason)` when this machine or build cannot run it.
    pub probe: fn() -> Result<(), String>,
    pub build: fn(&BuildCtx) -> Result<Built, TopologyError>,
}

/// The registered topologies, in run order. `host` is the baseline and comes first.
pub fn registry() -> Vec<TopologyDef> {
    vec![
        TopologyDef {
            name: "host",
            about: "both ends in one namespace over loopback (the baseline)",
            probe: || Ok(()),
            build: build_host,
        },
        TopologyDef {
            name: "veth",
            about: "two namespaces on a veth pair",
            probe: || Ok(()),
            build: build_veth,
        },
        TopologyDef {
            name: "routed",
            about: "two pods routed through a host namespace (classic container networking)",
            probe: || Ok(()),
            build: build_routed,
        },
        TopologyDef {
            name: "sockmap",
            about: "veth + the sockmap shortcut (sockops + sk_msg) on the pods' cgroup",
            probe: crate::sockmap_hook::probe,
            build: build_sockmap,
        },
        TopologyDef {
            name: "bpf",
            about: "veth + BPF host routing (bpf_redirect_peer)",
            probe: || Ok(()),
            build: build_bpf,
        },
        TopologyDef {
            name: "bpf-remote",
            about: "veth + BPF host routing to a pod on another host over a veth wire (fib + redirect out, redirect_peer in)",
            probe: || Ok(()),
            build: build_bpf_remote,
        },
        TopologyDef {
            name: "bpf-tc",
            about: "bpf with the programs attached by classic tc (clsact + cls_bpf) instead of TCX",
            probe: || Ok(()),
            build: build_bpf_tc,
        },
        TopologyDef {
            name: "netkit",
            about: "netkit pairs (L3) with BPF host routing (nsfast pod --mode netkit)",
            probe: probe_netkit,
            build: build_netkit,
        },
        TopologyDef {
            name: "cni-ptp",
            about:
                "pods made by the reference CNI ptp plugin (host-local IPAM), routed by the host",
            probe: probe_cni_ptp,
            build: build_cni_ptp,
        },
        TopologyDef {
            name: "cni-ptp-remote",
            about: "reference ptp pods on two hosts joined by a veth wire, routed by both hosts' stacks",
            probe: probe_cni_ptp,
            build: build_cni_ptp_remote,
        },
        TopologyDef {
            name: "slirp4netns",
            about: "rootless Docker's path: client in a container namespace on a bridge inside RootlessKit + slirp4netns, server in a VPN server namespace",
            probe: crate::rootless_hook::probe_world,
            build: build_slirp4netns,
        },
        TopologyDef {
            name: "vpnrelay",
            about: "the slirp4netns world with nsfast's vpnrelay moving the client's UDP to host sockets",
            probe: crate::rootless_hook::probe_relay,
            build: build_vpnrelay,
        },
        TopologyDef {
            name: "vsock",
            about: "both ends in one namespace over vsock loopback (CID 1); VM guests only",
            probe: crate::vsock_hook::probe,
            build: crate::vsock_hook::build_direct,
        },
        TopologyDef {
            name: "vsock-relay",
            about: "vsock loopback through nsfast's vsock relay (vsock-listen -> vsock-connect:1); VM guests only",
            probe: crate::vsock_hook::probe,
            build: crate::vsock_hook::build_relay,
        },
        TopologyDef {
            name: "vsock-socat",
            about: "vsock loopback through socat VSOCK-LISTEN,fork -> VSOCK-CONNECT:1; VM guests only",
            probe: crate::vsock_hook::probe_socat,
            build: crate::vsock_hook::build_socat,
        },
    ]
}

/// Topologies run when none are named.
pub const DEFAULT: [&str; 4] = ["host", "veth", "routed", "sockmap"];

/// Looks a topology up by name; the error lists the valid names.
pub fn find(name: &str) -> Result<TopologyDef, crate::BenchError> {
    let all = registry();
    let valid = all.iter().map(|d| d.name).collect::<Vec<_>>().join(", ");
    all.into_iter()
        .find(|d| d.name == name)
        .ok_or_else(|| crate::BenchError::BadArg {
            flag: "--topologies",
            value: name.into(),
            valid,
        })
}

fn probe_netkit() -> Result<(), String> {
    let k = nsfast_sys::kernel::KernelVersion::current();
    match net::probe_netkit() {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!(
            "kernel {k} lacks netkit (CONFIG_NETKIT, 6.7 or later)"
        )),
        Err(e) => Err(format!("netkit probe failed: {e}")),
    }
}

/// Where the reference CNI plugins are (Debian's containernetworking-plugins).
pub const CNI_PATH: &str = "/usr/lib/cni";

fn probe_cni_ptp() -> Result<(), String> {
    for p in ["ptp", "host-local"] {
        let f = Path::new(CNI_PATH).join(p);
        if !f.exists() {
            return Err(format!(
                "{} not found (install containernetworking-plugins)",
                f.display()
            ));
        }
    }
    Ok(())
}

fn other(topology: &'static str, what: impl Into<String>) -> TopologyError {
    TopologyError::Other {
        topology,
        what: what.into(),
    }
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
    /// The fast path's counters, read around every sample ([`crate::evidence`]); `None`
    /// for topologies that claim no fast path.
    pub fast_path: Option<crate::evidence::FastPath>,
    /// Things to keep alive while the topology exists (dropped first).
    pub extras: Vec<Box<dyn Any>>,
    /// A note printed with the results (e.g. what was attached).
    pub note: Option<String>,
}

impl Built {
    /// Whether `w` can run here: everything on IP topologies, streams only on vsock ones.
    pub fn supports(&self, w: crate::spec::Workload) -> bool {
        self.vsock.is_none() || !w.is_udp()
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

/// Removes a cgroup directory, retrying briefly while exiting processes leave it.
pub fn remove_cgroup_retry(path: &Path) -> io::Result<()> {
    for _ in 0..50 {
        match fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            Err(e) => return Err(e),
        }
    }
    fs::remove_dir(path)
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

/// Removes a cgroup and its child cgroups, deepest first.
pub fn remove_cgroup_tree(path: &Path) -> io::Result<()> {
    if !path.exists() {
        return Ok(());
    }
    if let Ok(rd) = fs::read_dir(path) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_cgroup_tree(&e.path())?;
            }
        }
    }
    remove_cgroup_retry(path)
}

pub(crate) fn ns(topology: &'static str, name: String) -> Result<NetNs, TopologyError> {
    NetNs::create(&name).map_err(|source| TopologyError::Netns { topology, source })
}

fn nl<T>(topology: &'static str, r: Result<T, NetError>) -> Result<T, TopologyError> {
    r.map_err(|source| TopologyError::Net { topology, source })
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

/// Sysctls for the namespace a client runs in: crr opens tens of thousands of connections,
/// so let it reuse TIME_WAIT ports and use the whole ephemeral range (per-namespace settings).
fn client_sysctls(topology: &'static str, n: &NetNs) -> Result<(), TopologyError> {
    nl(
        topology,
        net::set_sysctl(Some(n), "net.ipv4.tcp_tw_reuse", "1"),
    )?;
    nl(
        topology,
        net::set_sysctl(Some(n), "net.ipv4.ip_local_port_range", "1024 65535"),
    )
}

fn build_host(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    const T: &str = "host";
    let (dir, client, server) = cgroups(ctx, T)?;
    let mut b = Built {
        name: T,
        namespaces: vec![],
        client: Endpoint {
            ns: 0,
            cgroup: client,
        },
        server: Endpoint {
            ns: 0,
            cgroup: server,
        },
        server_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        server_port: 0,
        cgroup_dir: dir,
        vsock: None,
        fast_path: None,
        extras: vec![],
        note: None,
    };
    b.namespaces.push(ns(T, format!("{}-host", ctx.prefix))?);
    client_sysctls(T, &b.namespaces[0])?;
    Ok(b)
}

/// Two namespaces joined by a veth pair `eth0`/`eth0` on 10.201.0.0/24.
fn build_veth_pair(ctx: &BuildCtx, t: &'static str) -> Result<Built, TopologyError> {
    let (dir, client, server) = cgroups(ctx, t)?;
    let mut b = Built {
        name: t,
        namespaces: vec![],
        client: Endpoint {
            ns: 0,
            cgroup: client,
        },
        server: Endpoint {
            ns: 1,
            cgroup: server,
        },
        server_ip: IpAddr::V4(Ipv4Addr::new(10, 201, 0, 2)),
        server_port: 0,
        cgroup_dir: dir,
        vsock: None,
        fast_path: None,
        extras: vec![],
        note: None,
    };
    b.namespaces.push(ns(t, format!("{}-{t}-c", ctx.prefix))?);
    b.namespaces.push(ns(t, format!("{}-{t}-s", ctx.prefix))?);
    let (c, s) = (&b.namespaces[0], &b.namespaces[1]);
    nl(t, net::create_veth(c, "nsfb-c", s, "nsfb-s"))?;
    nl(
        t,
        net::add_address(Some(c), "nsfb-c", ip(10, 201, 0, 1), 24),
    )?;
    nl(
        t,
        net::add_address(Some(s), "nsfb-s", ip(10, 201, 0, 2), 24),
    )?;
    client_sysctls(t, c)?;
    Ok(b)
}

fn build_veth(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    build_veth_pair(ctx, "veth")
}

fn build_sockmap(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    const T: &str = "sockmap";
    let mut b = build_veth_pair(ctx, T)?;
    // Both pods' cgroups sit under the topology's cgroup directory: attach there.
    let (guard, note) = crate::sockmap_hook::attach(&b.cgroup_dir).map_err(|e| other(T, e))?;
    b.extras.push(guard);
    b.note = Some(note);
    b.fast_path = Some(crate::evidence::FastPath::Sockmap);
    Ok(b)
}

/// Pod A (client) — host — pod B (server): 10.202.1.0/24 and 10.202.2.0/24, the host
/// namespace forwarding between them, pods routing by default via the host.
fn build_routed(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    const T: &str = "routed";
    let (dir, client, server) = cgroups(ctx, T)?;
    let mut b = Built {
        name: T,
        namespaces: vec![],
        client: Endpoint {
            ns: 0,
            cgroup: client,
        },
        server: Endpoint {
            ns: 1,
            cgroup: server,
        },
        server_ip: ip(10, 202, 2, 2),
        server_port: 0,
        cgroup_dir: dir,
        vsock: None,
        fast_path: None,
        extras: vec![],
        note: None,
    };
    b.namespaces
        .push(ns(T, format!("{}-routed-a", ctx.prefix))?);
    b.namespaces
        .push(ns(T, format!("{}-routed-b", ctx.prefix))?);
    b.namespaces
        .push(ns(T, format!("{}-routed-h", ctx.prefix))?);
    let (a, bb, h) = (&b.namespaces[0], &b.namespaces[1], &b.namespaces[2]);
    nl(T, net::create_veth(a, "eth0", h, "veth-a"))?;
    nl(T, net::create_veth(bb, "eth0", h, "veth-b"))?;
    nl(
        T,
        net::add_address(Some(h), "veth-a", ip(10, 202, 1, 1), 24),
    )?;
    nl(
        T,
        net::add_address(Some(h), "veth-b", ip(10, 202, 2, 1), 24),
    )?;
    nl(T, net::add_address(Some(a), "eth0", ip(10, 202, 1, 2), 24))?;
    nl(T, net::add_address(Some(bb), "eth0", ip(10, 202, 2, 2), 24))?;
    let any = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
    nl(
        T,
        net::add_route(Some(a), any, 0, Some(ip(10, 202, 1, 1)), Some("eth0")),
    )?;
    nl(
        T,
        net::add_route(Some(bb), any, 0, Some(ip(10, 202, 2, 1)), Some("eth0")),
    )?;
    nl(T, net::set_sysctl(Some(h), "net.ipv4.ip_forward", "1"))?;
    client_sysctls(T, a)?;
    Ok(b)
}

fn build_slirp4netns(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    build_rootless(ctx, "slirp4netns", false)
}

fn build_vpnrelay(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    build_rootless(ctx, "vpnrelay", true)
}

/// The vpnrelay test world (crate nsfast-vpnrelay's testbed): client in its "gluetun"
/// namespace inside the tenant's RootlessKit network, server in its VPN server namespace;
/// with `relay`, the relay runs as the tenant. The world (tenant processes, namespaces, the
/// relay and its rule) goes away with the topology's extras.
fn build_rootless(ctx: &BuildCtx, t: &'static str, relay: bool) -> Result<Built, TopologyError> {
    let (dir, client, server) = cgroups(ctx, t)?;
    let parts = crate::rootless_hook::build(relay).map_err(|e| other(t, e))?;
    let fast_path = relay.then_some(crate::evidence::FastPath::VpnRelay);
    Ok(Built {
        name: t,
        namespaces: vec![parts.client, parts.server],
        client: Endpoint {
            ns: 0,
            cgroup: client,
        },
        server: Endpoint {
            ns: 1,
            cgroup: server,
        },
        server_ip: IpAddr::V4(nsfast_vpnrelay::testbed::SERVER_IP),
        server_port: crate::rootless_hook::PORT,
        cgroup_dir: dir,
        vsock: None,
        fast_path,
        extras: parts.guards,
        note: Some(parts.note),
    })
}

/// Client pod 0 and server pod 1 of host A of a two-pod topology whose pods live in
/// namespaces opened (not owned) by name: the topology value itself, kept in `extras`,
/// deletes them.
fn two_pods(
    ctx: &BuildCtx,
    t: &'static str,
    pods: [&str; 2],
    server_ip: Ipv4Addr,
    keep: Box<dyn Any>,
    note: String,
) -> Result<Built, TopologyError> {
    let (dir, client, server) = cgroups(ctx, t)?;
    let mut b = Built {
        name: t,
        namespaces: vec![],
        client: Endpoint {
            ns: 0,
            cgroup: client,
        },
        server: Endpoint {
            ns: 1,
            cgroup: server,
        },
        server_ip: IpAddr::V4(server_ip),
        server_port: 0,
        cgroup_dir: dir,
        vsock: None,
        fast_path: None,
        extras: vec![keep],
        note: Some(note),
    };
    for p in pods {
        let n = NetNs::open(p).map_err(|source| TopologyError::Netns {
            topology: t,
            source,
        })?;
        b.namespaces.push(n);
    }
    client_sysctls(t, &b.namespaces[0])?;
    Ok(b)
}

/// Pods per host and the server's (host, pod index) for the two-pod topologies: the client is
/// always pod 0 of host A; the server is pod 1 of host A, or with `remote` pod 0 of host B.
fn server_pod(remote: bool) -> (usize, (usize, usize)) {
    if remote {
        (1, (1, 0))
    } else {
        (2, (0, 1))
    }
}

/// Two pods (nsfast_pod::topology) in `mode`: pod a0 is the client; the server is pod a1 on
/// the same host, or with `remote` pod b0 on host B across the wire.
fn build_pods(
    ctx: &BuildCtx,
    t: &'static str,
    mode: nsfast_pod::ModeRequest,
    attach: nsfast_pod::AttachRequest,
    remote: bool,
) -> Result<Built, TopologyError> {
    let prefix = format!("{}-{t}", ctx.prefix);
    let (per_host, (h, i)) = server_pod(remote);
    let topo = nsfast_pod::topology::Topology::build_with(&prefix, mode, attach, per_host)
        .map_err(|e| other(t, e.to_string()))?;
    let (a0, srv) = (topo.pod(0, 0).clone(), topo.pod(h, i).clone());
    let note = format!(
        "pods {} -> {} (host {} -> {}): {:?}, attached by {}",
        a0.record.name,
        srv.record.name,
        topo.host_name(0),
        topo.host_name(h),
        a0.record.datapath,
        a0.record.attach.as_str()
    );
    let hosts: Vec<(&'static str, String)> = (0..=h)
        .map(|x| (["A", "B"][x], topo.host_name(x).to_string()))
        .collect();
    let mut b = two_pods(
        ctx,
        t,
        [&a0.record.netns, &srv.record.netns],
        srv.ip(),
        Box::new(topo),
        note,
    )?;
    // The redirect this topology is about: pod to pod on host A, or out of A and into B.
    let required = if remote {
        vec![
            (0, vec!["fib_redirect", "fib_redirect_neigh"]),
            (1, vec!["wire_to_pod"]),
        ]
    } else {
        vec![(0, vec!["pod_to_pod"])]
    };
    b.fast_path = Some(crate::evidence::FastPath::Pod { hosts, required });
    Ok(b)
}

/// veth + TCX BPF host routing: pod → pod by bpf_redirect_peer (`nsfast pod --mode veth`).
fn build_bpf(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    build_pods(
        ctx,
        "bpf",
        nsfast_pod::ModeRequest::Veth,
        nsfast_pod::AttachRequest::Auto,
        false,
    )
}

/// `bpf` with classic tc attachments (what kernels without TCX, e.g. 6.1, get), to compare
/// the two attach methods on one kernel.
fn build_bpf_tc(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    build_pods(
        ctx,
        "bpf-tc",
        nsfast_pod::ModeRequest::Veth,
        nsfast_pod::AttachRequest::Tc,
        false,
    )
}

/// veth + BPF host routing, pod → pod on another host: fib lookup + redirect out of host A,
/// TCX on host B's wire device + bpf_redirect_peer in.
fn build_bpf_remote(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    build_pods(
        ctx,
        "bpf-remote",
        nsfast_pod::ModeRequest::Veth,
        nsfast_pod::AttachRequest::Auto,
        true,
    )
}

/// netkit L3 pairs with the pod programs (`nsfast pod --mode netkit`).
fn build_netkit(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    build_pods(
        ctx,
        "netkit",
        nsfast_pod::ModeRequest::Netkit,
        nsfast_pod::AttachRequest::Auto,
        false,
    )
}

/// Two pods made by the reference ptp plugin on one host, routed by its IP stack.
fn build_cni_ptp(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    cni_ptp_pods(ctx, "cni-ptp", false)
}

/// ptp pods on two hosts across the wire, routed by both hosts' stacks.
fn build_cni_ptp_remote(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    cni_ptp_pods(ctx, "cni-ptp-remote", true)
}

/// Pods made by the reference ptp plugin: client pod a0, server pod a1 (same host) or, with
/// `remote`, pod b0 on host B.
fn cni_ptp_pods(ctx: &BuildCtx, t: &'static str, remote: bool) -> Result<Built, TopologyError> {
    let prefix = format!("{}-{}", ctx.prefix, if remote { "ptpr" } else { "ptp" });
    let (per_host, (h, i)) = server_pod(remote);
    let topo = nsfast_cni::reference::PtpTopology::build(&prefix, per_host, CNI_PATH)
        .map_err(|e| other(t, format!("{e} ({})", e.details)))?;
    let (a0, srv) = (topo.pod(0, 0), topo.pod(h, i));
    let names = [a0.netns.name().to_string(), srv.netns.name().to_string()];
    let server_ip = srv.ip;
    let note = format!("ptp pods {} -> {} ({server_ip})", names[0], names[1]);
    two_pods(
        ctx,
        t,
        [&names[0], &names[1]],
        server_ip,
        Box::new(topo),
        note,
    )
}

fn ip(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

/// Namespaces and cgroups left by earlier runs whose process is gone (`nsfb-<pid>-...`).
pub fn stale_leftovers() -> (Vec<String>, Vec<PathBuf>) {
    let dead = |name: &str| -> bool {
        let Some(rest) = name.strip_prefix("nsfb-") else {
            return false;
        };
        let pid = rest.split('-').next().unwrap_or("");
        match pid.parse::<u32>() {
            Ok(p) => !Path::new(&format!("/proc/{p}")).exists(),
            Err(_) => false,
        }
    };
    let ns: Vec<String> = nsfast_sys::netns::list_named()
        .into_iter()
        .filter(|n| dead(n))
        .collect();
    let cgs = nsfast_sys::cgroup::cgroup2_mount()
        .ok()
        .and_then(|m| fs::read_dir(m).ok())
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_str().is_some_and(dead))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    (ns, cgs)
}

/// Removes what [`stale_leftovers`] finds, and the `nsfast pod` state of killed runs' pod
/// topologies (`bpf`, `netkit`): pods of a stale host namespace are deleted through
/// `nsfast pod` (their tc filters, pins and records with them) before the namespaces go, and
/// pod state whose host namespace is already gone is removed after. Returns what was removed.
pub fn cleanup_stale() -> Vec<String> {
    let mut done = Vec::new();
    let (ns, _) = stale_leftovers();
    for n in &ns {
        let Ok(host) = nsfast_pod::Host::open(Some(n)) else {
            continue;
        };
        if !host.state_dir().exists() && !host.pin_dir().exists() {
            continue;
        }
        drop(host);
        match nsfast_pod::pod::del_all(Some(n)) {
            Ok(pods) => done.push(format!(
                "nsfast pod state of host namespace {n} ({} pod(s))",
                pods.len()
            )),
            Err(e) => tracing::warn!("pods of stale host namespace {n}: {e}"),
        }
    }
    // Pod namespaces went with their pods: list again.
    let (ns, cgs) = stale_leftovers();
    for n in ns {
        match nsfast_sys::netns::delete_named(&n) {
            Ok(()) => done.push(format!("network namespace {n}")),
            Err(e) => tracing::warn!("{e}"),
        }
    }
    for c in cgs {
        match remove_cgroup_tree(&c) {
            Ok(()) => done.push(format!("cgroup {}", c.display())),
            Err(e) => tracing::warn!("remove cgroup {}: {e}", c.display()),
        }
    }
    match nsfast_pod::pod::remove_orphaned_state() {
        Ok(dirs) => done.extend(
            dirs.iter()
                .map(|d| format!("nsfast pod state of a deleted namespace: {}", d.display())),
        ),
        Err(e) => tracing::warn!("orphaned pod state: {e}"),
    }
    // The slirp4netns / vpnrelay topologies build vpnrelay's test world (nsfv<pid>x<n>-*):
    // its tenant processes, namespaces and runtime folder.
    done.extend(nsfast_vpnrelay::testbed::cleanup_stale());
    done
}
