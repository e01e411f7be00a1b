/* owner: shared */
/* Who a pod is in Kubernetes, for people and the node agent: no program
 * reads it, so only bpf/maps.c includes this header (pkg/maps creates and
 * pins the map like every other). ebpf-cni writes an entry on ADD when the
 * runtime passed K8S_POD_NAMESPACE/K8S_POD_NAME in CNI_ARGS, and removes
 * it with the endpoint's entries on DEL and GC. */
#ifndef EBPF_CNI_LIB_PODS_H
#define EBPF_CNI_LIB_PODS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "../include/types.h"

/* Host veth ifindex (as endpoint_devs) -> the pod's namespace, name, UID. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 16384); /* as endpoint_devs */
	__type(key, __u32);
	__type(value, struct endpoint_pod);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} endpoint_pods SEC(".maps");

#endif
