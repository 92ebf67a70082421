// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * nsfast vsock relay, kernel path: the relay puts both legs of a connection (TCP or AF_VSOCK
 * stream sockets) into nsr_sockhash, keyed by socket cookie, and their pairing into nsr_peers.
 * This sk_skb stream-verdict program (no stream parser: the psock reads whole skbs with the
 * socket's read_skb) redirects every skb a leg receives to the EGRESS of the other leg, so the
 * bytes never reach user space. The relay process watches for EOF/RDHUP and errors.
 *
 * Rules that keep every byte in order (crates/vsock/src/kernel.rs has the user-space half):
 *  - no peer entry (not joined yet, or the relay ended this direction at EOF): the skb stays
 *    on its own socket (SK_PASS), where the relay reads it, and the socket is tainted: it is
 *    never redirected again, so nothing it receives later can overtake what stayed behind;
 *  - a refused redirect (the peer left the map) likewise stays and taints, never drops;
 *  - an skb without data (TCP's bare FIN) is dropped: it holds no byte;
 *  - begin/end count verdict runs, so the relay can wait until none is in flight after it
 *    removed a peer entry, before it reads the final byte count.
 */
#include "nsfast.h"
#include "relay_maps.h"

char LICENSE[] SEC("license") = "Dual MIT/GPL";

SEC("sk_skb/stream_verdict")
int nsr_verdict(struct __sk_buff *skb)
{
	__u64 cookie = bpf_get_socket_cookie(skb);
	struct nsr_counters *c = bpf_map_lookup_elem(&nsr_counters, &cookie);
	__u64 len = skb->len;
	__u64 *peer;
	__u64 peer_cookie;

	if (!c)
		return SK_PASS; /* not ours: keep the data on the socket */
	/*
	 * TCP queues a bare FIN as an skb without data, and read_skb hands it to us. Redirected,
	 * the target's psock workqueue would send 0 bytes, take that for a failure and report
	 * EPIPE on the target; kept on the socket it would be a 0-byte message a reader could
	 * take for EOF. It carries no byte (the FIN is in the socket's shutdown state), so drop it.
	 */
	if (len == 0)
		return SK_DROP;
	__sync_fetch_and_add(&c->begin, 1);
	if (c->flags & NSR_TAINTED)
		goto pass;
	peer = bpf_map_lookup_elem(&nsr_peers, &cookie);
	if (!peer)
		goto taint;
	peer_cookie = *peer;
	if (bpf_sk_redirect_hash(skb, &nsr_sockhash, &peer_cookie, 0) != SK_PASS) {
		__sync_fetch_and_add(&c->fails, 1);
		goto taint;
	}
	__sync_fetch_and_add(&c->bytes, len);
	__sync_fetch_and_add(&c->skbs, 1);
	__sync_fetch_and_add(&c->end, 1);
	return SK_PASS;
taint:
	c->flags |= NSR_TAINTED;
pass:
	__sync_fetch_and_add(&c->passed, len);
	__sync_fetch_and_add(&c->end, 1);
	return SK_PASS;
}

#define NSR_VIRTIO_VSOCK_OP_RW 5

/*
 * TP_PROTO(src_cid, src_port, dst_cid, dst_port, len, type, op, flags[, zcopy]): one call per
 * packet a virtio-family transport allocates; only data (OP_RW) of the watched sockets counts.
 */
SEC("raw_tp/virtio_transport_alloc_pkt")
int nsr_vsock_alloc(struct bpf_raw_tracepoint_args *ctx)
{
	struct nsr_vsock_key key = {};
	__u64 *sent;

	if ((__u16)ctx->args[6] != NSR_VIRTIO_VSOCK_OP_RW)
		return 0;
	key.src_port = (__u32)ctx->args[1];
	key.dst_cid = (__u32)ctx->args[2];
	key.dst_port = (__u32)ctx->args[3];
	sent = bpf_map_lookup_elem(&nsr_vsock_sent, &key);
	if (sent)
		__sync_fetch_and_add(sent, (__u32)ctx->args[4]);
	return 0;
}
