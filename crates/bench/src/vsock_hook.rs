//! The `vsock`, `vsock-relay`, `vsock-relay-kernel` and `vsock-socat` topologies: the bench's stream workloads (rr,
//! crr, stream, ping) over vsock loopback (CID 1) inside a VM guest, directly, through
//! nsfast's vsock relay, or through socat doing the same job.
//!
//! AF_VSOCK is only ever opened when `NSFAST_VM_GUEST=1` (set by the VM harness's guest init):
//! on a host, `/dev/vsock` may belong to the hypervisor's infrastructure, so the probe refuses
//! before any socket exists. All three topologies put the server (and the relay or socat, so
//! their CPU time is counted with the server's) in one fresh network namespace; on Linux 7.0+
//! that namespace gets its vsock mode from the parent's `child_ns_mode` (global by default),
//! and CID 1 reaches listeners of the same namespace in either mode. The relay or socat is
//! placed like the server (same CPU, or unpinned) before every measurement, so a same-cpu
//! run keeps all three on one CPU as the direct path keeps client and server.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nsfast_sys::probe::{ModuleIndex, ModuleState};
use nsfast_sys::vsock::{VsockAddr, VsockListener, VsockStream, VMADDR_CID_ANY, VMADDR_CID_LOCAL};

use crate::built::{self, BuildCtx, Built, Endpoint, TopologyError, VsockPath};
use crate::proc::{command_in, ChildGuard};
use crate::worker::{read_report, Role, VsockEnd, WorkerReport, WorkerSpec};

/// The environment variable the VM harness's guest init sets; nothing here opens AF_VSOCK
/// without it.
pub const GUEST_ENV: &str = "NSFAST_VM_GUEST";

/// This run's vsock ports: a block of 16 from the run's PID, so two runs in one guest do not
/// collide. Offsets: 0 direct server, 1 relay's server, 2 relay, 3 socat's server, 4 socat,
/// 15 the probe.
fn port(offset: u32) -> u32 {
    0x4000_0000 + (std::process::id() % 0x10_0000) * 16 + offset
}

/// Whether vsock loopback can be used here: only in a VM guest (`NSFAST_VM_GUEST=1`), with
/// the vsock_loopback transport loaded or built in, and a real CID 1 round trip.
pub fn probe() -> Result<(), String> {
    if std::env::var(GUEST_ENV).as_deref() != Ok("1") {
        return Err(format!(
            "vsock topologies run only inside a VM guest ({GUEST_ENV}=1, set by tests/vm): on a host /dev/vsock may belong to the hypervisor's infrastructure, so nsfast never opens AF_VSOCK there"
        ));
    }
    let k = nsfast_sys::kernel::KernelVersion::current();
    match ModuleIndex::load().state("vsock_loopback") {
        ModuleState::Loaded | ModuleState::BuiltIn => {}
        ModuleState::Loadable => {
            return Err(format!(
                "kernel {k}: vsock_loopback is not loaded (modprobe vsock_loopback)"
            ))
        }
        ModuleState::Absent => {
            return Err(format!(
                "kernel {k} lacks vsock_loopback (CONFIG_VSOCKETS_LOOPBACK)"
            ))
        }
    }
    round_trip(port(15)).map_err(|e| format!("vsock loopback (CID 1) round trip failed: {e}"))
}

/// Opt-in for the `vsock-relay-kernel` topology (see [`probe_relay_kernel`]).
pub const EXPERIMENTAL_ENV: &str = "NSFAST_BENCH_EXPERIMENTAL";

/// `probe`, and the opt-in `NSFAST_BENCH_EXPERIMENTAL=1`: the relay's kernel path with
/// AF_VSOCK legs is experimental (in the 7.2 guest it stalled and vsock loopback stopped
/// delivering for every later connection, docs/vsock.md), so a bench never runs it unasked.
pub fn probe_relay_kernel() -> Result<(), String> {
    if std::env::var(GUEST_ENV).as_deref() != Ok("1") {
        return probe();
    }
    if std::env::var(EXPERIMENTAL_ENV).as_deref() != Ok("1") {
        return Err(format!(
            "experimental: the relay's kernel path with AF_VSOCK legs stalled vsock loopback in the 7.2 guest; set {EXPERIMENTAL_ENV}=1 to run it"
        ));
    }
    probe()
}

/// `probe`, and a `socat` on PATH.
pub fn probe_socat() -> Result<(), String> {
    probe()?;
    socat_path().map(|_| ())
}

fn socat_path() -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("socat"))
        .find(|p| p.is_file())
        .ok_or_else(|| "socat not found on PATH (install socat 1.7.4 or later)".into())
}

/// Listens on `port`, connects to CID 1, accepts, and moves one byte.
fn round_trip(port: u32) -> std::io::Result<()> {
    use std::io::{Read, Write};
    let l = VsockListener::bind(VsockAddr {
        cid: VMADDR_CID_ANY,
        port,
    })?;
    let mut c = VsockStream::connect(VsockAddr {
        cid: VMADDR_CID_LOCAL,
        port,
    })?;
    let (mut s, _) = l.accept()?;
    c.write_all(b"x")?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b)?;
    Ok(())
}

/// One namespace, client and server cgroups, and the vsock ports.
fn base(ctx: &BuildCtx, t: &'static str, path: VsockPath) -> Result<Built, TopologyError> {
    let (dir, client, server) = built::cgroups(ctx, t)?;
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
        server_ip: std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        server_port: 0,
        cgroup_dir: dir,
        vsock: Some(path),
        floor: None,
        fast_path: None,
        extras: vec![],
        note: None,
    };
    b.namespaces
        .push(built::ns(t, format!("{}-{t}", ctx.prefix))?);
    Ok(b)
}

fn other(t: &'static str, what: impl Into<String>) -> TopologyError {
    TopologyError::Other {
        topology: t,
        what: what.into(),
    }
}

/// Client and server over CID 1 on the same port.
pub fn build_direct(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    let p = port(0);
    base(
        ctx,
        "vsock",
        VsockPath {
            server_port: p,
            client_port: p,
            helper_pid: None,
        },
    )
}

/// The server behind nsfast's relay (a `bench-worker` in relay role, in the server's cgroup,
/// unpinned), which forwards every connection of its port to the server's.
pub fn build_relay(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    relay_topology(ctx, "vsock-relay", 1, false)
}

/// As `vsock-relay`, with the relay's kernel path: the legs joined by the BPF sockmap
/// redirect (bpf/relay.bpf.c), no byte through the relay process.
pub fn build_relay_kernel(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    relay_topology(ctx, "vsock-relay-kernel", 5, true)
}

fn relay_topology(
    ctx: &BuildCtx,
    name: &'static str,
    first_port: u32,
    kernel_path: bool,
) -> Result<Built, TopologyError> {
    let mut path = VsockPath {
        server_port: port(first_port),
        client_port: port(first_port + 1),
        helper_pid: None,
    };
    let mut b = base(ctx, name, path)?;
    let launcher = ctx
        .launcher
        .as_ref()
        .ok_or_else(|| other(name, "no worker launcher to start the relay with"))?;
    let spec = WorkerSpec {
        role: Role::Relay,
        workload: crate::spec::Workload::Stream,
        addr: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        sizes: crate::spec::Sizes::default(),
        duration_s: 0.0,
        cpu: None,
        vsock: Some(VsockEnd {
            cid: VMADDR_CID_ANY,
            port: path.client_port,
        }),
        relay_to: Some(VsockEnd {
            cid: VMADDR_CID_LOCAL,
            port: path.server_port,
        }),
        floor: None,
        kernel_path,
    };
    let mut args = launcher.args.clone();
    args.push(serde_json::to_string(&spec).expect("spec serializes"));
    let mut cmd = command_in(
        &launcher.program,
        &args,
        &b.namespaces[0],
        b.server.cgroup.path(),
        None,
    );
    // Per-connection warnings would fill an unread pipe; errors before listening come on
    // stdout as a report.
    cmd.stderr(Stdio::null());
    let mut relay =
        ChildGuard::spawn(cmd, "vsock relay").map_err(|e| other(name, e.to_string()))?;
    match read_report(relay.stdout()) {
        Some(WorkerReport::ReadyVsock(_)) => {}
        Some(WorkerReport::Error(e)) => return Err(other(name, format!("relay: {e}"))),
        _ => return Err(other(name, "relay exited before listening")),
    }
    path.helper_pid = Some(relay.pid());
    b.vsock = Some(path);
    b.note = Some(format!(
        "{name}: nsfast vsock relay vsock-listen:{} -> vsock-connect:1:{} (default buffers{})",
        path.client_port,
        path.server_port,
        if kernel_path { ", --path kernel" } else { "" }
    ));
    b.extras.push(Box::new(relay));
    Ok(b)
}

/// The server behind `socat VSOCK-LISTEN:P,fork,reuseaddr VSOCK-CONNECT:1:S`, in the server's
/// cgroup, unpinned; ready once a connection to its port is accepted.
pub fn build_socat(ctx: &BuildCtx) -> Result<Built, TopologyError> {
    const T: &str = "vsock-socat";
    let mut path = VsockPath {
        server_port: port(3),
        client_port: port(4),
        helper_pid: None,
    };
    let socat = socat_path().map_err(|e| other(T, e))?;
    let mut b = base(ctx, T, path)?;
    let args = vec![
        format!("VSOCK-LISTEN:{},fork,reuseaddr", path.client_port),
        format!("VSOCK-CONNECT:1:{}", path.server_port),
    ];
    let mut cmd = command_in(
        &socat,
        &args,
        &b.namespaces[0],
        b.server.cgroup.path(),
        None,
    );
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = ChildGuard::spawn(cmd, "socat").map_err(|e| other(T, e.to_string()))?;
    wait_listening(&b.namespaces[0], &mut child, path.client_port).map_err(|e| other(T, e))?;
    path.helper_pid = Some(child.pid());
    b.vsock = Some(path);
    b.note = Some(format!(
        "vsock-socat: {} {} {}",
        socat.display(),
        args[0],
        args[1]
    ));
    b.extras.push(Box::new(child));
    Ok(b)
}

/// Connects to CID 1 `port` from `ns` until it is accepted (then closes at once: socat's
/// child for it fails to reach the absent server and exits), for up to 10 s.
fn wait_listening(
    ns: &nsfast_sys::netns::NetNs,
    child: &mut ChildGuard,
    port: u32,
) -> Result<(), String> {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(Some(st)) = child.child.try_wait() {
            return Err(format!("{} exited before listening: {st}", child.what));
        }
        let r = ns
            .run(|| {
                VsockStream::connect(VsockAddr {
                    cid: VMADDR_CID_LOCAL,
                    port,
                })
            })
            .map_err(|e| e.to_string())?;
        match r {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= end => {
                return Err(format!(
                    "{} not listening on vsock port {port} after 10 s: {e}",
                    child.what
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}
