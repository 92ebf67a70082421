//! The version string of the nsfast binaries.

use std::sync::OnceLock;

/// `0.1.0 (git <describe>, bpf sha256 <hex>)`.
pub fn long() -> &'static str {
    static V: OnceLock<String> = OnceLock::new();
    V.get_or_init(|| {
        format!(
            "{} (git {}, bpf sha256 {})",
            env!("CARGO_PKG_VERSION"),
            env!("NSFAST_GIT_REV"),
            nsfast_bpf::OBJECTS_SHA256
        )
    })
}
