/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * NetworkPolicy enforcement for the pod programs: the tables `nsfast policy` compiles
 * (crates/policy/src/compile.rs), looked up per packet. Layouts are mirrored in
 * crates/pod/src/abi.rs.
 *
 * A pod is named by an id (nsf_pol_ids: each of its addresses, IPv4 and IPv6, to the id) that
 * the tables use. That is sound as an identity because a packet from a pod reaches these
 * checks only after the anti-spoofing check (its source address's endpoint names the device
 * it arrived on), and a packet from the wire that claims a local pod's source is dropped
 * before: a pod cannot borrow another pod's rules. IPv4 and IPv6 packets are checked alike
 * (addresses in the ::ffff: form for IPv4, lib/pod_policy_rules.h).
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
 * Changes: `nsfast policy` writes the tables' other slot (lib/pod_policy_rules.h), forgets
 * the flows of other protocols than TCP (their next allowed packet records them again), then
 * adds one to nsf_pol_gen, which makes the new slot the one packets read. A TCP
 * flow recorded under an older generation is checked again when a reply needs it (still
 * allowed: it takes the new generation; denied: it is removed and the reply dropped), and a
 * pair of the pod shortcut checks its connection again at its next send (sockmap.bpf.c): a
 * change that denies a connection stops it on every path, one that allows it keeps it.
 */
#pragma once

#include <linux/ip.h>
#include <linux/ipv6.h>

#include "nsfast.h"
#include "pod_policy_rules.h"

struct nsf_pol_flow {
	struct nsf_pol_addr saddr;
	struct nsf_pol_addr daddr;
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

/* Per pod address: packets its pod's policies dropped. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct nsf_pol_addr);
	__type(value, __u64);
} nsf_pol_drops SEC(".maps");

NSF_INLINE void nsf_pol_count_drop(const struct nsf_pol_addr *pod)
{
	__u64 one = 1, *c = bpf_map_lookup_elem(&nsf_pol_drops, pod);

	if (c)
		*c += 1;
	else
		bpf_map_update_elem(&nsf_pol_drops, pod, &one, BPF_NOEXIST);
}

/* Records flow f as allowed under generation gen (no write when it already is). */
NSF_INLINE void nsf_pol_remember(const struct nsf_pol_flow *f, __u32 gen)
{
	__u32 *v = bpf_map_lookup_elem(&nsf_pol_flows, f);

	if (!v || *v != gen)
		bpf_map_update_elem(&nsf_pol_flows, f, &gen, BPF_ANY);
}

/*
 * The policy verdict of the packet of flow `f` (destination port `dport`, host order;
 * `opens`: it opens the flow, see above): 1 pass, 0 drop. `src_pod`/`dst_pod`: whether each
 * end may be a local pod (and so have policies).
 */
NSF_INLINE int nsf_pol_check(const struct nsf_pol_flow *f, __u16 dport, int opens, int src_pod,
			     int dst_pod)
{
	struct nsf_pol_flow rev;
	__u32 gen = nsf_pol_generation(), slot = gen & 1, sid = 0, did = 0, *seen;
	int in_iso = 0, out_iso = 0, replies_iso = 0, v;

	if (src_pod) {
		sid = nsf_pol_id(slot, &f->saddr);
		out_iso = nsf_pol_isolated(sid, NSF_POL_SLOT_DIR(NSF_POL_EGRESS, slot));
		replies_iso = nsf_pol_isolated(sid, NSF_POL_SLOT_DIR(NSF_POL_INGRESS, slot));
	}
	if (dst_pod) {
		did = nsf_pol_id(slot, &f->daddr);
		in_iso = nsf_pol_isolated(did, NSF_POL_SLOT_DIR(NSF_POL_INGRESS, slot));
		replies_iso |= nsf_pol_isolated(did, NSF_POL_SLOT_DIR(NSF_POL_EGRESS, slot));
	}
	if (!in_iso && !out_iso && !replies_iso) {
		/* Nothing to check. A TCP connection is remembered all the same once the host has
		 * policies, so that its replies still pass when a later policy isolates them. */
		if (opens && gen && f->proto == NSF_PROTO_TCP)
			nsf_pol_remember(f, gen);
		return 1;
	}
	v = nsf_pol_verdict(slot, &f->saddr, &f->daddr, sid, did, f->proto, dport);
	if (v == NSF_POL_ALLOWED) {
		/* Replies will meet isolation, or (TCP) may once a later policy isolates them. */
		if (opens && (replies_iso || f->proto == NSF_PROTO_TCP))
			nsf_pol_remember(f, gen);
		return 1;
	}
	/* A reply of a flow the rules allowed the other way: checked again if the rules changed
	 * since (the flow's own direction must still be allowed). */
	rev.saddr = f->daddr;
	rev.daddr = f->saddr;
	rev.sport = f->dport;
	rev.dport = f->sport;
	rev.proto = f->proto;
	seen = bpf_map_lookup_elem(&nsf_pol_flows, &rev);
	if (seen) {
		if (*seen == gen)
			return 1;
		if (nsf_pol_verdict(slot, &rev.saddr, &rev.daddr, did, sid, rev.proto,
				    bpf_ntohs(rev.dport)) == NSF_POL_ALLOWED) {
			*seen = gen;
			return 1;
		}
		bpf_map_delete_elem(&nsf_pol_flows, &rev);
	}
	nsf_pol_count_drop(v == NSF_POL_DENIED_SRC ? &f->saddr : &f->daddr);
	return 0;
}

/*
 * Ports and the TCP "opens" bit of a packet whose upper-layer header (protocol `proto`) is
 * at `off`: read for TCP, UDP and SCTP (their first four bytes); `first`: 0 for a non-first
 * fragment, which has no upper-layer header (port 0, which only rules without ports match;
 * a TCP fragment opens nothing). Returns -1 for a truncated header.
 */
NSF_INLINE int nsf_pol_l4(struct __sk_buff *skb, __u32 off, __u8 proto, int first,
			  struct nsf_pol_flow *f, __u16 *dport, int *opens)
{
	__u16 ports[2];
	__u8 flags;

	*dport = 0;
	*opens = 1;
	if (proto != NSF_PROTO_TCP && proto != NSF_PROTO_UDP && proto != NSF_PROTO_SCTP)
		return 0;
	if (!first) {
		*opens = proto != NSF_PROTO_TCP;
		return 0;
	}
	if (bpf_skb_load_bytes(skb, off, ports, 4) < 0)
		return -1;
	f->sport = ports[0];
	f->dport = ports[1];
	*dport = bpf_ntohs(ports[1]);
	if (proto == NSF_PROTO_TCP) {
		/* CWR ECE URG ACK PSH RST SYN FIN */
		if (bpf_skb_load_bytes(skb, off + 13, &flags, 1) < 0)
			return -1;
		*opens = (flags & 0x12) == 0x02; /* SYN without ACK */
	}
	return 0;
}

/*
 * The policy verdict of an IPv4 packet at `ip` (bounds-checked by the caller; header at
 * `l3` in the packet): 1 pass, 0 drop. `src_pod`/`dst_pod`: whether each end is a local pod
 * (and so has policies). Invalidates packet pointers.
 */
NSF_INLINE int nsf_pol_check4(struct __sk_buff *skb, __u32 l3, struct iphdr *ip, int src_pod,
			      int dst_pod)
{
	struct nsf_pol_flow f = { .proto = ip->protocol };
	int first = !(ip->frag_off & bpf_htons(0x1fff)), opens;
	__u16 dport;

	nsf_v4_mapped(f.saddr.w, ip->saddr);
	nsf_v4_mapped(f.daddr.w, ip->daddr);
	if (nsf_pol_l4(skb, l3 + ip->ihl * 4, ip->protocol, first, &f, &dport, &opens) < 0)
		return 0;
	return nsf_pol_check(&f, dport, opens, src_pod, dst_pod);
}

/* IPv6 extension headers that can come before the upper-layer header (RFC 8200 4, the IANA
 * list): hop-by-hop, routing, fragment, destination options, AH, mobility, HIP, shim6 and the
 * two experimental numbers. ESP (50) ends what can be read. */
#define NSF_NEXTHDR_FRAGMENT 44
#define NSF_NEXTHDR_AUTH 51
NSF_INLINE int nsf_ip6_ext(__u8 nh)
{
	return nh == 0 || nh == 43 || nh == NSF_NEXTHDR_FRAGMENT || nh == 60 ||
	       nh == NSF_NEXTHDR_AUTH || nh == 135 || nh == 139 || nh == 140 || nh == 253 ||
	       nh == 254;
}

/* How many extension headers a packet may carry; more is malformed. */
#define NSF_IP6_EXT_MAX 8

/* The length of extension header `nh` whose first four bytes are `h`. */
NSF_INLINE __u32 nsf_ip6_ext_len(__u8 nh, const __u8 h[4])
{
	if (nh == NSF_NEXTHDR_FRAGMENT)
		return 8;
	if (nh == NSF_NEXTHDR_AUTH)
		return ((__u32)h[1] + 2) * 4;
	return ((__u32)h[1] + 1) * 8;
}

/* Whether fragment header `h` is of a later fragment (offset not 0). */
NSF_INLINE int nsf_ip6_later_fragment(const __u8 h[4])
{
	return (((__u16)h[2] << 8 | h[3]) & 0xfff8) != 0;
}

/*
 * The policy verdict of an IPv6 packet at `ip6` (bounds-checked by the caller; header at
 * `l3`): as nsf_pol_check4, with the upper-layer header found behind the extension headers.
 * A truncated chain or more than NSF_IP6_EXT_MAX headers is dropped. Invalidates packet
 * pointers.
 */
NSF_INLINE int nsf_pol_check6(struct __sk_buff *skb, __u32 l3, struct ipv6hdr *ip6, int src_pod,
			      int dst_pod)
{
	struct nsf_pol_flow f = {};
	__u32 off = l3 + sizeof(struct ipv6hdr);
	__u8 nh = ip6->nexthdr;
	int first = 1, opens, i;
	__u16 dport;

	__builtin_memcpy(&f.saddr, &ip6->saddr, 16);
	__builtin_memcpy(&f.daddr, &ip6->daddr, 16);
#pragma unroll
	for (i = 0; i < NSF_IP6_EXT_MAX; i++) {
		__u8 h[4];

		if (!nsf_ip6_ext(nh))
			break;
		if (bpf_skb_load_bytes(skb, off, h, 4) < 0)
			return 0;
		if (nh == NSF_NEXTHDR_FRAGMENT && nsf_ip6_later_fragment(h))
			first = 0;
		off += nsf_ip6_ext_len(nh, h);
		nh = h[0];
		if (!first)
			break;
	}
	if (nsf_ip6_ext(nh) && first)
		return 0;
	f.proto = nh;
	if (nsf_pol_l4(skb, off, nh, first, &f, &dport, &opens) < 0)
		return 0;
	return nsf_pol_check(&f, dport, opens, src_pod, dst_pod);
}
