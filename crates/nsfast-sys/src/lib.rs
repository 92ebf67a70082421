//! nsfast plumbing, written once and shared by every part of nsfast.
//!
//! Module map:
//! - [`netns`]   — create, open, enter and delete network namespaces; run code or commands inside.
//! - [`cgroup`]  — find the cgroup2 mount, create/remove cgroups, move processes, cgroup ids.
//! - [`net`]     — rtnetlink through a handle bound to one namespace ([`netns::NetNs::netlink`]),
//!   split by concern: links (veth, netkit pairs, probe), addresses/routes, rules, tc, neighbours.
//! - [`args`]    — one parser each for sizes, durations, interface names (and [`ports`]:
//!   port lists such as `80,443,8000-8100`), used by every CLI and config reader.
//! - [`report`]  — an error with its causes on one line; [`logging`] — the one log setup.
//! - [`helpdoc`]  — EXAMPLES and SEE ALSO for `--help` and the man pages, from one table.
//! - [`kernel`]  — running kernel version, cached.
//! - [`bpf`]     — raw `bpf(2)` calls aya 0.14 does not expose (program query on a cgroup,
//!   netkit `BPF_LINK_CREATE`, object pin).
//! - [`signals`] — block SIGINT/SIGTERM and wait for them synchronously.
//! - [`lockfile`] — private lock files, locked with a bounded wait that SIGTERM ends and that names the holder.
//! - [`sockinfo`] — socket cookie, family, receive memory, queue sizes, TCP bytes written.
//! - [`sched`]   — CPU pinning (sched_setaffinity), allowed CPUs.
//! - [`child`]   — pre_exec helpers for children: die with the parent ([`child::die_with_parent`],
//!   one `PR_SET_PDEATHSIG` for every child nsfast starts), CPU pinning.
//! - [`syscall`] — [`syscall::cvt`]: a raw libc call's `-1`/`errno` as `io::Result`.
//! - [`cmsg`]    — control messages: an encoder into a control buffer and a bounds-checked
//!   iterator over a received one, yielding typed payloads (UDP GSO/GRO, zero-copy completions).
//! - [`procstat`] — /proc/stat per-CPU times (softirq) and /proc/PID/stat CPU time.
//! - [`probe`]   — kernel feature probe (netkit, TCX, BPF helpers, UDP GSO/GRO, vsock), each with a reason.
//! - [`vsock`]   — minimal AF_VSOCK stream sockets (listen/accept/connect) over raw syscalls.
//! - [`udp`]     — batched IPv4 UDP: recvmmsg + GRO, sendmmsg + GSO, transparent sockets, SCM_RIGHTS.
//! - [`conntrack`] — ctnetlink: dump IPv4 conntrack entries, delete by tuple.
//! - [`out`](mod@out)     — stdout output that returns errors instead of panicking (closed stdout).
//! - [`pidfd`]   — `pidfd_open(2)`: a handle on a process that a reused PID cannot redirect.
//! - [`userns`]  — join a rootless user/mount/network namespace set (RootlessKit child) before exec.
//! - [`metrics`] — Prometheus text/OpenMetrics snapshots and the `/metrics` endpoint
//!   (`--metrics-listen`).
//! - [`zerocopy`] — `MSG_ZEROCOPY` sends (SO_ZEROCOPY) and their error-queue completions.
//!
//! All `unsafe` in nsfast's plumbing lives in this crate, each block with a `// SAFETY:` note.

pub mod args;
pub mod bpf;
pub mod cgroup;
pub mod child;
pub mod cmsg;
pub mod conntrack;
pub mod helpdoc;
pub mod kernel;
pub mod lockfile;
pub mod logging;
pub mod metrics;
pub mod net;
pub mod netns;
pub mod nftables;
pub mod out;
pub mod pidfd;
pub mod ports;
pub mod probe;
pub mod procstat;
pub mod report;
pub mod sched;
pub mod signals;
pub mod sockinfo;
pub mod syscall;
pub mod systemd;
pub mod udp;
pub mod userns;
pub mod vsock;
pub mod zerocopy;
