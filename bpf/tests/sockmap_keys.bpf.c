// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * BPF_PROG_TEST_RUN harness for the sockmap helpers (key builder, port filter: nsf_test_keys;
 * pairing and unpairing: nsf_test_pair; admission: nsf_test_admit) (sockops and sk_msg programs cannot be
 * test-run, so their helpers are exercised through a tc classifier, as Cilium does).
 *
 * Input packet: 14 bytes of padding (a fake Ethernet header) then a struct nsf_conn_view.
 * The program builds the pair key into nsf_test_out[0] and returns nsf_port_allowed() of the
 * key's server port (1/0), or 255 when the view could not be read or keyed.
 */
#include "nsfast.h"
#include "sockmap_key.h"
#include "sockmap_maps.h"

char LICENSE[] SEC("license") = "Dual MIT/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct nsf_pair_key);
} nsf_test_out SEC(".maps");

SEC("classifier")
int nsf_test_keys(struct __sk_buff *skb)
{
	struct nsf_conn_view v = {};
	struct nsf_pair_key k = {};
	__u32 zero = 0;

	if (bpf_skb_load_bytes(skb, 14, &v, sizeof(v)) != 0)
		return 255;
	if (nsf_make_pair_key(&v, &k) != 0)
		return 255;
	bpf_map_update_elem(&nsf_test_out, &zero, &k, BPF_ANY);
	return nsf_port_allowed(k.server_port);
}

#include "sockmap_pair.h"

/* Input for nsf_test_pair, after 14 bytes of padding. */
struct nsf_test_pair_in {
	struct nsf_pair_key key;
	__u64 cookie;
	__u32 role;
	__u32 op; /* 0: established, 1: close */
};

/* The peer cookie nsf_pair handed the last claimer (0 unless it returned NSF_PAIRED). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} nsf_test_claimed SEC(".maps");

/* Runs nsf_pair (op 0; returns NSF_AMBIGUOUS/PENDING/PAIRED, the claimer's peer cookie into
 * nsf_test_claimed) or nsf_unpair (op 1; returns 3) on the input, or 255 when the input
 * cannot be read. */
SEC("classifier")
int nsf_test_pair(struct __sk_buff *skb)
{
	struct nsf_test_pair_in in = {};
	__u64 other = 0;
	__u32 zero = 0;
	int r;

	if (bpf_skb_load_bytes(skb, 14, &in, sizeof(in)) != 0)
		return 255;
	if (in.op == 0) {
		r = nsf_pair(&in.key, in.cookie, in.role, &other);
		bpf_map_update_elem(&nsf_test_claimed, &zero, &other, BPF_ANY);
		return r;
	}
	nsf_unpair(&in.key, in.cookie);
	return 3;
}

#include "sockmap_admit.h"

/* Input for nsf_test_admit, after 14 bytes of padding. */
struct nsf_test_admit_in {
	struct nsf_pair_key key;
	__u64 now;
	__u32 redirects;
	__u32 after;
	__u32 op; /* 0: nsf_admit_skip, 1: nsf_admit_record */
	__u32 active; /* nsf_admit_skip: 1 for the client end */
	__u64 probe_ns;
};

/* Runs nsf_admit_skip (op 0; returns its verdict, 1: keep TCP) or nsf_admit_record (op 1;
 * returns 3) on the input, or 255 when the input cannot be read. */
SEC("classifier")
int nsf_test_admit(struct __sk_buff *skb)
{
	struct nsf_test_admit_in in = {};

	if (bpf_skb_load_bytes(skb, 14, &in, sizeof(in)) != 0)
		return 255;
	if (in.op == 0)
		return nsf_admit_skip(&in.key, in.active, in.after, in.probe_ns, in.now);
	nsf_admit_record(&in.key, in.redirects, in.now);
	return 3;
}
