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
 * any routing decision, so it covers pod -> pod, pod -> wire and pod -> host alike. Pods are
 * IPv4-only: IPv6 and other ethertypes from a pod are dropped too (`pod_not_ipv4`), since the
 * host stack would take them with any source (and forward them where IPv6 forwarding is on).
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
#include <linux/pkt_cls.h>

#include "pod_endpoints.h"

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
		if (eth->h_proto != bpf_htons(ETH_P_IP)) {
			nsf_count(NSF_CNT_NOT_IPV4);
			return NSF_DROP;
		}
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

	ep = nsf_endpoint(ip->daddr);
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
	fib.tot_len = bpf_ntohs(ip->tot_len);
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

	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
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
