/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * NetworkPolicy rules: the tables `nsfast policy` compiles (crates/policy/src/compile.rs) and
 * their lookups, shared by the pod programs (lib/pod_policy.h, per packet) and the pod
 * shortcut (sockmap.bpf.c, per pair after a change). Layouts are mirrored in
 * crates/nsfast-bpf/src/pod_abi.rs. See lib/pod_policy.h for what the tables mean.
 */
#pragma once

#include "nsfast.h"

#define NSF_POL_INGRESS 0
#define NSF_POL_EGRESS 1
#define NSF_POL_RANGES 16 /* port ranges in one port set */
#define NSF_PROTO_TCP 6
#define NSF_PROTO_UDP 17
#define NSF_PROTO_SCTP 132

/* Protocol 0 in a range: every protocol and port (a rule without ports). */
struct nsf_pol_range {
	__u16 lo;
	__u16 hi;
	__u8 proto;
	__u8 pad[3];
};

struct nsf_pol_ports {
	__u32 n; /* ranges used */
	struct nsf_pol_range r[NSF_POL_RANGES];
};

/*
 * An address as the tables hold it: IPv6, or IPv4 as ::ffff:a.b.c.d (network order words, as
 * the shortcut's pair keys hold them), so one set of tables serves both families.
 */
struct nsf_pol_addr {
	__u32 w[4];
};

/*
 * Double buffering: every table entry belongs to one of two slots (the `slot` of an id key,
 * bit 1 of a `dir`), and the programs read only the slot of the current generation (its low
 * bit). A change writes the other slot whole, then advances the generation: a packet sees
 * the old rules or the new ones, never a mix, and a change killed before it advanced the
 * generation changed nothing that a packet sees (crates/pod/src/datapath.rs).
 */
#define NSF_POL_SLOT_DIR(dir, slot) ((dir) | (slot) << 1)

/* A pod's id within one slot: every address of a local pod (v4 and v6 of a dual-stack pod
 * alike) maps to the same nonzero id, which names the pod in the tables below. */
struct nsf_pol_id_key {
	__u32 slot;
	struct nsf_pol_addr addr;
};

struct nsf_pol_iso_key {
	__u32 pod; /* id */
	__u32 dir; /* NSF_POL_SLOT_DIR */
};

struct nsf_pol_peer_key {
	__u32 pod;
	__u32 peer; /* id of the peer pod; 0: any peer */
	__u32 dir;
};

/* LPM key: prefixlen counts 64 bits of pod and dir, then the peer prefix of the 128-bit
 * address (an IPv4 prefix of n bits is 96 + n bits of its ::ffff: form). */
struct nsf_pol_cidr_key {
	__u32 prefixlen;
	__u32 pod;
	__u32 dir; /* network order, so that it sorts as bytes */
	struct nsf_pol_addr addr;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct nsf_pol_id_key);
	__type(value, __u32);
} nsf_pol_ids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct nsf_pol_iso_key);
	__type(value, __u32);
} nsf_pol_iso SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct nsf_pol_peer_key);
	__type(value, struct nsf_pol_ports);
} nsf_pol_peers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct nsf_pol_cidr_key);
	__type(value, struct nsf_pol_ports);
} nsf_pol_cidrs SEC(".maps");

/* The policy generation (one entry): 0 until the host's tables are first written, then one
 * more after each change (skipping 0, so the slot alternates). Pinned with the tables; the
 * pod shortcut's object shares it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} nsf_pol_gen SEC(".maps");

NSF_INLINE int nsf_pol_ports_match(const struct nsf_pol_ports *s, __u8 proto, __u16 port)
{
	if (!s)
		return 0;
#pragma unroll
	for (int i = 0; i < NSF_POL_RANGES; i++) {
		const struct nsf_pol_range *r = &s->r[i];

		if (i >= s->n)
			break;
		if (r->proto == 0 || (r->proto == proto && port >= r->lo && port <= r->hi))
			return 1;
	}
	return 0;
}

/* The id of the local pod with address `a` in `slot`; 0: no local pod has it. */
NSF_INLINE __u32 nsf_pol_id(__u32 slot, const struct nsf_pol_addr *a)
{
	struct nsf_pol_id_key k = { .slot = slot, .addr = *a };
	__u32 *v = bpf_map_lookup_elem(&nsf_pol_ids, &k);

	return v ? *v : 0;
}

/* Whether pod `pod` is isolated in `dir` (NSF_POL_SLOT_DIR). Pod 0 never is. */
NSF_INLINE int nsf_pol_isolated(__u32 pod, __u32 dir)
{
	struct nsf_pol_iso_key k = { .pod = pod, .dir = dir };
	__u32 *v;

	if (!pod)
		return 0;
	v = bpf_map_lookup_elem(&nsf_pol_iso, &k);
	/* The value (1), not the pointer: clang may otherwise OR the pointers together, which
	 * the verifier refuses on maybe-null map values. */
	return v ? *v != 0 : 0;
}

/*
 * Whether direction `dir` (NSF_POL_SLOT_DIR) of pod `pod` lets (proto, port) through with
 * the peer at `peer`, whose id is `peer_id` (0: not a local pod).
 */
NSF_INLINE int nsf_pol_allows(__u32 pod, __u32 dir, __u32 peer_id, const struct nsf_pol_addr *peer,
			      __u8 proto, __u16 port)
{
	struct nsf_pol_peer_key pk = { .pod = pod, .peer = 0, .dir = dir };
	struct nsf_pol_cidr_key ck = {
		.prefixlen = 64 + 128, .pod = pod, .dir = bpf_htonl(dir), .addr = *peer,
	};

	if (!nsf_pol_isolated(pod, dir))
		return 1;
	if (nsf_pol_ports_match(bpf_map_lookup_elem(&nsf_pol_peers, &pk), proto, port))
		return 1;
	if (peer_id) {
		pk.peer = peer_id;
		if (nsf_pol_ports_match(bpf_map_lookup_elem(&nsf_pol_peers, &pk), proto, port))
			return 1;
	}
	return nsf_pol_ports_match(bpf_map_lookup_elem(&nsf_pol_cidrs, &ck), proto, port);
}

NSF_INLINE __u32 nsf_pol_generation(void)
{
	__u32 zero = 0, *g = bpf_map_lookup_elem(&nsf_pol_gen, &zero);

	return g ? *g : 0;
}

#define NSF_POL_ALLOWED 0
#define NSF_POL_DENIED_SRC 1 /* by the source pod's egress */
#define NSF_POL_DENIED_DST 2 /* by the destination pod's ingress */

/*
 * The verdict of the rules of `slot` on a packet from `s` (pod id `sid`, 0: not a local pod)
 * to `d` (`did`), protocol `proto`, destination port `dport`: the source's egress, then the
 * destination's ingress.
 */
NSF_INLINE int nsf_pol_verdict(__u32 slot, const struct nsf_pol_addr *s, const struct nsf_pol_addr *d,
			       __u32 sid, __u32 did, __u8 proto, __u16 dport)
{
	if (!nsf_pol_allows(sid, NSF_POL_SLOT_DIR(NSF_POL_EGRESS, slot), did, d, proto, dport))
		return NSF_POL_DENIED_SRC;
	if (!nsf_pol_allows(did, NSF_POL_SLOT_DIR(NSF_POL_INGRESS, slot), sid, s, proto, dport))
		return NSF_POL_DENIED_DST;
	return NSF_POL_ALLOWED;
}

/*
 * The verdict of a connection of the pod shortcut (both ends local pods, TCP) from `client`
 * to `server`:`port` (addresses as the pair key holds them) under the current rules: what its
 * SYN would get.
 */
NSF_INLINE int nsf_pol_conn_allowed(const __u32 client[4], const __u32 server[4], __u16 port)
{
	__u32 slot = nsf_pol_generation() & 1;
	struct nsf_pol_addr c, s;

	nsf_copy6(c.w, client);
	nsf_copy6(s.w, server);
	return nsf_pol_verdict(slot, &c, &s, nsf_pol_id(slot, &c), nsf_pol_id(slot, &s),
			       NSF_PROTO_TCP, port) == NSF_POL_ALLOWED;
}
