/* The one place where programs account for what they did with a packet. */
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

static __always_inline void count_packet(struct __sk_buff *skb, enum pkt_reason reason)
{
	enum pkt_reason idx = reason;
	struct pkt_counter *c = bpf_map_lookup_elem(&pkt_counters, &idx);

	if (c) {
		c->packets++;
		c->bytes += skb->len;
	}
}

#endif
