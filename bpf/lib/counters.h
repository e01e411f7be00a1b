/* The one place where programs account for what they did with a packet:
 * node-wide per reason (pkt_counters) and per device (endpoint_counters). */
#ifndef EBPF_CNI_LIB_COUNTERS_H
#define EBPF_CNI_LIB_COUNTERS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "../include/types.h"

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, REASON_MAX);
	__type(key, enum pkt_reason); /* also puts the enum into BTF for bpf2go */
	__type(value, struct pkt_counter);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} pkt_counters SEC(".maps");

/* Device ifindex -> its counters per reason. The programs create an entry on
 * a device's first packet, so a device without an endpoint entry is counted
 * too; DEL and GC delete the entry of an endpoint they remove. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* memory grows with devices, not with the cap */
	__uint(max_entries, 16384);           /* as endpoint_devs */
	__type(key, __u32);
	__type(value, struct dev_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} endpoint_counters SEC(".maps");

/* The first value of a device's counters: too big for the stack. */
static const struct dev_counters dev_counters_zero;

static __always_inline void count_device(struct __sk_buff *skb, enum pkt_reason reason)
{
	__u32 ifindex = skb->ifindex;
	__u32 idx = reason;
	struct dev_counters *ec;

	ec = bpf_map_lookup_elem(&endpoint_counters, &ifindex);
	if (!ec) {
		/* The new element is zero on every CPU. BPF_NOEXIST: another CPU
		 * may have created it meanwhile; then the lookup finds that one. A
		 * full map only costs the per-device count, never the packet. */
		bpf_map_update_elem(&endpoint_counters, &ifindex, &dev_counters_zero, BPF_NOEXIST);
		ec = bpf_map_lookup_elem(&endpoint_counters, &ifindex);
		if (!ec)
			return;
	}
	/* The barrier keeps clang from reusing an earlier comparison on
	 * another register: the verifier rejects by_reason[idx] as "unbounded
	 * memory access" unless the check is on the register it indexes with. */
	asm volatile("" : "+r"(idx));
	if (idx >= REASON_MAX)
		return;
	ec->by_reason[idx].packets++;
	ec->by_reason[idx].bytes += skb->len;
}

static __always_inline void count_packet(struct __sk_buff *skb, enum pkt_reason reason)
{
	enum pkt_reason idx = reason;
	struct pkt_counter *c = bpf_map_lookup_elem(&pkt_counters, &idx);

	if (c) {
		c->packets++;
		c->bytes += skb->len;
	}
	count_device(skb, reason);
}

#endif
