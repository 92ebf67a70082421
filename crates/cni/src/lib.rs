//! nsfast-cni: a CNI 1.1 plugin that makes nsfast pods.
//!
//! Module map:
//! - [`spec`]   — CNI protocol types: config, environment, results, error JSON and codes.
//! - [`ipam`]   — delegation to the IPAM plugin (e.g. `host-local`) found on `CNI_PATH`.
//! - [`plugin`] — ADD, DEL, CHECK, STATUS, GC, VERSION on top of `nsfast_pod`.
//!
//! The runtime executes the plugin in the host network namespace with `CNI_*` variables and
//! the network configuration on stdin; the result (or an error object) goes to stdout.

pub mod ipam;
pub mod plugin;
pub mod spec;

use std::process::ExitCode;

/// Entry point of the `nsfast-cni` binary.
pub fn main() -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
    let env = spec::Env::from_process();
    if env.command.is_none() {
        // Run by hand: say what we are, as the reference plugins do; stdin is not read.
        let _ = nsfast_sys::outln!("{}", spec::about());
        return ExitCode::SUCCESS;
    }
    // Runtimes may signal a plugin they gave up on: finish (or undo) the change first.
    let _ = nsfast_sys::signals::block_termination();
    let r = spec::read_bounded(std::io::stdin().lock()).and_then(|stdin| plugin::run(&env, &stdin));
    match r {
        Ok(Some(out)) => {
            // A runtime that closed our stdout gets no result either way; never a panic.
            let _ = nsfast_sys::outln!("{out}");
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = nsfast_sys::outln!("{}", e.to_json());
            ExitCode::FAILURE
        }
    }
}
