//! Compiles the BPF test harnesses `bpf/tests/*.bpf.c` into `$OUT_DIR/<name>.bpf.o` (with
//! nsfast-bpf's clang module), so test objects live in the lab and never in a shipped crate.

#[path = "../nsfast-bpf/clang.rs"]
mod clang;

fn main() {
    clang::compile_dir("nsfast-lab", "tests");
}
