//go:build ignore

/* Hook: tc egress of the node's VXLAN device (the overlay; lib/cluster.h).
 *
 * from_container sets the tunnel key of what it sends into the overlay
 * itself. What the node's stack forwards there has none: a pod's first
 * packet to a Service whose backend is behind the overlay (kube-proxy
 * DNATed it, the route of the cluster's ranges through this device
 * forwarded it), or a backend's reply netfilter translated back. Its key
 * comes from the same table: the node behind the destination's pod range.
 * Without one the packet cannot leave: dropped and counted. */

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

#include "include/types.h"
#include "lib/cluster.h"
#include "lib/counters.h"
#include "lib/policy.h"
#include "lib/verdict.h"

static __always_inline int handle(struct __sk_buff *skb, enum pkt_reason *why)
{
	struct bpf_tunnel_key key;
	struct cluster_settings *cs;
	struct cluster_route *r;
	int rc;

	*why = REASON_REDIRECT;
	/* from_container's, keyed already (toward an IPv4 or an IPv6 node:
	 * the helper reads a key of the family its flag names) */
	if (!bpf_skb_get_tunnel_key(skb, &key, sizeof(key), 0) ||
	    !bpf_skb_get_tunnel_key(skb, &key, sizeof(key), BPF_F_TUNINFO_IPV6))
		return TC_ACT_OK;
	/* A pod's packet the stack forwards into the overlay (after
	 * kube-proxy's translation): its egress policy decides it here. */
	rc = policy_stack_from_pod(skb);
	if (rc)
		return rc;
	if (cluster_route_of(skb, &r) < 0)
		return DROP(REASON_DROP_MALFORMED);
	cs = cluster_settings();
	if (!r || !(r->flags & CLUSTER_F_TUNNEL) || !cs || cluster_set_key(skb, cs, r))
		return DROP(REASON_DROP_TUNNEL);
	*why = REASON_TUNNEL_ENCAP;
	return TC_ACT_OK;
}

SEC("tc")
int to_tunnel(struct __sk_buff *skb)
{
	enum pkt_reason why = REASON_PASS;
	int ret = handle(skb, &why);

	return verdict(skb, ret, why, PKT_DIR_EGRESS); /* TCX_NEXT on egress: the device transmits it */
}

char __license[] SEC("license") = "GPL";
