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

struct nsf_pol_iso_key {
	__u32 pod; /* IPv4, network order */
	__u32 dir;
};

struct nsf_pol_peer_key {
	__u32 pod;
	__u32 peer; /* IPv4 of the peer pod; 0: any peer */
	__u32 dir;
};

/* LPM key: prefixlen counts 64 bits of pod and dir, then the peer prefix. */
struct nsf_pol_cidr_key {
	__u32 prefixlen;
	__u32 pod;
	__u32 dir; /* network order, so that it sorts as bytes */
	__u32 addr;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
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
 * more after each change. Pinned with the tables; the pod shortcut's object shares it. */
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

NSF_INLINE int nsf_pol_isolated(__u32 pod, __u32 dir)
{
	struct nsf_pol_iso_key k = { .pod = pod, .dir = dir };
	__u32 *v = bpf_map_lookup_elem(&nsf_pol_iso, &k);

	/* The value (1), not the pointer: clang may otherwise OR the pointers together, which
	 * the verifier refuses on maybe-null map values. */
	return v ? *v != 0 : 0;
}

/*
 * Whether direction `dir` of pod `pod` lets (proto, port) through with the peer at `peer`
 * (`peer_is_pod`: the address is a local pod's, so its identity entries apply).
 */
NSF_INLINE int nsf_pol_allows(__u32 pod, __u32 dir, __u32 peer, int peer_is_pod, __u8 proto,
			      __u16 port)
{
	struct nsf_pol_peer_key pk = { .pod = pod, .peer = 0, .dir = dir };
	struct nsf_pol_cidr_key ck = {
		.prefixlen = 96, .pod = pod, .dir = bpf_htonl(dir), .addr = peer,
	};

	if (!nsf_pol_isolated(pod, dir))
		return 1;
	if (nsf_pol_ports_match(bpf_map_lookup_elem(&nsf_pol_peers, &pk), proto, port))
		return 1;
	if (peer_is_pod) {
		pk.peer = peer;
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

/*
 * Whether the rules let a packet from `saddr` to `daddr` (proto, destination port `dport`)
 * through: the source's egress if `egress` (the source is a local pod), the destination's
 * ingress if `ingress` (the destination is one). `src_pod`/`dst_pod`: whether each end is a
 * local pod, whose identity entries then apply as a peer. Sets *denied_by to the pod whose
 * rules deny it.
 */
NSF_INLINE int nsf_pol_rules_allow(__u32 saddr, __u32 daddr, int egress, int ingress, int src_pod,
				   int dst_pod, __u8 proto, __u16 dport, __u32 *denied_by)
{
	if (egress && !nsf_pol_allows(saddr, NSF_POL_EGRESS, daddr, dst_pod, proto, dport)) {
		*denied_by = saddr;
		return 0;
	}
	if (ingress && !nsf_pol_allows(daddr, NSF_POL_INGRESS, saddr, src_pod, proto, dport)) {
		*denied_by = daddr;
		return 0;
	}
	return 1;
}

/*
 * The verdict of a connection of the pod shortcut (both ends local pods, TCP) from `client`
 * to `server`:`port` under the current rules: what its SYN would get.
 */
NSF_INLINE int nsf_pol_conn_allowed(__u32 client, __u32 server, __u16 port)
{
	__u32 denied_by = 0;

	return nsf_pol_rules_allow(client, server, 1, 1, 1, 1, NSF_PROTO_TCP, port, &denied_by);
}
