//! Traffic peer for nsfast's integration tests (see `nsfast_lab::peer`).

fn main() -> std::process::ExitCode {
    nsfast_lab::peer::main()
}
