//! `nsfast` — fast paths across Linux namespace and VM boundaries.
//!
//! Thin binary: argument parsing and output; the work lives in the library crates.

// The doc comments of the clap types are `--help` text and the man pages, written for a
// terminal (`<dead pid>`, `[IPV6]:PORT`), not rustdoc markup.
#![allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

mod cmd;

/// `--version`: the package version, the git revision it was built from and the hash of the
/// embedded BPF objects (shared with the `vpnrelay` binary).
#[path = "version.rs"]
mod version;

#[derive(Parser, Debug)]
#[command(
    name = "nsfast",
    version = version::long(),
    about = "Fast paths across Linux namespace and VM boundaries"
)]
struct Cli {
    /// Print every listing and status as JSON (one line; with `schema_version`), like `ip -j`.
    /// Valid before or after the subcommand. (`bench --json FILE` writes the run's document
    /// to FILE; `bench -j` alone prints JSON.)
    #[arg(
        short = 'j',
        long = "json",
        global = true,
        num_args = 0,
        default_missing_value = "-",
        value_parser = clap::value_parser!(std::path::PathBuf)
    )]
    json: Option<std::path::PathBuf>,
    /// Indent the JSON (implies --json), like `ip -j -p`.
    #[arg(short = 'p', long, global = true)]
    pretty: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Same-host TCP shortcut between sockets (sockops + sk_msg), across network namespaces.
    #[command(subcommand)]
    Sockmap(cmd::sockmap::SockmapCmd),
    /// vsock relays (vsock, TCP, UNIX, hybrid vsock).
    #[command(subcommand)]
    Vsock(cmd::vsock::VsockCmd),
    /// Pods on veth/netkit pairs with BPF host routing (redirect_peer, fib + redirect_neigh).
    #[command(subcommand)]
    Pod(cmd::pod::PodCmd),
    /// Kubernetes NetworkPolicies for the host's pods (networking.k8s.io/v1): apply, list,
    /// delete, and namespace labels.
    #[command(subcommand)]
    Policy(cmd::policy::PolicyCmd),
    /// Every path side by side (host, veth, routed, sockmap, ...): tables, JSON and SVG charts.
    Bench(Box<cmd::bench::BenchArgs>),
    /// Internal: one side of one `nsfast bench` measurement.
    #[command(hide = true)]
    BenchWorker(cmd::bench::WorkerArgs),
    /// Report which kernel features nsfast can use here (netkit, TCX, BPF helpers, UDP GSO/GRO,
    /// vsock transports and namespace modes), each with yes/no and what it enables or the
    /// fallback (-v: the reason).
    Probe(cmd::probe::ProbeArgs),
    /// Print the counters of the sockmap instances and pod hosts once, in the Prometheus text
    /// format (node_exporter's textfile collector); the daemons serve theirs with
    /// --metrics-listen.
    Metrics(cmd::metrics::MetricsArgs),
    /// Internal: write the man pages and shell completions (`make install`).
    #[command(name = "__gen-docs", hide = true)]
    GenDocs(cmd::gendocs::GenDocsArgs),
}

/// The command line with every command's EXAMPLES (`cmd::examples`) in its help.
fn command() -> clap::Command {
    nsfast_sys::helpdoc::attach(Cli::command(), cmd::examples::EXAMPLES)
}

fn main() -> ExitCode {
    nsfast_sys::logging::init("info");
    let cli = match Cli::from_arg_matches(&command().get_matches()) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    if cli.json.is_some() || cli.pretty {
        cmd::output::set(nsfast_sys::out::Json { pretty: cli.pretty });
    }
    let result = match cli.command {
        Command::Sockmap(c) => cmd::sockmap::run(c),
        Command::Vsock(c) => cmd::vsock::run(c),
        Command::Pod(c) => cmd::pod::run(c),
        Command::Policy(c) => cmd::policy::run(c),
        Command::Bench(a) => cmd::bench::run(*a),
        Command::BenchWorker(a) => cmd::bench::worker(a),
        Command::Probe(a) => cmd::probe::run(a),
        Command::Metrics(a) => cmd::metrics::run(a),
        Command::GenDocs(a) => cmd::gendocs::run(a, command()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A reader that went away (`| head`) is not an error: end quietly, as ripgrep does.
            if is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            let (code, msg) = classify(&e);
            nsfast_sys::out::errln(&format!("nsfast: error: {msg}"));
            ExitCode::from(code)
        }
    }
}

/// The exit code (docs/json.md, "Exit codes": 1 failure, 2 bad usage) and the message of a
/// failed run. A permission error of a process that is not root says so first: nearly
/// everything nsfast changes (BPF programs and maps, links, namespaces) takes CAP_BPF and
/// CAP_NET_ADMIN, and a bare "Operation not permitted" does not say which of them.
fn classify(e: &anyhow::Error) -> (u8, String) {
    use nsfast_sys::report::{self, EXIT_FAILURE, EXIT_USAGE};
    let usage = e.chain().any(|c| {
        report::is_usage(c)
            || c.downcast_ref::<nsfast_pod::PodError>()
                .is_some_and(nsfast_pod::PodError::is_usage)
    });
    if usage {
        return (EXIT_USAGE, format!("{e:#}"));
    }
    if e.chain().any(|c| report::needs_root(c, report::euid())) {
        return (EXIT_FAILURE, format!("{}: {e:#}", report::NEEDS_ROOT));
    }
    (EXIT_FAILURE, format!("{e:#}"))
}

/// A usage error (exit 2) for a bad combination of values clap cannot check by itself.
pub(crate) fn usage(msg: impl Into<String>) -> anyhow::Error {
    nsfast_sys::report::Usage(msg.into()).into()
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(nsfast_sys::out::is_broken_pipe)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every visible subcommand, argument and option of `cmd` and its subcommands without a
    /// help text, as `path: name`.
    pub(crate) fn missing_help(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        let path = format!("{path} {}", cmd.get_name()).trim().to_string();
        if cmd.get_about().is_none() && path.contains(' ') {
            out.push(format!("{path}: (subcommand)"));
        }
        for a in cmd.get_arguments() {
            if a.is_hide_set() || ["help", "version"].contains(&a.get_id().as_str()) {
                continue;
            }
            if a.get_help().is_none() && a.get_long_help().is_none() {
                out.push(format!("{path}: {}", a.get_id()));
            }
        }
        for s in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            missing_help(s, &path, out);
        }
    }

    #[test]
    fn every_visible_command_and_argument_has_help() {
        let mut missing = Vec::new();
        let mut nsfast = Cli::command();
        nsfast.build();
        missing_help(&nsfast, "", &mut missing);
        let mut vpnrelay = nsfast_vpnrelay::cli::command();
        vpnrelay.build();
        missing_help(&vpnrelay, "", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:#?}");
    }

    /// Options whose value is one of a fixed set name the set, so `-h` or the shell
    /// completions offer it.
    #[test]
    fn fixed_sets_are_typed_values() {
        let mut c = command();
        c.build();
        let find = |path: &[&str], arg: &str| -> Vec<String> {
            let mut cur = &c;
            for p in path {
                cur = cur.find_subcommand(p).unwrap_or_else(|| panic!("no {p}"));
            }
            let a = cur
                .get_arguments()
                .find(|a| a.get_id() == arg)
                .unwrap_or_else(|| panic!("{path:?}: no {arg}"));
            a.get_possible_values()
                .iter()
                .map(|v| v.get_name().to_string())
                .collect()
        };
        for (path, arg, has) in [
            (&["pod", "add"][..], "mode", "netkit-l2"),
            (&["vsock", "relay"], "path", "splice"),
            (&["vsock", "relay"], "zerocopy", "auto"),
            (&["vsock", "bridge"], "path", "kernel"),
            (&["vsock", "ns", "create"], "mode", "local"),
            (&["bench"], "topologies", "sockmap"),
            (&["bench"], "workloads", "udp-stream"),
            (&["bench"], "placement", "cross-cpu"),
            (&["probe"], "require", "tcx"),
        ] {
            let v = find(path, arg);
            assert!(v.iter().any(|n| n == has), "{path:?} --{arg}: {v:?}");
        }
    }

    #[test]
    fn every_command_has_examples_that_parse() {
        let bad = nsfast_sys::helpdoc::problems(&command(), cmd::examples::EXAMPLES);
        assert!(bad.is_empty(), "{bad:#?}");
        let mut c = command();
        let help = c
            .find_subcommand_mut("sockmap")
            .and_then(|s| s.find_subcommand_mut("run"))
            .unwrap()
            .render_help()
            .to_string();
        assert!(help.contains("Examples:\n  Attach to a running slice:\n    nsfast sockmap run --slice myapp.slice"), "{help}");
    }

    #[test]
    fn version_names_the_git_revision_and_the_bpf_hash() {
        let v = version::long();
        assert!(v.starts_with(env!("CARGO_PKG_VERSION")), "{v}");
        let (_, rest) = v.split_once("(git ").expect(v);
        let (rev, rest) = rest.split_once(", bpf sha256 ").expect(v);
        assert!(!rev.is_empty(), "{v}");
        let hash = rest.strip_suffix(')').expect(v);
        assert_eq!(hash.len(), 64, "{v}");
        assert!(hash.chars().all(|c| c.is_ascii_hexdigit()), "{v}");
    }

    #[test]
    fn man_pages_and_completions_are_generated() {
        let dir = std::env::temp_dir().join(format!("nsfast-gendocs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        cmd::gendocs::run(
            cmd::gendocs::GenDocsArgs {
                man_dir: Some(dir.join("man")),
                completions_dir: Some(dir.join("comp")),
                doc_dir: cmd::gendocs::DOC_DIR.into(),
            },
            command(),
        )
        .unwrap();
        for f in [
            "man/nsfast.8",
            "man/nsfast-pod.8",
            "man/nsfast-sockmap.8",
            "man/nsfast-sockmap-run.8",
            "man/nsfast-vsock.8",
            "man/nsfast-bench.8",
            "man/nsfast-probe.8",
            "man/vpnrelay.1",
            "comp/bash/nsfast",
            "comp/zsh/_nsfast",
            "comp/fish/nsfast.fish",
            "comp/bash/vpnrelay",
            "comp/zsh/_vpnrelay",
            "comp/fish/vpnrelay.fish",
        ] {
            let p = dir.join(f);
            let len = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
            assert!(len > 100, "{} missing or empty", p.display());
        }
        // Hidden subcommands get no page.
        assert!(!dir.join("man/nsfast-bench-worker.8").exists());
        assert!(!dir.join("man/nsfast-__gen-docs.8").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Every generated page has EXAMPLES and SEE ALSO; each page SEE ALSO names exists (a
    /// generated one or dist/man's), every page is named by another, and every documentation
    /// path a page names is a file `make install` installs (README.md, docs/*.md).
    #[test]
    fn man_pages_have_examples_and_see_also_that_resolve() {
        let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let dir = std::env::temp_dir().join(format!("nsfast-seealso-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        cmd::gendocs::run(
            cmd::gendocs::GenDocsArgs {
                man_dir: Some(dir.clone()),
                completions_dir: None,
                doc_dir: cmd::gendocs::DOC_DIR.into(),
            },
            command(),
        )
        .unwrap();
        let mut pages: Vec<(String, String)> = Vec::new();
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            pages.push((
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&p).unwrap(),
            ));
        }
        for e in std::fs::read_dir(repo.join("dist/man")).unwrap() {
            let p = e.unwrap().path();
            pages.push((
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&p).unwrap(),
            ));
        }
        let names: Vec<&str> = pages.iter().map(|(n, _)| n.as_str()).collect();
        let mut named = std::collections::BTreeSet::new();
        let mut bad = Vec::new();
        for (file, text) in &pages {
            let Some((_, see)) = text
                .split_once(".SH \"SEE ALSO\"\n")
                .or_else(|| text.split_once(".SH SEE ALSO\n"))
            else {
                bad.push(format!("{file}: no SEE ALSO"));
                continue;
            };
            if !text.contains(".SH EXAMPLES\n") {
                bad.push(format!("{file}: no EXAMPLES"));
            }
            let see = see.split("\n.SH ").next().unwrap_or_default();
            for l in see.lines().filter(|l| l.starts_with(".BR ")) {
                let mut w = l[4..].split(' ');
                let n = w.next().unwrap_or_default().replace("\\-", "-");
                let sec = w
                    .next()
                    .unwrap_or_default()
                    .trim_matches(|c| "(),".contains(c));
                let target = format!("{n}.{sec}");
                if !names.contains(&target.as_str()) {
                    bad.push(format!("{file}: SEE ALSO {target}: no such page"));
                }
                named.insert(target);
            }
            let plain = text.replace("\\-", "-");
            let mut rest = plain.as_str();
            while let Some(i) = rest.find("docs/") {
                let before = &rest[..i];
                if !before.ends_with("/usr/share/doc/nsfast/") {
                    bad.push(format!(
                        "{file}: a docs/ path outside /usr/share/doc/nsfast"
                    ));
                }
                rest = &rest[i..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || "/._-".contains(c)))
                    .unwrap_or(rest.len());
                let rel = rest[..end].trim_end_matches(['.', ',']);
                if !repo.join(rel).is_file() {
                    bad.push(format!("{file}: {rel} is not in the repository"));
                }
                rest = &rest[end..];
            }
            if plain.contains("/usr/share/doc/nsfast/README.md")
                && !repo.join("README.md").is_file()
            {
                bad.push(format!("{file}: README.md"));
            }
        }
        for (file, _) in &pages {
            if !named.contains(file) {
                bad.push(format!("{file}: no page names it in SEE ALSO"));
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(bad.is_empty(), "{bad:#?}");
    }
}
