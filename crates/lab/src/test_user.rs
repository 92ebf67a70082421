//! The lab's own tenant, `nsfvpn`, created on demand (a system account without a home, with
//! subordinate uid/gid ranges) for the tests and `nsfast-lab` commands that build the
//! rootless world, and kept. Test-only: nothing shipped calls this module; `nsfast bench`
//! takes an existing tenant instead (`--tenant`, [`crate::tenant::Tenant::lookup`]), and
//! crates/lab/tests/shipped.rs checks that no shipped binary carries this code.

use std::process::Command;

use anyhow::Context;

use crate::tenant::{Tenant, SUBGID, SUBUID};

/// The lab's tenant.
pub const NAME: &str = "nsfvpn";

/// The subordinate range it gets where it has none (start-end, as usermod takes it).
const SUB_RANGE: &str = "300000-365535";

/// Programs [`ensure`] needs, with the Debian package that ships each.
pub const NEEDS: &[(&str, &str)] = &[("useradd", "passwd"), ("usermod", "passwd")];

fn exists(name: &str) -> bool {
    nix::unistd::User::from_name(name).ok().flatten().is_some()
}

/// Creates [`NAME`] if missing and gives it subordinate uid/gid ranges where it has none
/// (useradd, usermod; needs root); idempotent. Returns it, checked as every tenant is.
pub fn ensure() -> anyhow::Result<Tenant> {
    crate::rootless::check_programs(NEEDS)?;
    if !exists(NAME) {
        let st = Command::new("useradd")
            .args(["-M", "-d", "/nonexistent", "-s", "/usr/sbin/nologin", NAME])
            .status()
            .context("running useradd")?;
        // A concurrent test may have created it in between: only its absence is an error.
        if !exists(NAME) {
            anyhow::bail!("useradd {NAME} failed ({st}) and there is no user {NAME}");
        }
    }
    for (file, flag) in [(SUBUID, "--add-subuids"), (SUBGID, "--add-subgids")] {
        let has = std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .any(|l| l.starts_with(&format!("{NAME}:")));
        if !has {
            let out = Command::new("usermod")
                .args([flag, SUB_RANGE, NAME])
                .output()
                .context("running usermod")?;
            anyhow::ensure!(
                out.status.success(),
                "usermod {flag} {SUB_RANGE} {NAME} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    Tenant::lookup(NAME).with_context(|| format!("the lab's tenant {NAME}"))
}
