//! clang for BPF, shared by the build scripts of nsfast-bpf (the shipped objects, `bpf/`) and
//! nsfast-lab (the test objects, `bpf/tests/`) through `#[path]`: [`compile_dir`] finds clang
//! (a missing clang is one clear error) and compiles a folder's `*.bpf.c`.

use std::env;
use std::path::{Path, PathBuf};
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

/// Compiles every `bpf/<sub>/*.bpf.c` (`sub` `""`: `bpf/` itself) into
/// `$OUT_DIR/<name>.bpf.o`, rebuilding when that folder, `bpf/lib` or `NSFAST_CLANG` changes.
/// Returns the objects' file names and paths, in name order. No clang: one clear error naming
/// `crate_name`'s build and how to install it.
pub fn compile_dir(crate_name: &str, sub: &str) -> Vec<(String, PathBuf)> {
    let bpf_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap())
        .join("../../bpf")
        .canonicalize()
        .unwrap();
    let src_dir = bpf_dir.join(sub);
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-env-changed=NSFAST_CLANG");
    let Some(clang) = find_clang() else {
        panic!(
            "\n\n{crate_name}: no clang found to compile the BPF programs in {}.\n\
             Install it with `apt-get install clang-19` (or run `make deps`), or point \
             NSFAST_CLANG at a clang binary.\n\n",
            src_dir.display()
        );
    };
    let arch_inc = format!(
        "/usr/include/{}-linux-gnu",
        env::var("CARGO_CFG_TARGET_ARCH").unwrap_or("x86_64".into())
    );
    let mut sources = Vec::new();
    for dir in [src_dir.clone(), bpf_dir.join("lib")] {
        println!("cargo:rerun-if-changed={}", dir.display());
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            println!("cargo:rerun-if-changed={}", p.display());
            if dir == src_dir && p.to_string_lossy().ends_with(".bpf.c") {
                sources.push(p);
            }
        }
    }
    sources.sort();
    sources
        .iter()
        .map(|src| {
            let name = src
                .file_name()
                .unwrap()
                .to_string_lossy()
                .replace(".bpf.c", ".bpf.o");
            let obj = out.join(&name);
            compile(&clang, src, &obj, &bpf_dir, &arch_inc);
            (name, obj)
        })
        .collect()
}
