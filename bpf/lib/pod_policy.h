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
 * Replies: a packet that opens a flow (a TCP SYN without ACK; any packet of another
 * protocol) and is allowed records the flow in nsf_pol_flows (an LRU hash) with the policy
 * generation it was checked under; a packet the rules deny passes when its reverse flow is
 * there. Only an opening packet records: a later TCP segment may be the reply direction's,
 * and recording it would turn the connection's own direction into a "reply" that no rule
 * checks. That is the whole of the connection tracking: the datapath has no other, and the
 * LRU bounds it.
 *
 * Changes: `nsfast policy` rewrites the tables, forgets the flows of other protocols than
 * TCP (their next allowed packet records them again), then adds one to nsf_pol_gen. A TCP
 * flow recorded under an older generation is checked again when a reply needs it (still
 * allowed: it takes the new generation; denied: it is removed and the reply dropped), and a
 * pair of the pod shortcut checks its connection again at its next send (sockmap.bpf.c): a
 * change that denies a connection stops it on every path, one that allows it keeps it.
 */
#pragma once

#include <linux/ip.h>

#include "nsfast.h"
#include "pod_policy_rules.h"

struct nsf_pol_flow {
	__u32 saddr;
	__u32 daddr;
	__u16 sport;
	__u16 dport;
	__u32 proto;
};

/* flow -> the policy generation it was allowed under */
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

NSF_INLINE void nsf_pol_count_drop(__u32 pod)
{
	__u64 one = 1, *c = bpf_map_lookup_elem(&nsf_pol_drops, &pod);

	if (c)
		*c += 1;
	else
		bpf_map_update_elem(&nsf_pol_drops, &pod, &one, BPF_NOEXIST);
}

/* Records flow f as allowed under generation gen (no write when it already is). */
NSF_INLINE void nsf_pol_remember(const struct nsf_pol_flow *f, __u32 gen)
{
	__u32 *v = bpf_map_lookup_elem(&nsf_pol_flows, f);

	if (!v || *v != gen)
		bpf_map_update_elem(&nsf_pol_flows, f, &gen, BPF_ANY);
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
	__u32 gen, *seen;
	int in_iso = 0, out_iso = 0, replies_iso = 0, opens = 1;
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
		if (ip->protocol == NSF_PROTO_TCP) {
			__u8 *flags = (__u8 *)ports + 13; /* CWR ECE URG ACK PSH RST SYN FIN */

			if ((void *)(flags + 1) > data_end)
				return 0;
			opens = (*flags & 0x12) == 0x02; /* SYN without ACK */
		}
	} else if (ip->protocol == NSF_PROTO_TCP) {
		opens = 0; /* a non-first fragment */
	}
	gen = nsf_pol_generation();
	if (src_pod) {
		out_iso = nsf_pol_isolated(ip->saddr, NSF_POL_EGRESS);
		replies_iso = nsf_pol_isolated(ip->saddr, NSF_POL_INGRESS);
	}
	if (dst_pod) {
		in_iso = nsf_pol_isolated(ip->daddr, NSF_POL_INGRESS);
		replies_iso |= nsf_pol_isolated(ip->daddr, NSF_POL_EGRESS);
	}
	if (!in_iso && !out_iso && !replies_iso) {
		/* Nothing to check. A TCP connection is remembered all the same once the host has
		 * policies, so that its replies still pass when a later policy isolates them. */
		if (opens && gen && ip->protocol == NSF_PROTO_TCP)
			nsf_pol_remember(&f, gen);
		return 1;
	}
	if (nsf_pol_rules_allow(ip->saddr, ip->daddr, out_iso, in_iso, src_pod, dst_pod,
				ip->protocol, dport, &denied_by)) {
		/* Replies will meet isolation, or (TCP) may once a later policy isolates them. */
		if (opens && (replies_iso || ip->protocol == NSF_PROTO_TCP))
			nsf_pol_remember(&f, gen);
		return 1;
	}
	/* A reply of a flow the rules allowed the other way: checked again if the rules changed
	 * since (the flow's own direction must still be allowed). */
	rev.saddr = f.daddr;
	rev.daddr = f.saddr;
	rev.sport = f.dport;
	rev.dport = f.sport;
	rev.proto = f.proto;
	seen = bpf_map_lookup_elem(&nsf_pol_flows, &rev);
	if (seen) {
		__u32 other = 0;

		if (*seen == gen)
			return 1;
		if (nsf_pol_rules_allow(rev.saddr, rev.daddr, dst_pod, src_pod, dst_pod, src_pod,
					rev.proto, bpf_ntohs(rev.dport), &other)) {
			*seen = gen;
			return 1;
		}
		bpf_map_delete_elem(&nsf_pol_flows, &rev);
	}
	nsf_pol_count_drop(denied_by);
	return 0;
}
