//! `nsfast probe [--json] [--require LIST]`: which kernel features nsfast can use here, what
//! each one enables or which fallback is used without it, and why.

use clap::Args;

/// Arguments of `nsfast probe`.
#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// Print one JSON object (kernel release, version and a list of {name, available, reason,
    /// enables, fallback}; with --require also `required` and `missing`) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Exit 1, naming what is missing, unless every listed feature is available (for scripts:
    /// `nsfast probe --require netkit,tcx`). Unknown names exit 2 with the valid ones.
    #[arg(
        long,
        value_name = "FEATURE,...",
        value_delimiter = ',',
        value_parser = clap::builder::PossibleValuesParser::new(nsfast_sys::probe::feature_names())
    )]
    pub require: Vec<String>,
}

pub fn run(args: ProbeArgs) -> anyhow::Result<()> {
    use std::io::Write;
    let report = nsfast_sys::probe::probe_all();
    let missing: Vec<&nsfast_sys::probe::Feature> = args
        .require
        .iter()
        .filter_map(|n| report.get(n))
        .filter(|f| !f.available)
        .collect();
    let mut out = std::io::stdout().lock();
    if args.json {
        let mut doc = serde_json::to_value(&report)?;
        if !args.require.is_empty() {
            doc["required"] = serde_json::json!(args.require);
            doc["missing"] = serde_json::json!(missing.iter().map(|f| f.name).collect::<Vec<_>>());
        }
        // Through io::Error, which keeps the kind: a closed stdout stays a BrokenPipe.
        serde_json::to_writer_pretty(&mut out, &doc).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        write_table(&mut out, &report)?;
    }
    out.flush()?;
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = missing.iter().map(|f| f.name).collect();
    let details: String = missing
        .iter()
        .map(|f| format!("\n  {}: {}; without it: {}", f.name, f.reason, f.fallback))
        .collect();
    anyhow::bail!(
        "missing required kernel feature{}: {}{details}",
        if missing.len() == 1 { "" } else { "s" },
        names.join(", ")
    )
}

/// The table: a header row, then per feature its answer, what it enables (or, when missing,
/// the fallback) and the reason.
fn write_table(
    out: &mut impl std::io::Write,
    report: &nsfast_sys::probe::Report,
) -> std::io::Result<()> {
    writeln!(
        out,
        "kernel {} ({})",
        report.kernel_release, report.kernel_version
    )?;
    let rows: Vec<(&str, &str, String, &str)> = report
        .features
        .iter()
        .map(|f| {
            let (answer, what) = if f.available {
                ("yes", format!("enables: {}", f.enables))
            } else {
                ("no", format!("fallback: {}", f.fallback))
            };
            (f.name, answer, what, f.reason.as_str())
        })
        .collect();
    let w0 = rows.iter().map(|r| r.0.len()).chain([7]).max().unwrap_or(7);
    let w2 = rows
        .iter()
        .map(|r| r.2.len())
        .chain([12])
        .max()
        .unwrap_or(12);
    writeln!(
        out,
        "{:w0$}  {:9}  {:w2$}  REASON",
        "FEATURE", "AVAILABLE", "NSFAST USES"
    )?;
    for (name, answer, what, reason) in rows {
        writeln!(out, "{name:w0$}  {answer:9}  {what:w2$}  {reason}")?;
    }
    Ok(())
}
