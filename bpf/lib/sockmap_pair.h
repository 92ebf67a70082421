/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * Pairing the two ends of a connection, and forgetting them at close. Kept apart from the
 * sockops program so BPF_PROG_TEST_RUN can exercise it through a tc harness
 * (bpf/tests/sockmap_keys.bpf.c): sockops programs cannot be test-run.
 *
 * The first end to establish leaves {cookie, role} under the pair key in nsf_pending; the
 * other end claims it by deleting the entry (only one deleter wins), learns the first end's
 * cookie from it (the caller caches that in the claimer's socket storage) and writes its own
 * cookie under the first end's in nsf_peers. So a connection costs one nsf_peers entry (the
 * first end's, removed at its close) and the claimer owns no map entry at all: it needs no
 * close callback. An entry of the same role under the same key means two connections share
 * a pair key: the key is poisoned and no one is paired with it.
 */
#pragma once

#include "nsfast.h"
#include "sockmap_maps.h"

#define NSF_AMBIGUOUS 0
#define NSF_PENDING   1
#define NSF_PAIRED    2

/* Claims the pending entry under `key` if it is the other end's. Returns NSF_PAIRED (with the
 * other end's tag in *other_tag and its cookie in *other_cookie), NSF_PENDING (no entry) or
 * NSF_AMBIGUOUS. */
NSF_INLINE int nsf_try_claim(struct nsf_pair_key *key, __u64 cookie, __u32 role, __u32 *other_tag,
			     __u64 *other_cookie)
{
	struct nsf_pending *p = bpf_map_lookup_elem(&nsf_pending, key);
	__u64 other;

	if (!p)
		return NSF_PENDING;
	other = p->cookie;
	*other_tag = p->tag;
	if (other == NSF_POISON || other == cookie)
		return NSF_AMBIGUOUS;
	if (p->role == role) {
		struct nsf_pending poison = { .cookie = NSF_POISON, .role = 0 };

		bpf_map_update_elem(&nsf_pending, key, &poison, BPF_ANY);
		nsf_count(NSF_STAT_PAIR_CONFLICT, 1);
		return NSF_AMBIGUOUS;
	}
	/* Whoever deletes the entry owns the pairing. */
	if (bpf_map_delete_elem(&nsf_pending, key) != 0)
		return NSF_AMBIGUOUS;
	/* The first end finds its peer here at its first send; the claimer's peer is
	 * *other_cookie, cached by the caller. */
	if (bpf_map_update_elem(&nsf_peers, &other, &cookie, BPF_ANY) != 0)
		return NSF_AMBIGUOUS;
	*other_cookie = other;
	nsf_count(NSF_STAT_PAIRED, 1);
	return NSF_PAIRED;
}

/* Called once per socket at ESTABLISHED. `tag` rides along in the pending entry (pod mode: the
 * pod slot + 1); on NSF_PAIRED (by claiming) *other_tag is the first end's tag and
 * *other_cookie its cookie, which the caller must keep as this socket's peer: nsf_peers holds
 * only the first end's side. */
NSF_INLINE int nsf_pair_tagged(struct nsf_pair_key *key, __u64 cookie, __u32 role, __u32 tag,
			       __u32 *other_tag, __u64 *other_cookie)
{
	struct nsf_pending mine = { .cookie = cookie, .role = role, .tag = tag };
	int r;

	*other_tag = 0;
	*other_cookie = 0;
	r = nsf_try_claim(key, cookie, role, other_tag, other_cookie);
	if (r != NSF_PENDING)
		return r;
	*other_tag = 0;
	if (bpf_map_update_elem(&nsf_pending, key, &mine, BPF_NOEXIST) == 0)
		return NSF_PENDING;
	/* The other end inserted at the same moment on another CPU: claim it. */
	r = nsf_try_claim(key, cookie, role, other_tag, other_cookie);
	return r == NSF_PENDING ? NSF_AMBIGUOUS : r;
}

NSF_INLINE int nsf_pair(struct nsf_pair_key *key, __u64 cookie, __u32 role, __u64 *other_cookie)
{
	__u32 other_tag;

	return nsf_pair_tagged(key, cookie, role, 0, &other_tag, other_cookie);
}

/* Called at close for a socket that was left pending at ESTABLISHED (the only kind that owns
 * map entries): its nsf_peers entry goes (a peer that claimed it meanwhile then finds its
 * redirects failing once this socket leaves the SOCKHASH, taints itself and uses TCP), or, if
 * it was never claimed, its pending entry. A claimer owns nothing and is never called here. */
NSF_INLINE void nsf_unpair(struct nsf_pair_key *key, __u64 cookie)
{
	struct nsf_pending *p;

	if (bpf_map_delete_elem(&nsf_peers, &cookie) == 0)
		return; /* claimed: the claimer already removed the pending entry */
	p = bpf_map_lookup_elem(&nsf_pending, key);
	if (p && p->cookie == cookie)
		bpf_map_delete_elem(&nsf_pending, key);
}
