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
