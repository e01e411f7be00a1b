/* owner: shared */
/* The node's published ports (hostports), keyed by (family, protocol,
 * port), so a lookup costs the same for 10 or 10,000 mappings. hostPort
 * publishes them and serves them (lib/hostport.h); masquerade never
 * translates a flow to one (nat_port_taken in lib/nat.h). */
#ifndef EBPF_CNI_LIB_PUBLISHED_PORTS_H
#define EBPF_CNI_LIB_PUBLISHED_PORTS_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include "../include/types.h"
#include "addr.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 131072);
	__type(key, struct hostport_key);
	__type(value, struct hostport_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} hostports SEC(".maps");

static __always_inline int hostport_proto(__u8 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP;
}

/* hostport_published reports whether port is published for proto on addr,
 * an address of the node: by a mapping on every node address, or on addr
 * itself. The masquerade never translates a flow to such a port
 * (nat_port_taken in lib/nat.h). */
static __always_inline int hostport_published(__u8 family, __u8 proto, __be16 port, const __u8 *addr)
{
	struct hostport_key k = { .family = family, .proto = proto, .port = port };
	struct hostport_entry *e;
	int i;

	if (!hostport_proto(proto))
		return 0;
	e = bpf_map_lookup_elem(&hostports, &k);
	if (!e)
		return 0;
	if (e->any)
		return 1;
#pragma unroll
	for (i = 0; i < HOSTPORT_MAX_IPS; i++) {
		if (i < e->n && addr_equal(e->host_ip[i], addr))
			return 1;
	}
	return 0;
}

#endif
