//! Snapshots of the commands that need no root and change nothing: `--help`, `-h` with its
//! EXAMPLES, `--version` and bad usage (exit 2, one error naming the bad value and what is
//! valid), run by trycmd from the console transcripts in `tests/cmd/*.md` (`$ command`, then
//! `? CODE` and the output; `[..]` stands for what differs per build). `TRYCMD=overwrite
//! cargo test -p nsfast --test cli_snapshots` rewrites them from the real output; review the
//! diff.

#[test]
fn cli_snapshots() {
    trycmd::TestCases::new()
        .register_bin("nsfast", trycmd::cargo::cargo_bin!("nsfast"))
        .register_bin("vpnrelay", trycmd::cargo::cargo_bin!("vpnrelay"))
        .env("RUST_LOG", "warn")
        .env("COLUMNS", "100")
        .case("tests/cmd/*.md");
}
