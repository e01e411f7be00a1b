/* owner: feature cluster */
/* Cluster routing: the cluster's pod ranges and the overlay.
 *
 * cluster_routes answers in one LPM lookup whether a destination is a pod
 * of the cluster (never masqueraded, never a Service: no flow tracking) and,
 * for another node's pod range behind the overlay, that node's underlay
 * address. Those pods are reached by encapsulation: the tunnel key set on
 * the packet and a redirect to the node's flow-based (collect_md) VXLAN
 * device, which adds the outer headers; from_tunnel on that device's
 * ingress delivers what it decapsulates. What the node's stack forwards into
 * the overlay (a Service's backend behind it, after kube-proxy's DNAT) takes
 * the route of the cluster's ranges through the device, whose egress
 * (to_tunnel) sets the tunnel key the same way. Pod ranges reached by direct
 * routing have no tunnel: the FIB (routes installed by the node agent or
 * the infrastructure) forwards them. */
#ifndef EBPF_CNI_LIB_CLUSTER_H
#define EBPF_CNI_LIB_CLUSTER_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "../include/types.h"
#include "skb.h"
#include "verdict.h"

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 16384);
	__type(key, struct cluster_key);
	__type(value, struct cluster_route);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cluster_routes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cluster_settings);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cluster_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct overlay_settings);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} overlay_config SEC(".maps");

#define VXLAN_TTL 64
#define VXLAN_HLEN 8
#define VXLAN_FLAG_VNI bpf_htonl(0x08000000) /* the first word of a VXLAN header: "I", a VNI follows */

/* cluster_lookup finds the cluster route of a destination (addr: 4 or 16
 * bytes as in the IP header). */
static __always_inline struct cluster_route *cluster_lookup(__u8 family, const void *addr)
{
	struct cluster_key k = { .family = family };

	if (family == ADDR_FAMILY_V4) {
		k.prefixlen = 32 + 32;
		__builtin_memcpy(k.addr, addr, 4);
	} else {
		k.prefixlen = 32 + 128;
		__builtin_memcpy(k.addr, addr, 16);
	}
	return bpf_map_lookup_elem(&cluster_routes, &k);
}

static __always_inline struct cluster_settings *cluster_settings(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&cluster_config, &zero);
}

/* cluster_set_key gives the packet the overlay's tunnel key toward the node
 * of r; the VXLAN device adds the outer headers from it. */
static __always_inline int cluster_set_key(struct __sk_buff *skb, const struct cluster_settings *cs,
					   const struct cluster_route *r)
{
	struct bpf_tunnel_key key = {};
	__u64 flags;

	key.tunnel_id = cs->vni;
	key.tunnel_ttl = VXLAN_TTL;
	if (r->node_family == ADDR_FAMILY_V4) {
		__u32 a;

		__builtin_memcpy(&a, r->node, 4);
		key.remote_ipv4 = bpf_ntohl(a); /* host byte order, as the helper wants */
		flags = BPF_F_ZERO_CSUM_TX;     /* VXLAN over IPv4 may leave the UDP checksum out */
	} else {
		__builtin_memcpy(key.remote_ipv6, r->node, 16);
		flags = BPF_F_TUNINFO_IPV6;
	}
	return bpf_skb_set_tunnel_key(skb, &key, sizeof(key), flags);
}

/* cluster_route_of finds the cluster route of the packet's destination
 * (*r NULL: none, or not IP); < 0 when its headers are cut short. */
static __always_inline int cluster_route_of(struct __sk_buff *skb, struct cluster_route **r)
{
	void *data = skb_data(skb);
	void *data_end = skb_data_end(skb);
	struct ethhdr *eth = data;

	*r = NULL;
	if ((void *)(eth + 1) > data_end)
		return -1;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > data_end)
			return -1;
		*r = cluster_lookup(ADDR_FAMILY_V4, &ip->daddr);
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end)
			return -1;
		*r = cluster_lookup(ADDR_FAMILY_V6, &ip6->daddr);
	}
	return 0;
}

static __always_inline struct overlay_settings *overlay_settings(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&overlay_config, &zero);
}

/* cluster_encap sends the packet into the overlay toward the node of r. */
static __always_inline int cluster_encap(struct __sk_buff *skb, const struct cluster_route *r, enum pkt_reason *why)
{
	struct cluster_settings *cs = cluster_settings();

	if (!cs || !cs->vxlan_ifindex || cluster_set_key(skb, cs, r))
		return DROP(REASON_DROP_TUNNEL);
	*why = REASON_TUNNEL_ENCAP;
	return bpf_redirect(cs->vxlan_ifindex, 0);
}

#endif
