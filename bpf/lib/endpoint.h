/* owner: shared */
/* Endpoint maps: the pods of this node. ebpf-cni writes them on ADD and
 * removes them on DEL/GC; the programs read them. Pinned by name. How a
 * packet is handed to a pod is lib/redirect.h. */
#ifndef EBPF_CNI_LIB_ENDPOINT_H
#define EBPF_CNI_LIB_ENDPOINT_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in6.h>
#include <bpf/bpf_helpers.h>
#include "../include/types.h"

/* Pod address -> the veth it lives behind: the forwarding table. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* memory grows with pods, not with the cap */
	__uint(max_entries, 65536);
	__type(key, struct endpoint_key);
	__type(value, struct endpoint_info);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} endpoints SEC(".maps");

/* Host veth ifindex -> the pod behind it: its MAC and addresses. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct endpoint_dev);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} endpoint_devs SEC(".maps");

static __always_inline struct endpoint_info *endpoint_lookup4(__be32 addr)
{
	struct endpoint_key key = { .family = ADDR_FAMILY_V4 };

	__builtin_memcpy(key.addr, &addr, 4);
	return bpf_map_lookup_elem(&endpoints, &key);
}

static __always_inline struct endpoint_info *endpoint_lookup6(const struct in6_addr *addr)
{
	struct endpoint_key key = { .family = ADDR_FAMILY_V6 };

	__builtin_memcpy(key.addr, addr, 16);
	return bpf_map_lookup_elem(&endpoints, &key);
}

#endif
