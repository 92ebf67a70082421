//! `nsfast-cni`: the CNI plugin binary. All logic is in the `nsfast_cni` library.

fn main() -> std::process::ExitCode {
    nsfast_cni::main()
}
