/* owner: shared */
/* Addresses as the maps hold them: 16 bytes, IPv4 in the first 4. */
#ifndef EBPF_CNI_LIB_ADDR_H
#define EBPF_CNI_LIB_ADDR_H

#include <linux/types.h>
#include <bpf/bpf_helpers.h>

static __always_inline int addr_is_zero(const __u8 *a)
{
	const __u32 *w = (const __u32 *)a;

	return !(w[0] | w[1] | w[2] | w[3]);
}

static __always_inline int addr_equal(const __u8 *a, const __u8 *b)
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;

	return !((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3]));
}

#endif
