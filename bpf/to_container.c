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
 * One exception: when the host veth's root qdisc queues (another plugin's
 * tbf, an fq: EP_F_QDISC, lib/qdisc.h), endpoint_redirect sends its
 * deliveries through the host veth's egress too, marked in tc_index; they
 * are counted as via_qdisc and policed here, and are not stack flows.
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
#include "lib/flow.h"
#include "lib/pkt.h"
#include "lib/policy.h"
#include "lib/published_ports.h"
#include "lib/qdisc.h"
#include "lib/scratch.h"
#include "lib/verdict.h"

/* A flow the stack forwarded to the pod may carry the stack's NAT (a
 * chained portmap's DNAT, kube-proxy), and its next packets toward the pod
 * will come through the stack again: its replies must go back through the
 * stack too (lib/flow.h: flow_via_stack), not be redirected past it. Mark
 * the pod, so from_container looks for such flows. The node's own sockets
 * need nothing: replies to the node reach the stack anyway. */
static __always_inline void remember_stack_flow(struct __sk_buff *skb, struct endpoint_dev *dev)
{
	struct nat_scratch *s;

	if (skb->sk)
		return;
	s = scratch_get();
	if (!s)
		return;
	__builtin_memset(&s->p, 0, sizeof(s->p));
	if (nat_parse(skb, &s->p) || s->p.later_frag || !hostport_proto(s->p.proto))
		return;
	flow_via_stack(s, 0, bpf_ktime_get_ns());
	if (!(dev->flags & EP_F_STACK))
		dev->flags |= EP_F_STACK;
}

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
	if (skb->tc_index == TC_INDEX_DELIVERY) {
		/* endpoint_redirect's, through the qdisc (lib/qdisc.h) */
		skb->tc_index = 0;
		*why = REASON_VIA_QDISC;
		return TC_ACT_OK;
	}
	/* What the stack delivers to the pod, after any translation of
	 * netfilter's, is decided here (lib/policy.h). */
	if (policy_on()) {
		int rc = policy_stack_to_pod(skb, ifindex);

		if (rc)
			return rc;
	}
	remember_stack_flow(skb, dev);
	return TC_ACT_OK;
}

SEC("tc")
int to_container(struct __sk_buff *skb)
{
	enum pkt_reason why = REASON_FROM_STACK;
	int ret = handle(skb, &why);

	return verdict(skb, ret, why, PKT_DIR_INGRESS);
}

char __license[] SEC("license") = "GPL";
