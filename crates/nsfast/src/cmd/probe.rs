//! `nsfast [-j] probe [--require LIST]`: which kernel features nsfast can use here, what
//! each one enables or which fallback is used without it, and why.

use clap::Args;

/// Arguments of `nsfast probe`.
#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// Exit 1, naming what is missing, unless every listed feature is available (for scripts:
    /// `nsfast probe --require netkit,tcx`). Unknown names exit 2 with the valid ones.
    #[arg(
        long,
        value_name = "FEATURE,...",
        value_delimiter = ',',
        value_parser = clap::builder::PossibleValuesParser::new(nsfast_sys::probe::feature_names())
    )]
    pub require: Vec<String>,
    /// Also print each feature's reason (what the probe saw); -j has every field too.
    #[arg(short, long)]
    pub verbose: bool,
}

/// Width the table fits in (a terminal's 80 columns leave the longest rows wrapped, not cut).
pub const WIDTH: usize = 100;

pub fn run(args: ProbeArgs) -> anyhow::Result<()> {
    use std::io::Write;
    let mut report = nsfast_sys::probe::probe_all();
    // The splice guard's probe attaches its programs for a moment: it needs the BPF object.
    report
        .features
        .push(match nsfast_bpf::sockmap_readers::probe_splice_guard() {
            Ok(()) => nsfast_sys::probe::feature(
                "splice_guard",
                true,
                "attached and detached its fentry/fexit and bpf LSM programs",
            ),
            Err(e) => nsfast_sys::probe::feature("splice_guard", false, e),
        });
    let missing: Vec<&nsfast_sys::probe::Feature> = args
        .require
        .iter()
        .filter_map(|n| report.get(n))
        .filter(|f| !f.available)
        .collect();
    let mut out = std::io::stdout().lock();
    // -j: one JSON object (kernel release, version and a list of {name, available, reason,
    // enables, fallback}; with --require also `required` and `missing`).
    if let Some(j) = crate::cmd::output::json() {
        let mut doc = serde_json::to_value(&report)?;
        if !args.require.is_empty() {
            doc["required"] = serde_json::json!(args.require);
            doc["missing"] = serde_json::json!(missing.iter().map(|f| f.name).collect::<Vec<_>>());
        }
        // Through io::Error, which keeps the kind: a closed stdout stays a BrokenPipe.
        writeln!(out, "{}", j.render(&doc)?)?;
    } else if args.require.is_empty() || args.verbose {
        write_table(&mut out, &report, args.verbose)?;
    }
    // With --require and without -v the text output is only what is missing: the error
    // below, on stderr (nothing at all when every feature is there).
    out.flush()?;
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = missing.iter().map(|f| f.name).collect();
    // One paragraph per missing feature, wrapped like the table.
    let details: String = missing
        .iter()
        .flat_map(|f| {
            let text = format!("{}: {}; without it: {}", f.name, f.reason, f.fallback);
            wrap(&text, WIDTH - 4)
                .into_iter()
                .enumerate()
                .map(|(i, l)| format!("\n{}{l}", if i == 0 { "  " } else { "    " }))
                .collect::<Vec<_>>()
        })
        .collect();
    anyhow::bail!(
        "missing required kernel feature{}: {}{details}",
        if missing.len() == 1 { "" } else { "s" },
        names.join(", ")
    )
}

/// The table: a header row, then per feature its answer and what it enables (or, when
/// missing, the fallback), wrapped to [`WIDTH`] columns; with `verbose` the reason under each.
fn write_table(
    out: &mut impl std::io::Write,
    report: &nsfast_sys::probe::Report,
    verbose: bool,
) -> std::io::Result<()> {
    writeln!(
        out,
        "kernel {} ({})",
        report.kernel_release, report.kernel_version
    )?;
    let w0 = report
        .features
        .iter()
        .map(|f| f.name.len())
        .chain([7])
        .max()
        .unwrap_or(7);
    let indent = w0 + 2 + 9 + 2;
    writeln!(out, "{:w0$}  {:9}  NSFAST USES", "FEATURE", "AVAILABLE")?;
    for f in &report.features {
        let (answer, what) = if f.available {
            ("yes", format!("enables: {}", f.enables))
        } else {
            ("no", format!("fallback: {}", f.fallback))
        };
        let mut lines = wrap(&what, WIDTH.saturating_sub(indent).max(20)).into_iter();
        writeln!(
            out,
            "{:w0$}  {answer:9}  {}",
            f.name,
            lines.next().unwrap_or_default()
        )?;
        for l in lines {
            writeln!(out, "{:indent$}{l}", "")?;
        }
        if verbose {
            for l in wrap(&format!("reason: {}", f.reason), WIDTH - 4) {
                writeln!(out, "    {l}")?;
            }
        }
    }
    Ok(())
}

/// `text` in lines of at most `width` characters, broken at spaces (a longer word gets a
/// line of its own).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut cur = String::new();
    for word in text.split_whitespace() {
        if !cur.is_empty() && cur.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(word);
    }
    if !cur.is_empty() || lines.is_empty() {
        lines.push(cur);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::wrap;

    #[test]
    fn wrap_breaks_at_spaces_within_the_width() {
        assert_eq!(wrap("a bb ccc dddd", 6), ["a bb", "ccc", "dddd"]);
        assert_eq!(wrap("toolongword x", 4), ["toolongword", "x"]);
        assert_eq!(wrap("", 10), [""]);
    }
}
