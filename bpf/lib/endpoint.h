/* Endpoint maps: the pods of this node. ebpf-cni writes them on ADD and
 * removes them on DEL/GC; the programs read them. Pinned by name. */
#ifndef EBPF_CNI_LIB_ENDPOINT_H
#define EBPF_CNI_LIB_ENDPOINT_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in6.h>
#include <bpf/bpf_helpers.h>
#include "../include/types.h"
#include "bandwidth.h"
#include "qdisc.h"
#include "verdict.h"

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

/* Hand a packet to the pod behind dst, straight into its netns: the pod's
 * MAC as destination, its gateway's (the host veth's) as source. Every
 * redirect into a pod goes through here, so the pod's ingress limit holds
 * whichever program hands it the packet (bpf_redirect_peer skips the host
 * veth's egress hook, where to_container polices the stack's traffic).
 * When the host veth's root qdisc queues (EP_F_QDISC: another plugin's
 * tbf), the packet goes through the host veth's egress instead, that qdisc
 * and to_container (which then polices it) included (lib/qdisc.h).
 * A negative return is a drop reason. */
static __always_inline int endpoint_redirect(struct __sk_buff *skb, struct ethhdr *eth,
					     const struct endpoint_info *dst)
{
	int via_qdisc = dst->flags & EP_F_QDISC;

	if (!via_qdisc && bw_ingress(skb, dst->ifindex, dst->flags, 0))
		return DROP(REASON_DROP_BW_INGRESS);
	__builtin_memcpy(eth->h_dest, dst->mac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, dst->host_mac, ETH_ALEN);
	if (via_qdisc) {
		skb->tc_index = TC_INDEX_DELIVERY;
		return bpf_redirect(dst->ifindex, 0);
	}
	return bpf_redirect_peer(dst->ifindex, 0);
}

#endif
