//! Traffic peer for nsfast's integration tests (see `nsfast_testsupport::peer`).

fn main() -> std::process::ExitCode {
    nsfast_testsupport::peer::main()
}
