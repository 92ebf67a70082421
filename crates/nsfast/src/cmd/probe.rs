//! `nsfast probe [--json]`: which kernel features nsfast can use here, and why.

use clap::Args;

/// Arguments of `nsfast probe`.
#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// Print one JSON object (kernel release, version and a list of {name, available, reason})
    /// instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: ProbeArgs) -> anyhow::Result<()> {
    use std::io::Write;
    let report = nsfast_sys::probe::probe_all();
    let mut out = std::io::stdout().lock();
    if args.json {
        // Through io::Error, which keeps the kind: a closed stdout stays a BrokenPipe.
        serde_json::to_writer_pretty(&mut out, &report).map_err(std::io::Error::from)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(
        out,
        "kernel {} ({})",
        report.kernel_release, report.kernel_version
    )?;
    let width = report
        .features
        .iter()
        .map(|f| f.name.len())
        .max()
        .unwrap_or(0);
    for f in &report.features {
        let answer = if f.available { "yes" } else { "no " };
        writeln!(out, "{:width$}  {answer}  {}", f.name, f.reason)?;
    }
    Ok(())
}
