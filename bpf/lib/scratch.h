/* owner: shared */
/* The per-CPU scratch slot of one program object (struct nat_scratch,
 * lib/pkt.h). Not pinned: every program object gets its own. */
#ifndef EBPF_CNI_LIB_SCRATCH_H
#define EBPF_CNI_LIB_SCRATCH_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "pkt.h"

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct nat_scratch);
} scratch SEC(".maps");

static __always_inline struct nat_scratch *scratch_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&scratch, &zero);
}

#endif
