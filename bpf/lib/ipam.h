/* owner: shared */
/* IPAM allocation maps, written and read by ebpf-ipam only (pkg/ipam) and
 * shown by the operator CLI. No program reads them: anti-spoofing checks a
 * pod's addresses in endpoint_devs, which ADD writes from the IPAM result.
 * Declared here for bpf/maps.c, which pkg/maps creates them from; pinned by
 * name under bpfRoot. ipam_nets is also the network registry of pkg/maps
 * (RegisterNetwork), which masquerade uses too. */
#ifndef EBPF_CNI_LIB_IPAM_H
#define EBPF_CNI_LIB_IPAM_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "../include/types.h"

/* Every address held by an attachment, all networks of the node. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* memory grows with use, not with the cap */
	__uint(max_entries, 262144);
	__type(key, struct ipam_key);
	__type(value, struct ipam_owner);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ipam_allocs SEC(".maps");

/* Round-robin cursor: the last address reserved in each range set. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 16384);
	__type(key, struct ipam_cursor_key);
	__type(value, struct ipam_cursor);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ipam_cursors SEC(".maps");

/* net_id -> network name, to catch FNV clashes between network names. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct ipam_net);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ipam_nets SEC(".maps");

#endif
