//! Where the `slirp4netns` and `vpnrelay` topologies meet crate `nsfast-vpnrelay`.
//!
//! Both build the vpnrelay test world ([`nsfast_vpnrelay::testbed::World`]): a tenant's
//! RootlessKit + slirp4netns network with a bridge and a "gluetun" namespace on it (the
//! client), and a "VPN server" namespace reached over a veth from a throwaway "host"
//! namespace (the server). `slirp4netns` is Docker's normal rootless path; `vpnrelay` is the
//! same world with the relay running as the tenant. The server listens on the VPN port, the
//! one the relay steers.

use std::any::Any;
use std::path::PathBuf;
use std::sync::OnceLock;

use nsfast_sys::netns::NetNs;
use nsfast_vpnrelay::bench::RelayProc;
use nsfast_vpnrelay::testbed::{self, World, WorldOpts};

/// The port the server listens on (the relay steers it).
pub const PORT: u16 = testbed::VPN_PORT;

static BIN: OnceLock<PathBuf> = OnceLock::new();

/// Uses `path` as the `vpnrelay` binary (tests; the first call wins).
pub fn set_vpnrelay_bin(path: PathBuf) {
    let _ = BIN.set(path);
}

/// The `vpnrelay` binary: the one set with [`set_vpnrelay_bin`], `NSFAST_VPNRELAY_BIN`, or
/// `vpnrelay` next to the running executable (or one directory up, for test executables).
pub fn vpnrelay_bin() -> Result<PathBuf, String> {
    if let Some(p) = BIN.get() {
        return Ok(p.clone());
    }
    if let Some(p) = std::env::var_os("NSFAST_VPNRELAY_BIN") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("NSFAST_VPNRELAY_BIN={} is not a file", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    for d in [Some(dir.as_path()), dir.parent()].into_iter().flatten() {
        let p = d.join("vpnrelay");
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(format!(
        "no vpnrelay binary next to {} (cargo build -p nsfast --bin vpnrelay, or set NSFAST_VPNRELAY_BIN)",
        exe.display()
    ))
}

/// Why the rootless world cannot be built here, if it cannot.
pub fn probe_world() -> Result<(), String> {
    testbed::check_programs(testbed::NEEDS).map_err(|e| e.to_string())
}

/// [`probe_world`] plus the relay binary.
pub fn probe_relay() -> Result<(), String> {
    probe_world()?;
    vpnrelay_bin().map(|_| ())
}

/// A built world: its client and server namespaces (handles that do not own them), and
/// guards to keep in the topology's extras, in drop order (relay before world).
pub struct Parts {
    pub client: NetNs,
    pub server: NetNs,
    pub guards: Vec<Box<dyn Any>>,
    pub note: String,
}

/// Builds the world; with `relay`, starts the relay in it as the tenant.
pub fn build(relay: bool) -> Result<Parts, String> {
    let chain = |e: anyhow::Error| format!("{e:#}");
    let bin = if relay { Some(vpnrelay_bin()?) } else { None };
    let w = World::build(&WorldOpts::default()).map_err(chain)?;
    let client = w.gluetun_ns().map_err(chain)?;
    let server = NetNs::open(&w.server.path().display().to_string()).map_err(|e| e.to_string())?;
    let mut guards: Vec<Box<dyn Any>> = Vec::new();
    let note = match &bin {
        Some(bin) => {
            let r = RelayProc::start(&w, bin).map_err(chain)?;
            guards.push(Box::new(r));
            format!(
                "vpnrelay: RootlessKit world {} (tenant {}), relay {} running on {} port {PORT}; CPU cost counts client and server only, not the relay",
                w.prefix,
                w.tenant.name,
                bin.display(),
                testbed::BRIDGE
            )
        }
        None => format!(
            "slirp4netns: RootlessKit world {} (tenant {}), client in \"gluetun\" on {}; CPU cost counts client and server only, not slirp4netns",
            w.prefix,
            w.tenant.name,
            testbed::BRIDGE
        ),
    };
    guards.push(Box::new(w));
    Ok(Parts {
        client,
        server,
        guards,
        note,
    })
}
