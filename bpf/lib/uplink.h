/* owner: shared */
/* The uplinks' addresses (uplinks: ifindex -> its IPv4 and IPv6 address),
 * written by pkg/uplink (a building block) with the uplinks' programs: the
 * address masquerade translates to (bpf/to_netdev.c) and the overlay's
 * outer source address (encap_to_uplink, lib/overlay.h). */
#ifndef EBPF_CNI_LIB_UPLINK_H
#define EBPF_CNI_LIB_UPLINK_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "../include/types.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct uplink_info);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} uplinks SEC(".maps");

#endif
