//! nsfast lab: the one place that builds throwaway worlds, for bench and the root
//! integration tests (never for product crates: they take it as a dev-dependency only;
//! `nsfast-bench` uses it by design, as a benchmark builds throwaway worlds).
//!
//! Module map:
//! - [`topology`] — the one trait of a throwaway world: probe (reason to skip), build (a guard
//!   that tears the world down on drop, in an order each implementor documents).
//! - [`name`]  — the one naming scheme (owner id `nsf<kind><pid>[x<n>]`, then `-<part>`) and
//!   who owns a name.
//! - [`cleanup`] — the one "remove what a dead run left" (`nsfast bench --cleanup`): dead bench
//!   runs', killed tests' and dead rootless worlds' objects.
//! - [`world`] — throwaway network namespaces joined by veth, cgroups, all removed on drop
//!   (also when a test panics).
//! - [`pods`]  — two hosts joined by a veth wire, with nsfast pods (`nsfast_pod::add`).
//! - [`ptp`]   — the same layout with pods of the reference CNI `ptp` plugin (bench baseline).
//! - [`bird`]  — three (or more) nodes on one L2 segment with nsfast pods and a BIRD 2 per
//!   node exchanging the pod CIDRs over BGP, with the shipped `dist/bird/bird.conf`.
//! - [`rootless`] — a real rootless world (RootlessKit + slirp4netns, run by an existing
//!   [`tenant`]) for vpnrelay's tests and the bench; [`rootless_bench`] measures in it
//!   (`nsfast-lab vpnrelay-bench`).
//! - [`tenant`] — the world's unprivileged user: an existing one, looked up and checked (not
//!   root, subordinate ids), never created (what `nsfast bench --tenant` uses).
//! - [`test_user`] — the lab's tenant `nsfvpn`, created on demand (useradd, usermod) for
//!   tests and `nsfast-lab`; nothing shipped calls it.
//! - [`shortcut`] — the sockmap shortcut on a throwaway cgroup (bench's `sockmap` topology).
//! - [`bpf`]   — BPF test objects (`bpf/tests/`), built by this crate's build script.
//! - [`bins`]  — finding (building) workspace binaries, e.g. the traffic peer, that tests run.
//! - [`peer`]  — the `nsfast-testpeer` traffic program (bulk with hashes, echo, many
//!   connections, ping-pong, half-close, FIONREAD, tagged servers) and helpers to run it.
//! - [`stream`] — a deterministic byte stream for byte-exact checks.
//! - [`kernel`] — kernel features a test expects, from the harness (env or kernel config).

pub mod bins;
pub mod bird;
pub mod bpf;
pub mod cleanup;
pub mod conform;
pub mod kernel;
pub mod name;
pub mod peer;
pub mod pods;
pub mod ptp;
pub mod rootless;
pub mod rootless_bench;
pub mod shortcut;
pub mod stream;
pub mod tenant;
pub mod test_user;
pub mod topology;
pub mod world;

/// Panics with a clear message unless running as root (root tests must never pass silently).
pub fn require_root() {
    if !nix::unistd::Uid::effective().is_root() {
        panic!("this test needs root (network namespaces, cgroups, BPF); run `make test` as root");
    }
}

/// A test size from the environment (`NSFAST_TEST_BULK_MIB`, `NSFAST_TEST_ROUNDS`, ...: the VM
/// lines shrink the host's sizes with them). Unset or not a number: `None`, the test's default.
pub fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// What TCP itself may buffer on one connection and direction in the current network
/// namespace: the sender's and the receiver's buffer maxima (`tcp_wmem[2]` + `tcp_rmem[2]`,
/// 4 MiB + 6 MiB by default).
pub fn tcp_buffers_max() -> u64 {
    let max = |name: &str| -> u64 {
        let v = std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}"))
            .unwrap_or_else(|e| panic!("read {name}: {e}"));
        v.split_whitespace()
            .last()
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("{name}: {v:?}"))
    };
    max("tcp_wmem") + max("tcp_rmem")
}

/// Waits up to `within` for `child` to end; `None` (the child is then killed and reaped) if it
/// is still running: a test that expected something else to end it fails at once, not after
/// the child's own run time.
pub fn wait_or_kill(
    child: &mut std::process::Child,
    within: std::time::Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
