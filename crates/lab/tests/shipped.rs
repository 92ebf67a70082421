//! The shipped binaries contain no test world: no `useradd`/`usermod` path (the rootless
//! world's tenant), no lab code, no reference-ptp world, no BPF test object, no test peer.
//! `nsfast` builds the lab's throwaway worlds by design (bench), but not its user management:
//! it takes an existing tenant (`--tenant`) and carries no code that creates one.
//!
//! Checks the binaries cargo builds with this test's profile (built fresh), or those in
//! `$NSFAST_SHIPPED_BIN_DIR` (e.g. `NSFAST_SHIPPED_BIN_DIR=target/release` after `make build`).

/// Strings only test worlds contain: the rootless world's user management and tenant, the
/// lab crate's source paths (panic locations, debug info), the ptp world, the BPF test
/// object and the test peer.
const TEST_WORLD: &[&str] = &[
    "useradd",
    "usermod",
    "nsfvpn",
    "crates/lab/src",
    "nsfast_lab",
    "PtpTopology",
    "sockmap_keys",
    "nsfast-testpeer",
];

/// What creating the lab's tenant carries (`nsfast_lab::test_user`): no shipped binary,
/// `nsfast` included, may contain it.
const USER_CREATION: &[&str] = &["useradd", "usermod", "--add-subuids", "nsfvpn"];

fn check(name: &str) {
    check_for(name, TEST_WORLD);
}

fn check_for(name: &str, strings: &[&str]) {
    let bin = nsfast_lab::bins::build_fresh(name, "NSFAST_SHIPPED_BIN_DIR");
    let bytes = std::fs::read(&bin).unwrap_or_else(|e| panic!("read {}: {e}", bin.display()));
    assert!(bytes.len() > 1 << 20, "{} is not a binary", bin.display());
    let found: Vec<&str> = strings
        .iter()
        .copied()
        .filter(|s| bytes.windows(s.len()).any(|w| w == s.as_bytes()))
        .collect();
    assert!(
        found.is_empty(),
        "{} contains test-world code: {found:?}",
        bin.display()
    );
}

#[test]
fn vpnrelay_binary_has_no_test_world() {
    check("vpnrelay");
}

#[test]
fn cni_plugin_binary_has_no_test_world() {
    check("nsfast-cni");
}

#[test]
fn nsfast_binary_has_no_user_creation() {
    check_for("nsfast", USER_CREATION);
}
