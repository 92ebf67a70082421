//! Compiles every `bpf/*.bpf.c` into `$OUT_DIR/<name>.bpf.o` with clang (`-target bpf -g -O2`,
//! BTF-defined maps). A missing clang is one clear error. The test objects (`bpf/tests/`) are
//! built by crate nsfast-lab's build script (the same [`clang`] module), never shipped.

use std::env;
use std::path::PathBuf;

#[path = "clang.rs"]
mod clang;
use clang::{compile, find_clang};

use sha2::Digest;

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap())
        .join("../..")
        .canonicalize()
        .unwrap();
    let bpf_dir = root.join("bpf");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-env-changed=NSFAST_CLANG");
    println!("cargo:rerun-if-changed={}", bpf_dir.display());
    let Some(clang) = find_clang() else {
        panic!(
            "\n\nnsfast: no clang found to compile the BPF programs in {}.\n\
             Install it with `apt-get install clang-19` (or run `make deps`), or point \
             NSFAST_CLANG at a clang binary.\n\n",
            bpf_dir.display()
        );
    };
    let arch_inc = format!(
        "/usr/include/{}-linux-gnu",
        env::var("CARGO_CFG_TARGET_ARCH").unwrap_or("x86_64".into())
    );
    let mut sources = Vec::new();
    for dir in [bpf_dir.clone(), bpf_dir.join("lib")] {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            println!("cargo:rerun-if-changed={}", p.display());
            if p.to_string_lossy().ends_with(".bpf.c") {
                sources.push(p);
            }
        }
    }
    sources.sort();
    // One hash over every embedded object (name and bytes, in name order): `nsfast --version`
    // prints it, so two builds can be told apart by the BPF code they load.
    let mut hash = sha2::Sha256::new();
    for src in &sources {
        let name = src
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace(".bpf.c", ".bpf.o");
        let obj = out.join(&name);
        compile(&clang, src, &obj, &bpf_dir, &arch_inc);
        let bytes =
            std::fs::read(&obj).unwrap_or_else(|e| panic!("reading {}: {e}", obj.display()));
        hash.update(name.as_bytes());
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(&bytes);
    }
    let digest = hash.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    println!("cargo:rustc-env=NSFAST_BPF_SHA256={hex}");
}
