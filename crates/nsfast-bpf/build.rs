//! Compiles every `bpf/*.bpf.c` into `$OUT_DIR/<name>.bpf.o` with clang (`-target bpf -g -O2`,
//! BTF-defined maps). A missing clang is one clear error. The test objects (`bpf/tests/`) are
//! built by crate nsfast-lab's build script (the same [`clang`] module), never shipped.

#[path = "clang.rs"]
mod clang;

use sha2::Digest;

fn main() {
    let objects = clang::compile_dir("nsfast", "");
    // One hash over every embedded object (name and bytes, in name order): `nsfast --version`
    // prints it, so two builds can be told apart by the BPF code they load.
    let mut hash = sha2::Sha256::new();
    for (name, obj) in &objects {
        let bytes = std::fs::read(obj).unwrap_or_else(|e| panic!("reading {}: {e}", obj.display()));
        hash.update(name.as_bytes());
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(&bytes);
    }
    let digest = hash.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    println!("cargo:rustc-env=NSFAST_BPF_SHA256={hex}");
}
