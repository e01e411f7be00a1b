/* owner: shared */
/* Packet bounds of a tc program's skb. */
#ifndef EBPF_CNI_LIB_SKB_H
#define EBPF_CNI_LIB_SKB_H

#include <linux/bpf.h>
#include <linux/stddef.h>

/* skb->data and skb->data_end read with one load each from the context
 * itself. Written as C, clang may compute &skb->data_end once, keep that
 * pointer in a register across inlined functions and load through it
 * later; the verifier rejects that ("dereference of modified ctx ptr"). */
static __always_inline void *skb_data(const struct __sk_buff *skb)
{
	void *p;

	asm volatile("%0 = *(u32 *)(%1 + %2)" : "=r"(p) : "r"(skb), "i"(offsetof(struct __sk_buff, data)));
	return p;
}

static __always_inline void *skb_data_end(const struct __sk_buff *skb)
{
	void *p;

	asm volatile("%0 = *(u32 *)(%1 + %2)" : "=r"(p) : "r"(skb), "i"(offsetof(struct __sk_buff, data_end)));
	return p;
}

#endif
