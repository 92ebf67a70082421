/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/* Common includes and constants for nsfast's BPF programs. */
#pragma once

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif

#define NSF_INLINE static __always_inline

#ifndef offsetof
#define offsetof(type, member) __builtin_offsetof(type, member)
#endif

/* An IPv4 address (network order) as the IPv6 words of its ::ffff:a.b.c.d form. */
NSF_INLINE void nsf_v4_mapped(__u32 out[4], __u32 ip4)
{
	out[0] = 0;
	out[1] = 0;
	out[2] = bpf_htonl(0x0000ffff);
	out[3] = ip4;
}

/* Copies an IPv6 address held as four words. */
NSF_INLINE void nsf_copy6(__u32 out[4], const __u32 in[4])
{
	out[0] = in[0];
	out[1] = in[1];
	out[2] = in[2];
	out[3] = in[3];
}

/*
 * Reads a u32 context field with one direct load at a constant offset. Plain C reads of
 * neighbouring fields can be compiled into a moved ctx pointer, which the verifier rejects
 * ("dereference of modified ctx ptr").
 */
#define NSF_CTX_U32(ctx, field)                                                   \
	({                                                                        \
		__u32 __v;                                                        \
		asm volatile("%0 = *(u32 *)(%1 + %2)"                             \
			     : "=r"(__v)                                          \
			     : "r"(ctx), "i"(offsetof(typeof(*(ctx)), field)));    \
		__v;                                                              \
	})
