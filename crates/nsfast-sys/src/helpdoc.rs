//! EXAMPLES for `--help` and the man pages, written once per command as data
//! ([`Example`]) and rendered for each: plain text for clap's `after_help`
//! ([`help_text`]) and roff for the man page ([`roff_examples`], [`roff_see_also`]).
//!
//! Each CLI keeps its table beside its clap definitions (`nsfast`'s in
//! `crates/nsfast/src/cmd/examples.rs`, `vpnrelay`'s in `nsfast_vpnrelay::cli`); their tests
//! parse every example's command line with the real parser, so an example cannot name a flag
//! or value the command refuses.

/// One example: what it does and the command line (no shell operators, no quotes, so a test
/// can split it at spaces and parse it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Example {
    pub what: &'static str,
    pub cmd: &'static str,
}

/// The examples of each command, by its path (`nsfast sockmap run`).
pub type Table = &'static [(&'static str, &'static [Example])];

/// The examples of `path` in `table` (none when it has no row).
pub fn lookup(table: Table, path: &str) -> &'static [Example] {
    table
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, e)| *e)
        .unwrap_or(&[])
}

/// `Examples:` and each example as two indented lines, for clap's `after_help`.
pub fn help_text(examples: &[Example]) -> String {
    let mut s = String::from("Examples:");
    for e in examples {
        s.push_str(&format!("\n  {}:\n    {}", e.what, e.cmd));
    }
    s
}

/// `cmd` and its visible subcommands at every depth, with their examples as `after_help`.
pub fn attach(cmd: clap::Command, table: Table) -> clap::Command {
    fn walk(cmd: clap::Command, path: &str, table: Table) -> clap::Command {
        let path = format!("{path} {}", cmd.get_name()).trim().to_string();
        let subs: Vec<String> = cmd
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .map(|s| s.get_name().to_string())
            .collect();
        let mut cmd = cmd;
        for s in subs {
            cmd = cmd.mut_subcommand(&s, |c| walk(c, &path, table));
        }
        let ex = lookup(table, &path);
        if ex.is_empty() {
            cmd
        } else {
            cmd.after_help(help_text(ex))
        }
    }
    walk(cmd, "", table)
}

/// What is wrong with `table` for `cmd` (for the CLIs' tests): a visible command without
/// examples, a row for no command, an example that does not start with its command's path,
/// or one the parser refuses.
pub fn problems(cmd: &clap::Command, table: Table) -> Vec<String> {
    fn paths(cmd: &clap::Command, path: &str, out: &mut Vec<(String, clap::Command)>) {
        let path = format!("{path} {}", cmd.get_name()).trim().to_string();
        out.push((path.clone(), cmd.clone()));
        // clap's own `help` subcommand has no page of its own.
        for s in cmd
            .get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        {
            paths(s, &path, out);
        }
    }
    let mut all = Vec::new();
    let mut root = cmd.clone();
    root.build();
    paths(&root, "", &mut all);
    let mut bad = Vec::new();
    for (path, _) in &all {
        if lookup(table, path).is_empty() {
            bad.push(format!("{path}: no examples"));
        }
    }
    for (path, examples) in table {
        if !all.iter().any(|(p, _)| p == path) {
            bad.push(format!("{path}: examples for no command"));
        }
        for e in examples.iter() {
            if !(e.cmd == *path || e.cmd.starts_with(&format!("{path} "))) {
                bad.push(format!("{path}: {:?} is not an example of it", e.cmd));
            }
            if e.cmd.contains(['\'', '"', '|', '&', ';', '>', '<', '$']) {
                bad.push(format!("{path}: {:?}: no quotes or shell operators", e.cmd));
                continue;
            }
            let words: Vec<&str> = e.cmd.split(' ').filter(|w| !w.is_empty()).collect();
            if let Err(err) = root.clone().try_get_matches_from(&words) {
                let first = err
                    .to_string()
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string();
                bad.push(format!("{path}: {:?}: {first}", e.cmd));
            }
        }
    }
    bad
}

/// Text for roff: backslashes doubled, `-` as `\-` (a plain hyphen in a command), and a
/// line that would start with `.` or `'` (a request) guarded with `\&`.
pub fn roff_escape(s: &str) -> String {
    let e = s.replace('\\', "\\\\").replace('-', "\\-");
    if e.starts_with('.') || e.starts_with('\'') {
        format!("\\&{e}")
    } else {
        e
    }
}

/// The EXAMPLES section: each description, then its command in bold on a line of its own.
pub fn roff_examples(examples: &[Example]) -> String {
    let mut s = String::from(".SH EXAMPLES\n");
    for e in examples {
        s.push_str(&format!(
            ".PP\n{}:\n.RS 4\n.nf\n.B {}\n.fi\n.RE\n",
            roff_escape(e.what),
            roff_escape(e.cmd)
        ));
    }
    s
}

/// One entry of a man page's EXIT STATUS, ENVIRONMENT or FILES section: `name` (a code, a
/// variable, a path) and what it means, on the pages of the commands under `scope` (a
/// command path: `nsfast pod` is on `nsfast pod` and every page below it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ref {
    pub scope: &'static str,
    pub name: &'static str,
    pub what: &'static str,
}

/// A CLI's reference entries by section.
#[derive(Debug, Clone, Copy)]
pub struct Refs {
    pub exit_status: &'static [Ref],
    pub environment: &'static [Ref],
    pub files: &'static [Ref],
}

/// Whether a command path lies under `scope`.
pub fn in_scope(scope: &str, path: &str) -> bool {
    path == scope || path.starts_with(&format!("{scope} "))
}

/// The EXIT STATUS, ENVIRONMENT and FILES sections of the page of `path`: each entry in
/// scope as a tagged paragraph; a section without one is left out.
pub fn roff_refs(refs: &Refs, path: &str) -> String {
    let mut s = String::new();
    for (title, rows) in [
        ("EXIT STATUS", refs.exit_status),
        ("ENVIRONMENT", refs.environment),
        ("FILES", refs.files),
    ] {
        let rows: Vec<&Ref> = rows.iter().filter(|r| in_scope(r.scope, path)).collect();
        if rows.is_empty() {
            continue;
        }
        s.push_str(&format!(".SH \"{title}\"\n"));
        for r in rows {
            s.push_str(&format!(
                ".TP\n.B {}\n{}\n",
                roff_escape(r.name),
                roff_escape(r.what)
            ));
        }
    }
    s
}

/// The SEE ALSO section: `pages` (`(name, section)`) as `name(section)` references, then
/// `files` (documentation paths) one a line.
pub fn roff_see_also(pages: &[(String, String)], files: &[String]) -> String {
    // No hyphenation: a page name split across lines is not one a reader can type.
    let mut s = String::from(".SH \"SEE ALSO\"\n.nh\n");
    for (i, (n, sec)) in pages.iter().enumerate() {
        let comma = if i + 1 < pages.len() { "," } else { "" };
        s.push_str(&format!(".BR {} ({}){comma}\n", roff_escape(n), sec));
    }
    for f in files {
        s.push_str(&format!(".br\n{}\n", roff_escape(f)));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Table = &[(
        "x run",
        &[Example {
            what: "Run it",
            cmd: "x run --fast",
        }],
    )];

    #[test]
    fn reference_sections_hold_the_entries_in_scope() {
        const R: Refs = Refs {
            exit_status: &[Ref {
                scope: "x",
                name: "2",
                what: "bad usage",
            }],
            environment: &[Ref {
                scope: "x run",
                name: "X_FAST",
                what: "go-fast",
            }],
            files: &[],
        };
        let run = roff_refs(&R, "x run");
        assert!(
            run.contains(".SH \"EXIT STATUS\"\n.TP\n.B 2\nbad usage\n"),
            "{run}"
        );
        assert!(
            run.contains(".SH \"ENVIRONMENT\"\n.TP\n.B X_FAST\ngo\\-fast\n"),
            "{run}"
        );
        assert!(!run.contains("FILES"), "{run}");
        let stop = roff_refs(&R, "x stop");
        assert!(
            stop.contains("EXIT STATUS") && !stop.contains("ENVIRONMENT"),
            "{stop}"
        );
        assert!(!in_scope("x run", "x runner") && in_scope("x", "x run"));
    }

    #[test]
    fn renders_help_and_roff() {
        assert_eq!(lookup(T, "x run").len(), 1);
        assert!(lookup(T, "x stop").is_empty());
        assert_eq!(
            help_text(lookup(T, "x run")),
            "Examples:\n  Run it:\n    x run --fast"
        );
        let r = roff_examples(lookup(T, "x run"));
        assert!(r.starts_with(".SH EXAMPLES\n"), "{r}");
        assert!(r.contains(".nf\n.B x run \\-\\-fast\n.fi\n"), "{r}");
        assert_eq!(roff_escape(".x"), "\\&.x");
        let s = roff_see_also(
            &[("x".into(), "8".into()), ("x-run".into(), "8".into())],
            &["/usr/share/doc/x/README.md".into()],
        );
        assert_eq!(
            s,
            ".SH \"SEE ALSO\"\n.nh\n.BR x (8),\n.BR x\\-run (8)\n.br\n/usr/share/doc/x/README.md\n"
        );
    }
}
