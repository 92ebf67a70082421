//! `nsfast` — fast paths across Linux namespace and VM boundaries.
//!
//! Thin binary: argument parsing and output; the work lives in the library crates.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;

#[derive(Parser, Debug)]
#[command(
    name = "nsfast",
    version,
    about = "Fast paths across Linux namespace and VM boundaries"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Same-host TCP shortcut between sockets (sockops + sk_msg), across network namespaces.
    #[command(subcommand)]
    Sockmap(cmd::sockmap::SockmapCmd),
    /// vsock relays (vsock, TCP, UNIX, hybrid vsock).
    #[command(subcommand)]
    Vsock(cmd::vsock::VsockCmd),
    /// Pods on veth/netkit pairs with BPF host routing (redirect_peer, fib + redirect_neigh).
    #[command(subcommand)]
    Pod(cmd::pod::PodCmd),
    /// Every path side by side (host, veth, routed, sockmap, ...): tables, JSON and SVG charts.
    Bench(Box<cmd::bench::BenchArgs>),
    /// Internal: one side of one `nsfast bench` measurement.
    #[command(hide = true)]
    BenchWorker(cmd::bench::WorkerArgs),
    /// Report which kernel features nsfast can use here (netkit, TCX, BPF helpers, UDP GSO/GRO,
    /// vsock transports and namespace modes), each with yes/no and the reason.
    Probe(cmd::probe::ProbeArgs),
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Sockmap(c) => cmd::sockmap::run(c),
        Command::Vsock(c) => cmd::vsock::run(c),
        Command::Pod(c) => cmd::pod::run(c),
        Command::Bench(a) => cmd::bench::run(*a),
        Command::BenchWorker(a) => cmd::bench::worker(a),
        Command::Probe(a) => cmd::probe::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A reader that went away (`| head`) is not an error: end quietly, as ripgrep does.
            if is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            nsfast_sys::out::errln(&format!("nsfast: error: {e:#}"));
            ExitCode::FAILURE
        }
    }
}

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(nsfast_sys::out::is_broken_pipe)
}
