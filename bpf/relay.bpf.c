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
 *    removed a peer entry, before it reads the final byte count;
 *  - a TCP skb that starts before what the socket already handled (a resent segment) has its
 *    old bytes cut off first (nsr_tcp_seq): the kernel's tcp_read_skb hands it over whole;
 *  - redirects go to nsr_targets, which holds both legs before either joins nsr_sockhash, so
 *    a verdict never finds its peer missing during the join.
 */
#include "nsfast.h"
#include "relay_maps.h"

char LICENSE[] SEC("license") = "Dual MIT/GPL";

/*
 * The head of the kernel's struct sk_buff as far as we read it: only cb[], where TCP keeps
 * struct tcp_skb_cb (seq, end_seq first). CO-RE: the offset of cb comes from the running
 * kernel's BTF.
 */
struct sk_buff___nsr {
	char cb[48];
} __attribute__((preserve_access_index));

struct nsr_tcp_cb {
	__u32 seq;
	__u32 end_seq;
};

/* bpf_skb_adjust_room shrinks an sk_skb by at most 0xfff bytes a call. */
#define NSR_TRIM_STEP 0xfff
#define NSR_TRIM_CALLS 128 /* up to 524,160 bytes: a resent GSO/BIG TCP skb's overlap */

/*
 * Cuts n bytes from the head of skb's data; 0 when done. A global function: the verifier checks
 * it once on its own, so its loop does not multiply the paths of the verdict program (inlined,
 * the loop took 503,029 verifier steps and 9 s on 6.18, and longer than a test's timeout on
 * 7.2 under TCG).
 */
__attribute__((noinline)) int nsr_trim_head(struct __sk_buff *skb, __u32 n)
{
	__u32 full = n / NSR_TRIM_STEP, rest = n % NSR_TRIM_STEP;

	if (full > NSR_TRIM_CALLS)
		return -1;
	for (__u32 i = 0; i < NSR_TRIM_CALLS; i++) {
		if (i >= full)
			break;
		if (bpf_skb_adjust_room(skb, -NSR_TRIM_STEP, 0, 0))
			return -1;
	}
	if (rest && bpf_skb_adjust_room(skb, -(__s32)rest, 0, 0))
		return -1;
	return 0;
}

/*
 * TCP legs: tcp_read_skb hands the psock whole skbs, also one whose head TCP already
 * delivered (a resent segment merged with new data is queued when seq < rcv_nxt < end_seq;
 * tcp_recvmsg skips the old bytes by copied_seq, tcp_read_skb does not). Redirected or passed
 * whole, its old bytes would reach the target twice. So the program remembers where the
 * stream stands (next_seq) and cuts the old bytes off. 0: go on with skb (maybe shorter);
 * 1: nothing new in it (drop); -1: it could not be trimmed.
 */
NSF_INLINE int nsr_tcp_seq(struct __sk_buff *skb, struct nsr_counters *c, __u32 len)
{
	struct nsr_tcp_cb cb;
	unsigned long off = __builtin_preserve_field_info(((struct sk_buff___nsr *)0)->cb,
							  0 /* BPF_FIELD_BYTE_OFFSET */);
	__u32 end, cut;
	__s32 old;

	if (bpf_probe_read_kernel(&cb, sizeof(cb), (void *)((unsigned long)skb + off)))
		return -1;
	end = cb.seq + len;
	if (!(c->flags & NSR_SEQ)) {
		/* The first skb after the join: nothing of the stream was handled before. */
		c->next_seq = end;
		c->flags |= NSR_SEQ;
		return 0;
	}
	old = (__s32)(c->next_seq - cb.seq);
	if (old <= 0) {
		c->next_seq = end;
		return 0;
	}
	/* All of it handled already cannot be queued by TCP, but never send a byte twice. */
	cut = (__u32)old < len ? (__u32)old : len;
	if (nsr_trim_head(skb, cut))
		return -1;
	__sync_fetch_and_add(&c->trimmed, cut);
	if (cut == len)
		return 1;
	c->next_seq = end;
	return 0;
}

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
	if (c->flags & NSR_TCP) {
		int r = nsr_tcp_seq(skb, c, len);

		if (r < 0)
			goto broken;
		if (r > 0) {
			__sync_fetch_and_add(&c->end, 1);
			return SK_DROP;
		}
		len = skb->len;
	}
	if (c->flags & NSR_TAINTED)
		goto pass;
	peer = bpf_map_lookup_elem(&nsr_peers, &cookie);
	if (!peer)
		goto taint;
	peer_cookie = *peer;
	if (bpf_sk_redirect_hash(skb, &nsr_targets, &peer_cookie, 0) != SK_PASS) {
		__sync_fetch_and_add(&c->fails, 1);
		goto taint;
	}
	__sync_fetch_and_add(&c->bytes, len);
	__sync_fetch_and_add(&c->skbs, 1);
	__sync_fetch_and_add(&c->end, 1);
	return SK_PASS;
broken:
	/* The stream has a hole now: the relay sees the flag and resets both legs. */
	c->flags |= NSR_BROKEN | NSR_TAINTED;
	__sync_fetch_and_add(&c->end, 1);
	return SK_DROP;
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
