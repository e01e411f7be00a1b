//go:build ignore

/* Hook: tc ingress of the host end of a pod's veth (packets leaving the pod).
 *
 * 1. Anti-spoofing: the source MAC must be the pod's, the source address one
 *    of the pod's (ARP sender address included); drops are counted by reason.
 * 2. ARP requests from the pod are answered here with the host veth's MAC:
 *    every address off the pod's link is reached through that gateway, and
 *    the node needs no bridge, no proxy_arp and no address on the veth.
 * 3. hostPort: a reply of a published port's flow gets the node's address
 *    and the hostPort back; a packet to a published port of the node goes
 *    to the pod behind it (hairpin when that is the sender). Only pods and
 *    nodes that have these pay for the lookups.
 * 4. Netfilter (lib/flow.h): a flow to a destination outside the cluster's
 *    pod ranges (a Service, the world) starts through the stack, so that
 *    kube-proxy's rules see its first packet; it stays there when netfilter
 *    translated it, and takes the fast path otherwise. While the node
 *    agent's lease on the set of destinations netfilter may translate runs
 *    (lib/xlat.h), a flow to a destination outside that set is fast from
 *    its first packet. A reply to a flow the node's stack delivered
 *    (another plugin's NAT) goes to the stack.
 * 5. A destination that is a pod of this node: rewrite L2, decrement TTL and
 *    bpf_redirect_peer straight into the other pod's netns (no bridge, no
 *    backlog queue, no netfilter FORWARD).
 * 6. A pod of another node behind the overlay (lib/overlay.h): VXLAN's
 *    outer headers written here and out of the uplink (encap_to_uplink),
 *    else the tunnel key and a redirect to the node's VXLAN device.
 * 7. Anything else: bpf_fib_lookup; forwarded with bpf_redirect or
 *    bpf_redirect_neigh when the FIB says so (other nodes' pod ranges by
 *    direct routing, the world), else (local destination, fragmentation
 *    needed, no route...) handed to the stack.
 * 8. NetworkPolicy (lib/policy.h): a new flow to a destination that is
 *    final here (a pod of this node, the cluster's pod ranges) is decided
 *    before anything forwards it; one the stack may translate (a Service)
 *    where it leaves the stack.
 * 9. Another plugin's qdiscs on the host veth (lib/qdisc.h): with its
 *    ingress qdisc, what 5 and 7 would redirect goes to its filters and the
 *    stack instead; a root qdisc that queues is noted on the pod's
 *    endpoint, so that deliveries to the pod pass it. */

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/in.h>
#include <linux/udp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "include/types.h"
#include "lib/skb.h"
#include "lib/bandwidth.h"
#include "lib/cluster.h"
#include "lib/conntrack.h"
#include "lib/counters.h"
#include "lib/endpoint.h"
#include "lib/fib.h"
#include "lib/flow.h"
#include "lib/hostport.h"
#include "lib/hostport_nat.h"
#include "lib/l3.h"
#include "lib/overlay.h"
#include "lib/pkt.h"
/* lib/policy.h's policy_from_pod_decide: besides the pods of this node,
 * from_container decides the flows to the cluster's pod ranges, whose
 * addresses no Service translates. */
#define POLICY_FINAL_DST(p) cluster_lookup((p)->family, (p)->daddr)
#include "lib/policy.h"
#include "lib/qdisc.h"
#include "lib/redirect.h"
#include "lib/scratch.h"
#include "lib/verdict.h"

/* linux/if_arp.h drags in libc headers; the few ARP constants we need. */
#define ARPHRD_ETHER 1
#define ARPOP_REQUEST 1
#define ARPOP_REPLY 2

struct arphdr {
	__be16 ar_hrd;
	__be16 ar_pro;
	__u8 ar_hln;
	__u8 ar_pln;
	__be16 ar_op;
};

/* The Ethernet/IPv4 ARP payload after struct arphdr. */
struct arp_eth_ipv4 {
	__u8 sha[ETH_ALEN];
	__be32 sip;
	__u8 tha[ETH_ALEN];
	__be32 tip;
} __attribute__((packed));

static __always_inline int mac_equal(const __u8 *a, const __u8 *b)
{
	return !((*(__u32 *)a ^ *(__u32 *)b) | (*(__u16 *)(a + 4) ^ *(__u16 *)(b + 4)));
}

/* dev_has_ip4/6: addr is one of the pod's: anti-spoofing from the device
 * entry, which lists them, without an endpoints lookup. */
static __always_inline int dev_has_ip4(const struct endpoint_dev *dev, __be32 addr)
{
	for (int i = 0; i < ENDPOINT_MAX_IPS; i++) {
		if (i >= dev->n_ip4)
			break;
		if (dev->ip4[i] == addr)
			return 1;
	}
	return 0;
}

static __always_inline int dev_has_ip6(const struct endpoint_dev *dev, const struct in6_addr *addr)
{
	for (int i = 0; i < ENDPOINT_MAX_IPS; i++) {
		if (i >= dev->n_ip6)
			break;
		const __u32 *a = (const __u32 *)dev->ip6[i];

		if (a[0] == addr->in6_u.u6_addr32[0] && a[1] == addr->in6_u.u6_addr32[1] &&
		    a[2] == addr->in6_u.u6_addr32[2] && a[3] == addr->in6_u.u6_addr32[3])
			return 1;
	}
	return 0;
}

/* qdisc_relearn sets EP_F_QDISC to want on every address entry of the pod
 * behind the host veth skb came in on, then on the device entry's copy
 * (lib/qdisc.h, qdisc_learn_dev). A global function: verified once, on
 * its own, and only run when the copy disagrees with the qdiscs. */
__attribute__((noinline)) int qdisc_relearn(struct __sk_buff *skb, __u32 want)
{
	__u32 ifindex = skb->ifindex;
	struct endpoint_dev *dev = bpf_map_lookup_elem(&endpoint_devs, &ifindex);
	struct endpoint_info *ep;

	if (!dev)
		return 0;
	want &= EP_F_QDISC;
	for (int i = 0; i < ENDPOINT_MAX_IPS; i++) {
		if (i < dev->n_ip4) {
			ep = endpoint_lookup4(dev->ip4[i]);
			if (ep && ep->ifindex == ifindex && (ep->flags & EP_F_QDISC) != want)
				ep->flags ^= EP_F_QDISC;
		}
		if (i < dev->n_ip6) {
			ep = endpoint_lookup6((const struct in6_addr *)dev->ip6[i]);
			if (ep && ep->ifindex == ifindex && (ep->flags & EP_F_QDISC) != want)
				ep->flags ^= EP_F_QDISC;
		}
	}
	if ((dev->flags & EP_F_QDISC) != want)
		dev->flags ^= EP_F_QDISC;
	return 0;
}

/* qdisc_learn_dev keeps the pod's EP_F_QDISC in step with q, looking at
 * the device entry's copy only: the per-packet path does no endpoint
 * lookup for it. */
static __always_inline void qdisc_learn_dev(struct __sk_buff *skb, const struct endpoint_dev *dev, __u32 q)
{
	__u32 want = (q & QDISC_ROOT) ? EP_F_QDISC : 0;

	if ((dev->flags & EP_F_QDISC) != want)
		qdisc_relearn(skb, want);
}

static __always_inline int handle_arp(struct __sk_buff *skb, const struct endpoint_dev *dev, __u32 q,
				      enum pkt_reason *why)
{
	void *data = skb_data(skb);
	void *data_end = skb_data_end(skb);
	struct ethhdr *eth = data;
	struct arphdr *arp = (void *)(eth + 1);
	struct arp_eth_ipv4 *body = (void *)(arp + 1);
	struct endpoint_info *ep;
	__be32 sip, tip;

	if ((void *)(body + 1) > data_end)
		return DROP(REASON_DROP_MALFORMED);
	if (arp->ar_hrd != bpf_htons(ARPHRD_ETHER) || arp->ar_pro != bpf_htons(ETH_P_IP) ||
	    arp->ar_hln != ETH_ALEN || arp->ar_pln != 4)
		return DROP(REASON_DROP_MALFORMED);

	sip = body->sip;
	tip = body->tip;
	/* The sender fields are what poisons neighbour caches: they must be
	 * the pod's own. A DAD probe (sender 0.0.0.0) is allowed. */
	if (!mac_equal(body->sha, dev->mac))
		return DROP(REASON_DROP_SPOOF_MAC);
	if (sip) {
		ep = endpoint_lookup4(sip);
		if (!ep || ep->ifindex != skb->ifindex)
			return DROP(REASON_DROP_SPOOF_SRC);
		qdisc_learn(ep, q); /* a pod ARPs before it sends anything else */
	}

	if (arp->ar_op != bpf_htons(ARPOP_REQUEST) || !sip || tip == sip) {
		*why = REASON_PASS;
		return TC_ACT_OK;
	}

	/* Answer in place: every address the pod asks for is behind the host
	 * veth (the pod's routes point at its gateway through it). */
	arp->ar_op = bpf_htons(ARPOP_REPLY);
	__builtin_memcpy(body->tha, body->sha, ETH_ALEN);
	body->tip = sip;
	__builtin_memcpy(body->sha, dev->host_mac, ETH_ALEN);
	body->sip = tip;
	__builtin_memcpy(eth->h_dest, dev->mac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, dev->host_mac, ETH_ALEN);

	*why = REASON_ARP_REPLY;
	/* Egress of the same host veth: the reply pops out of the pod's eth0. */
	return bpf_redirect(skb->ifindex, 0);
}

/* Forward through the FIB when the destination is not a pod of this node.
 * The lookup gets no tot_len: the kernel then checks the skb itself against
 * the egress device's MTU, segment by segment for a GSO packet. With
 * tot_len, a GSO packet's IP length (up to 64 KB) always looked too big and
 * went to the stack: bulk TCP to the world took the slow path, and with
 * kube-proxy's rules its conntrack saw one direction only (INVALID). */
static __always_inline int fib_forward(struct __sk_buff *skb, struct bpf_fib_lookup *p, struct nat_scratch *snat,
				       enum pkt_reason *why)
{
	void *data, *data_end;
	struct ethhdr *eth;
	int rc, hop;

	rc = fib_lookup_cached(skb, p);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		goto stack; /* local, unreachable, needs fragmenting, forwarding off... */
	if (p->ifindex == skb->ifindex)
		goto stack;

	data = skb_data(skb);
	data_end = skb_data_end(skb);
	eth = data;
	if ((void *)(eth + 1) > data_end)
		return DROP(REASON_DROP_MALFORMED);

	hop = l3_hop(eth + 1, data_end, eth->h_proto);
	if (hop < 0)
		return DROP(REASON_DROP_MALFORMED);
	if (hop == 0)
		goto stack; /* the stack sends the ICMP time exceeded */
	if (snat) {
		/* Masqueraded here (snat_early): to_netdev lets it pass. */
		if (nat_rewrite(skb, &snat->p, 1, snat->res.addr, snat->res.port, snat))
			return DROP(REASON_DROP_MALFORMED);
		skb->tc_index = TC_INDEX_SNAT;
		data = skb_data(skb);
		data_end = skb_data_end(skb);
		eth = data;
		if ((void *)(eth + 1) > data_end)
			return DROP(REASON_DROP_MALFORMED);
	}

	*why = REASON_FIB_REDIRECT;
	return fib_redirect(eth, p, rc);

stack:
	if (skb->tc_index == TC_INDEX_BYPASS)
		skb->tc_index = 0; /* a SYN that meets netfilter after all: conntrack decides its flow */
	*why = REASON_PASS;
	return TC_ACT_OK;
}

/* Into another pod of this node, straight into its netns; a spent TTL
 * goes to the stack, which answers with time exceeded. */
static __always_inline int redirect_to_pod(struct __sk_buff *skb, struct ethhdr *eth, void *data_end,
					   const struct endpoint_info *dst, enum pkt_reason *why)
{
	int hop = l3_hop(eth + 1, data_end, eth->h_proto);

	if (hop < 0)
		return DROP(REASON_DROP_MALFORMED);
	if (hop == 0) {
		*why = REASON_PASS;
		return TC_ACT_OK;
	}
	*why = REASON_REDIRECT;
	return endpoint_redirect(skb, eth, dst);
}

/* pod_translate handles hostPort for pods and nodes that use it:
 *  - a reply of a hostPort flow gets the address and port the client asked
 *    for (*xlat = REASON_REV_DNAT);
 *  - a packet to a published port of the node goes to the pod behind it,
 *    the sender itself included (hairpin) (*xlat = REASON_DNAT).
 * *parsed says whether s->p holds the packet. Returns a drop reason (< 0)
 * or 0: route the (maybe translated) packet on. to_pod: the destination is
 * a pod, no published port. */
static __always_inline int pod_translate(struct __sk_buff *skb, struct nat_scratch *s, const struct endpoint_dev *dev,
					 int to_pod, int *parsed, enum pkt_reason *xlat)
{
	struct hostport_target *t;
	struct endpoint_info *ep;
	int rc;

	if (!(dev->flags & EP_F_HOSTPORT) && (to_pod || !hostport_active()))
		return 0;
	__builtin_memset(&s->p, 0, sizeof(s->p));
	if (nat_parse(skb, &s->p))
		return 0;
	*parsed = 1;
	if (s->p.later_frag || !hostport_proto(s->p.proto))
		return 0;
	if (dev->flags & EP_F_HOSTPORT) {
		rc = hostport_rev(skb, s);
		if (rc < 0)
			return DROP(REASON_DROP_MALFORMED);
		if (rc > 0) {
			*xlat = REASON_REV_DNAT;
			return 0;
		}
	}
	if (to_pod || !hostport_active())
		return 0;
	t = hostport_match(s->p.family, s->p.proto, s->p.dport, s->p.daddr, 0);
	if (!t)
		return 0;
	__builtin_memset(&s->res, 0, sizeof(s->res));
	__builtin_memcpy(s->res.addr, t->addr, 16);
	s->res.port = t->port;
	{
		struct endpoint_key ek = { .family = s->p.family };

		__builtin_memcpy(ek.addr, s->res.addr, 16);
		ep = bpf_map_lookup_elem(&endpoints, &ek);
	}
	if (!ep)
		return 0; /* the pod is going away: the stack answers */
	if (hostport_dnat(skb, s, ep->ifindex == skb->ifindex))
		return DROP(REASON_DROP_MALFORMED);
	*xlat = REASON_DNAT;
	return 0;
}

/* snat_early: the pod's packet s->p to a destination outside the cluster
 * belongs to a flow to_netdev masqueraded (cur, its live OUT entry), and
 * its last packet was in the same second (lib/conntrack.h: nat_current):
 * fib_forward translates
 * it before it redirects it out of the uplink, where to_netdev lets it
 * pass (TC_INDEX_SNAT) instead of parsing it and looking its pod and its
 * flow up again. 1 with the translation in s->res. Not where NetworkPolicy
 * is on: to_netdev decides a pod's flows to the world, by the pod's tuple
 * (lib/policy.h). */
static __always_inline int snat_early(struct nat_scratch *s, struct nat_entry *cur)
{
	__u64 now;

	if (!cur || policy_on())
		return 0;
	now = bpf_ktime_get_ns();
	if (!nat_current(cur, now))
		return 0;
	nat_track(cur, &s->p, 0, now);
	if (s->p.proto == IPPROTO_TCP && !(cur->flags & NAT_F_FAST))
		cur->flags |= NAT_F_FAST; /* its replies skip the flow lookup (from_netdev) */
	__builtin_memcpy(&s->res, cur, sizeof(s->res));
	return 1;
}

/* Paths a pod's packet that we did not translate can take. */
enum pod_path {
	PATH_ROUTE = 0,  /* into the pod, or through the FIB */
	PATH_STACK = 1,  /* to the stack: netfilter translates (or may translate) its flow */
	PATH_TUNNEL = 2, /* into the overlay, to the node behind *cr */
};

/* pod_path decides, from the flows (lib/flow.h) and the cluster's ranges
 * (lib/cluster.h), whether the stack must see the packet. Pods of this node
 * and of the cluster are never Services: only a pod that the stack
 * delivered flows to (EP_F_STACK) looks its flows up for them. A packet to
 * the world finds its flow's NAT OUT entry first: a TCP flow set up in BPF
 * and masqueraded keeps its verdict there (NAT_F_BYPASS), and is not
 * looked up in flows; s->early says whether the packet is translated here
 * (snat_early). */
static __always_inline int pod_path(struct __sk_buff *skb, struct nat_scratch *s, const struct endpoint_dev *dev,
				    int to_pod, int *parsed, struct cluster_route **cr, enum pkt_reason *why)
{
	struct nat_entry *cur;

	if (!to_pod && cluster_route_of(skb, cr) < 0)
		return DROP(REASON_DROP_MALFORMED);
	/* Ints, not pointers: clang would OR the pointers, which the
	 * verifier refuses. */
	int cluster = *cr != NULL, path = PATH_ROUTE;

	if (cluster && ((*cr)->flags & CLUSTER_F_TUNNEL))
		path = PATH_TUNNEL;
	asm volatile("" : "+r"(cluster));
	if (to_pod | cluster) {
		if (!(dev->flags & EP_F_STACK))
			return path;
	}
	if (!*parsed) {
		__builtin_memset(&s->p, 0, sizeof(s->p));
		if (nat_parse(skb, &s->p))
			return PATH_ROUTE;
		*parsed = 1;
	}
	if (to_pod | cluster) {
		if (flow_is_stack(s)) {
			*why = REASON_STACK_REPLY;
			return PATH_STACK;
		}
		return path;
	}
	/* A pod the stack delivered flows to (EP_F_STACK: it talks to
	 * Services) looks its flows up first, so that a flow through the
	 * stack does not look up a NAT entry it cannot have; flow_egress
	 * finds a TCP flow set up in BPF by its NAT entry then. */
	s->early = 1;
	if (!s->stack_pod) {
		cur = nat_out_live(s, bpf_ktime_get_ns());
		if (cur && (cur->flags & NAT_F_BYPASS) && s->p.proto == IPPROTO_TCP) {
			s->early = snat_early(s, cur);
			return PATH_ROUTE;
		}
		/* Masqueraded already: its entry is looked up again if its
		 * flow keeps the fast path (a pointer kept across flow_egress
		 * would take stack 6.1 does not have). */
		s->early = cur != NULL;
	}
	if (flow_egress(skb, s, why))
		return PATH_STACK;
	if (s->early)
		s->early = snat_early(s, nat_out_live(s, bpf_ktime_get_ns()));
	return PATH_ROUTE;
}

/* route4 forwards an IPv4 packet of a pod: into another pod, or through
 * the FIB. dst is the destination's endpoint when known, else looked up. */
static __always_inline int route4(struct __sk_buff *skb, struct endpoint_info *dst, int lookup,
					struct nat_scratch *snat, enum pkt_reason *why)
{
	void *data = skb_data(skb);
	void *data_end = skb_data_end(skb);
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct bpf_fib_lookup p = {};

	if ((void *)(ip + 1) > data_end)
		return DROP(REASON_DROP_MALFORMED);
	if (lookup)
		dst = endpoint_lookup4(ip->daddr);
	if (dst)
		return redirect_to_pod(skb, eth, data_end, dst, why);

	p.family = AF_INET;
	p.tos = ip->tos;
	p.l4_protocol = ip->protocol;
	p.ifindex = skb->ifindex;
	p.ipv4_src = ip->saddr;
	p.ipv4_dst = ip->daddr;
	return fib_forward(skb, &p, snat, why);
}

static __always_inline int route6(struct __sk_buff *skb, struct endpoint_info *dst, int lookup,
					struct nat_scratch *snat, enum pkt_reason *why)
{
	void *data = skb_data(skb);
	void *data_end = skb_data_end(skb);
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	struct bpf_fib_lookup p = {};

	if ((void *)(ip6 + 1) > data_end)
		return DROP(REASON_DROP_MALFORMED);
	if (lookup)
		dst = endpoint_lookup6(&ip6->daddr);
	if (dst)
		return redirect_to_pod(skb, eth, data_end, dst, why);

	p.family = AF_INET6;
	p.flowinfo = *(__be32 *)ip6 & bpf_htonl(0x0FFFFFFF);
	p.l4_protocol = ip6->nexthdr;
	p.ifindex = skb->ifindex;
	__builtin_memcpy(p.ipv6_src, &ip6->saddr, 16);
	__builtin_memcpy(p.ipv6_dst, &ip6->daddr, 16);
	return fib_forward(skb, &p, snat, why);
}

/* policy_from_pod decides the pod's packet under NetworkPolicy when its
 * destination is final (lib/policy.h). 0: on; else a drop reason.
 *
 * A global function: the verifier checks it once, on its own, instead of
 * on every path of from_container that reaches it (inlined, it more than
 * doubled the instructions the verifier walks). */
__attribute__((noinline)) int policy_from_pod(struct __sk_buff *skb, __u32 dst_if)
{
	return policy_from_pod_decide(skb, dst_if);
}

/* policy_pod_egress is policy_from_pod's verdict as a constant the
 * verifier knows. */
static __always_inline int policy_pod_egress(struct __sk_buff *skb, const struct endpoint_info *dst)
{
	return policy_known(policy_from_pod(skb, dst ? dst->ifindex : 0));
}

/* translate_and_route: hostPort translation, then the path (the stack when
 * netfilter must see the packet, the overlay, or routing); a translated
 * packet is counted by its translation. */
static __always_inline int translate_and_route(struct __sk_buff *skb, const struct endpoint_dev *dev,
					       struct endpoint_info *dst, int v6, __u32 q, enum pkt_reason *why)
{
	enum pkt_reason xlat = REASON_PASS;
	struct cluster_route *cr = NULL;
	struct nat_scratch *s, *snat;
	int parsed = 0, ret, path;

	if (dst && !(dev->flags & (EP_F_HOSTPORT | EP_F_STACK))) {
		/* A pod of this node, and nothing of the sender's to look up:
		 * the shortest path (a chained plugin's qdisc aside; the stack
		 * then delivers it, and to_container notes its flow). */
		if (q & QDISC_INGRESS) {
			*why = REASON_TO_QDISC;
			return TC_ACT_OK;
		}
		return v6 ? route6(skb, dst, 0, NULL, why) : route4(skb, dst, 0, NULL, why);
	}
	s = scratch_get();
	if (!s)
		return DROP(REASON_DROP_MALFORMED);
	ret = pod_translate(skb, s, dev, dst != NULL, &parsed, &xlat);
	if (ret < 0)
		return ret;
	if (xlat == REASON_DNAT) {
		/* To a published port, that is to a pod of this node: its
		 * ingress policy (and the sender's egress) decides the flow as
		 * the pod sees it, translated. */
		struct endpoint_key ek = { .family = s->p.family };

		__builtin_memcpy(ek.addr, s->res.addr, 16);
		ret = policy_pod_egress(skb, bpf_map_lookup_elem(&endpoints, &ek));
		if (ret)
			return ret;
	}
	if (xlat != REASON_PASS) {
		/* Ours: the stack knows nothing of it, it goes our way. */
		ret = v6 ? route6(skb, NULL, 1, NULL, why) : route4(skb, NULL, 1, NULL, why);
		if (ret >= 0)
			*why = xlat;
		return ret;
	}
	s->early = 0;
	s->stack_pod = (dev->flags & EP_F_STACK) != 0;
	path = pod_path(skb, s, dev, dst != NULL, &parsed, &cr, why);
	if (path < 0)
		return path;
	if (path == PATH_STACK)
		return TC_ACT_OK;
	if (path == PATH_TUNNEL && cr)
		return overlay_send(skb, cr, why);
	if (q & QDISC_INGRESS) {
		/* Another plugin's filters want the pod's packets (a chained
		 * bandwidth plugin's ifb): the stack forwards them after, so
		 * the flow's replies must meet the stack's conntrack too. */
		if (!dst && !parsed) {
			__builtin_memset(&s->p, 0, sizeof(s->p));
			parsed = !nat_parse(skb, &s->p);
		}
		if (!dst && parsed && flow_tracked(s->p.proto) && !s->p.later_frag)
			flow_via_stack(s, 1, bpf_ktime_get_ns());
		if (skb->tc_index == TC_INDEX_BYPASS)
			skb->tc_index = 0; /* through the stack after all */
		*why = REASON_TO_QDISC;
		return TC_ACT_OK;
	}
	/* One call each: every inlined call of route4/route6 has its own
	 * bpf_fib_lookup on the stack (512 bytes for all on 6.1). */
	snat = s->early ? s : NULL;
	return v6 ? route6(skb, dst, 0, snat, why) : route4(skb, dst, 0, snat, why);
}

static __always_inline int handle_ipv4(struct __sk_buff *skb, const struct endpoint_dev *dev, __u32 q,
					enum pkt_reason *why)
{
	void *data = skb_data(skb);
	void *data_end = skb_data_end(skb);
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct endpoint_info *dst;
	int rc;

	if ((void *)(ip + 1) > data_end || ip->ihl < 5)
		return DROP(REASON_DROP_MALFORMED);

	if (!dev_has_ip4(dev, ip->saddr))
		return DROP(REASON_DROP_SPOOF_SRC);
	qdisc_learn_dev(skb, dev, q);
	if (bw_egress(skb, dev->flags))
		return DROP(REASON_DROP_BW_EGRESS);
	dst = endpoint_lookup4(ip->daddr);
	rc = policy_pod_egress(skb, dst);
	if (rc)
		return rc;
	return translate_and_route(skb, dev, dst, 0, q, why);
}

static __always_inline int handle_ipv6(struct __sk_buff *skb, const struct endpoint_dev *dev, __u32 q,
					enum pkt_reason *why)
{
	void *data = skb_data(skb);
	void *data_end = skb_data_end(skb);
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	struct endpoint_info *dst;
	int rc;

	if ((void *)(ip6 + 1) > data_end)
		return DROP(REASON_DROP_MALFORMED);

	/* Link-local and unspecified sources (NDP, DAD, router solicitation)
	 * never leave the link: the stack refuses to forward them. */
	if (ipv6_is_link_local_or_unspec(&ip6->saddr)) {
		*why = REASON_PASS;
		return TC_ACT_OK;
	}
	if (!dev_has_ip6(dev, &ip6->saddr))
		return DROP(REASON_DROP_SPOOF_SRC);
	qdisc_learn_dev(skb, dev, q);
	if (bw_egress(skb, dev->flags))
		return DROP(REASON_DROP_BW_EGRESS);
	if (ipv6_is_multicast(&ip6->daddr)) {
		*why = REASON_PASS; /* neighbour solicitation for the gateway */
		return TC_ACT_OK;
	}
	dst = endpoint_lookup6(&ip6->daddr);
	rc = policy_pod_egress(skb, dst);
	if (rc)
		return rc;
	return translate_and_route(skb, dev, dst, 1, q, why);
}

static __always_inline int handle(struct __sk_buff *skb, enum pkt_reason *why)
{
	void *data = skb_data(skb);
	void *data_end = skb_data_end(skb);
	struct ethhdr *eth = data;
	__u32 ifindex = skb->ifindex;
	struct endpoint_dev *dev;
	__u32 q;

	if ((void *)(eth + 1) > data_end)
		return DROP(REASON_DROP_MALFORMED);

	dev = bpf_map_lookup_elem(&endpoint_devs, &ifindex);
	if (!dev)
		return DROP(REASON_DROP_NO_ENDPOINT);
	if (!mac_equal(eth->h_source, dev->mac))
		return DROP(REASON_DROP_SPOOF_MAC);
	q = dev_qdiscs(skb);
	if (dev->flags & EP_F_CLSACT)
		q &= ~QDISC_INGRESS; /* our own */

	switch (eth->h_proto) {
	case bpf_htons(ETH_P_IP):
		return handle_ipv4(skb, dev, q, why);
	case bpf_htons(ETH_P_IPV6):
		return handle_ipv6(skb, dev, q, why);
	case bpf_htons(ETH_P_ARP):
		return handle_arp(skb, dev, q, why);
	default:
		/* Other protocols only reach the node's stack on this link. */
		*why = REASON_PASS;
		return TC_ACT_OK;
	}
}

#ifdef EBPF_CNI_NETKIT_PEER
/* Hook: netkit's peer program of a netkit pod (the pod's end's transmit,
 * run before the packet reaches the host end): the same as from_container
 * on a host veth's ingress. */
SEC("tc")
int from_netkit(struct __sk_buff *skb)
#else
SEC("tc")
int from_container(struct __sk_buff *skb)
#endif
{
	enum pkt_reason why = REASON_PASS;
	int ret = handle(skb, &why);

	return verdict(skb, ret, why, PKT_DIR_EGRESS);
}

char __license[] SEC("license") = "GPL";
