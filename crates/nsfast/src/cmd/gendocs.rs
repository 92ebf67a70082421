//! `nsfast __gen-docs`: man pages and shell completions generated from the clap definitions
//! (used by `make install` / `make deb`; hidden from `--help`).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Command;
use clap_complete::Shell;

/// Arguments of the hidden generator.
#[derive(clap::Args, Debug)]
pub struct GenDocsArgs {
    /// Directory for the man pages (nsfast*.8, vpnrelay.1); created if missing.
    #[arg(long, value_name = "DIR")]
    pub man_dir: Option<PathBuf>,
    /// Directory for the completions: bash/<cmd>, zsh/_<cmd>, fish/<cmd>.fish; created if
    /// missing.
    #[arg(long, value_name = "DIR")]
    pub completions_dir: Option<PathBuf>,
}

/// Writes one page for `cmd` and one per (non-hidden) subcommand at every depth, named
/// like git's (`nsfast-pod-add.8`).
fn man_pages(cmd: Command, section: &str, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    fn walk(cmd: Command, section: &str, dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned() {
            walk(sub, section, dir, out)?;
        }
        let man = clap_mangen::Man::new(cmd)
            .section(section)
            .manual("nsfast")
            .source(format!("nsfast {}", env!("CARGO_PKG_VERSION")));
        let path = man
            .generate_to(dir)
            .with_context(|| format!("writing a man page into {}", dir.display()))?;
        out.push(path);
        Ok(())
    }
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut out = Vec::new();
    walk(cmd, section, dir, &mut out)?;
    Ok(out)
}

fn completions(mut cmd: Command, dir: &Path) -> anyhow::Result<()> {
    let name = cmd.get_name().to_string();
    // File names as each shell's completion directory expects them (bash-completion loads
    // `completions/<cmd>` on demand).
    for (shell, sub, file) in [
        (Shell::Bash, "bash", name.clone()),
        (Shell::Zsh, "zsh", format!("_{name}")),
        (Shell::Fish, "fish", format!("{name}.fish")),
    ] {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        let mut buf = Vec::new();
        clap_complete::generate(shell, &mut cmd, &name, &mut buf);
        let path = d.join(file);
        std::fs::write(&path, buf).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

pub fn run(args: GenDocsArgs, nsfast: Command) -> anyhow::Result<()> {
    let vpnrelay = nsfast_vpnrelay::cli::command();
    if args.man_dir.is_none() && args.completions_dir.is_none() {
        anyhow::bail!("give --man-dir DIR and/or --completions-dir DIR");
    }
    if let Some(dir) = &args.man_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut pages = man_pages(nsfast.clone(), "8", dir)?;
        pages.extend(man_pages(vpnrelay.clone(), "1", dir)?);
        for p in pages {
            nsfast_sys::outln!("{}", p.display())?;
        }
    }
    if let Some(dir) = &args.completions_dir {
        completions(nsfast, dir)?;
        completions(vpnrelay, dir)?;
    }
    Ok(())
}
