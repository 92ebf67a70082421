// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * nsfast sockmap shortcut: a sockops program (attached to a cgroup) puts each established
 * TCP socket into a SOCKHASH keyed by its socket cookie and pairs the two ends of a local
 * connection; an sk_msg program (attached to the SOCKHASH) redirects every send straight into
 * the peer's receive queue (BPF_F_INGRESS), skipping TCP/IP and the veth hop.
 *
 * Safety rules (see README "How the shortcut stays correct"):
 *  - everything after pairing is keyed by socket cookies, which are never reused, so a stale
 *    entry can never deliver into another connection;
 *  - a direction that sent even one message through the kernel path is tainted and never
 *    redirected again (switching TCP -> redirect could reorder bytes at the receiver);
 *  - a failed redirect falls back to the kernel path instead of dropping.
 *
 * Pod mode (NSF_MODE_PODS, `nsfast pod shortcut`): a socket takes part only if its network
 * namespace is a registered pod (nsf_pods, by netns cookie) that has not opted out; the pod's
 * host id goes into the pair key, so only two pods of the same host can pair. Every other
 * socket in the cgroup is left alone (not even put into the SOCKHASH).
 */
#include "nsfast.h"
#include <bpf/bpf_tracing.h>
#include "sockmap_key.h"
#include "sockmap_maps.h"
#include "sockmap_pair.h"
#include "sockmap_admit.h"
#include "pod_policy_rules.h"

char LICENSE[] SEC("license") = "Dual MIT/GPL";

/* Bytes a receiver may leave unread before its sender's direction moves to TCP, whose receive
 * window then holds the sender back until the receiver has read everything (user space may
 * set it). */
volatile const __u64 nsf_queue_limit = 16 << 20;

/* Admission (lib/sockmap_admit.h): after this many connections in a row between the same
 * endpoints that gained nothing, new ones keep TCP without joining (0: every connection joins;
 * user space may set it). */
volatile const __u32 nsf_admit_after = 4;
/* ... and while they do, a probe joins at most this often per endpoints (ns; user space may
 * set it). */
volatile const __u64 nsf_admit_probe_ns = 10000000;

/* Sends a pending end may make before its peer claims it; after that it is taken to have no
 * local peer (a connection leaving the host) and its direction keeps TCP. */
#define NSF_EARLY_MSGS_MAX 64

#define NSF_MAY_READ 4 /* include/linux/fs.h */
#define NSF_MSG_PEEK 2
#define NSF_MSG_OOB 1
#define NSF_MSG_WAITALL 0x100
#define NSF_SOL_SOCKET 1
#define NSF_SOL_TCP 6
#define NSF_SO_RCVLOWAT 18
#define NSF_SO_ZEROCOPY 60
#define NSF_TCP_ULP 31
#define NSF_ENOPROTOOPT 92
#define NSF_EINVAL 22

/* The kernel types the tracing programs read (CO-RE: field offsets come from the running
 * kernel's BTF at load). */
struct sock {
	/* A socket in a SOCKHASH has its psock here (sk_psock()). */
	void *sk_user_data;
} __attribute__((preserve_access_index));
struct socket {
	struct sock *sk;
} __attribute__((preserve_access_index));
struct file;

NSF_INLINE void view_from_skops(struct bpf_sock_ops *skops, struct nsf_conn_view *v, __u32 active)
{
	v->family = NSF_CTX_U32(skops, family);
	v->active = active;
	v->local_ip4 = NSF_CTX_U32(skops, local_ip4);
	v->remote_ip4 = NSF_CTX_U32(skops, remote_ip4);
	v->local_ip6[0] = NSF_CTX_U32(skops, local_ip6[0]);
	v->local_ip6[1] = NSF_CTX_U32(skops, local_ip6[1]);
	v->local_ip6[2] = NSF_CTX_U32(skops, local_ip6[2]);
	v->local_ip6[3] = NSF_CTX_U32(skops, local_ip6[3]);
	v->remote_ip6[0] = NSF_CTX_U32(skops, remote_ip6[0]);
	v->remote_ip6[1] = NSF_CTX_U32(skops, remote_ip6[1]);
	v->remote_ip6[2] = NSF_CTX_U32(skops, remote_ip6[2]);
	v->remote_ip6[3] = NSF_CTX_U32(skops, remote_ip6[3]);
	v->local_port = NSF_CTX_U32(skops, local_port); /* host order */
	/* network order in the upper half on little endian: ntohl gives the port */
	v->remote_port = bpf_ntohl(NSF_CTX_U32(skops, remote_port));
	v->snd_nxt = NSF_CTX_U32(skops, snd_nxt);
	v->rcv_nxt = NSF_CTX_U32(skops, rcv_nxt);
}

NSF_INLINE void on_established(struct bpf_sock_ops *skops, __u32 active)
{
	struct nsf_conn_view v = {};
	struct nsf_pair_key key = {};
	struct nsf_sk_state *st;
	struct bpf_sock *sk;
	__u32 role = active ? NSF_ROLE_ACTIVE : NSF_ROLE_PASSIVE;
	__u32 zero = 0, tag = 0, other_tag = 0;
	struct nsf_config *cfg;
	__u64 cookie, other_cookie = 0;
	int r;

	cfg = bpf_map_lookup_elem(&nsf_config, &zero);
	if (cfg && (cfg->port_mode & NSF_MODE_PODS)) {
		__u64 ns = bpf_get_netns_cookie(skops);
		struct nsf_pod *pod = bpf_map_lookup_elem(&nsf_pods, &ns);

		if (!pod)
			return; /* not a pod: untouched */
		if (pod->flags & NSF_POD_NO_SHORTCUT) {
			nsf_pod_count(pod->slot + 1, NSF_POD_OPTED_OUT, 1);
			return;
		}
		tag = pod->slot + 1;
		key.pad = pod->host_id;
	}
	view_from_skops(skops, &v, active);
	{
		__u32 host_id = key.pad;

		if (nsf_make_pair_key(&v, &key) != 0)
			return;
		key.pad = host_id;
	}
	sk = skops->sk;
	if (!sk)
		return;
	/* Storage exists already if a socket option hook made it (or the listener's was cloned):
	 * then the option's verdict comes first; or if the socket was in the shortcut for an
	 * earlier connection and connected again (connect(AF_UNSPEC), then connect()): that
	 * connection's state is stale, and a socket that does not join must not keep it. */
	st = bpf_sk_storage_get(&nsf_skstate, sk, 0, 0);
	if (st && st->cookie && !(st->flags & NSF_SK_NO_SHORTCUT)) {
		st->cookie = 0;
		/* An option it set then that the shortcut cannot honour is still set. */
		st->flags = st->kept_reason ? NSF_SK_NO_SHORTCUT : 0;
	}
	if (!nsf_port_allowed(key.server_port)) {
		nsf_count(NSF_STAT_SKIPPED_PORT, 1);
		return;
	}
	if (!(st && (st->flags & NSF_SK_NO_SHORTCUT))) {
		if (nsf_admit_skip(&key, active, nsf_admit_after, nsf_admit_probe_ns,
				   bpf_ktime_get_ns())) {
			nsf_count(NSF_STAT_SKIPPED_SHORT, 1);
			return;
		}
		if (!st)
			st = bpf_sk_storage_get(&nsf_skstate, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	}
	if (!st) {
		nsf_count(NSF_STAT_SOCK_ADD_FAILED, 1);
		return;
	}
	if (st->flags & NSF_SK_NO_SHORTCUT) {
		/* An option set before (or inherited from the listener) that the shortcut cannot
		 * honour: the connection keeps TCP, untouched. */
		nsf_count(NSF_STAT_KEPT_TCP, 1);
		nsf_pod_count(tag, NSF_POD_FALLBACKS, 1);
		__builtin_memcpy(&st->key, &key, sizeof(key));
		nsf_kept_log(st, bpf_get_socket_cookie(skops), st->kept_reason, st->kept_pid,
			     st->kept_comm);
		return;
	}
	cookie = bpf_get_socket_cookie(skops);
	st->cookie = cookie;
	st->flags = 0;
	st->early_msgs = 0;
	st->early_sent = 0;
	st->pod_slot = tag;
	__builtin_memcpy(&st->key, &key, sizeof(key));

	if (bpf_sock_hash_update(skops, &nsf_sockhash, &cookie, BPF_NOEXIST) != 0) {
		st->flags = NSF_SK_TAINTED;
		nsf_count(NSF_STAT_SOCK_ADD_FAILED, 1);
		nsf_pod_count(tag, NSF_POD_FALLBACKS, 1);
		return;
	}
	nsf_count(NSF_STAT_SOCK_ADDED, 1);
	{
		/* Before pairing: a peer can redirect into this socket only once it is paired. */
		struct nsf_rx rx = {};

		if (bpf_map_update_elem(&nsf_rx, &cookie, &rx, BPF_NOEXIST) == 0)
			st->flags |= NSF_SK_RX;
	}

	r = nsf_pair_tagged(&key, cookie, role, tag, &other_tag, &other_cookie);
	if (r == NSF_PAIRED) {
		/* The claimer knows its peer now (no nsf_peers entry, no lookup at its first
		 * send) and owns no map entry, so it needs no close callback: the SOCKHASH drops
		 * it by itself at close. */
		st->peer = other_cookie;
		st->flags |= NSF_SK_PAIRED | NSF_SK_PEER_CACHED;
		/* Both ends of the connection count as paired, each in its own pod. */
		nsf_pod_count(tag, NSF_POD_PAIRED, 1);
		nsf_pod_count(other_tag, NSF_POD_PAIRED, 1);
	} else if (r == NSF_PENDING) {
		/* Owns its pending entry and, once claimed, its nsf_peers entry and both ends'
		 * nsf_rx entries: removed at close. */
		st->flags |= NSF_SK_PENDING;
		bpf_sock_ops_cb_flags_set(skops,
					  skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
	} else if (st->flags & NSF_SK_RX) {
		/* Ambiguous: no peer can learn this socket's cookie, so no one redirects into it
		 * and it needs no nsf_rx entry; it has no close callback to remove one. */
		bpf_map_delete_elem(&nsf_rx, &cookie);
		st->flags &= ~NSF_SK_RX;
	}
}

NSF_INLINE void on_close(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	struct nsf_sk_state *st;

	if (!sk)
		return;
	st = bpf_sk_storage_get(&nsf_skstate, sk, 0, 0);
	if (!st || (st->flags & NSF_SK_PAIRED))
		return; /* a claimer (which enabled no close callback) owns no map entry */
	{
		struct nsf_rx *rx = bpf_map_lookup_elem(&nsf_rx, &st->cookie);
		__u64 *peer = bpf_map_lookup_elem(&nsf_peers, &st->cookie);
		__u64 n = rx ? rx->redirects : 0, pc = peer ? *peer : 0;

		if (pc) {
			/* The claimer's nsf_rx entry goes with the connection's first end, which
			 * has the close callback: nothing sends into the claimer any more, and a
			 * reader that finds no entry reads as if the peer had never redirected
			 * (its splice guard counts the queue as unread, so a splice of bytes still
			 * queued is refused and the reader reads them with read(2)). */
			rx = bpf_map_lookup_elem(&nsf_rx, &pc);
			if (rx)
				n += rx->redirects;
			bpf_map_delete_elem(&nsf_rx, &pc);
		}
		/* What the shortcut carried for this connection, both ways. */
		if (nsf_admit_after)
			nsf_admit_record(&st->key, n, bpf_ktime_get_ns());
	}
	nsf_unpair(&st->key, st->cookie);
	bpf_map_delete_elem(&nsf_rx, &st->cookie);
	nsf_count(NSF_STAT_CLOSED, 1);
}

SEC("sockops")
int nsf_sockops(struct bpf_sock_ops *skops)
{
	switch (skops->op) {
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		on_established(skops, 1);
		break;
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		on_established(skops, 0);
		break;
	case BPF_SOCK_OPS_STATE_CB:
		if (skops->args[1] == BPF_TCP_CLOSE)
			on_close(skops);
		break;
	default:
		break;
	}
	return 1;
}

/* This direction moves from the shortcut to TCP (order-safe: the receiver reads its shortcut
 * queue first). Its shortcut stretch ends at the current stream offset. */
NSF_INLINE void nsf_leave_shortcut(struct nsf_sk_state *st, struct nsf_rx *rx)
{
	if (!(st->flags & NSF_SK_REDIRECTING))
		return;
	rx->s_end = rx->sent_total;
	__sync_fetch_and_and(&rx->flags, ~NSF_RX_REDIR);
	st->flags &= ~NSF_SK_REDIRECTING;
}

/*
 * Pod mode: whether st's connection is still allowed by the host's NetworkPolicies
 * (lib/pod_policy_rules.h), checked once per policy generation: at the first send after a
 * change, as its SYN would be checked now (IPv4 and IPv6 alike).
 */
NSF_INLINE int nsf_pair_policy_ok(struct nsf_sk_state *st)
{
	__u32 gen = nsf_pol_generation();

	if (gen == st->pol_gen)
		return 1;
	if (!nsf_pol_conn_allowed(st->key.client_ip, st->key.server_ip, st->key.server_port))
		return 0;
	st->pol_gen = gen;
	return 1;
}

SEC("sk_msg")
int nsf_sk_msg(struct sk_msg_md *msg)
{
	struct bpf_sock *sk = msg->sk;
	struct nsf_counters *c;
	struct nsf_sk_state *st = NULL;
	__u64 size = msg->size;
	__u64 peer_cookie;
	struct nsf_rx *rx = NULL;
	__u32 fl;
	enum nsf_stat fallback;
	int redirected = 0, gated = 0;

	if (!sk) {
		__u32 zero = 0;

		/* Never taken in practice; referencing nsf_config here keeps it reachable (for
		 * `status`) from this program, which outlives the sockops program while redirected
		 * sockets drain, without a lookup on the hot path. */
		bpf_map_lookup_elem(&nsf_config, &zero);
		goto count;
	}
	st = bpf_sk_storage_get(&nsf_skstate, sk, 0, 0);
	if (!st || (st->flags & NSF_SK_TAINTED))
		goto count;
	if (st->flags & NSF_SK_KEEP_TCP) {
		fallback = NSF_STAT_KEPT_TCP;
		goto to_tcp_counted;
	}
	if (!(st->flags & NSF_SK_PEER_CACHED)) {
		__u64 *peer = bpf_map_lookup_elem(&nsf_peers, &st->cookie);

		if (!peer) {
			if ((st->flags & NSF_SK_PENDING) && st->early_msgs < NSF_EARLY_MSGS_MAX) {
				/* Not claimed yet: these bytes take TCP, and count as sent into
				 * the peer once it is known, so this direction redirects only
				 * after the peer has read them (the gate below). Only this
				 * socket's sends, under its lock, touch these fields. */
				st->early_msgs += 1;
				st->early_sent += size;
				gated = 1;
				goto count;
			}
			/* Not paired (the peer is not local, or left): TCP from now on. */
			st->flags |= NSF_SK_TAINTED;
			nsf_count(NSF_STAT_TAINTED, 1);
			nsf_pod_count(st->pod_slot, NSF_POD_FALLBACKS, 1);
			goto count;
		}
		/* Cookies are never reused, so the cached peer can only go stale by closing, and
		 * then the redirect below fails and falls back. */
		st->peer = *peer;
		st->flags |= NSF_SK_PEER_CACHED;
	}
	peer_cookie = st->peer;
	rx = bpf_map_lookup_elem(&nsf_rx, &peer_cookie);
	if (!rx) {
		fallback = NSF_STAT_RX_MISSING;
		goto to_tcp;
	}
	if (st->early_sent) {
		/* Before the gate reads sent_total: the bytes sent before the claim are on TCP,
		 * ahead of everything after. */
		__sync_fetch_and_add(&rx->sent_total, st->early_sent);
		st->early_sent = 0;
	}
	if (st->pod_slot && !nsf_pair_policy_ok(st)) {
		/* Denied now: TCP for good, where the pod programs drop what the policies deny. */
		fallback = NSF_STAT_POLICY_DENIED;
		goto to_tcp;
	}
	fl = rx->flags;
	if (fl & NSF_RX_SPLICE) {
		fallback = NSF_STAT_SPLICE_PASS;
		goto to_tcp;
	}
	if (fl & NSF_RX_KEEP_TCP) {
		fallback = NSF_STAT_KEPT_TCP;
		goto to_tcp_counted;
	}
	if (!(st->flags & NSF_SK_REDIRECTING)) {
		if (!(fl & NSF_RX_READS_MSG) || rx->sent_total != rx->total_read) {
			gated = 1;
			goto on_tcp;
		}
		st->flags |= NSF_SK_REDIRECTING;
		__sync_fetch_and_or(&rx->flags, NSF_RX_REDIR);
	} else if (rx->sent_total - rx->total_read + size > nsf_queue_limit) {
		/* The receiver fell behind: TCP's receive window holds the sender back until it
		 * has read everything, then this direction redirects again. */
		nsf_leave_shortcut(st, rx);
		nsf_count(NSF_STAT_QUEUE_LIMIT, 1);
		gated = 1;
		goto on_tcp;
	}
	/* Counted before the redirect and the receiver's splice flag read after it, both with
	 * full barriers (fetching atomics): either this send sees the flag and keeps TCP, or the
	 * splice guard sees these bytes unread and refuses the splice. */
	__sync_fetch_and_add(&rx->sent_total, size);
	if (__sync_fetch_and_or(&rx->flags, 0) & NSF_RX_SPLICE) {
		__sync_fetch_and_sub(&rx->sent_total, size);
		fallback = NSF_STAT_SPLICE_PASS;
		goto to_tcp;
	}
	if (bpf_msg_redirect_hash(msg, &nsf_sockhash, &peer_cookie, BPF_F_INGRESS) != SK_PASS) {
		/* The peer left the map (closed): fall back to TCP rather than dropping. */
		__sync_fetch_and_sub(&rx->sent_total, size);
		fallback = NSF_STAT_REDIRECT_FAILED;
		goto to_tcp;
	}
	redirected = 1;
	/* Only this socket sends into rx's, under its socket lock. */
	rx->redirects += 1;
	goto count;
to_tcp:
	nsf_count(fallback, 1);
	nsf_pod_count(st->pod_slot, NSF_POD_FALLBACKS, 1);
to_tcp_counted:
	/* For good: this direction never redirects again. */
	st->flags |= NSF_SK_TAINTED;
	if (rx)
		nsf_leave_shortcut(st, rx);
on_tcp:
	if (rx)
		__sync_fetch_and_add(&rx->sent_total, size);
count:
	if (st && st->pod_slot) {
		struct nsf_pod_counters *pc = nsf_pod_counters(st->pod_slot);

		if (pc) {
			if (redirected) {
				pc->v[NSF_POD_REDIRECT_MSGS] += 1;
				pc->v[NSF_POD_REDIRECT_BYTES] += size;
			} else {
				pc->v[NSF_POD_PASS_BYTES] += size;
			}
		}
	}
	c = nsf_counters();
	if (c) {
		if (redirected) {
			c->v[NSF_STAT_REDIRECT_MSGS] += 1;
			c->v[NSF_STAT_REDIRECT_BYTES] += size;
		} else {
			if (gated) {
				c->v[NSF_STAT_GATED_MSGS] += 1;
				c->v[NSF_STAT_GATED_BYTES] += size;
			}
			c->v[NSF_STAT_PASS_MSGS] += 1;
			c->v[NSF_STAT_PASS_BYTES] += size;
		}
	}
	return SK_PASS;
}

/*
 * Readers. recvmsg(2), read(2) and the rest of that family read the shortcut queue first, then
 * TCP's; splice(2) and sendfile(2) from a TCP socket read TCP's receive queue only
 * (tcp_read_sock), never the shortcut queue. So:
 *  - a sender redirects only into a receiver seen returning from a recvmsg-family read, once it
 *    has read everything sent so far (nsf_sk_msg), so a reader that only splices keeps TCP;
 *  - a socket seen splicing gets NSF_RX_SPLICE, and its peer's next send moves that direction
 *    to TCP for good;
 *  - where the bpf LSM runs, the guard refuses (EINVAL) a splice or sendfile from a socket
 *    whose shortcut queue holds bytes: splice would miss them and return later bytes first.
 *    EINVAL is what splice(2) returns for a file that cannot splice; Go's io.Copy, HAProxy and
 *    nsfast's relay then read with read(2), which returns the queued bytes first.
 */
NSF_INLINE struct nsf_rx *nsf_rx_of(struct nsf_sk_state *st)
{
	return bpf_map_lookup_elem(&nsf_rx, &st->cookie);
}

/* What waits in the shortcut queue of rx's socket (read after a full barrier): everything
 * unread while its sender redirects, else what is unread of its last shortcut stretch. */
NSF_INLINE __u64 nsf_rx_unread(struct nsf_rx *rx)
{
	__u32 fl = __sync_fetch_and_or(&rx->flags, 0);
	__u64 read = rx->total_read;
	__s64 n;

	if (fl & NSF_RX_REDIR)
		n = (__s64)(rx->sent_total - read);
	else
		n = (__s64)(rx->s_end - read);
	return n > 0 ? (__u64)n : 0;
}

/* Marks st's socket as a splice reader; returns its unread shortcut bytes (1 when its nsf_rx
 * entry was evicted: unknown counts as unread). */
NSF_INLINE __u64 nsf_mark_splice(struct nsf_sk_state *st)
{
	struct nsf_rx *rx = nsf_rx_of(st);

	if (!rx)
		return (st->flags & NSF_SK_RX) ? 1 : 0;
	if (!(__sync_fetch_and_or(&rx->flags, NSF_RX_SPLICE) & NSF_RX_SPLICE)) {
		nsf_count(NSF_STAT_SPLICE_READERS, 1);
		nsf_kept_log_current(st, NSF_KEPT_SPLICE);
	}
	return nsf_rx_unread(rx);
}

/* A recvmsg-family read of sk returned ret (bytes, or a negative errno). */
NSF_INLINE void nsf_rx_account(struct sock *sk, int ret, int flags)
{
	struct nsf_sk_state *st;
	struct nsf_rx *rx;

	/* Every read of every socket on the host passes here: one that was never in a SOCKHASH
	 * (no psock; a redirect can only target a socket with one) leaves at once. */
	if (!sk->sk_user_data)
		return;
	st = bpf_sk_storage_get(&nsf_skstate, sk, 0, 0);
	if (!st)
		return;
	rx = nsf_rx_of(st);
	if (!rx)
		return;
	if (ret > 0 && !(flags & NSF_MSG_PEEK))
		__sync_fetch_and_add(&rx->total_read, (__u64)ret);
	if (flags & (NSF_MSG_WAITALL | NSF_MSG_OOB)) {
		/* The shortcut's queue returns what it holds without waiting for the rest and has
		 * no urgent byte: a receiver that reads this way keeps TCP. Seen before its first
		 * read returns, its sender has not redirected yet. */
		if (!(__sync_fetch_and_or(&rx->flags, NSF_RX_KEEP_TCP) & NSF_RX_KEEP_TCP)) {
			nsf_count(NSF_STAT_KEPT_TCP, 1);
			nsf_kept_log_current(st, (flags & NSF_MSG_OOB) ? NSF_KEPT_OOB
								       : NSF_KEPT_WAITALL);
		}
	}
	if (!(rx->flags & NSF_RX_READS_MSG))
		__sync_fetch_and_or(&rx->flags, NSF_RX_READS_MSG);
}

/*
 * Socket options the shortcut cannot honour: SO_RCVLOWAT (the shortcut's queue is readable at
 * one byte), TCP_ULP (kTLS must see the bytes as TCP does) and SO_ZEROCOPY (a send through
 * the shortcut is copied and gets no completion). Set before the connection is established
 * (or on its listener), the connection never joins; set on a connection in the shortcut,
 * the directions it concerns move to TCP for good. SO_ZEROCOPY there is refused with
 * ENOPROTOOPT, as a kernel without zero-copy answers (its sends cannot leave the shortcut's
 * copy path), so the application copies as it would there.
 */
SEC("cgroup/setsockopt")
int nsf_setsockopt(struct bpf_sockopt *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	struct nsf_sk_state *st;
	struct nsf_rx *rx;
	__s32 level = ctx->level, name = ctx->optname;
	int in = 0, out = 0, zc = 0;
	__u32 reason;

	if (!sk)
		return 1;
	if (level == NSF_SOL_SOCKET && name == NSF_SO_RCVLOWAT) {
		in = 1;
		reason = NSF_KEPT_RCVLOWAT;
	} else if (level == NSF_SOL_SOCKET && name == NSF_SO_ZEROCOPY) {
		out = zc = 1;
		reason = NSF_KEPT_ZEROCOPY;
	} else if (level == NSF_SOL_TCP && name == NSF_TCP_ULP) {
		in = out = 1;
		reason = NSF_KEPT_ULP;
	} else {
		return 1;
	}
	if (sk->protocol != 6 /* IPPROTO_TCP */)
		return 1;
	st = bpf_sk_storage_get(&nsf_skstate, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st)
		return 1;
	if (!st->cookie) {
		/* Not (yet) in the shortcut: it never joins. */
		if (!(st->flags & NSF_SK_NO_SHORTCUT)) {
			st->flags |= NSF_SK_NO_SHORTCUT;
			st->kept_pid = (__u32)(bpf_get_current_pid_tgid() >> 32);
			st->kept_reason = reason;
			bpf_get_current_comm(st->kept_comm, sizeof(st->kept_comm));
		}
		return 1;
	}
	if (zc) {
		bpf_set_retval(-NSF_ENOPROTOOPT);
		return 0;
	}
	if (!st->kept_reason) {
		/* The option stays set: should the socket connect again, it does not join. */
		st->kept_pid = (__u32)(bpf_get_current_pid_tgid() >> 32);
		st->kept_reason = reason;
		bpf_get_current_comm(st->kept_comm, sizeof(st->kept_comm));
	}
	if (out && !(st->flags & NSF_SK_KEEP_TCP)) {
		st->flags |= NSF_SK_KEEP_TCP;
		nsf_count(NSF_STAT_KEPT_TCP, 1);
		nsf_kept_log_current(st, reason);
	}
	rx = nsf_rx_of(st);
	if (in && rx && !(__sync_fetch_and_or(&rx->flags, NSF_RX_KEEP_TCP) & NSF_RX_KEEP_TCP)) {
		nsf_count(NSF_STAT_KEPT_TCP, 1);
		if (!out)
			nsf_kept_log_current(st, reason);
	}
	return 1;
}

/* sock_recvmsg()'s tracepoint (Linux 6.5 and later)... */
SEC("tp_btf/sock_recv_length")
int BPF_PROG(nsf_rx_read_tp, struct sock *sk, int ret, int flags)
{
	nsf_rx_account(sk, ret, flags);
	return 0;
}

/* ... or its return, where the tracepoint is missing. */
SEC("fexit/sock_recvmsg")
int BPF_PROG(nsf_rx_read_fexit, struct socket *sock, void *m, int flags, int ret)
{
	struct sock *sk = sock->sk;

	if (sk)
		nsf_rx_account(sk, ret, flags);
	return 0;
}

/* Marks the calling thread as inside splice(2)/sendfile(2) until the call returns. */
NSF_INLINE void nsf_splicing_enter(void)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 one = 1;

	bpf_map_update_elem(&nsf_splicing, &id, &one, BPF_ANY);
}

NSF_INLINE void nsf_splicing_exit(void)
{
	__u64 id = bpf_get_current_pid_tgid();

	bpf_map_delete_elem(&nsf_splicing, &id);
}

SEC("fentry/do_splice")
int BPF_PROG(nsf_splice_enter)
{
	nsf_splicing_enter();
	return 0;
}

SEC("fexit/do_splice")
int BPF_PROG(nsf_splice_exit)
{
	nsf_splicing_exit();
	return 0;
}

/* Attached to the architecture's sendfile64 syscall entry point (user space names it). */
SEC("fentry/sendfile")
int BPF_PROG(nsf_sendfile_enter)
{
	nsf_splicing_enter();
	return 0;
}

SEC("fexit/sendfile")
int BPF_PROG(nsf_sendfile_exit)
{
	nsf_splicing_exit();
	return 0;
}

/* Every splice/sendfile read of a TCP socket passes here. */
SEC("fentry/tcp_splice_read")
int BPF_PROG(nsf_splice_seen, struct socket *sock)
{
	struct nsf_sk_state *st;
	struct sock *sk = sock->sk;

	if (!sk)
		return 0;
	st = bpf_sk_storage_get(&nsf_skstate, sk, 0, 0);
	if (st)
		nsf_mark_splice(st);
	return 0;
}

/* rw_verify_area() asks this before splice(2)/sendfile(2) read from a file, and before the
 * read takes anything. */
SEC("lsm/file_permission")
int BPF_PROG(nsf_splice_guard, struct file *file, int mask, int ret)
{
	struct nsf_sk_state *st;
	struct socket *sock;
	struct sock *sk;
	__u64 id;

	if (ret != 0 || !(mask & NSF_MAY_READ))
		return ret;
	sock = bpf_sock_from_file(file);
	if (!sock)
		return 0;
	sk = sock->sk;
	if (!sk)
		return 0;
	st = bpf_sk_storage_get(&nsf_skstate, sk, 0, 0);
	if (!st)
		return 0;
	id = bpf_get_current_pid_tgid();
	if (!bpf_map_lookup_elem(&nsf_splicing, &id))
		return 0; /* read(2), readv(2): they see the shortcut queue */
	if (nsf_mark_splice(st) == 0)
		return 0;
	nsf_count(NSF_STAT_SPLICE_REFUSED, 1);
	return -NSF_EINVAL;
}
