/* owner: core */
/* The one redirect into a pod of this node, whichever program hands it the
 * packet (from_container, and lib/deliver.h for the uplinks and the
 * overlay): the endpoint's entry (lib/endpoint.h) says where, the pod's
 * ingress limit (bandwidth, lib/bandwidth.h) and another plugin's root
 * qdisc (lib/qdisc.h) say how. */
#ifndef EBPF_CNI_LIB_REDIRECT_H
#define EBPF_CNI_LIB_REDIRECT_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_helpers.h>
#include "../include/types.h"
#include "bandwidth.h"
#include "endpoint.h"
#include "qdisc.h"
#include "verdict.h"

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
#ifdef EBPF_CNI_NETKIT_PEER
	/* From a netkit pod's transmit, not a tc ingress hook: the kernel
	 * takes bpf_redirect_peer only there. The packet goes out of the other
	 * pod's host end instead, whose egress program (to_container,
	 * to_netkit) polices it, as through a queueing qdisc. */
	int via_qdisc = 1;
#else
	int via_qdisc = dst->flags & EP_F_QDISC;
#endif

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
