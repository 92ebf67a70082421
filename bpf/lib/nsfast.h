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
