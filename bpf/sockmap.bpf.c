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
 */
#include "nsfast.h"
#include "sockmap_key.h"
#include "sockmap_maps.h"

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

NSF_INLINE void pair(__u64 a, __u64 b, struct nsf_sk_state *st)
{
	bpf_map_update_elem(&nsf_peers, &a, &b, BPF_ANY);
	bpf_map_update_elem(&nsf_peers, &b, &a, BPF_ANY);
	st->flags |= NSF_SK_PAIRED;
	nsf_count(NSF_STAT_PAIRED, 1);
}

/* Claims the pending entry for `key` if it is our peer's. Returns 1 if paired, 0 if there is
 * no entry, -1 if the entry is not usable (poisoned, or the same role: an ambiguity). */
NSF_INLINE int try_claim(struct nsf_pair_key *key, __u64 cookie, __u32 role, struct nsf_sk_state *st)
{
	struct nsf_pending *p = bpf_map_lookup_elem(&nsf_pending, key);
	__u64 other;
	__u32 other_role;

	if (!p)
		return 0;
	other = p->cookie;
	other_role = p->role;
	if (other == NSF_POISON || other == cookie)
		return -1;
	if (other_role == role) {
		/* Two connections with the same pair key: pair neither. */
		struct nsf_pending poison = { .cookie = NSF_POISON, .role = 0 };

		bpf_map_update_elem(&nsf_pending, key, &poison, BPF_ANY);
		nsf_count(NSF_STAT_PAIR_CONFLICT, 1);
		return -1;
	}
	/* Whoever deletes the entry owns the pairing. */
	if (bpf_map_delete_elem(&nsf_pending, key) != 0)
		return -1;
	pair(cookie, other, st);
	return 1;
}

NSF_INLINE void on_established(struct bpf_sock_ops *skops, __u32 active)
{
	struct nsf_conn_view v = {};
	struct nsf_pair_key key = {};
	struct nsf_sk_state *st;
	struct bpf_sock *sk;
	__u32 role = active ? NSF_ROLE_ACTIVE : NSF_ROLE_PASSIVE;
	__u64 cookie;
	int r;

	view_from_skops(skops, &v, active);
	if (nsf_make_pair_key(&v, &key) != 0)
		return;
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
	__builtin_memcpy(&st->key, &key, sizeof(key));

	if (bpf_sock_hash_update(skops, &nsf_sockhash, &cookie, BPF_NOEXIST) != 0) {
		st->flags = NSF_SK_TAINTED;
		nsf_count(NSF_STAT_SOCK_ADD_FAILED, 1);
		return;
	}
	nsf_count(NSF_STAT_SOCK_ADDED, 1);
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);

	r = try_claim(&key, cookie, role, st);
	if (r != 0)
		return;
	{
		struct nsf_pending mine = { .cookie = cookie, .role = role };

		if (bpf_map_update_elem(&nsf_pending, &key, &mine, BPF_NOEXIST) != 0)
			/* The peer inserted at the same moment on another CPU: claim it. */
			try_claim(&key, cookie, role, st);
	}
}

NSF_INLINE void on_close(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	struct nsf_sk_state *st;
	struct nsf_pending *p;
	__u64 *peer;
	__u64 me, other;

	if (!sk)
		return;
	st = bpf_sk_storage_get(&nsf_skstate, sk, 0, 0);
	if (!st)
		return;
	me = st->cookie;
	peer = bpf_map_lookup_elem(&nsf_peers, &me);
	if (peer) {
		other = *peer;
		/* The peer's later sends find no peer, taint themselves and use TCP. */
		bpf_map_delete_elem(&nsf_peers, &other);
		bpf_map_delete_elem(&nsf_peers, &me);
	}
	p = bpf_map_lookup_elem(&nsf_pending, &st->key);
	if (p && p->cookie == me)
		bpf_map_delete_elem(&nsf_pending, &st->key);
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
	struct nsf_sk_state *st;
	__u64 *peer;
	__u64 peer_cookie;
	__u64 size = msg->size;
	__u32 zero = 0;

	/* Referencing nsf_config keeps it reachable (for `status`) from this program, which
	 * outlives the sockops program while redirected sockets drain. */
	if (!sk || !bpf_map_lookup_elem(&nsf_config, &zero))
		goto pass;
	st = bpf_sk_storage_get(&nsf_skstate, sk, 0, 0);
	if (!st || (st->flags & NSF_SK_TAINTED))
		goto pass;
	peer = bpf_map_lookup_elem(&nsf_peers, &st->cookie);
	if (!peer) {
		/* Not paired (yet, or any more): this direction uses TCP from now on. */
		st->flags |= NSF_SK_TAINTED;
		nsf_count(NSF_STAT_TAINTED, 1);
		goto pass;
	}
	peer_cookie = *peer;
	if (bpf_msg_redirect_hash(msg, &nsf_sockhash, &peer_cookie, BPF_F_INGRESS) != SK_PASS) {
		/* The peer left the map (closed): fall back to TCP rather than dropping. */
		st->flags |= NSF_SK_TAINTED;
		nsf_count(NSF_STAT_REDIRECT_FAILED, 1);
		goto pass;
	}
	nsf_count(NSF_STAT_REDIRECT_MSGS, 1);
	nsf_count(NSF_STAT_REDIRECT_BYTES, size);
	return SK_PASS;
pass:
	nsf_count(NSF_STAT_PASS_MSGS, 1);
	nsf_count(NSF_STAT_PASS_BYTES, size);
	return SK_PASS;
}
