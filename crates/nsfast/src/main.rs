//! `nsfast` — fast paths across Linux namespace and VM boundaries.
//!
//! Thin binary: argument parsing and output; the work lives in the library crates.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;

#[derive(Parser, Debug)]
#[command(name = "nsfast", version, about = "Fast paths across Linux namespace and VM boundaries")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Same-host TCP shortcut between sockets (sockops + sk_msg), across network namespaces.
    #[command(subcommand)]
    Sockmap(cmd::sockmap::SockmapCmd),
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Sockmap(c) => cmd::sockmap::run(c),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            eprintln!("nsfast: error: {e:#}");
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
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
