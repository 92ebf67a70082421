//! The EXIT STATUS, ENVIRONMENT and FILES sections of nsfast's man pages
//! ([`nsfast_sys::helpdoc::Refs`]), each entry on the pages of the commands it concerns.
//! The exit codes are docs/json.md's contract; a variable or file a command reads is listed
//! on that command's pages.

use nsfast_sys::helpdoc::{Ref, Refs};

const fn r(scope: &'static str, name: &'static str, what: &'static str) -> Ref {
    Ref { scope, name, what }
}

pub const REFS: Refs = Refs {
    exit_status: &[
        r("nsfast", "0", "Done: a status printed, a pod added, a daemon stopped by SIGTERM or SIGINT, output cut short by a closed stdout."),
        r("nsfast", "1", "Failure: the command was valid and the system said no (a pod that exists, a missing cgroup, a permission error, a feature probe --require names); the last line on stderr says what failed."),
        r("nsfast", "2", "Bad usage: a value or a combination of values is invalid; one error line names it and what is valid, and nothing was changed."),
    ],
    environment: &[
        r("nsfast", "RUST_LOG", "Log filter (tracing's syntax, e.g. debug or nsfast_pod=debug); default info. Logs go to stderr."),
        r("nsfast", "NSFAST_LOG_FORMAT", "text (the default) or json: one JSON object per log line (timestamp, level, fields)."),
        r("nsfast", "JOURNAL_STREAM", "Set by systemd for a service. When it names stderr, log and error lines start with their syslog priority (<3> error, <4> warning, <6> info, <7> debug) and carry no time: journald files them at that priority."),
        r("nsfast sockmap run", "NSFAST_ALLOW_SPLICE_HOLE", "1 or true: as --allow-splice-hole, run where the splice guard cannot load (see that option)."),
        r("nsfast pod shortcut enable", "NSFAST_ALLOW_SPLICE_HOLE", "1 or true: as --allow-splice-hole, enable where the splice guard cannot load (see that option)."),
        r("nsfast sockmap run", "NSFAST_SPLICE_GUARD", "off: load without the splice guard even where it could load, as on a kernel that refuses it (for tests); the run then needs --allow-splice-hole."),
        r("nsfast pod", "NSFAST_POD_ATTACH", "auto (the default), tcx or tc: how veth and uplink programs attach (tc: clsact + cls_bpf, also on kernels with TCX; tcx: an error where TCX is missing)."),
        r("nsfast pod", "NSFAST_LOCK_TIMEOUT_SECS", "How long a pod command waits for the host's lock held by another (1-86400 s; default 120); the error names the holder."),
        r("nsfast pod", "NSFAST_BPFFS", "The bpffs mount for the pins (default /sys/fs/bpf)."),
        r("nsfast pod", "NSFAST_ALLOW_PRIVATE_MOUNT_NS", "1: run in a private mount namespace, where namespace and bpffs mounts would not be seen outside (refused otherwise); for a container that shares /run/netns and /sys/fs/bpf by its own arrangement."),
        r("nsfast policy", "NSFAST_LOCK_TIMEOUT_SECS", "How long a policy change waits for the host's lock (1-86400 s; default 120)."),
        r("nsfast bench", "NSFAST_BENCH_EXPERIMENTAL", "1: offer the experimental vsock-relay-kernel topology."),
    ],
    files: &[
        r("nsfast pod", "/run/nsfast/pod/KEY/", "A host's pod records (POD.json, 0600), its lock (.lock), uplink filters (uplinks/) and the shortcut's state; KEY names the host namespace by its cookie."),
        r("nsfast pod", "/sys/fs/bpf/nsfast-pod/KEY/", "A host's pinned maps and one pinned link per attachment: removing a pin detaches."),
        r("nsfast policy", "/run/nsfast/policy/KEY/", "A host's stored NetworkPolicies and namespace labels."),
        r("nsfast sockmap run", "/etc/default/nsfast-sockmap", "Environment of nsfast-sockmap@.service (optional), e.g. NSFAST_ALLOW_SPLICE_HOLE=1."),
        r("nsfast vsock bridge", "/etc/default/nsfast-vsock-bridge", "NSFAST_VSOCK_BRIDGE_ARGS, the arguments of nsfast-vsock-bridge.service."),
    ],
};
