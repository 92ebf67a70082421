/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * Pairing the two ends of a connection, and forgetting them at close. Kept apart from the
 * sockops program so BPF_PROG_TEST_RUN can exercise it through a tc harness
 * (bpf/tests/sockmap_keys.bpf.c): sockops programs cannot be test-run.
 *
 * The first end to establish leaves {cookie, role} under the pair key in nsf_pending; the
 * other end claims it by deleting the entry (only one deleter wins) and writes both directions
 * into nsf_peers. An entry of the same role under the same key means two connections share
 * a pair key: the key is poisoned and no one is paired with it.
 */
#pragma once

#include "nsfast.h"
#include "sockmap_maps.h"

#define NSF_AMBIGUOUS 0
#define NSF_PENDING   1
#define NSF_PAIRED    2

/* Claims the pending entry under `key` if it is the other end's. Returns NSF_PAIRED (with the
 * other end's tag in *other_tag), NSF_PENDING (no entry) or NSF_AMBIGUOUS. */
NSF_INLINE int nsf_try_claim(struct nsf_pair_key *key, __u64 cookie, __u32 role, __u32 *other_tag)
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
	bpf_map_update_elem(&nsf_peers, &cookie, &other, BPF_ANY);
	bpf_map_update_elem(&nsf_peers, &other, &cookie, BPF_ANY);
	nsf_count(NSF_STAT_PAIRED, 1);
	return NSF_PAIRED;
}

/* Called once per socket at ESTABLISHED. `tag` rides along in the pending entry (pod mode: the
 * pod slot + 1); on NSF_PAIRED by claiming, *other_tag is the first end's tag (else 0). */
NSF_INLINE int nsf_pair_tagged(struct nsf_pair_key *key, __u64 cookie, __u32 role, __u32 tag,
			       __u32 *other_tag)
{
	struct nsf_pending mine = { .cookie = cookie, .role = role, .tag = tag };
	int r;

	*other_tag = 0;
	r = nsf_try_claim(key, cookie, role, other_tag);
	if (r != NSF_PENDING)
		return r;
	*other_tag = 0;
	if (bpf_map_update_elem(&nsf_pending, key, &mine, BPF_NOEXIST) == 0)
		return NSF_PENDING;
	/* The other end inserted at the same moment on another CPU: claim it. */
	r = nsf_try_claim(key, cookie, role, other_tag);
	return r == NSF_PENDING ? NSF_AMBIGUOUS : r;
}

NSF_INLINE int nsf_pair(struct nsf_pair_key *key, __u64 cookie, __u32 role)
{
	__u32 other_tag;

	return nsf_pair_tagged(key, cookie, role, 0, &other_tag);
}

/* Called once per socket at close: its peer's later sends find no peer, taint themselves and
 * use TCP; a still-pending entry of this socket is removed. */
NSF_INLINE void nsf_unpair(struct nsf_pair_key *key, __u64 cookie)
{
	struct nsf_pending *p;
	__u64 *peer = bpf_map_lookup_elem(&nsf_peers, &cookie);

	if (peer) {
		__u64 other = *peer;

		bpf_map_delete_elem(&nsf_peers, &other);
		bpf_map_delete_elem(&nsf_peers, &cookie);
	}
	p = bpf_map_lookup_elem(&nsf_pending, key);
	if (p && p->cookie == cookie)
		bpf_map_delete_elem(&nsf_pending, key);
}
