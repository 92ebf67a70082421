//! The global `-j/--json` and `-p/--pretty`: set once by `main`, read by every listing and
//! status. The writer itself (and `schema_version`) is `nsfast_sys::out::Json`.

use std::sync::OnceLock;

use nsfast_sys::out::Json;

static MODE: OnceLock<Json> = OnceLock::new();

/// Turns JSON output on for this process (called once, from `main`).
pub fn set(mode: Json) {
    let _ = MODE.set(mode);
}

/// `Some(writer)` when `-j`/`-p` was given, before or after the subcommand.
pub fn json() -> Option<Json> {
    MODE.get().copied()
}
