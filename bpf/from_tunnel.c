//go:build ignore

/* Hook: tc ingress of the node's VXLAN device (the overlay; lib/cluster.h).
 *
 * The device decapsulated a packet another node's from_container sent into
 * the overlay: a packet of one of its pods for a pod of this node. It goes
 * straight into the pod (bpf_redirect_peer), unless netfilter translated
 * its flow on this node (the reply of a local pod's connection to a
 * Service whose backend is that remote pod, lib/flow.h): that one, and
 * anything not for a local pod, goes to the stack. */

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

#include "include/types.h"
#include "lib/counters.h"
#include "lib/deliver.h"
#include "lib/endpoint.h"
#include "lib/flow.h"
#include "lib/pkt.h"
#include "lib/scratch.h"
#include "lib/verdict.h"

/* The inner frame's destination MAC is the sender's gateway, not this
 * device's: for the stack the packet is for this host. */
static __always_inline int to_stack(struct __sk_buff *skb)
{
	bpf_skb_change_type(skb, PACKET_HOST);
	return TC_ACT_OK;
}

static __always_inline int handle(struct __sk_buff *skb, enum pkt_reason *why)
{
	struct nat_scratch *s = scratch_get();
	struct endpoint_info *ep;
	int ret;

	*why = REASON_PASS;
	if (!s)
		return to_stack(skb);
	__builtin_memset(&s->p, 0, sizeof(s->p));
	if (nat_parse(skb, &s->p))
		return to_stack(skb);
	ep = pod_of(s->p.daddr, s->p.family);
	if (!ep)
		return to_stack(skb);
	ret = deliver(skb, s, ep, REASON_TUNNEL_DECAP, 0, why);
	if (ret == TC_ACT_OK)
		return to_stack(skb);
	return ret;
}

SEC("tc")
int from_tunnel(struct __sk_buff *skb)
{
	enum pkt_reason why = REASON_PASS;
	int ret = handle(skb, &why);

	return verdict(skb, ret, why, PKT_DIR_INGRESS);
}

char __license[] SEC("license") = "GPL";
