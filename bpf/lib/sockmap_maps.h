/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/* Maps of the sockmap shortcut, shared by the programs and their tests. */
#pragma once

#include "nsfast.h"
#include "sockmap_key.h"

#define NSF_MAX_SOCKETS 65536

/* Port filter modes (nsf_config.port_mode bits). */
#define NSF_PORTS_INCLUDE 1 /* only server ports marked NSF_PORT_INCLUDE */
/* Pod mode (set by `nsfast pod shortcut enable`, never by `nsfast sockmap run`): only sockets
 * whose network namespace is in nsf_pods take part, and the pod's host id goes into the pair
 * key, so pods of different hosts never pair. Carried in nsf_config.port_mode so the config
 * layout of plain instances is unchanged. */
#define NSF_MODE_PODS 0x10000
/* nsf_ports values */
#define NSF_PORT_INCLUDE 1
#define NSF_PORT_EXCLUDE 2

/* Per-socket flags in nsf_sk_state.flags */
#define NSF_SK_PAIRED  1
#define NSF_SK_TAINTED 2 /* this direction used the kernel path once: never redirect again */
#define NSF_SK_PEER_CACHED 4 /* nsf_sk_state.peer holds the peer's cookie */
#define NSF_SK_RX 8 /* the socket has an nsf_rx entry (a missing one was evicted) */
#define NSF_SK_REDIRECTING 16 /* this direction redirects now */
/* Set by nsf_setsockopt: the socket uses an option the shortcut cannot honour. */
#define NSF_SK_NO_SHORTCUT 32 /* set before the connection was established: never joins */
#define NSF_SK_KEEP_TCP 64    /* its sends keep TCP for good */
/* The connection's first end to establish: its peer claims it at its own ESTABLISHED, which
 * can come after this end's first sends (the handshake's last ACK still in flight, or in a
 * softirq not yet run). */
#define NSF_SK_PENDING 128

/* nsf_rx.flags */
#define NSF_RX_SPLICE 1 /* the socket was read with splice(2)/sendfile(2): never redirect into it */
#define NSF_RX_READS_MSG 2 /* a recvmsg(2)-family read of the socket returned */
#define NSF_RX_REDIR 4 /* its sender redirects (unread bytes up to sent_total may be in the shortcut queue) */
#define NSF_RX_KEEP_TCP 8 /* it reads in a way the shortcut cannot honour (MSG_WAITALL, SO_RCVLOWAT, kTLS) */

/* Pending roles */
#define NSF_ROLE_ACTIVE  1
#define NSF_ROLE_PASSIVE 2
#define NSF_POISON ((__u64)-1)

/* Counters (per-CPU array indices); keep in sync with crates/sockmap/src/stats.rs. */
enum nsf_stat {
	NSF_STAT_SOCK_ADDED = 0,
	NSF_STAT_SOCK_ADD_FAILED,
	NSF_STAT_PAIRED,
	NSF_STAT_PAIR_CONFLICT,
	NSF_STAT_REDIRECT_MSGS,
	NSF_STAT_REDIRECT_BYTES,
	NSF_STAT_PASS_MSGS,
	NSF_STAT_PASS_BYTES,
	NSF_STAT_TAINTED,
	NSF_STAT_REDIRECT_FAILED,
	NSF_STAT_SKIPPED_PORT,
	NSF_STAT_CLOSED,
	NSF_STAT_SPLICE_READERS, /* receiving sockets seen reading with splice/sendfile */
	NSF_STAT_SPLICE_PASS,    /* directions moved to TCP because their receiver splices */
	NSF_STAT_SPLICE_REFUSED, /* splice/sendfile calls refused (EINVAL): shortcut bytes unread */
	NSF_STAT_QUEUE_LIMIT,    /* times a direction moved to TCP because its receiver fell behind */
	NSF_STAT_RX_MISSING,     /* directions kept on TCP: the receiver's nsf_rx entry was missing */
	NSF_STAT_GATED_MSGS,     /* sends on TCP until the receiver is seen reading all of it */
	NSF_STAT_GATED_BYTES,
	NSF_STAT_KEPT_TCP,       /* sockets kept on TCP for an option or read flag (nsf_setsockopt, MSG_WAITALL) */
	NSF_STAT_POLICY_DENIED,  /* pod mode: directions moved to TCP because a policy change denies their connection */
	NSF_STAT_SKIPPED_SHORT,  /* connection ends kept on TCP without joining: their endpoints' recent connections gained nothing (sockmap_admit.h) */
	NSF_STAT_MAX,
};

struct nsf_config {
	__u64 cgroup_id;
	__u32 loader_pid;
	__u32 port_mode;
	__u64 started_unix;
	/* The values the read-only globals were loaded with, for `status` (the programs read
	 * the globals). */
	__u64 queue_limit;
	__u64 admit_probe_ns;
	__u32 admit_after;
	__u32 pad;
};

struct nsf_pending {
	__u64 cookie;
	__u32 role;
	__u32 tag; /* pod mode: the first end's pod slot + 1 (0: none) */
};

/* Why a connection keeps TCP (nsf_kept_event.reason). */
enum nsf_kept_reason {
	NSF_KEPT_RCVLOWAT = 1, /* SO_RCVLOWAT */
	NSF_KEPT_ZEROCOPY,     /* SO_ZEROCOPY */
	NSF_KEPT_ULP,          /* TCP_ULP (kTLS) */
	NSF_KEPT_WAITALL,      /* a read with MSG_WAITALL */
	NSF_KEPT_OOB,          /* a read with MSG_OOB */
	NSF_KEPT_SPLICE,       /* a splice(2)/sendfile(2) read */
};

struct nsf_sk_state {
	__u64 cookie;
	__u64 peer; /* valid with NSF_SK_PEER_CACHED */
	__u32 flags;
	__u32 pod_slot; /* pod mode: the socket's pod slot + 1 in nsf_pod_stats (0: none) */
	struct nsf_pair_key key;
	/* With NSF_SK_NO_SHORTCUT: who set the option and which (logged when the connection is
	 * established, the first moment its addresses are known). */
	__u32 kept_pid;
	__u32 kept_reason;
	char kept_comm[16];
	__u32 pol_gen; /* pod mode: the policy generation its connection was last allowed under */
	/* With NSF_SK_PENDING: sends made before the peer claimed this end (on TCP), and their
	 * bytes, which go into the peer's nsf_rx.sent_total once it is known. */
	__u32 early_msgs;
	__u64 early_sent;
};

/*
 * The last NSF_KEPT_SLOTS connections that kept TCP, one event per connection end and reason,
 * for `sockmap run` to log and the status commands to show. Event n (from nsf_kept_head) goes
 * to slot n % NSF_KEPT_SLOTS; its seq is n + 1 once complete (0 while written).
 */
#define NSF_KEPT_SLOTS 64

struct nsf_kept_event {
	__u64 seq;
	__u64 cookie; /* the socket that keeps TCP */
	struct nsf_pair_key key; /* its connection (ISNs included) */
	__u32 pid; /* the process that set the option or made the read (its tgid) */
	__u32 reason; /* enum nsf_kept_reason */
	char comm[16];
};

/*
 * A receiving socket's side of the shortcut (nsf_rx value, keyed by the receiver's cookie),
 * in offsets of its one sender's byte stream. The sender moves between TCP and the shortcut:
 * shortcut -> TCP at any time (tcp_bpf_recvmsg empties the shortcut queue before it reads
 * TCP's), TCP -> shortcut only when the receiver has returned from a recvmsg-family read and
 * has read everything sent so far (total_read == sent_total), because otherwise the receiver
 * would read the newer shortcut bytes first, and splice(2) never sees the shortcut queue.
 */
struct nsf_rx {
	__u64 sent_total; /* bytes the sender sent, either way (added before each redirect) */
	__u64 total_read; /* bytes the receiver's reads returned (recvmsg(2), read(2), ...) */
	__u64 s_end;      /* stream offset where the sender's last shortcut stretch ended */
	__u32 flags;      /* NSF_RX_* */
	__u32 redirects;  /* sends its sender redirected into it (what the connection gained) */
};

/* Pod mode: a pod's network namespace (nsf_pods value). */
#define NSF_POD_NO_SHORTCUT 1 /* opted out (`--no-shortcut`) or `--host-firewall`: its sockets keep the kernel path */
#define NSF_MAX_PODS 4096

struct nsf_pod {
	__u32 host_id; /* goes into nsf_pair_key.pad: pods of different hosts never pair */
	__u32 flags;   /* NSF_POD_* */
	__u32 slot;    /* index into nsf_pod_stats */
	__u32 netns_ino; /* user space's: the pod's netns inode (slot kept while it lives); never read here */
};

/* Per-pod counters (pod mode), one per-CPU value per slot. */
enum nsf_pod_stat {
	NSF_POD_PAIRED = 0,    /* connection ends of this pod that were paired */
	NSF_POD_REDIRECT_MSGS, /* sends of this pod redirected */
	NSF_POD_REDIRECT_BYTES,
	NSF_POD_FALLBACKS,     /* sockets of this pod that fell back to the kernel path */
	NSF_POD_PASS_BYTES,    /* bytes this pod's tracked sockets sent on the kernel path */
	NSF_POD_OPTED_OUT,     /* connection ends skipped because the pod opted out */
	NSF_POD_STAT_MAX,
};

struct nsf_pod_counters {
	__u64 v[NSF_POD_STAT_MAX];
};

/* All counters in one per-CPU value: the hot path updates two of them with one lookup. */
struct nsf_counters {
	__u64 v[NSF_STAT_MAX];
};

/* socket cookie -> socket */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, NSF_MAX_SOCKETS);
	__type(key, __u64);
	__type(value, __u32);
} nsf_sockhash SEC(".maps");

/* pair key -> first socket of the pair to establish (until its peer claims it) */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, NSF_MAX_SOCKETS);
	__type(key, struct nsf_pair_key);
	__type(value, struct nsf_pending);
} nsf_pending SEC(".maps");

/* socket cookie -> peer socket cookie */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 2 * NSF_MAX_SOCKETS);
	__type(key, __u64);
	__type(value, __u64);
} nsf_peers SEC(".maps");

/* receiving socket cookie -> what it was given and has read (LRU: a missing entry makes the
 * sender keep TCP and the receiver's splice refused, never a hidden byte) */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, NSF_MAX_SOCKETS);
	__type(key, __u64);
	__type(value, struct nsf_rx);
} nsf_rx SEC(".maps");

/* thread (pid_tgid) -> inside splice(2) or sendfile(2): what the splice guard acts on */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, __u32);
} nsf_splicing SEC(".maps");

/* per-socket state, reachable from sk_msg through msg->sk */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	/* BPF_F_CLONE: an accepted socket inherits its listener's state, so an option set on the
	 * listener (which the accepted socket inherits too) keeps it off the shortcut. */
	__uint(map_flags, BPF_F_NO_PREALLOC | BPF_F_CLONE);
	__type(key, int);
	__type(value, struct nsf_sk_state);
} nsf_skstate SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct nsf_counters);
} nsf_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct nsf_config);
} nsf_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NSF_KEPT_SLOTS);
	__type(key, __u32);
	__type(value, struct nsf_kept_event);
} nsf_kept SEC(".maps");

/* The number of nsf_kept events written so far. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} nsf_kept_head SEC(".maps");

/* server port -> NSF_PORT_* bits */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u16);
	__type(value, __u8);
} nsf_ports SEC(".maps");

/* pod mode: network namespace cookie -> pod */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, NSF_MAX_PODS);
	__type(key, __u64);
	__type(value, struct nsf_pod);
} nsf_pods SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NSF_MAX_PODS);
	__type(key, __u32);
	__type(value, struct nsf_pod_counters);
} nsf_pod_stats SEC(".maps");

/* The counters of pod slot tag - 1 (tag 0: not a pod). */
NSF_INLINE struct nsf_pod_counters *nsf_pod_counters(__u32 tag)
{
	__u32 slot = tag - 1;

	if (tag == 0)
		return NULL;
	return bpf_map_lookup_elem(&nsf_pod_stats, &slot);
}

/* Adds n to counter idx of pod slot tag - 1 (tag 0: nothing counted). */
NSF_INLINE void nsf_pod_count(__u32 tag, enum nsf_pod_stat idx, __u64 n)
{
	struct nsf_pod_counters *c = nsf_pod_counters(tag);

	if (c && idx < NSF_POD_STAT_MAX)
		c->v[idx] += n;
}

NSF_INLINE struct nsf_counters *nsf_counters(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&nsf_stats, &zero);
}

NSF_INLINE void nsf_count(enum nsf_stat idx, __u64 n)
{
	struct nsf_counters *c = nsf_counters();

	if (c && idx < NSF_STAT_MAX)
		c->v[idx] += n;
}

/* Records that the socket of st (cookie, its connection key) keeps TCP for reason, caused by
 * process pid/comm. */
NSF_INLINE void nsf_kept_log(const struct nsf_sk_state *st, __u64 cookie, __u32 reason, __u32 pid,
			     const char comm[16])
{
	__u32 zero = 0, slot;
	__u64 *head = bpf_map_lookup_elem(&nsf_kept_head, &zero);
	struct nsf_kept_event *e;
	__u64 n;

	if (!head)
		return;
	n = __sync_fetch_and_add(head, 1);
	slot = (__u32)(n % NSF_KEPT_SLOTS);
	e = bpf_map_lookup_elem(&nsf_kept, &slot);
	if (!e)
		return;
	e->seq = 0;
	e->cookie = cookie;
	__builtin_memcpy(&e->key, &st->key, sizeof(e->key));
	e->pid = pid;
	e->reason = reason;
	__builtin_memcpy(e->comm, comm, sizeof(e->comm));
	__sync_fetch_and_add(&e->seq, n + 1);
}

/* nsf_kept_log for the calling process (process context only: syscalls, their tracepoints). */
NSF_INLINE void nsf_kept_log_current(const struct nsf_sk_state *st, __u32 reason)
{
	char comm[16] = {};

	bpf_get_current_comm(comm, sizeof(comm));
	nsf_kept_log(st, st->cookie, reason, (__u32)(bpf_get_current_pid_tgid() >> 32), comm);
}

/* Whether connections to server port `port` take the shortcut. */
NSF_INLINE int nsf_port_allowed(__u16 port)
{
	__u32 zero = 0;
	struct nsf_config *cfg = bpf_map_lookup_elem(&nsf_config, &zero);
	__u8 *bits = bpf_map_lookup_elem(&nsf_ports, &port);
	__u8 b = bits ? *bits : 0;

	if (b & NSF_PORT_EXCLUDE)
		return 0;
	if (cfg && (cfg->port_mode & NSF_PORTS_INCLUDE))
		return (b & NSF_PORT_INCLUDE) != 0;
	return 1;
}
