//! nsfast-cni: a CNI 1.1 plugin that makes nsfast pods.
//!
//! Module map:
//! - [`error`]  — the CNI error object and codes (a leaf: every other module may use it).
//! - [`spec`]   — CNI protocol types: config, environment, results (re-exports [`error`]).
//! - [`ipam`]   — delegation to the IPAM plugin (e.g. `host-local`) found on `CNI_PATH`.
//! - [`log`]    — `logFile` / `logLevel`: the plugin's log lines appended to a file.
//! - [`plugin`] — ADD, DEL, CHECK, STATUS, GC, VERSION on top of `nsfast_pod`.
//!
//! The runtime executes the plugin in the host network namespace with `CNI_*` variables and
//! the network configuration on stdin; the result (or an error object) goes to stdout.

pub mod error;
pub mod ipam;
pub mod log;
pub mod plugin;
pub mod spec;

use std::process::ExitCode;

/// Entry point of the `nsfast-cni` binary.
pub fn main() -> ExitCode {
    let env = spec::Env::from_process();
    if env.command.is_none() {
        // Run by hand: say what we are, as the reference plugins do; stdin is not read.
        let _ = nsfast_sys::outln!("{}", spec::about());
        return ExitCode::SUCCESS;
    }
    // Runtimes may signal a plugin they gave up on: finish (or undo) the change first.
    let _ = nsfast_sys::signals::block_termination();
    // The configuration says where the log goes (logFile, logLevel): read it first.
    let r = spec::read_bounded(std::io::stdin().lock()).and_then(|stdin| {
        let settings = log::Settings::from_stdin(&stdin)?;
        log::init(&settings)?;
        Ok(stdin)
    });
    let stdin = match r {
        Ok(s) => s,
        Err(e) => {
            // No log file (yet): stderr is all there is.
            let _ = log::init(&log::Settings::default());
            tracing::error!(
                "{}: {} ({})",
                env.command.as_deref().unwrap_or("?"),
                e.msg,
                e.details
            );
            let _ = nsfast_sys::outln!("{}", e.to_json());
            return ExitCode::from(e.exit_status());
        }
    };
    let what = invocation(&env, &stdin);
    tracing::debug!(
        "{what}: CNI_NETNS={} CNI_PATH={} CNI_ARGS={} config {}",
        env.netns.as_deref().unwrap_or("-"),
        env.path.as_deref().unwrap_or("-"),
        env.args.as_deref().unwrap_or("-"),
        // One line: the configuration as compact JSON.
        serde_json::from_slice::<serde_json::Value>(&stdin)
            .map(|v| v.to_string())
            .unwrap_or_else(|_| format!("{:?}", String::from_utf8_lossy(&stdin)))
    );
    match plugin::run(&env, &stdin) {
        Ok(Some(out)) => {
            tracing::info!("{what}: ok");
            tracing::debug!("{what}: result {out}");
            // A runtime that closed our stdout gets no result either way; never a panic.
            let _ = nsfast_sys::outln!("{out}");
            ExitCode::SUCCESS
        }
        Ok(None) => {
            tracing::info!("{what}: ok");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!("{what}: error {}: {} ({})", e.code, e.msg, e.details);
            let _ = nsfast_sys::outln!("{}", e.to_json());
            ExitCode::from(e.exit_status())
        }
    }
}

/// `ADD container C ifname I network "N" (pid P)`: who asked for what, for the log lines.
fn invocation(env: &spec::Env, stdin: &[u8]) -> String {
    let network = serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .and_then(|v| v.get("name").and_then(|n| n.as_str()).map(str::to_string));
    let mut s = env.command.clone().unwrap_or_default();
    if let Some(c) = &env.container_id {
        s.push_str(&format!(" container {c}"));
    }
    if let Some(i) = &env.ifname {
        s.push_str(&format!(" ifname {i}"));
    }
    if let Some(n) = network {
        s.push_str(&format!(" network {n:?}"));
    }
    s.push_str(&format!(" (pid {})", std::process::id()));
    s
}
