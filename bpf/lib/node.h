/* owner: shared */
/* The node's own facts (struct node_facts): no program reads them, so only
 * bpf/maps.c includes this header (pkg/maps creates and pins the map like
 * every other). Every ADD writes the netns cookie of its host veth's
 * network namespace: STATUS, GC and the operator CLI collect the entries
 * of endpoints whose host veth is gone only where they run in it. */
#ifndef EBPF_CNI_LIB_NODE_H
#define EBPF_CNI_LIB_NODE_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "../include/types.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct node_facts);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} node_info SEC(".maps");

#endif
