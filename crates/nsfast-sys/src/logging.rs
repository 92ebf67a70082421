//! The one log setup of the nsfast binaries (`nsfast`, `vpnrelay`, `nsfast-cni`, `vmtest`):
//! `tracing` to stderr, filtered by `RUST_LOG` (else a default), without targets. Under systemd
//! (stderr is the journal, [`crate::systemd::stderr_is_journal`]) no timestamps (the journal
//! adds them) and no colour; elsewhere colour only on a terminal.

use std::io::IsTerminal;

use tracing::Subscriber;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// `RUST_LOG`, else `default` (e.g. `info`).
pub fn env_filter(default: &str) -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default))
}

/// The stderr layer, filtered by `filter`; for a binary that adds layers of its own (the CNI
/// plugin's `logFile`).
pub fn stderr_layer<S>(filter: EnvFilter) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false);
    if crate::systemd::stderr_is_journal() {
        fmt.with_ansi(false)
            .without_time()
            .with_filter(filter)
            .boxed()
    } else {
        fmt.with_ansi(std::io::stderr().is_terminal())
            .with_filter(filter)
            .boxed()
    }
}

/// Installs the stderr layer at [`env_filter`]`(default)`. A second call does nothing.
pub fn init(default: &str) {
    let _ = tracing_subscriber::registry()
        .with(stderr_layer(env_filter(default)))
        .try_init();
}
