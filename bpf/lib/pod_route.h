/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * BPF host routing for pods, after the kernel selftests test_tc_peer.c / test_tc_neigh_fib.c
 * and Cilium's local-delivery and fib helpers:
 *   pod -> local pod:  veth: bpf_redirect_peer to the destination's host-side veth;
 *                      netkit: bpf_redirect to the destination's primary.
 *   pod -> elsewhere:  bpf_fib_lookup; hit: MAC rewrite + bpf_redirect; no neighbour:
 *                      bpf_redirect_neigh; local or unroutable: the normal stack.
 *   wire -> pod:       bpf_redirect_peer into the pod.
 *   ARP from a pod:    answered with the host-side MAC (every pod route goes via the host).
 * Anti-spoofing: whatever a pod sends must carry its own address (IPv4 source, ARP sender IP):
 * the endpoint of that address must name the device the packet came from (skb->ifindex: the
 * host-side veth at its ingress; for a netkit pod the primary, which netkit makes skb->dev
 * before running the peer program). Anything else is dropped and counted (`spoofed`), before
 * any routing decision, so it covers pod -> pod, pod -> wire and pod -> host alike. Other
 * ethertypes from a pod are dropped too (`pod_not_ipv4`), since the host stack would take them
 * with any source.
 * IPv6 (dual-stack pods) follows the same paths with its own endpoint table (nsf_pod_eps6):
 * the source must be an IPv6 address of the pod (an IPv4-only pod has none, so all its IPv6 is
 * dropped); the unspecified and link-local sources (the pod's own link chatter: DAD, MLD,
 * router solicitations) are dropped uncounted as spoofing (`pod_not_ipv4`), the gateway's
 * fe80::1 as source is spoofing. NDP is checked as ARP is: a neighbour solicitation is answered
 * in place with the host-side MAC (the gateway fe80::1 and on-link peers alike), a neighbour
 * advertisement must be for the pod's own address, router advertisements and redirects from a
 * pod are dropped (`spoofed`). Packets to link-local or multicast destinations go to the host
 * stack of the pod's own link, never the FIB. Hop limit as TTL.
 * Host firewall (NSF_EP_HOST_FW on the source or destination pod): after the source check,
 * the packet goes to the host stack (netfilter, routing) instead of being redirected.
 * Routed hops (pod -> wire, wire -> pod) decrement the TTL (TTL 1 goes to the stack for
 * ICMP). pod -> local pod is a hop inside one host and leaves the frame untouched, like a
 * bridge (netkit: MACs only): every write would first copy the head of a cloned TCP segment.
 * Packet writes go through bpf_skb_store_bytes, never direct stores: a tc program with a
 * direct packet write gets a prologue that un-clones every packet it sees (bpf_unclone_prologue),
 * which alone cost ~8 % of TCP_RR between pods.
 * `l2` is a compile-time constant: 14 with an Ethernet header (veth, netkit L2 and L3), 0 without.
 */
#pragma once

#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>

#include "pod_endpoints.h"
#include "pod_policy.h"

/* From linux/if_arp.h, which pulls in libc headers. */
#define ARPHRD_ETHER 1
#define ARPOP_REQUEST 1
#define ARPOP_REPLY 2

#ifndef NETKIT_NEXT
#define NETKIT_NEXT -1
#endif

/* Drop: TC_ACT_SHOT for tc/tcx and NETKIT_DROP for netkit are both 2. */
#define NSF_DROP 2
_Static_assert(TC_ACT_SHOT == NSF_DROP, "tc drop verdict");

/* ARP over Ethernet for IPv4, as on the wire. */
struct nsf_arp4 {
	__be16 htype;
	__be16 ptype;
	__u8 hlen;
	__u8 plen;
	__be16 op;
	__u8 sha[6];
	__u8 sip[4];
	__u8 tha[6];
	__u8 tip[4];
} __attribute__((packed));

/* IPv6 next header / ICMPv6 types used here. */
#define NSF_NEXTHDR_ICMPV6 58
#define NSF_ND_ROUTER_SOLICIT 133
#define NSF_ND_ROUTER_ADVERT 134
#define NSF_ND_NEIGH_SOLICIT 135
#define NSF_ND_NEIGH_ADVERT 136
#define NSF_ND_REDIRECT 137
#define NSF_ND_OPT_TARGET_LLADDR 2
/* Neighbour advertisement flags (RFC 4861 4.4), network order: Router, Solicited, Override. */
#define NSF_NA_FLAGS bpf_htonl(0xe0000000)

/* The pods' IPv6 gateway, fe80::1 (answered by the NDP responder). */
#define NSF_GW6_W0 bpf_htonl(0xfe800000)
#define NSF_GW6_W3 bpf_htonl(1)

/* An ICMPv6 neighbour solicitation / advertisement (RFC 4861 4.3, 4.4), options follow. */
struct nsf_nd {
	__u8 type;
	__u8 code;
	__be16 csum;
	__be32 flags; /* NA: R, S, O; NS: reserved */
	__u8 target[16];
} __attribute__((packed));

/* Continue with the next check (not a verdict: verdicts are >= -1 and < 8). */
#define NSF_CONTINUE (-100)

NSF_INLINE void nsf_mac_copy(__u8 *dst, const __u8 *src)
{
	__builtin_memcpy(dst, src, 6);
}

/*
 * Routing is a hop: decrement the IPv4 TTL at `l3` with an incremental checksum update, as
 * Cilium's ipv4_l3() does. Returns -1 (leave the packet to the stack, which answers with ICMP
 * time exceeded) if the TTL would reach zero. Invalidates packet pointers.
 */
NSF_INLINE int nsf_dec_ttl(struct __sk_buff *skb, __u32 l3, __u8 ttl)
{
	__u8 new_ttl = ttl - 1;

	if (ttl <= 1)
		return -1;
	if (bpf_l3_csum_replace(skb, l3 + offsetof(struct iphdr, check), bpf_htons(ttl << 8),
				bpf_htons(new_ttl << 8), 2) < 0)
		return -1;
	if (bpf_skb_store_bytes(skb, l3 + offsetof(struct iphdr, ttl), &new_ttl, 1, 0) < 0)
		return -1;
	return 0;
}

/* Writes a frame's destination and source MACs (helper writes: see the note at the top). */
NSF_INLINE int nsf_set_macs(struct __sk_buff *skb, const __u8 *dst, const __u8 *src)
{
	if (bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_dest), dst, 6, 0) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_source), src, 6, 0) < 0 ? -1 : 0;
}

/*
 * Hands a frame to the pod behind `ep`.
 * From a veth's or the wire's ingress: bpf_redirect_peer jumps into the destination namespace
 * without the backlog. The frame is not touched: the peer redirect scrubs the skb and marks it
 * PACKET_HOST, the destination's stack never looks at the MACs, and the pod sees the same hop
 * a bridge would give it (TTL kept). Not writing is what makes this path as cheap as the
 * host's loopback: a TCP segment is a clone of the socket's copy, and any write to it (the
 * TTL, a MAC) first copies its head.
 * From a netkit pod (peer program, already in the host namespace): transmit on the
 * destination primary; netkit runs eth_type_trans for its peer, so the MACs must be right.
 */
NSF_INLINE long nsf_to_pod(struct __sk_buff *skb, const struct nsf_endpoint *ep, __u32 l2,
			   int netkit_src)
{
	if (netkit_src) {
		if (l2 && nsf_set_macs(skb, ep->pod_mac, ep->host_mac) < 0)
			return -1;
		return bpf_redirect(ep->ifindex, 0);
	}
	return bpf_redirect_peer(ep->ifindex, 0);
}

/*
 * An ARP frame from a pod: dropped (`spoofed`) unless its sender IP is the pod's own address;
 * a request for another address is answered in place with the host-side MAC; the pod's
 * replies (to the host's requests) and gratuitous ARP go to the stack (`pass`).
 */
NSF_INLINE long nsf_arp_from_pod(struct __sk_buff *skb, long pass)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct nsf_arp4 *arp = (void *)(eth + 1);
	struct nsf_endpoint *ep;
	struct {
		struct ethhdr eth;
		struct nsf_arp4 arp;
	} __attribute__((packed)) reply;
	__u32 sip, tip;

	if ((void *)(arp + 1) > data_end || arp->htype != bpf_htons(ARPHRD_ETHER) ||
	    arp->ptype != bpf_htons(ETH_P_IP) || arp->hlen != 6 || arp->plen != 4) {
		nsf_count(NSF_CNT_NOT_IPV4);
		return NSF_DROP;
	}
	__builtin_memcpy(&sip, arp->sip, 4);
	__builtin_memcpy(&tip, arp->tip, 4);
	ep = nsf_endpoint(sip);
	if (!ep || ep->ifindex != skb->ifindex) {
		nsf_count(NSF_CNT_SPOOFED);
		return NSF_DROP;
	}
	if (arp->op != bpf_htons(ARPOP_REQUEST) || tip == sip)
		return pass;

	nsf_mac_copy(reply.eth.h_dest, eth->h_source);
	nsf_mac_copy(reply.eth.h_source, ep->host_mac);
	reply.eth.h_proto = bpf_htons(ETH_P_ARP);
	reply.arp = *arp;
	reply.arp.op = bpf_htons(ARPOP_REPLY);
	nsf_mac_copy(reply.arp.tha, arp->sha);
	nsf_mac_copy(reply.arp.sha, ep->host_mac);
	__builtin_memcpy(reply.arp.tip, &sip, 4);
	__builtin_memcpy(reply.arp.sip, &tip, 4);
	if (bpf_skb_store_bytes(skb, 0, &reply, sizeof(reply), 0) < 0)
		return NSF_DROP;
	nsf_count(NSF_CNT_ARP_REPLY);
	/* Back out of the asking pod's host-side device, i.e. into the pod. */
	return bpf_redirect(ep->ifindex, 0);
}


/* fe80::/10 */
NSF_INLINE int nsf_ip6_link_local(const __u8 *a)
{
	return a[0] == 0xfe && (a[1] & 0xc0) == 0x80;
}

NSF_INLINE int nsf_ip6_multicast(const __u8 *a)
{
	return a[0] == 0xff;
}

NSF_INLINE int nsf_ip6_unspecified(const struct in6_addr *a)
{
	return !(a->in6_u.u6_addr32[0] | a->in6_u.u6_addr32[1] | a->in6_u.u6_addr32[2] |
		 a->in6_u.u6_addr32[3]);
}

NSF_INLINE int nsf_ip6_is_gateway(const struct in6_addr *a)
{
	return a->in6_u.u6_addr32[0] == NSF_GW6_W0 && a->in6_u.u6_addr32[1] == 0 &&
	       a->in6_u.u6_addr32[2] == 0 && a->in6_u.u6_addr32[3] == NSF_GW6_W3;
}

/* The length bpf_fib_lookup checks against the route's MTU: the packet's own, or 0 for a
 * GSO packet. A GSO packet's IP length is that of all its segments together (a pod's TCP
 * hands its device up to 64 KB at a time), which fails the MTU check (FRAG_NEEDED) although
 * every segment fits; with 0 the helper checks the skb against the egress device instead
 * (is_skb_forwardable, which lets a GSO skb through, as the stack's forwarding does). */
NSF_INLINE __u16 nsf_fib_tot_len(const struct __sk_buff *skb, __u16 len)
{
	return skb->gso_size ? 0 : len;
}

/* Routing is a hop: the IPv6 hop limit at `l3` minus one (no header checksum); -1 if it
 * would reach zero (the stack answers with ICMPv6 time exceeded). */
NSF_INLINE int nsf_dec_hop_limit(struct __sk_buff *skb, __u32 l3, __u8 hl)
{
	__u8 new_hl = hl - 1;

	if (hl <= 1)
		return -1;
	return bpf_skb_store_bytes(skb, l3 + offsetof(struct ipv6hdr, hop_limit), &new_hl, 1, 0) <
			       0 ?
		       -1 :
		       0;
}

/* A neighbour advertisement as nsfast sends it: Ethernet, IPv6, NA, target link-layer
 * address option. */
struct nsf_na_frame {
	struct ethhdr eth;
	struct ipv6hdr ip6;
	struct nsf_nd na;
	__u8 opt_type;
	__u8 opt_len; /* in units of 8 bytes */
	__u8 opt_mac[6];
} __attribute__((packed));

/* What the ICMPv6 checksum covers (RFC 8200 8.1): the pseudo header and the message. */
struct nsf_na_csum {
	struct in6_addr src;
	struct in6_addr dst;
	__be32 len;
	__be32 nexthdr;
	struct nsf_nd na;
	__u8 opt_type;
	__u8 opt_len;
	__u8 opt_mac[6];
} __attribute__((aligned(4)));

_Static_assert(sizeof(struct nsf_na_frame) == ETH_HLEN + 40 + 32, "NA frame");
_Static_assert(sizeof(struct nsf_na_csum) == 72, "NA checksum input");

/* The 16-bit one's complement checksum of the 32-bit partial sum `s`. */
NSF_INLINE __u16 nsf_csum_fold(__u64 s)
{
	s = (s & 0xffffffff) + (s >> 32);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

/*
 * Answers the neighbour solicitation at `ip6` (from pod endpoint `src`, source checked) in
 * place: a solicited advertisement from the target (fe80::1 or any other address the pod asks
 * for: every route goes via the host) with the host-side MAC, sent back into the pod.
 */
NSF_INLINE long nsf_ndp_answer(struct __sk_buff *skb, __u32 l2, const struct nsf_endpoint *src)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = data + l2;
	struct nsf_nd *nd = (void *)(ip6 + 1);
	struct nsf_na_frame r = {};
	struct nsf_na_csum c = {};
	__u32 want = sizeof(r);
	__s64 sum;

	if (!l2 || (void *)(nd + 1) > data_end)
		return NSF_DROP;
	__builtin_memcpy(r.eth.h_dest, eth->h_source, 6);
	__builtin_memcpy(r.eth.h_source, src->host_mac, 6);
	r.eth.h_proto = bpf_htons(ETH_P_IPV6);
	r.ip6.version = 6;
	r.ip6.payload_len = bpf_htons(32);
	r.ip6.nexthdr = NSF_NEXTHDR_ICMPV6;
	r.ip6.hop_limit = 255;
	__builtin_memcpy(&r.ip6.saddr, nd->target, 16);
	r.ip6.daddr = ip6->saddr;
	r.na.type = NSF_ND_NEIGH_ADVERT;
	r.na.flags = NSF_NA_FLAGS;
	__builtin_memcpy(r.na.target, nd->target, 16);
	r.opt_type = NSF_ND_OPT_TARGET_LLADDR;
	r.opt_len = 1;
	__builtin_memcpy(r.opt_mac, src->host_mac, 6);

	c.src = r.ip6.saddr;
	c.dst = r.ip6.daddr;
	c.len = bpf_htonl(32);
	c.nexthdr = bpf_htonl(NSF_NEXTHDR_ICMPV6);
	c.na = r.na;
	c.opt_type = r.opt_type;
	c.opt_len = r.opt_len;
	__builtin_memcpy(c.opt_mac, r.opt_mac, 6);
	sum = bpf_csum_diff(0, 0, (__be32 *)&c, sizeof(c), 0);
	if (sum < 0)
		return NSF_DROP;
	r.na.csum = nsf_csum_fold((__u64)sum);

	if (skb->len != want && bpf_skb_change_tail(skb, want, 0) < 0)
		return NSF_DROP;
	if (bpf_skb_store_bytes(skb, 0, &r, sizeof(r), 0) < 0)
		return NSF_DROP;
	nsf_count(NSF_CNT_NDP_REPLY);
	return bpf_redirect(src->ifindex, 0);
}

/*
 * NDP and router messages in an ICMPv6 packet from pod endpoint `src` (source checked):
 * a verdict, or NSF_CONTINUE for any other ICMPv6 message. Messages directly after the
 * IPv6 header; behind extension headers they are dropped before (nsf_ip6_ext_check).
 */
NSF_INLINE long nsf_icmp6_from_pod(struct __sk_buff *skb, __u32 l2,
				   const struct nsf_endpoint *src, long pass)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ipv6hdr *ip6 = data + l2;
	struct nsf_nd *nd = (void *)(ip6 + 1);
	struct nsf_endpoint *t;
	__u8 type;

	if ((void *)(ip6 + 1) > data_end)
		return NSF_DROP;
	if ((void *)nd + 1 > data_end) {
		nsf_count(NSF_CNT_NOT_IPV4);
		return NSF_DROP;
	}
	type = nd->type;
	if (type < NSF_ND_ROUTER_SOLICIT || type > NSF_ND_REDIRECT)
		return NSF_CONTINUE;
	/* A pod is a host, never a router: router advertisements and redirects are spoofing. */
	if (type == NSF_ND_ROUTER_ADVERT || type == NSF_ND_REDIRECT) {
		nsf_count(NSF_CNT_SPOOFED);
		return NSF_DROP;
	}
	if (type == NSF_ND_ROUTER_SOLICIT) {
		nsf_count(NSF_CNT_NOT_IPV4);
		return NSF_DROP;
	}
	/* Neighbour solicitation or advertisement: well formed (RFC 4861 7.1.1, 7.1.2). */
	if ((void *)(nd + 1) > data_end || nd->code != 0 || ip6->hop_limit != 255 ||
	    bpf_ntohs(ip6->payload_len) < sizeof(*nd) || nsf_ip6_multicast(nd->target)) {
		nsf_count(NSF_CNT_NOT_IPV4);
		return NSF_DROP;
	}
	t = nsf_endpoint6(nd->target);
	if (type == NSF_ND_NEIGH_ADVERT) {
		/* The pod advertises only its own address (to the host stack, which asked). */
		if (!t || t->ifindex != skb->ifindex) {
			nsf_count(NSF_CNT_SPOOFED);
			return NSF_DROP;
		}
		return pass;
	}
	/* Asking for its own address: nobody else on this link answers. */
	if (t && t->ifindex == skb->ifindex)
		return pass;
	return nsf_ndp_answer(skb, l2, src);
}

/*
 * NDP hidden behind IPv6 extension headers (a packet from pod endpoint `src`, source
 * checked, whose next header `nh` is one): the chain is walked to its upper-layer header;
 * ICMPv6 neighbour discovery or router messages there (types 133-137) are dropped as
 * spoofing (a pod's kernel never sends them behind extension headers, and the host's would
 * act on some), any other upper layer continues (NSF_CONTINUE). A later fragment (offset not
 * 0) carries no upper-layer header and continues: NDP's type is in the first fragment, which
 * this catches. A truncated chain or more than NSF_IP6_EXT_MAX headers: dropped, malformed.
 */
NSF_INLINE long nsf_ip6_ext_check(struct __sk_buff *skb, __u32 l2, __u8 nh)
{
	__u32 off = l2 + sizeof(struct ipv6hdr);
	int i;

#pragma unroll
	for (i = 0; i < NSF_IP6_EXT_MAX; i++) {
		__u8 h[4];

		if (bpf_skb_load_bytes(skb, off, h, 4) < 0)
			break;
		if (nh == NSF_NEXTHDR_ICMPV6) {
			if (h[0] >= NSF_ND_ROUTER_SOLICIT && h[0] <= NSF_ND_REDIRECT) {
				nsf_count(NSF_CNT_SPOOFED);
				return NSF_DROP;
			}
			return NSF_CONTINUE;
		}
		if (!nsf_ip6_ext(nh))
			return NSF_CONTINUE;
		if (nh == NSF_NEXTHDR_FRAGMENT && nsf_ip6_later_fragment(h))
			return NSF_CONTINUE; /* not the first fragment */
		off += nsf_ip6_ext_len(nh, h);
		nh = h[0];
	}
	nsf_count(NSF_CNT_NOT_IPV4);
	return NSF_DROP;
}

/*
 * A packet from a pod's link-local source at `l2` (see nsf_from_pod6). `add` gives each pod
 * one link-local address of its own and an endpoint entry for it (the same value as its
 * global address'): from it a pod may only do neighbour discovery (the kernel sends its
 * neighbour probes from it), answered or checked as from its global address. Another pod's
 * link-local address is spoofing; one nsfast did not give (the kernel-made address of a pod
 * from before, MLD/RS chatter) is dropped as before (`pod_not_ipv4`).
 */
NSF_INLINE long nsf_from_pod6_ll(struct __sk_buff *skb, __u32 l2, long pass)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ipv6hdr *ip6 = data + l2;
	struct nsf_endpoint *src;
	long rc;

	if ((void *)(ip6 + 1) > data_end)
		return NSF_DROP;
	src = nsf_endpoint6(&ip6->saddr);
	if (!src) {
		nsf_count(NSF_CNT_NOT_IPV4);
		return NSF_DROP;
	}
	if (src->ifindex != skb->ifindex) {
		nsf_count(NSF_CNT_SPOOFED);
		return NSF_DROP;
	}
	if (ip6->nexthdr != NSF_NEXTHDR_ICMPV6) {
		if (nsf_ip6_ext(ip6->nexthdr) &&
		    nsf_ip6_ext_check(skb, l2, ip6->nexthdr) == NSF_DROP)
			return NSF_DROP;
		nsf_count(NSF_CNT_NOT_IPV4);
		return NSF_DROP;
	}
	rc = nsf_icmp6_from_pod(skb, l2, src, pass);
	if (rc != NSF_CONTINUE)
		return rc;
	nsf_count(NSF_CNT_NOT_IPV4);
	return NSF_DROP;
}

/* An IPv6 packet a pod sent, at `l2` (see nsf_from_pod). */
NSF_INLINE long nsf_from_pod6(struct __sk_buff *skb, __u32 l2, int netkit, long pass)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct bpf_fib_lookup fib = {};
	struct nsf_endpoint *src, *ep;
	struct ipv6hdr *ip6 = data + l2;
	long rc;

	if ((void *)(ip6 + 1) > data_end || ip6->version != 6) {
		nsf_count(NSF_CNT_NOT_IPV4);
		return NSF_DROP;
	}
	/* Anti-spoofing: the source must be one of this pod's IPv6 addresses. */
	if (nsf_ip6_is_gateway(&ip6->saddr)) {
		nsf_count(NSF_CNT_SPOOFED);
		return NSF_DROP;
	}
	if (nsf_ip6_unspecified(&ip6->saddr)) {
		nsf_count(NSF_CNT_NOT_IPV4);
		return NSF_DROP;
	}
	if (nsf_ip6_link_local(ip6->saddr.in6_u.u6_addr8))
		return nsf_from_pod6_ll(skb, l2, pass);
	src = nsf_endpoint6(&ip6->saddr);
	if (!src || src->ifindex != skb->ifindex) {
		nsf_count(NSF_CNT_SPOOFED);
		return NSF_DROP;
	}
	if (nsf_ip6_ext(ip6->nexthdr)) {
		rc = nsf_ip6_ext_check(skb, l2, ip6->nexthdr);
		if (rc != NSF_CONTINUE)
			return rc;
	}
	if (ip6->nexthdr == NSF_NEXTHDR_ICMPV6) {
		rc = nsf_icmp6_from_pod(skb, l2, src, pass);
		if (rc != NSF_CONTINUE)
			return rc;
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		ip6 = data + l2;
		if ((void *)(ip6 + 1) > data_end)
			return NSF_DROP;
	}
	/* The pod's own link (the host-side device's link-local address, multicast): the host
	 * stack, which never forwards these. */
	if (nsf_ip6_link_local(ip6->daddr.in6_u.u6_addr8) ||
	    nsf_ip6_multicast(ip6->daddr.in6_u.u6_addr8)) {
		nsf_count(NSF_CNT_POD_TO_STACK);
		return pass;
	}

	/* NetworkPolicy, as for IPv4 (every destination but the pod's own link). */
	ep = nsf_endpoint6(&ip6->daddr);
	if (!nsf_pol_check6(skb, l2, ip6, 1, ep != 0))
		return NSF_DROP;
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	ip6 = data + l2;
	if ((void *)(ip6 + 1) > data_end)
		return NSF_DROP;
	if (ep) {
		if ((src->flags | ep->flags) & NSF_EP_HOST_FW) {
			nsf_count(NSF_CNT_POD_TO_STACK);
			return pass;
		}
		rc = nsf_to_pod(skb, ep, l2, netkit);
		if (rc < 0)
			return pass;
		nsf_count(NSF_CNT_POD_TO_POD);
		return rc;
	}
	if (src->flags & NSF_EP_HOST_FW) {
		nsf_count(NSF_CNT_POD_TO_STACK);
		return pass;
	}

	fib.family = AF_INET6;
	fib.flowinfo = *(__be32 *)ip6 & bpf_htonl(0x0fffffff);
	fib.l4_protocol = ip6->nexthdr;
	fib.tot_len = nsf_fib_tot_len(skb, bpf_ntohs(ip6->payload_len) + sizeof(*ip6));
	__builtin_memcpy(fib.ipv6_src, &ip6->saddr, 16);
	__builtin_memcpy(fib.ipv6_dst, &ip6->daddr, 16);
	fib.ifindex = skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;

	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if ((rc == BPF_FIB_LKUP_RET_SUCCESS || rc == BPF_FIB_LKUP_RET_NO_NEIGH) &&
	    nsf_dec_hop_limit(skb, l2, ip6->hop_limit) < 0) {
		nsf_count(NSF_CNT_POD_TO_STACK);
		return pass;
	}
	if (rc == BPF_FIB_LKUP_RET_SUCCESS && l2) {
		if (nsf_set_macs(skb, fib.dmac, fib.smac) < 0)
			return pass;
		nsf_count(NSF_CNT_FIB_REDIRECT);
		return bpf_redirect(fib.ifindex, 0);
	}
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH || (rc == BPF_FIB_LKUP_RET_SUCCESS && !l2)) {
		struct bpf_redir_neigh nh = { .nh_family = AF_INET6 };

		__builtin_memcpy(nh.ipv6_nh, fib.ipv6_dst, 16); /* the next hop */
		nsf_count(NSF_CNT_FIB_NEIGH);
		return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
	}
	nsf_count(NSF_CNT_POD_TO_STACK);
	return pass;
}

/* An IPv6 frame that arrived on the wire (see nsf_from_wire). */
NSF_INLINE long nsf_from_wire6(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ipv6hdr *ip6 = data + ETH_HLEN;
	struct nsf_endpoint *ep;
	long rc;

	if ((void *)(ip6 + 1) > data_end)
		return TC_ACT_OK;
	/* Pods' link-local addresses have endpoint entries too (their own link's NDP): never a
	 * destination from the wire. */
	ep = nsf_ip6_link_local(ip6->daddr.in6_u.u6_addr8) ? NULL : nsf_endpoint6(&ip6->daddr);
	if (!ep || (ep->flags & NSF_EP_HOST_FW)) {
		nsf_count(NSF_CNT_WIRE_TO_STACK);
		return TC_ACT_OK;
	}
	if (nsf_endpoint6(&ip6->saddr)) {
		nsf_count(NSF_CNT_SPOOFED);
		return TC_ACT_SHOT;
	}
	/* NetworkPolicy: the destination pod's ingress. */
	if (!nsf_pol_check6(skb, ETH_HLEN, ip6, 0, 1))
		return TC_ACT_SHOT;
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	ip6 = data + ETH_HLEN;
	if ((void *)(ip6 + 1) > data_end)
		return TC_ACT_OK;
	ep = nsf_endpoint6(&ip6->daddr);
	if (!ep)
		return TC_ACT_OK;
	if (nsf_dec_hop_limit(skb, ETH_HLEN, ip6->hop_limit) < 0) {
		nsf_count(NSF_CNT_WIRE_TO_STACK);
		return TC_ACT_OK;
	}
	rc = nsf_to_pod(skb, ep, ETH_HLEN, 0);
	if (rc < 0)
		return TC_ACT_OK;
	nsf_count(NSF_CNT_WIRE_TO_POD);
	return rc;
}

/*
 * A packet a pod sent. `pass` is the "normal stack" verdict of the attach point
 * (TC_ACT_OK for tc/tcx, NETKIT_NEXT for netkit).
 */
NSF_INLINE long nsf_from_pod(struct __sk_buff *skb, __u32 l2, int netkit, long pass)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct bpf_fib_lookup fib = {};
	struct nsf_endpoint *src, *ep;
	struct iphdr *ip;
	long rc;

	if (l2) {
		struct ethhdr *eth = data;

		if ((void *)(eth + 1) > data_end) {
			nsf_count(NSF_CNT_NOT_IPV4);
			return NSF_DROP;
		}
		if (eth->h_proto == bpf_htons(ETH_P_ARP))
			return nsf_arp_from_pod(skb, pass);
		if (eth->h_proto == bpf_htons(ETH_P_IPV6))
			return nsf_from_pod6(skb, l2, netkit, pass);
		if (eth->h_proto != bpf_htons(ETH_P_IP)) {
			nsf_count(NSF_CNT_NOT_IPV4);
			return NSF_DROP;
		}
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		return nsf_from_pod6(skb, l2, netkit, pass);
	} else if (skb->protocol != bpf_htons(ETH_P_IP)) {
		nsf_count(NSF_CNT_NOT_IPV4);
		return NSF_DROP;
	}
	ip = data + l2;
	if ((void *)(ip + 1) > data_end || ip->ihl < 5) {
		nsf_count(NSF_CNT_NOT_IPV4);
		return NSF_DROP;
	}

	/* Anti-spoofing: the source must be this pod's own address (see the top). */
	src = nsf_endpoint(ip->saddr);
	if (!src || src->ifindex != skb->ifindex) {
		nsf_count(NSF_CNT_SPOOFED);
		return NSF_DROP;
	}

	/* NetworkPolicy: the source's egress, and the destination's ingress if it is a local
	 * pod (lib/pod_policy.h). Every destination: pods, the wire and the host alike. */
	ep = nsf_endpoint(ip->daddr);
	if (!nsf_pol_check4(skb, l2, ip, 1, ep != 0))
		return NSF_DROP;
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	ip = data + l2;
	if ((void *)(ip + 1) > data_end)
		return NSF_DROP;
	if (ep) {
		if ((src->flags | ep->flags) & NSF_EP_HOST_FW) {
			nsf_count(NSF_CNT_POD_TO_STACK);
			return pass;
		}
		/* A hop inside one host: like a bridge, the TTL is kept (see nsf_to_pod). */
		rc = nsf_to_pod(skb, ep, l2, netkit);
		if (rc < 0)
			return pass;
		nsf_count(NSF_CNT_POD_TO_POD);
		return rc;
	}
	if (src->flags & NSF_EP_HOST_FW) {
		nsf_count(NSF_CNT_POD_TO_STACK);
		return pass;
	}

	fib.family = AF_INET;
	fib.tos = ip->tos;
	fib.l4_protocol = ip->protocol;
	fib.tot_len = nsf_fib_tot_len(skb, bpf_ntohs(ip->tot_len));
	fib.ipv4_src = ip->saddr;
	fib.ipv4_dst = ip->daddr;
	fib.ifindex = skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;

	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if ((rc == BPF_FIB_LKUP_RET_SUCCESS || rc == BPF_FIB_LKUP_RET_NO_NEIGH) &&
	    nsf_dec_ttl(skb, l2, ip->ttl) < 0) {
		nsf_count(NSF_CNT_POD_TO_STACK);
		return pass;
	}
	if (rc == BPF_FIB_LKUP_RET_SUCCESS && l2) {
		if (nsf_set_macs(skb, fib.dmac, fib.smac) < 0)
			return pass;
		nsf_count(NSF_CNT_FIB_REDIRECT);
		return bpf_redirect(fib.ifindex, 0);
	}
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH ||
	    (rc == BPF_FIB_LKUP_RET_SUCCESS && !l2)) {
		struct bpf_redir_neigh nh = {
			.nh_family = AF_INET,
			.ipv4_nh = fib.ipv4_dst, /* the fib wrote the next hop here */
		};

		nsf_count(NSF_CNT_FIB_NEIGH);
		return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
	}
	/* Local destination (host services), forwarding off, no route: the normal stack. */
	nsf_count(NSF_CNT_POD_TO_STACK);
	return pass;
}

/* A frame that arrived on the wire (TCX ingress of the uplink). */
NSF_INLINE long nsf_from_wire(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct nsf_endpoint *ep;
	struct iphdr *ip;
	long rc;

	if ((void *)(eth + 1) > data_end)
		return TC_ACT_OK;
	if (eth->h_proto == bpf_htons(ETH_P_IPV6))
		return nsf_from_wire6(skb);
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end)
		return TC_ACT_OK;
	ep = nsf_endpoint(ip->daddr);
	if (!ep || (ep->flags & NSF_EP_HOST_FW)) {
		nsf_count(NSF_CNT_WIRE_TO_STACK);
		return TC_ACT_OK;
	}
	/* A local pod's address never arrives from the wire: its packets leave by this host. */
	if (nsf_endpoint(ip->saddr)) {
		nsf_count(NSF_CNT_SPOOFED);
		return TC_ACT_SHOT;
	}
	/* NetworkPolicy: the destination pod's ingress (lib/pod_policy.h). */
	if (!nsf_pol_check4(skb, ETH_HLEN, ip, 0, 1))
		return TC_ACT_SHOT;
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	ip = data + ETH_HLEN;
	if ((void *)(ip + 1) > data_end)
		return TC_ACT_OK;
	/* Every pod, netkit L3 included: L3 netkit devices are Ethernet devices too (IFF_NOARP),
	 * and the peer redirect scrubs the frame to PACKET_HOST, so bpf_redirect_peer delivers it
	 * as for veth (checked on 6.12 and 7.2). */
	if (nsf_dec_ttl(skb, ETH_HLEN, ip->ttl) < 0) {
		nsf_count(NSF_CNT_WIRE_TO_STACK);
		return TC_ACT_OK;
	}
	rc = nsf_to_pod(skb, ep, ETH_HLEN, 0);
	if (rc < 0)
		return TC_ACT_OK;
	nsf_count(NSF_CNT_WIRE_TO_POD);
	return rc;
}

/*
 * A packet the host stack sends into a pod (TCX egress of a veth pod's host-side device; the
 * primary program of a netkit pair, which also sees what nsf_to_pod redirects there). What
 * a local pod sent was checked at its source (nsf_from_pod: its egress and this pod's
 * ingress), and the node's own traffic (made in the host namespace: it came in on no device,
 * ingress_ifindex 0) is always allowed, as Kubernetes defines it. Anything else reached the
 * pod through the host stack from elsewhere (a wire without the wire program, the inbound of
 * a --host-firewall pod after the host's rules) and meets the pod's ingress policy here, as
 * from the wire.
 */
NSF_INLINE long nsf_from_stack(struct __sk_buff *skb, long pass)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return pass;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > data_end || ip->ihl < 5)
			return pass;
		if (!skb->ingress_ifindex || nsf_endpoint(ip->saddr) || !nsf_endpoint(ip->daddr))
			return pass;
		return nsf_pol_check4(skb, ETH_HLEN, ip, 0, 1) ? pass : NSF_DROP;
	}
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end)
			return pass;
		/* The pod's own link is not policed: NDP and MLD, the gateway's answers from
		 * fe80::1 (nsf_ndp_answer sends them back out of this device) included. */
		if (nsf_ip6_link_local(ip6->daddr.in6_u.u6_addr8) ||
		    nsf_ip6_multicast(ip6->daddr.in6_u.u6_addr8) ||
		    nsf_ip6_link_local(ip6->saddr.in6_u.u6_addr8))
			return pass;
		if (!skb->ingress_ifindex || nsf_endpoint6(&ip6->saddr) ||
		    !nsf_endpoint6(&ip6->daddr))
			return pass;
		return nsf_pol_check6(skb, ETH_HLEN, ip6, 0, 1) ? pass : NSF_DROP;
	}
	return pass;
}
