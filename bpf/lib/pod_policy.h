/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * NetworkPolicy enforcement for the pod programs: the tables `nsfast policy` compiles
 * (crates/policy/src/compile.rs), looked up per packet. Layouts are mirrored in
 * crates/pod/src/abi.rs.
 *
 * A pod is named by its IPv4 address. That is sound as an identity because a packet from a
 * pod reaches these checks only after the anti-spoofing check (its source address's endpoint
 * names the device it arrived on), and a packet from the wire that claims a local pod's
 * source is dropped before: a pod cannot borrow another pod's rules.
 *
 * Per pod and direction (NSF_POL_INGRESS: traffic into the pod, NSF_POL_EGRESS: out of it):
 *   nsf_pol_iso:   whether it is isolated (no entry: not isolated, everything passes);
 *   nsf_pol_peers: port sets allowed with one peer pod, or with any peer (peer 0);
 *   nsf_pol_cidrs: longest-prefix table of port sets by peer address (excepts already
 *                  subtracted; each prefix holds the union of the prefixes covering it).
 * Replies: an allowed packet whose replies would meet an isolated direction (the source's
 * ingress, the destination's egress) records its flow in nsf_pol_flows (an LRU hash); a
 * packet the rules deny passes when its reverse flow is there. That is the
 * whole of the connection tracking: the datapath has no other, and the LRU bounds it.
 */
#pragma once

#include <linux/ip.h>

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

struct nsf_pol_flow {
	__u32 saddr;
	__u32 daddr;
	__u16 sport;
	__u16 dport;
	__u32 proto;
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

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct nsf_pol_flow);
	__type(value, __u32);
} nsf_pol_flows SEC(".maps");

/* Per pod: packets its policies dropped (key: the pod's IPv4 address). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u64);
} nsf_pol_drops SEC(".maps");

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

NSF_INLINE void nsf_pol_count_drop(__u32 pod)
{
	__u64 one = 1, *c = bpf_map_lookup_elem(&nsf_pol_drops, &pod);

	if (c)
		*c += 1;
	else
		bpf_map_update_elem(&nsf_pol_drops, &pod, &one, BPF_NOEXIST);
}

/*
 * The policy verdict of an IPv4 packet at `ip` (bounds-checked by the caller) from `saddr`
 * to `daddr`: 1 pass, 0 drop. `src_pod`/`dst_pod`: whether each end is a local pod (and so
 * has policies). Ports are read for TCP, UDP and SCTP (their first four bytes); other
 * protocols and non-first fragments have port 0, which only rules without ports match.
 */
NSF_INLINE int nsf_pol_check4(struct __sk_buff *skb, struct iphdr *ip, int src_pod, int dst_pod)
{
	void *data_end = (void *)(long)skb->data_end;
	struct nsf_pol_flow f = { .saddr = ip->saddr, .daddr = ip->daddr, .proto = ip->protocol };
	struct nsf_pol_flow rev;
	__u16 dport = 0;
	__u32 one = 1;
	int in_iso = 0, out_iso = 0, replies_iso = 0, ok = 1;
	__u32 denied_by = 0;

	if ((ip->protocol == NSF_PROTO_TCP || ip->protocol == NSF_PROTO_UDP ||
	     ip->protocol == NSF_PROTO_SCTP) &&
	    !(ip->frag_off & bpf_htons(0x1fff))) {
		__u16 *ports = (void *)ip + ip->ihl * 4;

		if ((void *)(ports + 2) > data_end)
			return 0;
		f.sport = ports[0];
		f.dport = ports[1];
		dport = bpf_ntohs(ports[1]);
	}
	if (src_pod) {
		out_iso = nsf_pol_isolated(ip->saddr, NSF_POL_EGRESS);
		replies_iso = nsf_pol_isolated(ip->saddr, NSF_POL_INGRESS);
	}
	if (dst_pod) {
		in_iso = nsf_pol_isolated(ip->daddr, NSF_POL_INGRESS);
		replies_iso |= nsf_pol_isolated(ip->daddr, NSF_POL_EGRESS);
	}
	/* Neither this direction nor the replies' is policed: nothing to check or remember. */
	if (!in_iso && !out_iso && !replies_iso)
		return 1;
	if (out_iso && !nsf_pol_allows(ip->saddr, NSF_POL_EGRESS, ip->daddr, dst_pod, ip->protocol,
				       dport)) {
		ok = 0;
		denied_by = ip->saddr;
	}
	if (ok && in_iso &&
	    !nsf_pol_allows(ip->daddr, NSF_POL_INGRESS, ip->saddr, src_pod, ip->protocol, dport)) {
		ok = 0;
		denied_by = ip->daddr;
	}
	if (ok) {
		/* Replies will meet isolation: remember the flow so they pass. */
		if (replies_iso && !bpf_map_lookup_elem(&nsf_pol_flows, &f))
			bpf_map_update_elem(&nsf_pol_flows, &f, &one, BPF_ANY);
		return 1;
	}
	/* A reply of a connection the policies allowed the other way. */
	rev.saddr = f.daddr;
	rev.daddr = f.saddr;
	rev.sport = f.dport;
	rev.dport = f.sport;
	rev.proto = f.proto;
	if (bpf_map_lookup_elem(&nsf_pol_flows, &rev))
		return 1;
	nsf_pol_count_drop(denied_by);
	return 0;
}
