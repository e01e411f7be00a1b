/* owner: feature bandwidth */
/* Source pacing: TCP senders on this node held to a pod's rate by their
 * own stack (bpf/sock_pacing.c). Pinned by name. */
#ifndef EBPF_CNI_LIB_PACING_H
#define EBPF_CNI_LIB_PACING_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "../include/types.h"

/* Network namespace cookie -> whose it is: a pod's host veth ifindex, or
 * 0 for the node's own netns. Only sockets of these namespaces are paced:
 * a socket anywhere else (another plugin's pods, or a test's "world") is
 * not this node's to touch. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 16385); /* as endpoint_devs, and the node */
	__type(key, __u64);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} local_netns SEC(".maps");

#endif
