//! Records the git revision (`git describe --always --dirty`, "unknown" outside git) for
//! `nsfast --version`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=NSFAST_GIT_REV");
    let rev = std::env::var("NSFAST_GIT_REV")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| git(&["describe", "--always", "--dirty"]))
        .unwrap_or_else(|| "unknown".into());
    // Re-run when HEAD moves (commit, checkout) or the index changes (add, commit).
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        for f in ["HEAD", "logs/HEAD", "index"] {
            let p = std::path::Path::new(&dir).join(f);
            if p.exists() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
    println!("cargo:rustc-env=NSFAST_GIT_REV={rev}");
}
