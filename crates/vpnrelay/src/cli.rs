//! The `vpnrelay` command line (the binary in crates/nsfast is a one-line wrapper).

use std::os::fd::{FromRawFd, OwnedFd};
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use nsfast_sys::args::{duration, size};

use crate::config::{self, Config};

#[derive(Parser, Debug)]
#[command(
    name = "vpnrelay",
    version,
    about = "Fast VPN tunnels (WireGuard, OpenVPN/UDP) for containers under rootless Docker",
    long_about = "Moves a container's UDP tunnel traffic off rootless Docker's user-space network stack \
(slirp4netns, pasta, ...) onto host sockets with batched UDP (recvmmsg/sendmmsg, GRO/GSO). \
Runs as the Docker user: no root, setuid or file capability.\n\n\
Every VPNRELAY_* environment variable has a flag of the relay commands (see `vpnrelay \
transparent --help`); a flag wins over its variable. RUST_LOG sets the log filter.\n\n\
Refuses to run as root: run it as the user that runs rootless Docker."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the relay, clean up after every exit and restart it with backoff (5 s to 60 s);
    /// exits at once if a supervisor for BRIDGE already runs, so a cron line is enough.
    Supervise(SuperviseArgs),
    /// Run the relay in the foreground until SIGTERM/SIGINT.
    Transparent(Target),
    /// Remove a stale rule and reset the bridge's tunnel conntrack entries; does nothing while
    /// a relay for BRIDGE runs.
    Cleanup(Target),
    /// Show each relay's counters (flows, bytes, refused, per-client limit) from
    /// $XDG_RUNTIME_DIR/vpnrelay/relay-BRIDGE.stats and whether it runs.
    Status(StatusArgs),
    #[command(name = "__child", hide = true)]
    Child {
        mode: String,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(clap::Args, Debug)]
struct SuperviseArgs {
    #[command(flatten)]
    target: Target,
    /// Serve the relay's counters (what `vpnrelay status` shows) and the supervisor's
    /// restarts as Prometheus metrics at http://ADDR/metrics: PORT or :PORT (loopback,
    /// 127.0.0.1), localhost:PORT, IPV4:PORT or [IPV6]:PORT [default: no endpoint].
    #[arg(long, value_name = "ADDR",
          value_parser = nsfast_sys::metrics::listen_arg("--metrics-listen"))]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Allow --metrics-listen on an address other than loopback (the endpoint has no
    /// authentication).
    #[arg(long, requires = "metrics_listen")]
    metrics_public: bool,
}

#[derive(clap::Args, Debug)]
struct StatusArgs {
    /// Only this bridge [default: every relay with a stats file]; exits 1 unless its relay
    /// runs.
    #[arg(long, value_name = "NAME")]
    bridge: Option<String>,
    /// Print JSON (with `schema_version`) instead of a table.
    #[arg(short = 'j', long)]
    json: bool,
    /// Indent the JSON (implies --json).
    #[arg(short = 'p', long)]
    pretty: bool,
    /// The user's runtime directory (stats files under DIR/vpnrelay) [default: /run/user/UID].
    #[arg(long, env = "XDG_RUNTIME_DIR", value_name = "DIR")]
    runtime_dir: Option<std::path::PathBuf>,
}

/// `vpnrelay status`: the relays' stats files as a table or JSON. With `--bridge`, a bad
/// name is a usage error, and a bridge whose relay does not run (after its status is shown)
/// a failure, so that scripts can test it.
fn status(a: &StatusArgs) -> anyhow::Result<()> {
    if let Some(b) = &a.bridge {
        nsfast_sys::args::ifname::check("--bridge", b)
            .map_err(|e| nsfast_sys::report::Usage(e.to_string()))?;
    }
    let dir = a
        .runtime_dir
        .clone()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or_else(crate::state::runtime_dir)
        .join("vpnrelay");
    let relays = crate::state::read_status(&dir, a.bridge.as_deref())?;
    status_print(a, &dir, &relays)?;
    match &a.bridge {
        Some(b) if !relays.iter().any(|r| r.running) => {
            anyhow::bail!("the relay of bridge {b} is not running")
        }
        _ => Ok(()),
    }
}

fn status_print(
    a: &StatusArgs,
    dir: &std::path::Path,
    relays: &[crate::state::RelayStatus],
) -> anyhow::Result<()> {
    if a.json || a.pretty {
        let j = nsfast_sys::out::Json { pretty: a.pretty };
        let list: Vec<serde_json::Value> = relays.iter().map(|r| r.to_json()).collect();
        j.print(&serde_json::json!({ "relays": list }))?;
        return Ok(());
    }
    if relays.is_empty() {
        nsfast_sys::outln!("no relay stats under {}", dir.display())?;
        return Ok(());
    }
    nsfast_sys::outln!(
        "{:<18} {:<16} {:>6} {:>8} {:>8} {:>14} {:>14} {:>9}",
        "BRIDGE",
        "STATE",
        "FLOWS",
        "OPENED",
        "REFUSED",
        "UP BYTES",
        "DOWN BYTES",
        "PER-CLIENT"
    )?;
    for r in relays {
        let n = |k: &str| r.stats.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
        let state = match (r.running, r.pid) {
            (true, Some(p)) => format!("running ({p})"),
            (true, None) => "running".into(),
            (false, _) => "stopped".into(),
        };
        let per_client = r
            .stats
            .get("max_flows_per_client")
            .and_then(|v| v.as_u64())
            .map(|v| v.to_string())
            .unwrap_or_else(|| "-".into());
        nsfast_sys::outln!(
            "{:<18} {:<16} {:>6} {:>8} {:>8} {:>14} {:>14} {:>9}",
            r.bridge,
            state,
            n("flows_open"),
            n("flows_opened"),
            n("refused_handed_back") + n("refused_dropped"),
            n("up_bytes"),
            n("down_bytes"),
            per_client
        )?;
    }
    Ok(())
}

#[derive(clap::Args, Debug)]
struct Target {
    /// The Docker network's bridge inside the rootless network namespace (e.g. br-1a2b3c4d5e6f).
    #[arg(value_parser = bridge_arg)]
    bridge: String,
    /// UDP ports of the VPN servers, e.g. 51820 or 1194,51820-51830.
    #[arg(value_parser = ports_arg)]
    ports: String,
    /// Flows one client (container: its bridge port, whatever its source addresses) may hold
    /// in the relay; its further flows keep Docker's normal path (slirp4netns), so one
    /// container cannot take every slot.
    #[arg(
        long,
        env = "VPNRELAY_MAX_FLOWS_PER_CLIENT",
        default_value_t = crate::config::DEFAULT_FLOWS_PER_CLIENT as u16,
        value_parser = clap::value_parser!(u16).range(1..=crate::config::MAX_FLOWS as i64),
        value_name = "N"
    )]
    max_flows_per_client: u16,
    /// Routing table number and `ip rule` priority of the relay's rule (1-2147483647, not
    /// 253-255) [default: 4820].
    #[arg(long, env = "VPNRELAY_RULE", value_name = "N")]
    rule: Option<String>,
    /// Socket buffer request per socket: bytes, or with K/M/G (4096 to 1G) [default: 16M].
    #[arg(long, env = "VPNRELAY_SOCKBUF", value_name = "SIZE",
          value_parser = size::arg("--sockbuf", config::MIN_SOCKBUF, config::MAX_SOCKBUF))]
    sockbuf: Option<u64>,
    /// Time without traffic before a flow is closed: seconds, or with a unit such as 3m
    /// (1s to 24h) [default: 180].
    #[arg(long, env = "VPNRELAY_IDLE_TIMEOUT", value_name = "DURATION",
          value_parser = duration::arg_in("--idle-timeout", config::MIN_IDLE, config::MAX_IDLE))]
    idle_timeout: Option<std::time::Duration>,
    /// No UDP GRO on receive (single datagrams); in the variable 0, false, no, off or empty
    /// mean off, anything else on.
    #[arg(long, env = "VPNRELAY_NO_GRO", value_parser = clap::builder::FalseyValueParser::new())]
    no_gro: bool,
    /// No UDP GSO on send (single datagrams, still batched by sendmmsg).
    #[arg(long, env = "VPNRELAY_NO_GSO", value_parser = clap::builder::FalseyValueParser::new())]
    no_gso: bool,
    /// RootlessKit's state directory (child_pid; netns with --detach-netns)
    /// [default: $XDG_RUNTIME_DIR/dockerd-rootless].
    #[arg(long, env = "VPNRELAY_DOCKER_STATE", value_name = "DIR")]
    docker_state: Option<std::path::PathBuf>,
    /// The user's runtime directory (lock and stats files under DIR/vpnrelay)
    /// [default: /run/user/UID].
    #[arg(long, env = "XDG_RUNTIME_DIR", value_name = "DIR")]
    runtime_dir: Option<std::path::PathBuf>,
}

/// `<bridge>` as clap's value parser: a bad name exits 2 before anything else runs.
fn bridge_arg(s: &str) -> Result<String, String> {
    config::check_bridge(s)
        .map(|()| s.to_string())
        .map_err(|e| e.to_string())
}

/// `<ports>` as clap's value parser (the list is read again, the same way, by
/// [`Config::from_args`]).
fn ports_arg(s: &str) -> Result<String, String> {
    let ports = nsfast_sys::ports::PortList::parse("<ports>", s).map_err(|e| e.to_string())?;
    if ports.len() > config::MAX_PORTS {
        return Err(config::ConfigError::TooManyPorts(ports.len()).to_string());
    }
    Ok(s.to_string())
}

impl Target {
    /// The environment the flags stand for, as the configuration, the state lookup and the
    /// relay's own children read it: each flag's value (or its variable's, which clap
    /// already read), booleans as `1`/`0`. Unset ones are left out.
    fn env_assignments(&self) -> Vec<(&'static str, std::ffi::OsString)> {
        let mut v: Vec<(&'static str, std::ffi::OsString)> = Vec::new();
        let mut set = |k, x: Option<std::ffi::OsString>| {
            if let Some(x) = x {
                v.push((k, x));
            }
        };
        set("VPNRELAY_RULE", self.rule.clone().map(Into::into));
        set(
            "VPNRELAY_SOCKBUF",
            self.sockbuf.map(|v| size::format(v).into()),
        );
        set(
            "VPNRELAY_IDLE_TIMEOUT",
            self.idle_timeout.map(|d| duration::format(d).into()),
        );
        set(
            "VPNRELAY_NO_GRO",
            Some(if self.no_gro { "1" } else { "0" }.into()),
        );
        set(
            "VPNRELAY_NO_GSO",
            Some(if self.no_gso { "1" } else { "0" }.into()),
        );
        set(
            "VPNRELAY_DOCKER_STATE",
            self.docker_state.clone().map(Into::into),
        );
        set("XDG_RUNTIME_DIR", self.runtime_dir.clone().map(Into::into));
        v
    }

    /// Exports [`Self::env_assignments`] into this process's environment, which the
    /// configuration ([`Config::from_args`]), the state lookup and the relay's children
    /// (`transparent`, `__child`) read. Called before any thread is started.
    fn export_env(&self) {
        for (k, x) in self.env_assignments() {
            std::env::set_var(k, x);
        }
    }
}

/// The uid `uid` of our user namespace is in the initial one, by `/proc/self/uid_map`'s
/// text (`inside outside count` lines); `None` if it is not mapped.
pub fn host_uid(uid_map: &str, uid: u32) -> Option<u32> {
    uid_map.lines().find_map(|l| {
        let mut it = l.split_whitespace().map(|v| v.parse::<u64>().ok());
        let (inside, outside, count) = (it.next()??, it.next()??, it.next()??);
        let uid = u64::from(uid);
        (inside <= uid && uid < inside + count)
            .then(|| u32::try_from(outside + (uid - inside)).ok())
            .flatten()
    })
}

/// Our effective uid as the initial user namespace sees it (the relay's child runs as uid 0
/// of RootlessKit's user namespace, which is the tenant outside).
fn effective_host_uid() -> u32 {
    let euid = nix::unistd::geteuid().as_raw();
    std::fs::read_to_string("/proc/self/uid_map")
        .ok()
        .and_then(|m| host_uid(&m, euid))
        .unwrap_or(euid)
}

/// The error when started as root, or `None` for the tenant.
///
/// Everything vpnrelay reads (RootlessKit's state, its lock folder) belongs to the tenant;
/// as root it would act on files and processes the tenant controls with root's rights, and
/// it needs no privilege: the tenant owns the namespaces it joins.
pub fn refuse_root(euid: u32) -> Option<String> {
    (euid == 0).then(|| {
        "refusing to run as root (effective uid 0): vpnrelay acts on files and processes of the rootless Docker user \
(RootlessKit's state, $XDG_RUNTIME_DIR/vpnrelay) and needs no privilege; run it as that user, \
e.g. `sudo -u USER XDG_RUNTIME_DIR=/run/user/UID vpnrelay ...`, a systemd user unit or the user's crontab"
            .to_string()
    })
}

/// The clap definition (for man pages and completions).
pub fn command() -> clap::Command {
    nsfast_sys::helpdoc::attach(Cli::command(), EXAMPLES)
}

const fn ex(what: &'static str, cmd: &'static str) -> nsfast_sys::helpdoc::Example {
    nsfast_sys::helpdoc::Example { what, cmd }
}

/// EXAMPLES of every visible command, for `--help` and the man pages (vpnrelay(1)).
/// vpnrelay's EXIT STATUS, ENVIRONMENT and FILES (man page sections; see
/// [`nsfast_sys::helpdoc::Refs`]).
pub const REFS: nsfast_sys::helpdoc::Refs = {
    use nsfast_sys::helpdoc::Ref;
    const fn r(scope: &'static str, name: &'static str, what: &'static str) -> Ref {
        Ref { scope, name, what }
    }
    nsfast_sys::helpdoc::Refs {
        exit_status: &[
            r("vpnrelay", "0", "Done: a relay or supervisor stopped by SIGTERM or SIGINT, a cleanup, a status printed; a second supervisor that finds one running."),
            r("vpnrelay", "1", "Failure: the command was valid and the system said no (no RootlessKit state, no permission, a lock held by a symbolic link); the last line on stderr says what failed."),
            r("vpnrelay", "2", "Bad usage: a bad argument or VPNRELAY_* value, named with what is valid; nothing was changed."),
            r("vpnrelay status", "1 (status --bridge)", "That bridge has no stats, or its relay does not run (its status is printed first)."),
        ],
        environment: &[
            r("vpnrelay", "RUST_LOG", "Log filter; default info. Logs go to stderr."),
            r("vpnrelay", "NSFAST_LOG_FORMAT", "text (the default) or json: one JSON object per log line."),
            r("vpnrelay", "JOURNAL_STREAM", "Set by systemd. When it names stderr, log and error lines start with their syslog priority (<3> error, <4> warning, <6> info) and carry no time."),
            r("vpnrelay", "XDG_RUNTIME_DIR", "The user's runtime directory: state and stats under it, in vpnrelay/."),
            r("vpnrelay", "VPNRELAY_*", "The options' variables (VPNRELAY_RULE, VPNRELAY_SOCKBUF, VPNRELAY_IDLE_TIMEOUT, VPNRELAY_NO_GRO, VPNRELAY_NO_GSO, VPNRELAY_MAX_FLOWS_PER_CLIENT, VPNRELAY_DOCKER_STATE): see OPTIONS; an empty one is unset."),
        ],
        files: &[
            r("vpnrelay", "$XDG_RUNTIME_DIR/vpnrelay/relay-BRIDGE.stats", "The relay's counters (JSON, 0600), read by vpnrelay status."),
            r("vpnrelay", "$XDG_RUNTIME_DIR/vpnrelay/relay-BRIDGE.lock", "Held by the running relay (its PID inside); never followed through a symbolic link."),
            r("vpnrelay", "$XDG_RUNTIME_DIR/dockerd-rootless/", "RootlessKit's state (child PID), unless VPNRELAY_DOCKER_STATE names another."),
            r("vpnrelay", "~/.config/vpnrelay/BRIDGE.env", "PORTS=... for the user unit vpnrelay@BRIDGE.service."),
        ],
    }
};

pub const EXAMPLES: nsfast_sys::helpdoc::Table = &[
    (
        "vpnrelay",
        &[
            ex(
                "Relay WireGuard on UDP 51820 for bridge br-1a2b3c4d5e6f, restarted when it exits",
                "vpnrelay supervise br-1a2b3c4d5e6f 51820",
            ),
            ex("Each relay's counters", "vpnrelay status"),
        ],
    ),
    (
        "vpnrelay supervise",
        &[
            ex(
                "WireGuard and OpenVPN ports (a crontab line every minute runs one supervisor)",
                "vpnrelay supervise br-1a2b3c4d5e6f 1194,51820-51830",
            ),
            ex(
                "At most 4 flows per container, counters for Prometheus on loopback port 9466",
                "vpnrelay supervise br-1a2b3c4d5e6f 51820 --max-flows-per-client 4 --metrics-listen 9466",
            ),
        ],
    ),
    (
        "vpnrelay transparent",
        &[ex(
            "In the foreground, logging each flow",
            "vpnrelay transparent br-1a2b3c4d5e6f 51820",
        )],
    ),
    (
        "vpnrelay cleanup",
        &[ex(
            "After a crash: the stale rule and conntrack entries",
            "vpnrelay cleanup br-1a2b3c4d5e6f 51820",
        )],
    ),
    (
        "vpnrelay status",
        &[
            ex("Every relay of this user", "vpnrelay status"),
            ex("One bridge, as JSON", "vpnrelay status --bridge br-1a2b3c4d5e6f -j"),
        ],
    ),
];

/// Entry point of the `vpnrelay` binary.
pub fn main() -> ExitCode {
    main_with_version(env!("CARGO_PKG_VERSION"))
}

/// [`main`] with the version string `--version` prints.
pub fn main_with_version(version: &'static str) -> ExitCode {
    // Before any thread exists, so every thread inherits the mask and signals are taken
    // synchronously where the program checks for them.
    if let Err(e) = nsfast_sys::signals::block_termination() {
        eprintln!("vpnrelay: error: blocking signals: {e}");
        return ExitCode::FAILURE;
    }
    nsfast_sys::logging::init("info");
    let cli = match Cli::from_arg_matches(&command().version(version).get_matches()) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    if let Some(msg) = refuse_root(effective_host_uid()) {
        nsfast_sys::out::errln(&format!("vpnrelay: error: {msg}"));
        return ExitCode::FAILURE;
    }
    // Still one thread: the environment can be written safely.
    match &cli.command {
        Cmd::Supervise(SuperviseArgs { target: t, .. }) | Cmd::Transparent(t) | Cmd::Cleanup(t) => {
            t.export_env()
        }
        Cmd::Child { target, .. } => target.export_env(),
        Cmd::Status(_) => {}
    }
    let res = match cli.command {
        Cmd::Supervise(a) => config(&a.target).and_then(|c| {
            if let Some(addr) = a.metrics_listen {
                nsfast_sys::metrics::check_exposure(
                    "--metrics-listen",
                    addr,
                    a.metrics_public,
                    "--metrics-public",
                )
                .map_err(nsfast_sys::report::Usage)?;
            }
            crate::supervise::supervise(&c, a.metrics_listen)
        }),
        Cmd::Transparent(t) => config(&t).and_then(|c| crate::host::transparent(&c)),
        Cmd::Cleanup(t) => config(&t).and_then(|c| crate::host::cleanup(&c)),
        Cmd::Status(a) => status(&a),
        Cmd::Child { mode, target } => return child(&mode, &target),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.chain().any(nsfast_sys::out::is_broken_pipe) => ExitCode::SUCCESS,
        Err(e) => {
            nsfast_sys::out::errln(&format!("vpnrelay: error: {e:#}"));
            // docs/json.md, "Exit codes": 2 for a bad value, 1 for a failure.
            if e.chain().any(nsfast_sys::report::is_usage) {
                ExitCode::from(nsfast_sys::report::EXIT_USAGE)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// The configuration; a bad argument or variable is a usage error (exit 2).
fn config(t: &Target) -> anyhow::Result<Config> {
    let mut c = Config::from_args(&t.bridge, &t.ports)
        .map_err(|e| nsfast_sys::report::Usage(with_flag_name(e.to_string())))?;
    c.max_flows_per_client = usize::from(t.max_flows_per_client);
    Ok(c)
}

/// The flag that stands for each variable (see [`Target`]).
const FLAG_OF_ENV: &[(&str, &str)] = &[
    ("VPNRELAY_RULE", "--rule"),
    ("VPNRELAY_SOCKBUF", "--sockbuf"),
    ("VPNRELAY_IDLE_TIMEOUT", "--idle-timeout"),
];

/// A configuration error that names a variable (`invalid VPNRELAY_SOCKBUF="9": ...`) also
/// names its flag, which may be where the value came from.
fn with_flag_name(msg: String) -> String {
    for (var, flag) in FLAG_OF_ENV {
        if msg.starts_with(&format!("invalid {var}=")) {
            return format!("{msg} ({flag} or {var})");
        }
    }
    msg
}

fn child(mode: &str, t: &Target) -> ExitCode {
    let mode = match mode {
        "relay" => crate::child::Mode::Relay,
        "cleanup" => crate::child::Mode::Cleanup,
        _ => return ExitCode::from(2),
    };
    let Some(fd) = std::env::var(crate::host::CHILD_FD_ENV)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
        .filter(|&fd| fd > 2)
    else {
        eprintln!("vpnrelay: __child is internal: started by vpnrelay itself");
        return ExitCode::from(2);
    };
    // SAFETY: the parent passed this descriptor (its socketpair end) to us and nothing else
    // in this process owns it.
    let ctl = unsafe { OwnedFd::from_raw_fd(fd) };
    let _ = nix::fcntl::fcntl(
        &ctl,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    );
    let cfg = match config(t) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vpnrelay: error: {e}");
            return ExitCode::from(2);
        }
    };
    ExitCode::from(crate::child::run(mode, &cfg, ctl) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_has_examples_that_parse() {
        let bad = nsfast_sys::helpdoc::problems(&command(), EXAMPLES);
        assert!(bad.is_empty(), "{bad:#?}");
        let help = command()
            .find_subcommand_mut("supervise")
            .unwrap()
            .render_help()
            .to_string();
        assert!(help.contains("Examples:\n  "), "{help}");
    }

    #[test]
    fn uid_maps() {
        assert_eq!(host_uid("         0          0 4294967295\n", 0), Some(0));
        assert_eq!(
            host_uid("         0       1000          1\n", 0),
            Some(1000)
        );
        assert_eq!(host_uid("0 1000 1\n1 300000 65536\n", 5), Some(300004));
        assert_eq!(host_uid("0 1000 1\n", 7), None);
        assert_eq!(host_uid("garbage", 0), None);
        assert!(refuse_root(0).unwrap().contains("refusing to run as root"));
        assert!(refuse_root(1000).is_none());
    }

    /// Every environment variable vpnrelay reads for its relay commands.
    const ENV_VARS: &[&str] = &[
        "VPNRELAY_RULE",
        "VPNRELAY_SOCKBUF",
        "VPNRELAY_IDLE_TIMEOUT",
        "VPNRELAY_NO_GRO",
        "VPNRELAY_NO_GSO",
        "VPNRELAY_DOCKER_STATE",
        "VPNRELAY_MAX_FLOWS_PER_CLIENT",
        "XDG_RUNTIME_DIR",
    ];

    /// `--help` of each relay command names every variable as a flag's `[env: NAME=]`.
    #[test]
    fn help_names_every_env_var_as_a_flag() {
        for sub in ["supervise", "transparent", "cleanup"] {
            let mut c = command();
            let help = c
                .find_subcommand_mut(sub)
                .unwrap()
                .render_long_help()
                .to_string();
            for var in ENV_VARS {
                assert!(
                    help.contains(&format!("[env: {var}=")),
                    "vpnrelay {sub} --help does not name {var}:\n{help}"
                );
            }
        }
    }

    #[test]
    fn config_errors_name_the_flag_too() {
        assert_eq!(
            with_flag_name("invalid VPNRELAY_SOCKBUF=\"9\": bytes between 4096 and 1G".into()),
            "invalid VPNRELAY_SOCKBUF=\"9\": bytes between 4096 and 1G (--sockbuf or VPNRELAY_SOCKBUF)"
        );
        assert_eq!(with_flag_name("invalid port".into()), "invalid port");
        // Every flag named there exists.
        let c = command();
        let t = c.find_subcommand("transparent").unwrap();
        for (_, flag) in FLAG_OF_ENV {
            assert!(
                t.get_arguments().any(|a| a.get_long() == Some(&flag[2..])),
                "{flag}"
            );
        }
    }

    fn target(args: &[&str]) -> Target {
        let mut argv = vec!["vpnrelay", "transparent", "br-vpn", "51820"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv).unwrap().command {
            Cmd::Transparent(t) => t,
            c => panic!("{c:?}"),
        }
    }

    /// Sizes and durations are typed clap values (exit 2 naming the flag and the value), with
    /// the units every other command takes.
    #[test]
    fn sizes_and_durations_are_checked_by_clap() {
        let t = target(&["--sockbuf", "512KiB", "--idle-timeout", "1.5m"]);
        assert_eq!(t.sockbuf, Some(512 << 10));
        assert_eq!(t.idle_timeout, Some(std::time::Duration::from_secs(90)));
        for (flag, value) in [
            ("--sockbuf", "9"),
            ("--sockbuf", "2G"),
            ("--sockbuf", "lots"),
            ("--idle-timeout", "0"),
            ("--idle-timeout", "500ms"),
            ("--idle-timeout", "2d"),
        ] {
            let argv = ["vpnrelay", "transparent", "br-vpn", "51820", flag, value];
            let e = Cli::try_parse_from(argv).expect_err(value);
            assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{e}");
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("invalid value '{value}' for '{flag} ")),
                "{msg}"
            );
        }
    }

    /// Flags become the environment the configuration and the children read.
    #[test]
    fn flags_become_the_environment_the_relay_reads() {
        let t = target(&[
            "--rule",
            "5000",
            "--sockbuf",
            "1M",
            "--idle-timeout",
            "60",
            "--no-gso",
            "--docker-state",
            "/srv/rk",
            "--runtime-dir",
            "/run/user/1234",
        ]);
        let got: Vec<(&str, String)> = t
            .env_assignments()
            .into_iter()
            .map(|(k, v)| (k, v.into_string().unwrap()))
            .collect();
        let want: Vec<(&str, String)> = [
            ("VPNRELAY_RULE", "5000"),
            ("VPNRELAY_SOCKBUF", "1M"),
            // Validated by the shared parser and printed back in its form (60 s = 1m).
            ("VPNRELAY_IDLE_TIMEOUT", "1m"),
            ("VPNRELAY_NO_GRO", "0"),
            ("VPNRELAY_NO_GSO", "1"),
            ("VPNRELAY_DOCKER_STATE", "/srv/rk"),
            ("XDG_RUNTIME_DIR", "/run/user/1234"),
        ]
        .into_iter()
        .map(|(k, v)| (k, v.to_string()))
        .collect();
        assert_eq!(got, want);
    }
}
