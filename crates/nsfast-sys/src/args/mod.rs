//! Command-line and configuration values, each parsed by one function with one rule for every
//! CLI (`nsfast`, `vpnrelay`, `nsfast-cni`) and config reader (vpnrelay's environment, CNI's
//! `CNI_IFNAME`, the bench spec):
//!
//! - [`size`]     — byte sizes: `65536`, `256K`, `4MiB`, `1g` (K, M, G are powers of 1024).
//! - [`duration`] — durations: `10` (seconds), `0.5`, `500ms`, `2m`, `1h`; whole milliseconds.
//! - [`ifname`]   — network interface names, checked before the kernel sees them.
//! - [`crate::ports`] — port lists and ranges (`80,443,8000-8100`), TCP (u16) and vsock (u32).
//!
//! Every error names the option (or variable), the bad value and what would be valid. Each
//! parser has a `*_arg` constructor that returns a clap `value_parser`.

pub mod duration;
pub mod ifname;
pub mod size;

pub use crate::ports;

/// A bad value: `invalid {what} {value:?} for {flag}: {reason}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {value:?} for {flag}: {reason}")]
pub struct ArgError {
    /// The option or variable the value was given to (`--buffer`, `CNI_IFNAME`).
    pub flag: String,
    /// What kind of value: `size`, `duration`, `interface name`.
    pub what: &'static str,
    /// The value as given.
    pub value: String,
    /// Why it is not valid and what would be.
    pub reason: String,
}

impl ArgError {
    pub(crate) fn new(
        flag: &str,
        what: &'static str,
        value: &str,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            flag: flag.into(),
            what,
            value: value.into(),
            reason: reason.into(),
        }
    }
}

/// Splits `t` (already trimmed) into its leading number (digits, and with `fraction` one `.`
/// followed by digits) and the rest (the unit).
pub(crate) fn split_number(t: &str, fraction: bool) -> (&str, &str) {
    let mut dot = false;
    let end = t
        .char_indices()
        .find(|&(_, c)| {
            if c == '.' && fraction && !dot {
                dot = true;
                false
            } else {
                !c.is_ascii_digit()
            }
        })
        .map(|(i, _)| i)
        .unwrap_or(t.len());
    t.split_at(end)
}
