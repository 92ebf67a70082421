//! The one log setup of the nsfast binaries (`nsfast`, `vpnrelay`, `nsfast-cni`, `vmtest`):
//! `tracing` to stderr, filtered by `RUST_LOG` (else `default`), without targets. Under systemd
//! (stderr is the journal, [`crate::systemd::stderr_is_journal`]) no timestamps (the journal
//! adds them) and no colour; elsewhere colour only on a terminal.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Installs the subscriber; `default` is the filter without `RUST_LOG`, e.g. `info`. A second
/// call does nothing.
pub fn init(default: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = if crate::systemd::stderr_is_journal() {
        fmt.with_ansi(false).without_time().try_init()
    } else {
        fmt.with_ansi(std::io::stderr().is_terminal()).try_init()
    };
}
