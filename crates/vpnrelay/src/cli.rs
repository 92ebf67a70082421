//! The `vpnrelay` command line (the binary in crates/nsfast is a one-line wrapper).

use std::os::fd::{FromRawFd, OwnedFd};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::Config;

#[derive(Parser, Debug)]
#[command(
    name = "vpnrelay",
    version,
    about = "Fast VPN tunnels (WireGuard, OpenVPN/UDP) for containers under rootless Docker",
    long_about = "Moves a container's UDP tunnel traffic off rootless Docker's user-space network stack \
(slirp4netns, pasta, ...) onto host sockets with batched UDP (recvmmsg/sendmmsg, GRO/GSO). \
Runs as the Docker user: no root, setuid or file capability.\n\n\
Environment: VPNRELAY_RULE (routing table and rule priority, default 4820), VPNRELAY_SOCKBUF \
(socket buffers, default 16M), VPNRELAY_NO_GRO=1, VPNRELAY_NO_GSO=1 (single datagrams), \
VPNRELAY_DOCKER_STATE (RootlessKit state dir, default $XDG_RUNTIME_DIR/dockerd-rootless), \
VPNRELAY_IDLE_TIMEOUT (seconds before an idle flow is closed, default 180), RUST_LOG."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the relay, clean up after every exit and restart it with backoff (5 s to 60 s);
    /// exits at once if a supervisor for BRIDGE already runs, so a cron line is enough.
    Supervise(Target),
    /// Run the relay in the foreground until SIGTERM/SIGINT.
    Transparent(Target),
    /// Remove a stale rule and reset the bridge's tunnel conntrack entries; does nothing while
    /// a relay for BRIDGE runs.
    Cleanup(Target),
    /// Benchmark (needs root): builds a throwaway RootlessKit + slirp4netns world and measures
    /// slirp4netns vs the relay vs a direct host socket in interleaved rounds.
    #[command(hide = true)]
    Bench {
        /// Rounds (medians are reported).
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 3.0)]
        secs: f64,
        /// Also iperf3 TCP through a WireGuard tunnel (wireguard-go on both ends).
        #[arg(long)]
        wireguard: bool,
    },
    #[command(name = "__child", hide = true)]
    Child {
        mode: String,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(clap::Args, Debug)]
struct Target {
    /// The Docker network's bridge inside the rootless network namespace (e.g. br-1a2b3c4d5e6f).
    bridge: String,
    /// UDP ports of the VPN servers, e.g. 51820 or 1194,51820-51830.
    ports: String,
}

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Entry point of the `vpnrelay` binary.
pub fn main() -> ExitCode {
    // Before any thread exists, so every thread inherits the mask and signals are taken
    // synchronously where the program checks for them.
    if let Err(e) = nsfast_sys::signals::block_termination() {
        eprintln!("vpnrelay: error: blocking signals: {e}");
        return ExitCode::FAILURE;
    }
    init_logging();
    let cli = Cli::parse();
    let res = match cli.command {
        Cmd::Supervise(t) => config(&t).and_then(|c| crate::supervise::supervise(&c)),
        Cmd::Transparent(t) => config(&t).and_then(|c| crate::host::transparent(&c)),
        Cmd::Cleanup(t) => config(&t).and_then(|c| crate::host::cleanup(&c)),
        Cmd::Child { mode, target } => return child(&mode, &target),
        Cmd::Bench {
            rounds,
            secs,
            wireguard,
        } => crate::bench::run(&crate::bench::BenchOpts {
            rounds,
            secs,
            wireguard,
        })
        .map(drop),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.chain().any(nsfast_sys::out::is_broken_pipe) => ExitCode::SUCCESS,
        Err(e) => {
            nsfast_sys::out::errln(&format!("vpnrelay: error: {e:#}"));
            ExitCode::FAILURE
        }
    }
}

fn config(t: &Target) -> anyhow::Result<Config> {
    Ok(Config::from_args(&t.bridge, &t.ports)?)
}

fn child(mode: &str, t: &Target) -> ExitCode {
    let mode = match mode {
        "relay" => crate::child::Mode::Relay,
        "cleanup" => crate::child::Mode::Cleanup,
        _ => return ExitCode::from(2),
    };
    let Some(fd) = std::env::var(crate::host::CHILD_FD_ENV)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
        .filter(|&fd| fd > 2)
    else {
        eprintln!("vpnrelay: __child is internal: started by vpnrelay itself");
        return ExitCode::from(2);
    };
    // SAFETY: the parent passed this descriptor (its socketpair end) to us and nothing else
    // in this process owns it.
    let ctl = unsafe { OwnedFd::from_raw_fd(fd) };
    let _ = nix::fcntl::fcntl(
        &ctl,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    );
    let cfg = match Config::from_args(&t.bridge, &t.ports) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vpnrelay: error: {e}");
            return ExitCode::from(2);
        }
    };
    ExitCode::from(crate::child::run(mode, &cfg, ctl) as u8)
}
