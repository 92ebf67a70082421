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
    /// Where the documentation is installed (`make install`'s DOCDIR): the man pages name
    /// DIR/README.md and DIR/docs/*.md.
    #[arg(long, value_name = "DIR", default_value = DOC_DIR)]
    pub doc_dir: PathBuf,
}

/// The documentation folder of the Debian package.
pub const DOC_DIR: &str = "/usr/share/doc/nsfast";

/// The static pages in dist/man (installed beside the generated ones), as SEE ALSO names them.
pub const STATIC_PAGES: &[(&str, &str)] = &[("nsfast-cni", "8")];

/// The doc page of each part, by the first word after the binary's name (`pod` for `nsfast
/// pod shortcut status`); the root pages name the README and the machine-output contract.
fn doc_pages(path: &str) -> Vec<&'static str> {
    let mut words = path.split(' ');
    let root = words.next().unwrap_or_default();
    let part = words.next();
    let mut v = match (root, part) {
        ("vpnrelay", None) => vec!["README.md", "docs/vpnrelay.md", "docs/json.md"],
        ("vpnrelay", Some(_)) => vec!["docs/vpnrelay.md"],
        (_, None) => vec!["README.md", "docs/json.md", "docs/metrics.md"],
        (_, Some("sockmap")) => vec!["docs/sockmap.md"],
        (_, Some("pod")) => vec!["docs/pod.md"],
        (_, Some("vsock")) => vec!["docs/vsock.md"],
        (_, Some("bench")) => vec!["docs/bench.md"],
        (_, Some("probe")) => vec!["docs/status.md"],
        (_, Some("metrics")) => vec!["docs/metrics.md"],
        _ => vec![],
    };
    if [
        "nsfast sockmap run",
        "nsfast vsock bridge",
        "vpnrelay supervise",
    ]
    .contains(&path)
    {
        v.push("docs/metrics.md");
    }
    v
}

/// `page` with every `docs/NAME` that is not already part of a longer path written as
/// `doc_dir/docs/NAME`, where the documentation is installed.
fn installed_doc_paths(page: &str, doc_dir: &str) -> String {
    let mut out = String::with_capacity(page.len());
    let mut rest = page;
    while let Some(i) = rest.find("docs/") {
        let (before, after) = rest.split_at(i);
        out.push_str(before);
        if out.ends_with('/') {
            out.push_str("docs/");
        } else {
            out.push_str(&format!("{doc_dir}/docs/"));
        }
        rest = &after["docs/".len()..];
    }
    out.push_str(rest);
    out
}

/// Writes one page for `cmd` and one per (non-hidden) subcommand at every depth, named
/// like git's (`nsfast-pod-add.8`): clap_mangen's sections, EXIT STATUS, ENVIRONMENT and
/// FILES (`refs`, the entries in the command's scope), then EXAMPLES (`examples`, also
/// `--help`'s) and SEE ALSO (the root, the parent, the subcommands, the other roots in
/// `others`, and the part's documentation under `doc_dir`).
fn man_pages(
    cmd: Command,
    section: &str,
    dir: &Path,
    examples: nsfast_sys::helpdoc::Table,
    refs: &nsfast_sys::helpdoc::Refs,
    others: &[(String, String)],
    doc_dir: &str,
) -> anyhow::Result<Vec<PathBuf>> {
    struct Ctx<'a> {
        section: &'a str,
        dir: &'a Path,
        examples: nsfast_sys::helpdoc::Table,
        refs: &'a nsfast_sys::helpdoc::Refs,
        others: &'a [(String, String)],
        doc_dir: &'a str,
        root: String,
    }
    fn page_name(cmd: &Command) -> String {
        cmd.get_display_name()
            .unwrap_or_else(|| cmd.get_name())
            .to_string()
    }
    fn walk(
        cmd: Command,
        path: &str,
        parent: Option<&str>,
        cx: &Ctx,
        out: &mut Vec<PathBuf>,
    ) -> anyhow::Result<()> {
        let path = format!("{path} {}", cmd.get_name()).trim().to_string();
        let name = page_name(&cmd);
        let subs: Vec<Command> = cmd
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .cloned()
            .collect();
        for sub in &subs {
            walk(sub.clone(), &path, Some(&name), cx, out)?;
        }
        let mut see: Vec<(String, String)> = Vec::new();
        let mut add = |n: String, sec: &str| {
            if n != name && !see.iter().any(|(m, _)| *m == n) {
                see.push((n, sec.to_string()));
            }
        };
        add(cx.root.clone(), cx.section);
        if let Some(p) = parent {
            add(p.to_string(), cx.section);
        }
        for s in &subs {
            add(page_name(s), cx.section);
        }
        if parent.is_none() {
            for (n, sec) in cx.others {
                add(n.clone(), sec);
            }
        }
        let files: Vec<String> = doc_pages(&path)
            .into_iter()
            .map(|d| format!("{}/{d}", cx.doc_dir))
            .collect();
        let examples = nsfast_sys::helpdoc::lookup(cx.examples, &path);
        let man = clap_mangen::Man::new(cmd.clone())
            .section(cx.section)
            .manual("nsfast")
            .source(format!("nsfast {}", env!("CARGO_PKG_VERSION")));
        let mut buf = Vec::new();
        man.render_title(&mut buf)?;
        man.render_name_section(&mut buf)?;
        man.render_synopsis_section(&mut buf)?;
        man.render_description_section(&mut buf)?;
        if cmd.get_arguments().any(|a| !a.is_hide_set()) {
            man.render_options_section(&mut buf)?;
        }
        if !subs.is_empty() {
            man.render_subcommands_section(&mut buf)?;
        }
        let mut page = installed_doc_paths(&String::from_utf8_lossy(&buf), cx.doc_dir);
        page.push_str(&nsfast_sys::helpdoc::roff_refs(cx.refs, &path));
        if !examples.is_empty() {
            page.push_str(&nsfast_sys::helpdoc::roff_examples(examples));
        }
        page.push_str(&nsfast_sys::helpdoc::roff_see_also(&see, &files));
        let mut version = Vec::new();
        if cmd.get_version().is_some() || cmd.get_long_version().is_some() {
            man.render_version_section(&mut version)?;
        }
        page.push_str(&String::from_utf8_lossy(&version));
        let file = cx.dir.join(man.get_filename());
        std::fs::write(&file, page)
            .with_context(|| format!("writing the man page {}", file.display()))?;
        out.push(file);
        Ok(())
    }
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let cx = Ctx {
        section,
        dir,
        examples,
        refs,
        others,
        doc_dir,
        root: page_name(&cmd),
    };
    let mut out = Vec::new();
    walk(cmd, "", None, &cx, &mut out)?;
    Ok(out)
}

/// `cmd` without its hidden subcommands, at every depth: clap_complete's generators offer
/// hidden subcommands (`bench-worker`, `__gen-docs`) as completions, hidden arguments not.
fn without_hidden_subcommands(cmd: &Command) -> Command {
    let subs: Vec<Command> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(without_hidden_subcommands)
        .collect();
    // The generator runs once per process: leaking the few names is simpler than clap's
    // `string` feature for owned names.
    let name: &'static str = Box::leak(cmd.get_name().to_string().into_boxed_str());
    let mut c = Command::new(name)
        .args(cmd.get_arguments().cloned())
        .subcommands(subs);
    if let Some(a) = cmd.get_about() {
        c = c.about(a.clone());
    }
    c
}

fn completions(cmd: Command, dir: &Path) -> anyhow::Result<()> {
    let mut cmd = without_hidden_subcommands(&cmd);
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
        return Err(crate::usage(
            "give --man-dir DIR and/or --completions-dir DIR",
        ));
    }
    if let Some(dir) = &args.man_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let doc_dir = args.doc_dir.display().to_string();
        let page = |n: &str, s: &str| (n.to_string(), s.to_string());
        let statics = STATIC_PAGES.iter().map(|(n, s)| page(n, s));
        let for_nsfast: Vec<_> = statics.clone().chain([page("vpnrelay", "1")]).collect();
        let for_vpnrelay: Vec<_> = [page("nsfast", "8")].into_iter().chain(statics).collect();
        let mut pages = man_pages(
            nsfast.clone(),
            "8",
            dir,
            crate::cmd::examples::EXAMPLES,
            &crate::cmd::manref::REFS,
            &for_nsfast,
            &doc_dir,
        )?;
        pages.extend(man_pages(
            vpnrelay.clone(),
            "1",
            dir,
            nsfast_vpnrelay::cli::EXAMPLES,
            &nsfast_vpnrelay::cli::REFS,
            &for_vpnrelay,
            &doc_dir,
        )?);
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
