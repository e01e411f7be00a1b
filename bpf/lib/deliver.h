/* owner: core */
/* Delivery into a pod of this node of a packet that came from outside it
 * (an uplink, the overlay): as a router would, straight into the pod's
 * netns (lib/redirect.h), unless the packet's flow goes through the stack
 * (lib/flow.h); the pod's ingress policy decides it (lib/policy.h). */
#ifndef EBPF_CNI_LIB_DELIVER_H
#define EBPF_CNI_LIB_DELIVER_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include "../include/types.h"
#include "skb.h"
#include "endpoint.h"
#include "flow.h"
#include "l3.h"
#include "pkt.h"
#include "policy.h"
#include "redirect.h"
#include "verdict.h"

/* Into the pod behind ep: TTL, L2, redirect_peer. A spent TTL goes to the
 * stack, translated already: it routes the packet to the pod's veth and
 * answers with its own time exceeded. */
static __always_inline int to_pod(struct __sk_buff *skb, const struct endpoint_info *ep, enum pkt_reason reason,
				  enum pkt_reason *why)
{
	void *data = skb_data(skb);
	void *data_end = skb_data_end(skb);
	struct ethhdr *eth = data;
	int rc;

	if ((void *)(eth + 1) > data_end)
		return DROP(REASON_DROP_MALFORMED);
	rc = l3_hop(eth + 1, data_end, eth->h_proto);
	if (rc < 0)
		return DROP(REASON_DROP_MALFORMED);
	*why = reason;
	if (rc == 0)
		return TC_ACT_OK;
	return endpoint_redirect(skb, eth, ep);
}

/* deliver hands s->p (as it is now, after any translation of ours) to the
 * pod behind ep, or to the stack when netfilter translated its flow (the
 * stack translates it back, and to_container decides its policy). fast:
 * the flow is known to be on the fast path, its flow is not looked up. */
static __always_inline int deliver(struct __sk_buff *skb, struct nat_scratch *s, const struct endpoint_info *ep,
				   enum pkt_reason reason, int fast, enum pkt_reason *why)
{
	int rc;

	if (!fast && flow_ingress(skb, s)) {
		*why = REASON_FLOW_STACK;
		return TC_ACT_OK;
	}
	rc = policy_into_pod(skb, s, ep);
	if (rc)
		return rc;
	return to_pod(skb, ep, reason, why);
}

static __always_inline struct endpoint_info *pod_of(const __u8 *addr, __u8 family)
{
	struct endpoint_key ek = { .family = family };

	__builtin_memcpy(ek.addr, addr, 16);
	return bpf_map_lookup_elem(&endpoints, &ek);
}

#endif
