/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * Admission: whether a new connection joins the shortcut at all.
 *
 * Joining costs both ends socket storage, a SOCKHASH entry (and its psock) and the pairing
 * maps; what it gains is per send redirected. A connection that exchanges one request and one
 * reply gains nothing (both are sent before their receiver is seen reading, so both keep TCP)
 * and pays the join, which makes it slower than without the shortcut. So the first end of
 * each pair reports at its close how many sends the shortcut carried for the connection; after
 * `after` connections in a row between the same endpoints (client address, server address and
 * port, host id) that carried fewer than NSF_ADMIT_MIN_REDIRECTS, each within
 * NSF_ADMIT_WINDOW_NS of the last, new connections between them keep TCP without joining.
 *
 * A probe still joins, at most one per `probe_ns` per endpoints (the first `probe_ns` after
 * their history began): the first one that gains resets the history, and the next connections
 * join again. Bounding probes by time, not by a share of connections, keeps their cost per
 * second fixed however fast short connections come, and lets every connection of endpoints
 * that connect less often than once per `probe_ns` join. Only the client end claims a probe
 * (it decides first: its ESTABLISHED comes with the SYN-ACK, the server's with the client's
 * ACK), recording the connection's ISNs in the entry so that the server end joins too; a
 * server end never claims one, which would join alone beside a client that kept TCP.
 *
 * A connection that keeps TCP records nothing at its close (it has no close callback), but it
 * keeps the streak's window open as a short connection would: so endpoints that keep
 * connecting stay on TCP between probes however long `probe_ns` is, and the window runs out
 * only after a quiet NSF_ADMIT_WINDOW_NS. (It moves last_ns at most every
 * NSF_ADMIT_REFRESH_NS, so that fast connections do not write the entry at every one.)
 *
 * Both ends decide on the same entry at their ESTABLISHED callbacks; a close in between can
 * make them disagree, and the one that joined alone stays unpaired (it keeps TCP, as any
 * unpaired socket does), cleans up at its close and records there as short: what it carried
 * is nothing, as for a connection to a peer outside the shortcut, whose ends never pair and
 * which admission thus stops joining. A missing or evicted entry means "join".
 *
 * Times come from bpf_ktime_get_ns() on different CPUs and an entry may be written between an
 * end's clock read and its lookup, so `now` can be before a stored time: differences are
 * compared signed, and last_ns only moves forward.
 */
#pragma once

#include "nsfast.h"
#include "sockmap_key.h"

/* Fewer sends carried than this (both directions together) and a connection gained less than
 * its join cost (docs/pod.md, "What a connection costs"). */
#define NSF_ADMIT_MIN_REDIRECTS 8
/* Short connections further apart than this do not count as a streak: at that rate the join
 * costs nothing that matters, and joining keeps the chance of a long connection. */
#define NSF_ADMIT_WINDOW_NS 1000000000LL
/* A connection that keeps TCP moves its endpoints' last_ns forward if it is older than this. */
#define NSF_ADMIT_REFRESH_NS (NSF_ADMIT_WINDOW_NS / 8)
#define NSF_ADMIT_MAX 16384

struct nsf_admit_key {
	__u32 client_ip[4];
	__u32 server_ip[4];
	__u16 server_port;
	__u16 pad;
	__u32 host_id; /* pod mode: nsf_pair_key.pad */
};

struct nsf_admit {
	__u64 last_ns;         /* when the last short connection closed (bpf_ktime_get_ns) */
	__u64 probe_ns;        /* when the last probe was claimed (first: when the history began) */
	__u32 streak;          /* short connections in a row, each within the window of the one before */
	__u32 probe_client_isn; /* the ISNs of the connection the last probe was claimed for */
	__u32 probe_server_isn;
	__u32 pad;
};

/* endpoints -> their recent short connections (LRU: a forgotten history means "join"). The
 * kernel's common LRU evicts in batches and keeps per-CPU free lists, so on a many-CPU node a
 * history can be forgotten before the map is full; and an entry deleted by one CPU can be
 * reused for other endpoints while another CPU still writes through its pointer. Both cost
 * speed only: a connection joins that could have kept TCP, or the reverse until a probe. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, NSF_ADMIT_MAX);
	__type(key, struct nsf_admit_key);
	__type(value, struct nsf_admit);
} nsf_admit SEC(".maps");

NSF_INLINE void nsf_admit_key_of(const struct nsf_pair_key *k, struct nsf_admit_key *a)
{
	nsf_copy6(a->client_ip, k->client_ip);
	nsf_copy6(a->server_ip, k->server_ip);
	a->server_port = k->server_port;
	a->pad = 0;
	a->host_id = k->pad;
}

/* Signed nanoseconds from `then` to `now` (negative: `then` was written later on another CPU). */
NSF_INLINE __s64 nsf_admit_since(__u64 now, __u64 then)
{
	return (__s64)(now - then);
}

/* Whether the end (`active`: the client end) of the connection of pair key k keeps TCP without
 * joining: its endpoints' last `after` connections (0: admission off) carried too little, the
 * last within the window before now, and it is not a probe (see above; claiming one, or
 * keeping TCP, updates the entry). */
NSF_INLINE int nsf_admit_skip(const struct nsf_pair_key *k, __u32 active, __u32 after,
			      __u64 probe_ns, __u64 now)
{
	struct nsf_admit_key a = {};
	struct nsf_admit *h;

	if (after == 0)
		return 0;
	nsf_admit_key_of(k, &a);
	h = bpf_map_lookup_elem(&nsf_admit, &a);
	if (!h || h->streak < after || nsf_admit_since(now, h->last_ns) > NSF_ADMIT_WINDOW_NS)
		return 0;
	if (h->probe_client_isn == k->client_isn && h->probe_server_isn == k->server_isn)
		return 0; /* the client end claimed this connection as a probe */
	if (!active || nsf_admit_since(now, h->probe_ns) < (__s64)probe_ns) {
		if (nsf_admit_since(now, h->last_ns) > NSF_ADMIT_REFRESH_NS)
			h->last_ns = now;
		return 1;
	}
	/* Racing claims on other CPUs may both probe: probes are bounded, not exact. */
	h->probe_ns = now;
	h->probe_client_isn = k->client_isn;
	h->probe_server_isn = k->server_isn;
	return 0;
}

/* Records, at the close of its first end, that the connection of pair key k carried
 * `redirects` sends through the shortcut. */
NSF_INLINE void nsf_admit_record(const struct nsf_pair_key *k, __u64 redirects, __u64 now)
{
	struct nsf_admit_key a = {};
	struct nsf_admit *h;

	nsf_admit_key_of(k, &a);
	if (redirects >= NSF_ADMIT_MIN_REDIRECTS) {
		bpf_map_delete_elem(&nsf_admit, &a);
		return;
	}
	h = bpf_map_lookup_elem(&nsf_admit, &a);
	if (!h) {
		struct nsf_admit n = { .last_ns = now, .probe_ns = now, .streak = 1 };

		bpf_map_update_elem(&nsf_admit, &a, &n, BPF_NOEXIST);
		return;
	}
	/* Racing closes on other CPUs may lose a count: the history is a heuristic. */
	if (nsf_admit_since(now, h->last_ns) > NSF_ADMIT_WINDOW_NS) {
		h->streak = 1; /* a new history */
		h->probe_ns = now;
	} else if (h->streak < 0xffffffffU)
		h->streak += 1;
	if (nsf_admit_since(now, h->last_ns) > 0)
		h->last_ns = now;
}
