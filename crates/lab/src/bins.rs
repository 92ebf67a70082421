//! Finding the workspace binaries a test runs as separate processes.
//!
//! A test of another package cannot name this package's binaries with `CARGO_BIN_EXE_*`, so
//! [`find`] looks for them as the VM harness and `cargo test --workspace` leave them: the path
//! in an environment variable (VM guests: `/bin/...`), else next to the running test executable
//! (`target/<profile>/deps/<test>` → `target/<profile>/<name>`).

use std::path::PathBuf;

/// `name` from `$env_var`, else from the test executable's profile folder (or its own). Panics
/// with the command that builds it when it is missing: a test never passes without its peer.
pub fn find(name: &str, env_var: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env_var) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("own executable");
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    for d in [Some(dir.as_path()), dir.parent()].into_iter().flatten() {
        let p = d.join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "no {name} next to {}: build it first (`cargo build -p nsfast-lab --bin {name}`; \
         `cargo test --workspace` does), or set {env_var}",
        exe.display()
    );
}

/// The traffic peer (`nsfast-testpeer`, this package's binary), or `$NSFAST_TESTPEER_BIN`.
pub fn testpeer() -> PathBuf {
    find("nsfast-testpeer", "NSFAST_TESTPEER_BIN")
}

/// Binary `name`, freshly built by cargo as the workspace builds it (`cargo build --workspace
/// --bin NAME`, the VM harness's way; usually a no-op after `cargo build --workspace`) with the
/// test executable's profile (`target/<profile>/<name>`), or from the folder `$dir_var` names if
/// set (e.g. `target/release` to check what `make build` made). For checks of the shipped
/// binaries themselves, which must never read a stale copy.
pub fn build_fresh(name: &str, dir_var: &str) -> PathBuf {
    if let Some(d) = std::env::var_os(dir_var) {
        return PathBuf::from(d).join(name);
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
    bin
}
