//! `nsfast` — fast paths across Linux namespace and VM boundaries.
//!
//! Thin binary: argument parsing and output; the work lives in the library crates.

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
    /// Every path side by side (host, veth, routed, sockmap, ...): tables, JSON and SVG charts.
    Bench(Box<cmd::bench::BenchArgs>),
    /// Internal: one side of one `nsfast bench` measurement.
    #[command(hide = true)]
    BenchWorker(cmd::bench::WorkerArgs),
    /// Report which kernel features nsfast can use here (netkit, TCX, BPF helpers, UDP GSO/GRO,
    /// vsock transports and namespace modes), each with yes/no and the reason.
    Probe(cmd::probe::ProbeArgs),
    /// Internal: write the man pages and shell completions (`make install`).
    #[command(name = "__gen-docs", hide = true)]
    GenDocs(cmd::gendocs::GenDocsArgs),
}

fn main() -> ExitCode {
    nsfast_sys::logging::init("info");
    let cli = match Cli::from_arg_matches(&Cli::command().get_matches()) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let result = match cli.command {
        Command::Sockmap(c) => cmd::sockmap::run(c),
        Command::Vsock(c) => cmd::vsock::run(c),
        Command::Pod(c) => cmd::pod::run(c),
        Command::Bench(a) => cmd::bench::run(*a),
        Command::BenchWorker(a) => cmd::bench::worker(a),
        Command::Probe(a) => cmd::probe::run(a),
        Command::GenDocs(a) => cmd::gendocs::run(a, Cli::command()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A reader that went away (`| head`) is not an error: end quietly, as ripgrep does.
            if is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            nsfast_sys::out::errln(&format!("nsfast: error: {e:#}"));
            ExitCode::FAILURE
        }
    }
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
            },
            Cli::command(),
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
}
