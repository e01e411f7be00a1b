/* owner: feature flows */
/* The destinations the node's netfilter may translate, as the node agent
 * knows them from the API (kube-proxy's Service ranges, ClusterIPs,
 * externalIPs, load-balancer IPs, the nodes' addresses for NodePorts), and
 * the agent's lease on that set.
 *
 * Without the set, a pod's first packet to anything outside the cluster's
 * pod ranges goes through the stack so that netfilter can decide
 * (lib/flow.h). With it, while the lease runs, a new flow to a destination
 * outside it is set up here as a settled fast flow (FLOW_F_BYPASS) and its
 * first packet takes the fast path like the rest; a destination in the set,
 * or any destination once the lease is over (the agent stopped renewing it,
 * or never wrote it), keeps the path through the stack. The agent writes
 * the set before it renews the lease, so a running lease never covers a set
 * older than the API it read. */
#ifndef EBPF_CNI_LIB_XLAT_H
#define EBPF_CNI_LIB_XLAT_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "../include/types.h"

#define XLAT_MAX_ENTRIES 65536

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, XLAT_MAX_ENTRIES);
	__type(key, struct xlat_key);  /* a prefix netfilter may translate */
	__type(value, struct xlat_dst); /* what kube-proxy has there, for people */
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlat_dsts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct xlat_term); /* the agent's lease on xlat_dsts */
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xlat_lease SEC(".maps");

/* xlat_bypass: a new flow of family to daddr (4 or 16 bytes as in the IP
 * header) may be set up without the stack: the agent's lease runs at now
 * (bpf_ktime_get_ns) and daddr is not in the set. */
static __always_inline int xlat_bypass(__u8 family, const __u8 *daddr, __u64 now)
{
	struct xlat_key k = { .family = family };
	struct xlat_term *l;
	__u32 zero = 0;

	l = bpf_map_lookup_elem(&xlat_lease, &zero);
	if (!l || now >= l->expires)
		return 0;
	if (family == ADDR_FAMILY_V4) {
		k.prefixlen = 32 + 32;
		__builtin_memcpy(k.addr, daddr, 4);
	} else {
		k.prefixlen = 32 + 128;
		__builtin_memcpy(k.addr, daddr, 16);
	}
	return bpf_map_lookup_elem(&xlat_dsts, &k) == NULL;
}

#endif
