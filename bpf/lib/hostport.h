/* owner: feature hostPort */
/* hostPort: where the node's published ports (lib/published_ports.h) lead,
 * for packets and for the node's own sockets: the node's addresses, the
 * settings, the sockets' reverse translation. The packets' translation is
 * lib/hostport_nat.h. */
#ifndef EBPF_CNI_LIB_HOSTPORT_H
#define EBPF_CNI_LIB_HOSTPORT_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "../include/types.h"
#include "addr.h"
#include "published_ports.h"

/* The node's own addresses (endpoint_key layout) -> ifindex: where a port
 * published on every address answers. Written by ADDs with port mappings. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, struct endpoint_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} node_addrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct hostport_settings);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} hostport_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct sock_rev_key);
	__type(value, struct sock_rev);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sock_revnat SEC(".maps");

static __always_inline struct hostport_settings *hostport_cfg(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&hostport_config, &zero);
}

static __always_inline int hostport_active(void)
{
	struct hostport_settings *c = hostport_cfg();

	return c && c->active;
}

static __always_inline int is_node_addr(__u8 family, const __u8 *addr)
{
	struct endpoint_key k = { .family = family };

	__builtin_memcpy(k.addr, addr, 16);
	return bpf_map_lookup_elem(&node_addrs, &k) != NULL;
}

/* hostport_match finds the target of a packet or connection to addr:port;
 * local says addr is known to be the node's (loopback). */
static __always_inline struct hostport_target *hostport_match(__u8 family, __u8 proto, __be16 port,
							       const __u8 *addr, int local)
{
	struct hostport_key k = { .family = family, .proto = proto, .port = port };
	struct hostport_entry *e;
	int i;

	e = bpf_map_lookup_elem(&hostports, &k);
	if (!e)
		return NULL;
	if (e->any) {
		if (local || is_node_addr(family, addr))
			return &e->to[0];
		return NULL;
	}
#pragma unroll
	for (i = 0; i < HOSTPORT_MAX_IPS; i++) {
		if (i < e->n && addr_equal(e->host_ip[i], addr))
			return &e->to[i];
	}
	return NULL;
}

#endif
