//! Compiles the BPF test harnesses `bpf/tests/*.bpf.c` into `$OUT_DIR/<name>.bpf.o` (with
//! nsfast-bpf's clang module), so test objects live in the lab and never in a shipped crate.

use std::env;
use std::path::PathBuf;

#[path = "../nsfast-bpf/clang.rs"]
mod clang;

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap())
        .join("../..")
        .canonicalize()
        .unwrap();
    let bpf_dir = root.join("bpf");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-env-changed=NSFAST_CLANG");
    println!("cargo:rerun-if-changed={}", bpf_dir.join("tests").display());
    println!("cargo:rerun-if-changed={}", bpf_dir.join("lib").display());
    let Some(clang) = clang::find_clang() else {
        panic!(
            "\n\nnsfast-lab: no clang found to compile the BPF test programs in {}.\n\
             Install it with `apt-get install clang-19` (or run `make deps`), or point \
             NSFAST_CLANG at a clang binary.\n\n",
            bpf_dir.join("tests").display()
        );
    };
    let arch_inc = format!(
        "/usr/include/{}-linux-gnu",
        env::var("CARGO_CFG_TARGET_ARCH").unwrap_or("x86_64".into())
    );
    for dir in [bpf_dir.join("tests"), bpf_dir.join("lib")] {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            println!("cargo:rerun-if-changed={}", e.path().display());
        }
    }
    for e in std::fs::read_dir(bpf_dir.join("tests"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let src = e.path();
        let name = src.file_name().unwrap().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".bpf.c") {
            let obj = out.join(format!("{stem}.bpf.o"));
            clang::compile(&clang, &src, &obj, &bpf_dir, &arch_inc);
        }
    }
}
