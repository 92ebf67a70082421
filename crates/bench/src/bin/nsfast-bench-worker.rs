//! `nsfast-bench-worker SPEC`: the bench worker on its own (what `nsfast bench-worker` runs),
//! for this crate's tests, which measure through the runner without the nsfast binary.

fn main() {
    let Some(spec) = std::env::args().nth(1) else {
        eprintln!("usage: nsfast-bench-worker SPEC-JSON");
        std::process::exit(2);
    };
    let mut out = std::io::stdout();
    if let Err(e) = nsfast_bench::worker::run(&spec, &mut out) {
        eprintln!("nsfast-bench-worker: {e}");
        std::process::exit(1);
    }
}
