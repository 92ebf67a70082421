//! `nsfast-lab`: lab commands that build throwaway worlds by hand (needs root). Not shipped.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "nsfast-lab",
    about = "nsfast lab commands (throwaway worlds; needs root)"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Builds a throwaway RootlessKit + slirp4netns world and measures slirp4netns vs the
    /// relay vs a direct host socket in interleaved rounds (was the hidden `vpnrelay bench`).
    VpnrelayBench {
        /// Rounds (medians are reported).
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 3.0)]
        secs: f64,
        /// Also iperf3 TCP through a WireGuard tunnel (wireguard-go on both ends).
        #[arg(long)]
        wireguard: bool,
        /// The `vpnrelay` binary to measure (default: `$NSFAST_VPNRELAY_BIN`, or `vpnrelay`
        /// next to this program).
        #[arg(long, value_name = "PATH")]
        vpnrelay: Option<PathBuf>,
        /// The user that runs the world: an existing unprivileged user with ranges in
        /// /etc/subuid and /etc/subgid (default: the lab's `nsfvpn`, created if missing).
        #[arg(long, value_name = "USER")]
        tenant: Option<String>,
    },
    /// Creates the lab's tenant `nsfvpn` if missing (useradd; subordinate uid/gid ranges by
    /// usermod where it has none), for `nsfast bench --tenant nsfvpn`; prints its name.
    Tenant,
}

/// `name`, checked, or the lab's own tenant (created if missing).
fn tenant(name: Option<&str>) -> anyhow::Result<nsfast_lab::tenant::Tenant> {
    match name {
        Some(n) => Ok(nsfast_lab::tenant::Tenant::lookup(n)?),
        None => nsfast_lab::test_user::ensure(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.command {
        Cmd::VpnrelayBench {
            rounds,
            secs,
            wireguard,
            vpnrelay,
            tenant: name,
        } => vpnrelay
            .map(Ok)
            .unwrap_or_else(|| nsfast_lab::rootless::vpnrelay_bin().map_err(anyhow::Error::msg))
            .and_then(|bin| {
                nsfast_lab::rootless_bench::run(&nsfast_lab::rootless_bench::BenchOpts {
                    bin,
                    rounds,
                    secs,
                    wireguard,
                    tenant: tenant(name.as_deref())?,
                })
            })
            .map(drop),
        Cmd::Tenant => tenant(None).and_then(|t| {
            nsfast_sys::outln!("{}", t.name)?;
            Ok(())
        }),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.chain().any(nsfast_sys::out::is_broken_pipe) => ExitCode::SUCCESS,
        Err(e) => {
            nsfast_sys::out::errln(&format!("nsfast-lab: error: {e:#}"));
            ExitCode::FAILURE
        }
    }
}
