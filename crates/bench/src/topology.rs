//! Topologies: where the client and the server live and how packets get between them. Each is
//! built in throwaway namespaces and cgroups named with the run's prefix (`nsfb<pid>`,
//! `nsfast_lab::name`), through crate nsfast-lab's worlds, and torn down when its [`Built`] is
//! dropped.
//!
//! [`registry`] is the registration point: one [`TopologyDef`] per topology, in the order they
//! are run; each implements [`nsfast_lab::topology::Topology`]. Adapters (`sockmap_hook`,
//! `rootless_hook`, `vsock_hook`) provide probe and build functions and import only the shared
//! types of [`crate::built`], never this module.

use std::any::Any;
use std::net::{IpAddr, Ipv4Addr};

use nsfast_lab::pods::{AttachRequest, ModeRequest};
use nsfast_lab::topology::Topology;
use nsfast_sys::net::{self, NetError};
use nsfast_sys::netns::NetNs;

use crate::built::{cgroups, ns, other};
pub use crate::built::{
    BuildCtx, Built, Endpoint, Floor, ProbeCtx, RunCgroup, Tenant, TopologyError, VsockPath,
};

/// A topology that can be built.
pub struct TopologyDef {
    pub name: &'static str,
    pub about: &'static str,
    /// `Err(reason)` when this machine, build or the run's options cannot run it.
    pub probe: fn(&ProbeCtx) -> Result<(), String>,
    pub build: fn(&BuildCtx) -> Result<Built, TopologyError>,
}

impl Topology for TopologyDef {
    type Ctx = BuildCtx;
    type Guard = Built;
    type Error = TopologyError;

    fn name(&self) -> &str {
        self.name
    }

    /// The probe without run options ([`ProbeCtx::default`]: no tenant).
    fn probe(&self) -> Result<(), String> {
        (self.probe)(&ProbeCtx::default())
    }

    /// Tear-down order ([`Built`]'s drop): extras (attachments, worlds, relays) first, then
    /// the cgroups, then the namespaces.
    fn build(&self, ctx: &BuildCtx) -> Result<Built, TopologyError> {
        (self.build)(ctx)
    }
}

/// The registered topologies, in run order. `host` is the baseline and comes first.
pub fn registry() -> Vec<TopologyDef> {
    vec![
        TopologyDef {
            name: "host",
            about: "both ends in one namespace over loopback (the baseline)",
            probe: |_| Ok(()),
            build: build_host,
        },
        TopologyDef {
            name: "veth",
            about: "two namespaces on a veth pair",
            probe: |_| Ok(()),
            build: build_veth,
        },
        TopologyDef {
            name: "routed",
            about: "two pods routed through a host namespace (classic container networking)",
            probe: |_| Ok(()),
            build: build_routed,
        },
        TopologyDef {
            name: "sockmap",
            about: "veth + the sockmap shortcut (sockops + sk_msg) on the pods' cgroup",
            probe: |_| crate::sockmap_hook::probe(),
            build: build_sockmap,
        },
        TopologyDef {
            name: "bpf",
            about: "veth + BPF host routing (bpf_redirect_peer)",
            probe: |_| Ok(()),
            build: build_bpf,
        },
        TopologyDef {
            name: "bpf-shortcut",
            about: "bpf + the pod shortcut (nsfast pod shortcut: sockmap between the host's pods)",
            probe: |_| crate::sockmap_hook::probe(),
            build: build_bpf_shortcut,
        },
        TopologyDef {
            name: "bpf-remote",
            about: "veth + BPF host routing to a pod on another host over a veth wire (fib + redirect out, redirect_peer in)",
            probe: |_| Ok(()),
            build: build_bpf_remote,
        },
        TopologyDef {
            name: "bpf-policy-10",
            about: "bpf with both pods isolated by NetworkPolicy: 10 ingress rules, one of which allows the pair",
            probe: |_| Ok(()),
            build: |ctx| build_bpf_policy(ctx, "bpf-policy-10", 10),
        },
        TopologyDef {
            name: "bpf-policy-1000",
            about: "bpf-policy-10 with 1,000 ingress rules",
            probe: |_| Ok(()),
            build: |ctx| build_bpf_policy(ctx, "bpf-policy-1000", 1000),
        },
        TopologyDef {
            name: "bpf-tc",
            about: "bpf with the programs attached by classic tc (clsact + cls_bpf) instead of TCX",
            probe: |_| Ok(()),
            build: build_bpf_tc,
        },
        TopologyDef {
            name: "netkit",
            about: "netkit pairs (L3) with BPF host routing (nsfast pod --mode netkit)",
            probe: |_| probe_netkit(),
            build: build_netkit,
        },
        TopologyDef {
            name: "cni-ptp",
            about:
                "pods made by the reference CNI ptp plugin (host-local IPAM), routed by the host",
            probe: |_| probe_cni_ptp(),
            build: build_cni_ptp,
        },
        TopologyDef {
            name: "cni-ptp-remote",
            about: "reference ptp pods on two hosts joined by a veth wire, routed by both hosts' stacks",
            probe: |_| probe_cni_ptp(),
            build: build_cni_ptp_remote,
        },
        TopologyDef {
            name: "slirp4netns",
            about: "rootless Docker's path: client in a container namespace on a bridge inside RootlessKit + slirp4netns, server in a VPN server namespace",
            probe: crate::rootless_hook::probe_world,
            build: build_slirp4netns,
        },
        TopologyDef {
            name: "pasta",
            about: "the slirp4netns world with pasta instead (RootlessKit >= 2 --net=pasta, Debian unstable's packages from scripts/fetch-rootlesskit2.sh and scripts/fetch-pasta.sh)",
            probe: crate::rootless_hook::probe_pasta,
            build: build_pasta,
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
            probe: |_| crate::vsock_hook::probe(),
            build: crate::vsock_hook::build_direct,
        },
        TopologyDef {
            name: "vsock-relay",
            about: "vsock loopback through nsfast's vsock relay (vsock-listen -> vsock-connect:1); VM guests only",
            probe: |_| crate::vsock_hook::probe(),
            build: crate::vsock_hook::build_relay,
        },
        TopologyDef {
            name: "vsock-relay-kernel",
            about: "vsock loopback through nsfast's vsock relay --path kernel (BPF sockmap redirect between the legs); VM guests only, experimental (NSFAST_BENCH_EXPERIMENTAL=1)",
            probe: |_| crate::vsock_hook::probe_relay_kernel(),
            build: crate::vsock_hook::build_relay_kernel,
        },
        TopologyDef {
            name: "vsock-socat",
            about: "vsock loopback through socat VSOCK-LISTEN,fork -> VSOCK-CONNECT:1; VM guests only",
            probe: |_| crate::vsock_hook::probe_socat(),
            build: crate::vsock_hook::build_socat,
        },
        TopologyDef {
            name: "pipe",
            about: "the floor: two FIFOs between the two processes (no sockets; no crr, no udp-stream)",
            probe: |_| Ok(()),
            build: |ctx| build_floor(ctx, "pipe", Floor::Pipe),
        },
        TopologyDef {
            name: "unix",
            about: "the floor for sockets: an AF_UNIX stream socket (no TCP/IP; no udp-stream)",
            probe: |_| Ok(()),
            build: |ctx| build_floor(ctx, "unix", Floor::Unix),
        },
    ]
}

/// Topologies run when none are named.
pub const DEFAULT: [&str; 6] = ["host", "pipe", "unix", "veth", "routed", "sockmap"];

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

fn ptp_spec(pods_per_host: usize) -> nsfast_lab::ptp::PtpSpec<'static> {
    nsfast_lab::ptp::PtpSpec {
        pods_per_host,
        cni_path: CNI_PATH,
    }
}

fn probe_cni_ptp() -> Result<(), String> {
    ptp_spec(1).probe()
}

pub use nsfast_lab::cleanup::{remove_cgroup_retry, remove_cgroup_tree};

fn nl<T>(topology: &'static str, r: Result<T, NetError>) -> Result<T, TopologyError> {
    r.map_err(|source| TopologyError::Net { topology, source })
}

/// Sysctls for the namespace a client runs in (per-namespace settings). crr opens tens of
/// thousands of connections a second and the client closes first, so each one would leave a
/// TIME_WAIT socket holding its 4-tuple. `tcp_tw_reuse` frees a port only a second after its
/// last use, which caps crr at the ephemeral range per ~2 s (~32,000 tx/s for every topology
/// alike) and makes connect(2) search the range (a third of the connect cost at the cap). With
/// no TIME_WAIT buckets the close goes straight to CLOSED: the same packets on the wire, the
/// port free at once, and crr measures the path again.
fn client_sysctls(topology: &'static str, n: &NetNs) -> Result<(), TopologyError> {
    for (key, value) in [
        ("net.ipv4.tcp_tw_reuse", "1"),
        ("net.ipv4.ip_local_port_range", "1024 65535"),
        ("net.ipv4.tcp_max_tw_buckets", "0"),
    ] {
        nl(topology, net::set_sysctl(Some(n), key, value))?;
    }
    Ok(())
}

fn build_host(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    let b = one_namespace(ctx, "host", None)?;
    client_sysctls(b.name, &b.namespaces[0])?;
    Ok(b)
}

/// Both ends in one namespace, joined by a floor transport ([`crate::floor`]).
fn build_floor(ctx: &BuildCtx, t: &'static str, floor: Floor) -> Result<Built, TopologyError> {
    one_namespace(ctx, t, Some(floor))
}

/// Both ends in one namespace `<prefix>-<t>`: over loopback (`host`), or a floor transport.
fn one_namespace(
    ctx: &BuildCtx,
    t: &'static str,
    floor: Option<Floor>,
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
            ns: 0,
            cgroup: server,
        },
        server_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        server_port: 0,
        cgroup_dir: dir,
        vsock: None,
        floor,
        fast_path: None,
        extras: vec![],
        note: None,
    };
    b.namespaces.push(ns(t, format!("{}-{t}", ctx.prefix))?);
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
        floor: None,
        fast_path: None,
        extras: vec![],
        note: None,
    };
    b.namespaces.push(ns(t, format!("{}-{t}-c", ctx.prefix))?);
    b.namespaces.push(ns(t, format!("{}-{t}-s", ctx.prefix))?);
    let (c, s) = (&b.namespaces[0], &b.namespaces[1]);
    let link = |c: &NetNs, s: &NetNs| -> Result<(), NetError> {
        let (nc, ns) = (c.netlink()?, s.netlink()?);
        nc.create_veth("nsfb-c", &ns, "nsfb-s")?;
        nc.add_address("nsfb-c", ip(10, 201, 0, 1), 24)?;
        ns.add_address("nsfb-s", ip(10, 201, 0, 2), 24)
    };
    nl(t, link(c, s))?;
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
        floor: None,
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
    let link = || -> Result<(), NetError> {
        let (na, nb, nh) = (a.netlink()?, bb.netlink()?, h.netlink()?);
        na.create_veth("eth0", &nh, "veth-a")?;
        nb.create_veth("eth0", &nh, "veth-b")?;
        nh.add_address("veth-a", ip(10, 202, 1, 1), 24)?;
        nh.add_address("veth-b", ip(10, 202, 2, 1), 24)?;
        na.add_address("eth0", ip(10, 202, 1, 2), 24)?;
        nb.add_address("eth0", ip(10, 202, 2, 2), 24)?;
        let any = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        na.add_route(any, 0, Some(ip(10, 202, 1, 1)), Some("eth0"))?;
        nb.add_route(any, 0, Some(ip(10, 202, 2, 1)), Some("eth0"))
    };
    nl(T, link())?;
    nl(T, net::set_sysctl(Some(h), "net.ipv4.ip_forward", "1"))?;
    client_sysctls(T, a)?;
    Ok(b)
}

fn build_slirp4netns(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    build_rootless(ctx, "slirp4netns", crate::rootless_hook::Path::Slirp4netns)
}

fn build_pasta(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    build_rootless(ctx, "pasta", crate::rootless_hook::Path::Pasta)
}

fn build_vpnrelay(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    build_rootless(ctx, "vpnrelay", crate::rootless_hook::Path::VpnRelay)
}

/// The vpnrelay test world (`nsfast_lab::rootless`): client in its "gluetun"
/// namespace inside the tenant's RootlessKit network (slirp4netns or pasta), server in its
/// VPN server namespace; for vpnrelay, the relay runs as the tenant. The world (tenant
/// processes, namespaces, the relay and its rule) goes away with the topology's extras.
fn build_rootless(
    ctx: &BuildCtx,
    t: &'static str,
    path: crate::rootless_hook::Path,
) -> Result<Built, TopologyError> {
    let (dir, client, server) = cgroups(ctx, t)?;
    let tenant = ctx
        .tenant
        .as_ref()
        .ok_or_else(|| other(t, crate::rootless_hook::NO_TENANT))?;
    let parts = crate::rootless_hook::build(path, tenant).map_err(|e| other(t, e))?;
    let fast_path = (path == crate::rootless_hook::Path::VpnRelay)
        .then_some(crate::evidence::FastPath::VpnRelay);
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
        server_ip: IpAddr::V4(nsfast_lab::rootless::SERVER_IP),
        server_port: crate::rootless_hook::PORT,
        cgroup_dir: dir,
        vsock: None,
        floor: None,
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
        floor: None,
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

/// Two pods (nsfast_lab::pods) in `mode`: pod a0 is the client; the server is pod a1 on
/// the same host, or with `remote` pod b0 on host B across the wire.
fn build_pods(
    ctx: &BuildCtx,
    t: &'static str,
    mode: ModeRequest,
    attach: AttachRequest,
    remote: bool,
) -> Result<Built, TopologyError> {
    let prefix = format!("{}-{t}", ctx.prefix);
    let (per_host, (h, i)) = server_pod(remote);
    let spec = nsfast_lab::pods::PodsSpec {
        mode,
        attach,
        pods_per_host: per_host,
    };
    let topo = spec.build(&prefix).map_err(|e| other(t, e.to_string()))?;
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
    build_pods(ctx, "bpf", ModeRequest::Veth, AttachRequest::Auto, false)
}

/// `bpf` with the pod shortcut enabled on host A (attached to the topology's cgroup): pod
/// ↔ pod TCP skips TCP/IP. Torn down with the pods (the last `pod del` removes it).
fn build_bpf_shortcut(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    const T: &str = "bpf-shortcut";
    let mut b = build_pods(ctx, T, ModeRequest::Veth, AttachRequest::Auto, false)?;
    let Some(crate::evidence::FastPath::Pod { hosts, .. }) = &b.fast_path else {
        return Err(other(T, "no pod host".to_string()));
    };
    let host_name = hosts[0].1.clone();
    let host = nsfast_pod::Host::open(Some(&host_name)).map_err(|e| other(T, e.to_string()))?;
    // The bench's peers read with recv(2) only: the splice guard's hole cannot open here.
    let request = nsfast_pod::shortcut::EnableRequest {
        allow_splice_hole: true,
        ..Default::default()
    };
    nsfast_pod::shortcut::enable(&host, Some(&b.cgroup_dir), request)
        .map_err(|e| other(T, e.to_string()))?;
    b.note = Some(format!(
        "{}; pod shortcut on host {host_name}, cgroup {}",
        b.note.take().unwrap_or_default(),
        b.cgroup_dir.display()
    ));
    b.fast_path = Some(crate::evidence::FastPath::PodShortcut { host: host_name });
    Ok(b)
}

/// `bpf` with a NetworkPolicy of `rules` ingress rules applied on host A (what the policy
/// check costs per packet and per connection against `bpf`, the same path without one).
/// The policy directory goes with the topology.
fn build_bpf_policy(ctx: &BuildCtx, t: &'static str, rules: usize) -> Result<Built, TopologyError> {
    let mut b = build_pods(ctx, t, ModeRequest::Veth, AttachRequest::Auto, false)?;
    let Some(crate::evidence::FastPath::Pod { hosts, .. }) = &b.fast_path else {
        return Err(other(t, "no pod host".to_string()));
    };
    let host_name = hosts[0].1.clone();
    let host = nsfast_pod::Host::open(Some(&host_name)).map_err(|e| other(t, e.to_string()))?;
    let dir = nsfast_pod::policy::dir(&host);
    b.extras.push(Box::new(RemoveOnDrop(dir)));
    nsfast_pod::policy::apply(&host, &policy_yaml(rules)).map_err(|e| other(t, e.to_string()))?;
    b.note = Some(format!(
        "{}; NetworkPolicy with {rules} ingress rules on every pod of host {host_name}",
        b.note.take().unwrap_or_default()
    ));
    Ok(b)
}

/// One NetworkPolicy selecting every pod of namespace `default` with `rules` ingress rules:
/// `rules - 1` allowing one address of the reserved 240.0.0.0/4 (which no host uses) on a
/// port of its own, and the last allowing every pod of the namespace, the bench's client and
/// server included.
pub fn policy_yaml(rules: usize) -> String {
    let mut y = String::from(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
         metadata: {name: bench-rules, namespace: default}\n\
         spec:\n  podSelector: {}\n  ingress:\n",
    );
    for i in 0..rules.saturating_sub(1) {
        let a = Ipv4Addr::from(u32::from(Ipv4Addr::new(240, 0, 0, 0)) + i as u32);
        y.push_str(&format!(
            "  - from: [{{ipBlock: {{cidr: {a}/32}}}}]\n    ports: [{{protocol: TCP, port: {}}}]\n",
            10_000 + i
        ));
    }
    y.push_str("  - from: [{podSelector: {}}]\n");
    y
}

/// Removes a directory when dropped (a topology's policy state).
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `bpf` with classic tc attachments (what kernels without TCX, e.g. 6.1, get), to compare
/// the two attach methods on one kernel.
fn build_bpf_tc(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    build_pods(ctx, "bpf-tc", ModeRequest::Veth, AttachRequest::Tc, false)
}

/// veth + BPF host routing, pod → pod on another host: fib lookup + redirect out of host A,
/// TCX on host B's wire device + bpf_redirect_peer in.
fn build_bpf_remote(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    build_pods(
        ctx,
        "bpf-remote",
        ModeRequest::Veth,
        AttachRequest::Auto,
        true,
    )
}

/// netkit L3 pairs with the pod programs (`nsfast pod --mode netkit`).
fn build_netkit(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    build_pods(
        ctx,
        "netkit",
        ModeRequest::Netkit,
        AttachRequest::Auto,
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
    let topo = ptp_spec(per_host)
        .build(&prefix)
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

/// What killed runs left (`nsfb<dead pid>-*`): see [`nsfast_lab::cleanup::leftovers`].
pub fn stale_leftovers() -> nsfast_lab::cleanup::Leftovers {
    nsfast_lab::cleanup::leftovers()
}

/// `nsfast bench --cleanup`: [`nsfast_lab::cleanup::dead_runs`]. Returns what was removed.
pub fn cleanup_stale() -> Vec<String> {
    nsfast_lab::cleanup::dead_runs()
}

#[cfg(test)]
mod tests {
    use super::policy_yaml;

    #[test]
    fn the_bench_policies_are_valid_and_have_their_rule_counts() {
        for n in [1, 10, 1000] {
            let p = nsfast_policy::parse(&policy_yaml(n)).unwrap_or_else(|e| panic!("{n}: {e}"));
            assert_eq!(p.len(), 1);
            let pol = &p[0].policy;
            assert_eq!(pol.ingress.len(), n);
            assert!(pol.ingress_isolates && !pol.egress_isolates);
            // The last rule, the one the bench's pods meet, allows every pod of the namespace.
            assert!(pol.ingress[n - 1].ports.is_none(), "{n}");
        }
    }
}
