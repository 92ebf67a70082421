//! clang for BPF: finding it and compiling one object. Shared by the build scripts of
//! nsfast-bpf (the shipped objects) and nsfast-lab (the test objects) through `#[path]`.

use std::env;
use std::path::Path;
use std::process::Command;

pub fn find_clang() -> Option<String> {
    if let Ok(c) = env::var("NSFAST_CLANG") {
        return Some(c);
    }
    for c in ["clang-19", "clang-20", "clang-18", "clang"] {
        if Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return Some(c.to_string());
        }
    }
    None
}

pub fn compile(clang: &str, src: &Path, obj: &Path, bpf_dir: &Path, arch_inc: &str) {
    let output = Command::new(clang)
        .args([
            "-target", "bpf", "-g", "-O2", "-Wall", "-Werror", "-mcpu=v3",
        ])
        .arg(format!("-I{}", bpf_dir.display()))
        .arg(format!("-I{}", bpf_dir.join("lib").display()))
        .arg(format!("-I{arch_inc}"))
        .arg("-c")
        .arg(src)
        .arg("-o")
        .arg(obj)
        .output()
        .unwrap_or_else(|e| panic!("running {clang}: {e}"));
    if !output.status.success() {
        panic!(
            "\n\nnsfast: {clang} failed on {}:\n{}\n",
            src.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
