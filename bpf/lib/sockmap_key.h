/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * Connection identity for the sockmap shortcut.
 *
 * Both ends of one TCP connection compute the same pair key at their ESTABLISHED callback:
 * client and server address/port (IPv4 as ::ffff:a.b.c.d, so a v4-mapped IPv6 socket pairs
 * with a plain IPv4 one) plus both initial sequence numbers. The active side sees its own ISN
 * in snd_nxt-1 and the server's in rcv_nxt-1; the passive side sees them swapped. Two
 * connections with equal 4-tuples in different namespaces differ in their ISNs (random per
 * connection), so their pair keys differ; the key is used only to *pair* the two sockets
 * once, after which everything is keyed by socket cookies, which the kernel never reuses.
 */
#pragma once

#include "nsfast.h"

struct nsf_pair_key {
	__u32 client_ip[4]; /* network byte order words */
	__u32 server_ip[4];
	__u32 client_isn;
	__u32 server_isn;
	__u16 client_port; /* host byte order */
	__u16 server_port;
	__u32 pad; /* 0; pod mode: the pods' host id (pods of different hosts never pair) */
};

/* What the key builder needs, in plain form so it can be unit-tested from a tc program. */
struct nsf_conn_view {
	__u32 family;      /* AF_INET or AF_INET6 */
	__u32 active;      /* 1 on the connecting side */
	__u32 local_ip4;   /* network order (AF_INET) */
	__u32 remote_ip4;
	__u32 local_ip6[4];  /* network order words (AF_INET6) */
	__u32 remote_ip6[4];
	__u32 local_port;  /* host order */
	__u32 remote_port; /* host order */
	__u32 snd_nxt;
	__u32 rcv_nxt;
};

/* Fills *k from *v. Returns 0, or -1 for an unsupported family. */
NSF_INLINE int nsf_make_pair_key(const struct nsf_conn_view *v, struct nsf_pair_key *k)
{
	__u32 local[4], remote[4];

	if (v->family == AF_INET) {
		nsf_v4_mapped(local, v->local_ip4);
		nsf_v4_mapped(remote, v->remote_ip4);
	} else if (v->family == AF_INET6) {
		nsf_copy6(local, v->local_ip6);
		nsf_copy6(remote, v->remote_ip6);
	} else {
		return -1;
	}
	k->pad = 0;
	if (v->active) {
		nsf_copy6(k->client_ip, local);
		nsf_copy6(k->server_ip, remote);
		k->client_port = (__u16)v->local_port;
		k->server_port = (__u16)v->remote_port;
		k->client_isn = v->snd_nxt - 1;
		k->server_isn = v->rcv_nxt - 1;
	} else {
		nsf_copy6(k->client_ip, remote);
		nsf_copy6(k->server_ip, local);
		k->client_port = (__u16)v->remote_port;
		k->server_port = (__u16)v->local_port;
		k->client_isn = v->rcv_nxt - 1;
		k->server_isn = v->snd_nxt - 1;
	}
	return 0;
}
