//go:build ignore

/* Hook: tc egress of the host end of a pod's veth (packets the node's stack
 * delivers to the pod).
 *
 * Only the stack's traffic passes here: what the other programs hand to a
 * pod goes straight into its netns with bpf_redirect_peer and skips this
 * hook. That is traffic from the node itself, traffic the node forwarded,
 * and traffic another plugin's NAT (a chained portmap, kube-proxy) sent to
 * the pod.
 *
 * It polices the pod's ingress limit for that traffic (endpoint_redirect
 * polices the rest). Where the host veth has an fq qdisc, it paces instead
 * of dropping: the packet gets its departure time (EDT). */

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

#include "include/types.h"
#include "lib/bandwidth.h"
#include "lib/counters.h"
#include "lib/endpoint.h"
#include "lib/verdict.h"

static __always_inline int handle(struct __sk_buff *skb, enum pkt_reason *why)
{
	__u32 ifindex = skb->ifindex;
	struct endpoint_dev *dev;

	*why = REASON_FROM_STACK;
	dev = bpf_map_lookup_elem(&endpoint_devs, &ifindex);
	if (!dev)
		return TC_ACT_OK; /* the pod is being set up or torn down */
	if (bw_ingress(skb, ifindex, dev->flags, 1))
		return DROP(REASON_DROP_BW_INGRESS);
	return TC_ACT_OK;
}

SEC("tc")
int to_container(struct __sk_buff *skb)
{
	enum pkt_reason why = REASON_FROM_STACK;
	int ret = handle(skb, &why);

	return verdict(skb, ret, why);
}

char __license[] SEC("license") = "GPL";
