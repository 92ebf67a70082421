// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * nsfast pod datapath: BPF host routing for pods on veth (TCX) and netkit devices.
 * One entry point per attach point; the logic lives in lib/pod_route.h.
 * Section names are "classifier/..." because aya-obj only accepts those for tc programs.
 */
#include "pod_route.h"

/* TCX ingress of a pod's host-side veth: everything the pod sends. */
SEC("classifier/from_container")
int nsf_pod_from_container(struct __sk_buff *skb)
{
	return nsf_from_pod(skb, ETH_HLEN, 0, TC_ACT_OK);
}

/* TCX egress of a pod's host-side veth: what the host stack sends into the pod. */
SEC("classifier/to_container")
int nsf_pod_to_container(struct __sk_buff *skb)
{
	return nsf_from_stack(skb, TC_ACT_OK);
}

/* TCX ingress of the uplink ("wire") device: frames for local pods jump into them. */
SEC("classifier/from_wire")
int nsf_pod_from_wire(struct __sk_buff *skb)
{
	return nsf_from_wire(skb);
}

/* BPF_NETKIT_PEER of an L2 netkit pair: what the pod sends, run in the host namespace. */
SEC("classifier/netkit_peer_l2")
int nsf_pod_netkit_peer_l2(struct __sk_buff *skb)
{
	return nsf_from_pod(skb, ETH_HLEN, 1, NETKIT_NEXT);
}

/*
 * BPF_NETKIT_PEER of an L3 netkit pair. L3 netkit devices are still Ethernet devices
 * (ether_setup, IFF_NOARP): what the pod transmits carries an Ethernet header built from the
 * device's own address, so the program parses it at ETH_HLEN like L2 (checked on 6.12 and
 * 7.2 in the VM matrix: at offset 0 every packet failed the IHL check and took the stack
 * uncounted). Only ARP never comes.
 */
SEC("classifier/netkit_peer_l3")
int nsf_pod_netkit_peer_l3(struct __sk_buff *skb)
{
	return nsf_from_pod(skb, ETH_HLEN, 1, NETKIT_NEXT);
}

/* BPF_NETKIT_PRIMARY: traffic to the pod from the host stack (and what nsf_to_pod
 * redirects to the primary). */
SEC("classifier/netkit_primary")
int nsf_pod_netkit_primary(struct __sk_buff *skb)
{
	return nsf_from_stack(skb, NETKIT_NEXT);
}

char _license[] SEC("license") = "Dual MIT/GPL";
