//! Where the `slirp4netns`, `pasta` and `vpnrelay` topologies meet crate `nsfast-lab`'s
//! rootless world.
//!
//! All build the vpnrelay test world ([`nsfast_lab::rootless::World`]): a tenant's
//! RootlessKit + slirp4netns network with a bridge and a "gluetun" namespace on it (the
//! client), and a "VPN server" namespace reached over a veth from a throwaway "host"
//! namespace (the server). `slirp4netns` is Docker's normal rootless path; `pasta` is the same
//! world with RootlessKit >= 2 `--net=pasta` (rootless Docker's other network; Debian
//! unstable's packages, [`testbed::pasta_tools`]); `vpnrelay` is the slirp4netns world with
//! the relay running as the tenant. The server listens on the VPN port, the one the relay
//! steers.
//!
//! The world runs as an existing unprivileged user the operator names (`--tenant USER`,
//! [`nsfast_lab::tenant::Tenant::lookup`]): nsfast bench never creates users or edits
//! /etc/subuid and /etc/subgid, so without a tenant both topologies are skipped with
//! [`NO_TENANT`] as the reason.

use std::any::Any;

use nsfast_lab::rootless::{self as testbed, World, WorldOpts};
use nsfast_lab::rootless_bench::RelayProc;
use nsfast_sys::netns::NetNs;

use crate::built::{ProbeCtx, Tenant};

/// The port the server listens on (the relay steers it).
pub const PORT: u16 = testbed::VPN_PORT;

pub use nsfast_lab::rootless::{set_vpnrelay_bin, vpnrelay_bin};

/// The skip reason of the rootless topologies in a run without a tenant.
pub const NO_TENANT: &str = "needs --tenant USER, an existing unprivileged user with ranges in /etc/subuid and /etc/subgid to run as (nsfast bench creates no users)";

/// Why the rootless world cannot be built here, if it cannot: no tenant, or a missing program.
pub fn probe_world(ctx: &ProbeCtx) -> Result<(), String> {
    if ctx.tenant.is_none() {
        return Err(NO_TENANT.into());
    }
    testbed::check_programs(testbed::NEEDS).map_err(|e| e.to_string())
}

/// Which path a rootless topology measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    Slirp4netns,
    Pasta,
    VpnRelay,
}

/// [`probe_world`] plus RootlessKit >= 2 and pasta.
pub fn probe_pasta(ctx: &ProbeCtx) -> Result<(), String> {
    probe_world(ctx)?;
    testbed::pasta_tools().map(|_| ())
}

/// [`probe_world`] plus the relay binary.
pub fn probe_relay(ctx: &ProbeCtx) -> Result<(), String> {
    probe_world(ctx)?;
    vpnrelay_bin().map(|_| ())
}

/// `--tenant`'s value: the existing user `name`, if it can run the world (the error names it
/// and says what a valid tenant is).
pub fn tenant(name: &str) -> Result<Tenant, String> {
    Tenant::lookup(name).map_err(|e| e.to_string())
}

/// A built world: its client and server namespaces (handles that do not own them), and
/// guards to keep in the topology's extras, in drop order (relay before world).
pub struct Parts {
    pub client: NetNs,
    pub server: NetNs,
    pub guards: Vec<Box<dyn Any>>,
    pub note: String,
}

/// Builds the world for `path` run by `tenant`; for [`Path::VpnRelay`], starts the relay in
/// it as the tenant.
pub fn build(path: Path, tenant: &Tenant) -> Result<Parts, String> {
    let chain = |e: anyhow::Error| format!("{e:#}");
    let bin = if path == Path::VpnRelay {
        Some(vpnrelay_bin()?)
    } else {
        None
    };
    let opts = if path == Path::Pasta {
        let (rk, pasta) = testbed::pasta_tools()?;
        WorldOpts {
            rootlesskit: Some(rk),
            pasta: Some(pasta),
            ..Default::default()
        }
    } else {
        WorldOpts::default()
    };
    let w = World::build(&opts, tenant).map_err(chain)?;
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
            "{net}: RootlessKit world {} (tenant {}), client in \"gluetun\" on {}; CPU cost counts client and server only, not {net}",
            w.prefix,
            w.tenant.name,
            testbed::BRIDGE,
            net = w.net,
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
