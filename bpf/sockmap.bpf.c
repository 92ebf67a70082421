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
#include "sockmap_key.h"
#include "sockmap_maps.h"
#include "sockmap_pair.h"

char LICENSE[] SEC("license") = "Dual MIT/GPL";

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
	if (!nsf_port_allowed(key.server_port)) {
		nsf_count(NSF_STAT_SKIPPED_PORT, 1);
		return;
	}
	sk = skops->sk;
	if (!sk)
		return;
	st = bpf_sk_storage_get(&nsf_skstate, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st) {
		nsf_count(NSF_STAT_SOCK_ADD_FAILED, 1);
		return;
	}
	cookie = bpf_get_socket_cookie(skops);
	st->cookie = cookie;
	st->flags = 0;
	st->pod_slot = tag;
	__builtin_memcpy(&st->key, &key, sizeof(key));

	if (bpf_sock_hash_update(skops, &nsf_sockhash, &cookie, BPF_NOEXIST) != 0) {
		st->flags = NSF_SK_TAINTED;
		nsf_count(NSF_STAT_SOCK_ADD_FAILED, 1);
		nsf_pod_count(tag, NSF_POD_FALLBACKS, 1);
		return;
	}
	nsf_count(NSF_STAT_SOCK_ADDED, 1);

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
		/* Owns its pending entry and, once claimed, its nsf_peers entry: removed at
		 * close. (An ambiguous end owns nothing either.) */
		bpf_sock_ops_cb_flags_set(skops,
					  skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
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
	nsf_unpair(&st->key, st->cookie);
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

SEC("sk_msg")
int nsf_sk_msg(struct sk_msg_md *msg)
{
	struct bpf_sock *sk = msg->sk;
	struct nsf_counters *c;
	struct nsf_sk_state *st = NULL;
	__u64 size = msg->size;
	__u64 peer_cookie;
	int redirected = 0;

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
	if (!(st->flags & NSF_SK_PEER_CACHED)) {
		__u64 *peer = bpf_map_lookup_elem(&nsf_peers, &st->cookie);

		if (!peer) {
			/* Not paired (yet, or any more): this direction uses TCP from now on. */
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
	if (bpf_msg_redirect_hash(msg, &nsf_sockhash, &peer_cookie, BPF_F_INGRESS) != SK_PASS) {
		/* The peer left the map (closed): fall back to TCP rather than dropping. */
		st->flags |= NSF_SK_TAINTED;
		nsf_count(NSF_STAT_REDIRECT_FAILED, 1);
		nsf_pod_count(st->pod_slot, NSF_POD_FALLBACKS, 1);
		goto count;
	}
	redirected = 1;
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
			c->v[NSF_STAT_PASS_MSGS] += 1;
			c->v[NSF_STAT_PASS_BYTES] += size;
		}
	}
	return SK_PASS;
}
