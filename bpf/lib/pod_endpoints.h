/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * Pod endpoint table and datapath counters, shared by every pod program of one host.
 * `nsfast pod add/del` keep the table; the loader pins both maps per host namespace.
 * Layouts are mirrored in crates/pod/src/abi.rs.
 */
#pragma once

#include "nsfast.h"

/* Endpoint flags. */
#define NSF_EP_NETKIT (1U << 0) /* host-side device is a netkit primary */
#define NSF_EP_L3 (1U << 1)	/* netkit L3 pod (no ARP; its device still has an Ethernet header) */
#define NSF_EP_HOST_FW (1U << 2) /* host firewall: the pod's traffic goes through the host stack */

/*
 * One pod address. Key: the pod's IPv4 address, network byte order.
 * The table also says which addresses a pod may send from: a packet from a pod is genuine
 * only if the entry of its source address names the device it arrived on (anti-spoofing).
 */
struct nsf_endpoint {
	__u32 ifindex;	   /* host-side device: veth host end or netkit primary */
	__u32 flags;	   /* NSF_EP_* */
	__u8 pod_mac[6];   /* the pod device's MAC: destination of frames to the pod */
	__u8 host_mac[6];  /* the host-side device's MAC: source of frames to the pod */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct nsf_endpoint);
} nsf_pod_eps SEC(".maps");

/* An IPv6 address as a map key: the 16 bytes as on the wire. */
struct nsf_ip6 {
	__u32 w[4];
};

/*
 * The same for IPv6: key the pod's IPv6 address (bytes as on the wire), value as above (one
 * dual-stack pod has an entry in each table, with the same value). Its own table, so that
 * IPv4-only hosts keep their 4-byte keys and nothing about them changes.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct nsf_ip6);
	__type(value, struct nsf_endpoint);
} nsf_pod_eps6 SEC(".maps");

/* Counter slots (indexes into nsf_pod_cnt). */
enum {
	NSF_CNT_POD_TO_POD = 0,	   /* pod -> local pod, bpf_redirect_peer / netkit redirect */
	NSF_CNT_FIB_REDIRECT = 1,  /* pod -> wire, fib hit, MACs rewritten, bpf_redirect */
	NSF_CNT_FIB_NEIGH = 2,	   /* pod -> wire, fib without neighbour, bpf_redirect_neigh */
	NSF_CNT_POD_TO_STACK = 3,  /* pod -> anything else (host services): normal stack */
	NSF_CNT_WIRE_TO_POD = 4,   /* wire -> local pod, bpf_redirect_peer */
	NSF_CNT_WIRE_TO_STACK = 5, /* wire -> not a pod: normal stack */
	NSF_CNT_ARP_REPLY = 6,	   /* ARP request from a pod answered with the host MAC */
	NSF_CNT_NOT_IPV4 = 7,	   /* pod frame that is not IPv4, IPv6 or ARP, or malformed, or IPv6
				    * from the unspecified or a link-local source (the pod's own link
				    * chatter: DAD, MLD, router solicitations): dropped */
	NSF_CNT_SPOOFED = 8,	   /* pod packet / ARP / NDP with a source or target that is not the
				    * pod's, router advertisements and redirects from a pod: dropped;
				    * wire frame to a pod claiming a local pod's source: dropped */
	NSF_CNT_NDP_REPLY = 9,	   /* IPv6 neighbour solicitation from a pod answered with the host MAC */
	NSF_CNT_MAX = 10,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NSF_CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} nsf_pod_cnt SEC(".maps");

NSF_INLINE void nsf_count(__u32 slot)
{
	__u64 *c = bpf_map_lookup_elem(&nsf_pod_cnt, &slot);

	if (c)
		*c += 1;
}

NSF_INLINE struct nsf_endpoint *nsf_endpoint(__u32 ip4)
{
	return bpf_map_lookup_elem(&nsf_pod_eps, &ip4);
}

/* The endpoint of the IPv6 address at `addr` (16 bytes, e.g. in a packet). */
NSF_INLINE struct nsf_endpoint *nsf_endpoint6(const void *addr)
{
	struct nsf_ip6 k;

	__builtin_memcpy(&k, addr, sizeof(k));
	return bpf_map_lookup_elem(&nsf_pod_eps6, &k);
}
