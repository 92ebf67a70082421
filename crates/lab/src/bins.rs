//! Finding the workspace binaries a test runs as separate processes.
//!
//! A test of another package cannot name this package's binaries with `CARGO_BIN_EXE_*`, so
//! [`find`] takes the path from an environment variable (VM guests: `/bin/...`) or builds the
//! binary as the workspace builds it (`cargo build --workspace --bin NAME`, the VM harness's
//! way; a no-op when it is up to date) with the running test executable's profile, so a test
//! never runs a stale copy.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

/// `$env_var` if set, else [`fresh`]`(name)`.
pub fn find(name: &str, env_var: &str) -> PathBuf {
    match std::env::var_os(env_var) {
        Some(p) => PathBuf::from(p),
        None => fresh(name),
    }
}

/// The traffic peer (`nsfast-testpeer`, this package's binary), or `$NSFAST_TESTPEER_BIN`.
pub fn testpeer() -> PathBuf {
    find("nsfast-testpeer", "NSFAST_TESTPEER_BIN")
}

/// Binary `name` of this workspace, built by cargo (once per process) with the test
/// executable's profile: `target/<profile>/<name>`. Panics when the build fails: a test never
/// passes without its binary.
pub fn fresh(name: &str) -> PathBuf {
    static BUILT: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.get(name) {
        return p.clone();
    }
    let exe = std::env::current_exe().expect("own executable");
    let profile_dir = exe
        .parent()
        .and_then(|p| p.parent())
        .expect("target/<profile>/deps/<test>");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.args(["build", "-q", "--workspace", "--bin", name]);
    if profile_dir.ends_with("release") {
        cmd.arg("--release");
    }
    let st = cmd.status().expect("running cargo build");
    assert!(st.success(), "cargo build --workspace --bin {name} failed");
    let bin = profile_dir.join(name);
    assert!(bin.is_file(), "{} missing after the build", bin.display());
    built.insert(name.to_string(), bin.clone());
    bin
}

/// Binary `name` from the folder `$dir_var` names if set (e.g. `target/release` to check what
/// `make build` made), else [`fresh`]`(name)`. For checks of the shipped binaries themselves.
pub fn build_fresh(name: &str, dir_var: &str) -> PathBuf {
    match std::env::var_os(dir_var) {
        Some(d) => PathBuf::from(d).join(name),
        None => fresh(name),
    }
}

/// The `nsfast` binary under test: `$NSFAST_BIN` (a VM guest's `/bin/nsfast`), else
/// `$NSFAST_SHIPPED_BIN_DIR/nsfast` (`make test-root`'s own build), else [`fresh`].
pub fn nsfast() -> PathBuf {
    match std::env::var_os("NSFAST_BIN") {
        Some(p) => PathBuf::from(p),
        None => build_fresh("nsfast", "NSFAST_SHIPPED_BIN_DIR"),
    }
}
