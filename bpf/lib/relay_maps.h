/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * Maps of the vsock relay's kernel path (bpf/relay.bpf.c); the Rust mirror is
 * crates/vsock/src/kernel.rs (keep the layout of struct nsr_counters in sync).
 */
#pragma once

#include "nsfast.h"

#define NSR_MAX_SOCKETS 65536

/* nsr_counters.flags */
#define NSR_TAINTED 1 /* passed one skb to itself: never redirected again (ordering) */
#define NSR_TCP 2     /* set by the relay: a TCP leg (its skbs carry TCP's sequence numbers) */
#define NSR_SEQ 4     /* next_seq holds the sequence number after the last byte handled */
#define NSR_BROKEN 8  /* a resent skb could not be trimmed and was dropped: the relay resets */

/*
 * Per joined socket, keyed by its cookie; written by the verdict program run for the data
 * this socket RECEIVES (so "bytes" is what left this socket for its peer's egress).
 */
struct nsr_counters {
	__u64 bytes;     /* redirected to the peer's egress */
	__u64 skbs;      /* skbs redirected */
	__u64 fails;     /* a peer entry existed but the redirect was refused */
	__u64 passed;    /* bytes kept on this socket (read by the relay in user space) */
	__u64 begin;     /* verdict runs started ... */
	__u64 end;       /* ... and finished: equal when no verdict is in flight */
	__u32 flags;
	__u32 next_seq;  /* TCP: the sequence number after the last byte handled (NSR_SEQ) */
	__u64 trimmed;   /* TCP: bytes cut from the head of resent skbs (already handled) */
};

/*
 * socket cookie -> socket, for redirects only (no program is attached to this map). Both legs
 * go in here before either goes into nsr_sockhash, so the first leg's verdict always finds the
 * other leg to redirect to.
 */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, NSR_MAX_SOCKETS);
	__type(key, __u64);
	__type(value, __u32);
} nsr_targets SEC(".maps");

/* socket cookie -> socket (the verdict program is attached to this map) */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, NSR_MAX_SOCKETS);
	__type(key, __u64);
	__type(value, __u32);
} nsr_sockhash SEC(".maps");

/* socket cookie -> the other leg's cookie; removed by the relay at that leg's EOF */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, NSR_MAX_SOCKETS);
	__type(key, __u64);
	__type(value, __u64);
} nsr_peers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, NSR_MAX_SOCKETS);
	__type(key, __u64);
	__type(value, struct nsr_counters);
} nsr_counters SEC(".maps");

/*
 * AF_VSOCK targets: the bytes each one sent, counted at the virtio transports' packet
 * allocation (tracepoint vsock:virtio_transport_alloc_pkt, loopback, virtio and vhost alike),
 * keyed by the socket's own port and its peer. The relay waits on this count before it
 * half-closes a vsock target whose source is also vsock (see crates/vsock/src/kernel.rs).
 */
struct nsr_vsock_key {
	__u32 src_port;
	__u32 dst_cid;
	__u32 dst_port;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, NSR_MAX_SOCKETS);
	__type(key, struct nsr_vsock_key);
	__type(value, __u64);
} nsr_vsock_sent SEC(".maps");
