//! Kernel features a test expects, taken from the harness, never from nsfast's own probes (a
//! wrong probe must not pick a test's easy branch).
//!
//! Source, in order: `NSFAST_EXPECT_<FEATURE>=1|0` (the VM guest's init sets them from the
//! guest kernel's config, see tests/vm/init.sh); else the running kernel's config
//! (`NSFAST_KERNEL_CONFIG`, `/boot/config-$(uname -r)` or `/proc/config.gz`). Neither
//! readable: the test panics rather than guess.

/// A kernel feature some tests branch on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// netkit devices (CONFIG_NETKIT, 6.7+).
    Netkit,
    /// TCX attachments (CONFIG_NET_XGRESS, 6.6+).
    Tcx,
    /// vsock over the loopback transport (CONFIG_VSOCKETS_LOOPBACK).
    VsockLoopback,
}

impl Feature {
    /// The environment variable the harness sets.
    pub fn env_var(self) -> &'static str {
        match self {
            Feature::Netkit => "NSFAST_EXPECT_NETKIT",
            Feature::Tcx => "NSFAST_EXPECT_TCX",
            Feature::VsockLoopback => "NSFAST_EXPECT_VSOCK_LOOPBACK",
        }
    }

    /// The kernel config option behind it.
    pub fn config_key(self) -> &'static str {
        match self {
            Feature::Netkit => "CONFIG_NETKIT",
            Feature::Tcx => "CONFIG_NET_XGRESS",
            Feature::VsockLoopback => "CONFIG_VSOCKETS_LOOPBACK",
        }
    }
}

/// The running kernel's config text, if it can be read (read once per process).
pub fn kernel_config() -> Option<&'static str> {
    static CONFIG: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    CONFIG.get_or_init(read_kernel_config).as_deref()
}

fn read_kernel_config() -> Option<String> {
    if let Some(p) = std::env::var_os("NSFAST_KERNEL_CONFIG") {
        return std::fs::read_to_string(p).ok();
    }
    nsfast_sys::kernel::config_text()
}

/// Whether `key` is built in or a module in `config`.
pub fn config_on(config: &str, key: &str) -> bool {
    let prefix = format!("{key}=");
    config
        .lines()
        .filter_map(|l| l.trim().strip_prefix(&prefix))
        .any(|v| v == "y" || v == "m")
}

/// Whether the kernel under test has `f`, according to the harness (see the module docs).
/// Panics when no source says.
pub fn expect(f: Feature) -> bool {
    if let Ok(v) = std::env::var(f.env_var()) {
        match v.as_str() {
            "1" => return true,
            "0" => return false,
            _ => panic!("{}={v:?}: expected 1 or 0", f.env_var()),
        }
    }
    let config = kernel_config().unwrap_or_else(|| {
        panic!(
            "cannot tell whether this kernel has {f:?}: set {}=1|0 or make the kernel config \
             readable (/boot/config-$(uname -r), /proc/config.gz, or NSFAST_KERNEL_CONFIG)",
            f.env_var()
        )
    });
    config_on(config, f.config_key())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_options_are_read_exactly() {
        let c = "CONFIG_NETKIT=y\n# CONFIG_VSOCKETS_LOOPBACK is not set\nCONFIG_NET_XGRESS_X=y\nCONFIG_VSOCKETS=m\n";
        assert!(config_on(c, "CONFIG_NETKIT"));
        assert!(config_on(c, "CONFIG_VSOCKETS"));
        assert!(!config_on(c, "CONFIG_VSOCKETS_LOOPBACK"));
        assert!(
            !config_on(c, "CONFIG_NET_XGRESS"),
            "a longer name is another option"
        );
    }
}
