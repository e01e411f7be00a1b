//go:build ignore

/* Hook: tc ingress of an uplink (the node's device towards the outside).
 *
 * hostPort: a packet to a published port of the node goes to the pod behind
 * it, translated to the pod's address and containerPort; the client's
 * address is kept. (The pod's replies are translated back in
 * from_container.)
 *
 * Replies to masqueraded flows are translated back to the pod's address and
 * port and redirected straight into the pod (bpf_redirect_peer): they never
 * reach the node's routing, netfilter or FORWARD path. ICMP errors about a
 * masqueraded flow (fragmentation needed, packet too big, unreachable, time
 * exceeded) are translated too, inner packet included, so path-MTU discovery
 * works from pods.
 *
 * Packets routed to a pod's address (from other nodes, or a router with a
 * route to the node's pod range) go straight into the pod too.
 *
 * Either way, a packet whose flow netfilter translated (the reply of a pod's
 * connection to a Service, lib/flow.h) goes to the stack instead, whose
 * conntrack translates it back. Anything else passes to the stack untouched. */

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "include/types.h"
#include "lib/addr.h"
#include "lib/conntrack.h"
#include "lib/counters.h"
#include "lib/deliver.h"
#include "lib/endpoint.h"
#include "lib/flow.h"
#include "lib/hostport.h"
#include "lib/hostport_nat.h"
#include "lib/nat.h"
#include "lib/overlay.h"
#include "lib/pkt.h"
#include "lib/rewrite.h"
#include "lib/scratch.h"
#include "lib/verdict.h"

static __always_inline int is_icmp_error(const struct nat_pkt *p)
{
	if (p->proto == IPPROTO_ICMP)
		return p->icmp_type == ICMP_DEST_UNREACH_ || p->icmp_type == ICMP_TIME_EXCEEDED_ ||
		       p->icmp_type == ICMP_PARAMETERPROB_;
	if (p->proto == IPPROTO_ICMPV6_)
		return p->icmp_type == ICMPV6_DEST_UNREACH_ || p->icmp_type == ICMPV6_PKT_TOOBIG_ ||
		       p->icmp_type == ICMPV6_TIME_EXCEED_ || p->icmp_type == ICMPV6_PARAMPROB_;
	return 0;
}

/* An ICMP error quotes the packet it is about: the translated flow as it
 * left, from the node's address and port to the remote. Find the flow by
 * the quote, and give the pod back its own address and port in both the
 * outer and the quoted headers. */
static __always_inline int rev_icmp_error(struct __sk_buff *skb, struct nat_scratch *s, enum pkt_reason *why)
{
	struct nat_pkt *p = &s->p, *q = &s->q;
	struct nat_key *in = &s->in;
	struct nat_entry *iv, *ov;
	struct endpoint_info *ep;
	__u32 icmp_csum = p->l4off + 2;
	__u64 now = bpf_ktime_get_ns();

	__builtin_memset(q, 0, sizeof(*q));
	__builtin_memset(in, 0, sizeof(*in));
	q->family = p->family;
	q->l3off = p->l4off + 8;
	/* The quoted header. */
	if (p->family == ADDR_FAMILY_V4) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, q->l3off, &ip, sizeof(ip)) || ip.ihl < 5)
			return TC_ACT_OK;
		q->proto = ip.protocol;
		q->l4off = q->l3off + ip.ihl * 4;
		__builtin_memcpy(q->saddr, &ip.saddr, 4);
		__builtin_memcpy(q->daddr, &ip.daddr, 4);
	} else {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, q->l3off, &ip6, sizeof(ip6)))
			return TC_ACT_OK;
		q->proto = ip6.nexthdr;
		q->l4off = q->l3off + sizeof(ip6);
		__builtin_memcpy(q->saddr, &ip6.saddr, 16);
		__builtin_memcpy(q->daddr, &ip6.daddr, 16);
	}
	if (!addr_equal(q->saddr, p->daddr))
		return TC_ACT_OK; /* not about a packet this node sent */

	if (q->proto == IPPROTO_TCP || q->proto == IPPROTO_UDP) {
		__be16 ports[2];

		if (bpf_skb_load_bytes(skb, q->l4off, ports, sizeof(ports)))
			return TC_ACT_OK;
		q->sport = ports[0];
		q->dport = ports[1];
		in->sport = q->dport;
		in->dport = q->sport;
	} else if (is_icmp(q->proto)) {
		__u8 hdr[8];

		if (bpf_skb_load_bytes(skb, q->l4off, hdr, sizeof(hdr)))
			return TC_ACT_OK;
		q->icmp_type = hdr[0];
		if (!nat_is_echo_request(q))
			return TC_ACT_OK;
		__builtin_memcpy(&q->sport, hdr + 4, 2);
		q->dport = q->sport;
		in->sport = 0;
		in->dport = q->sport;
	} else {
		return TC_ACT_OK;
	}
	in->family = p->family;
	in->proto = q->proto;
	in->dir = NAT_DIR_IN;
	__builtin_memcpy(in->saddr, q->daddr, 16);
	__builtin_memcpy(in->daddr, q->saddr, 16);

	ov = nat_in_lookup(in, &iv, now, &s->tmp);
	if (!ov)
		return TC_ACT_OK;
	ep = pod_of(iv->addr, p->family);
	if (!ep)
		return TC_ACT_OK;
	__builtin_memcpy(&s->iv, iv, sizeof(s->iv));
	ov->last_seen = now;

	/* Outer destination: the pod. ICMPv6 sums a pseudo-header with it,
	 * ICMPv4 does not (nat_rewrite knows). An ICMP error has no port: the
	 * same value in and out leaves that field alone. */
	if (nat_rewrite(skb, p, 0, s->iv.addr, p->dport, s))
		return DROP(REASON_DROP_MALFORMED);

	/* Quoted source address and port. For IPv4, the quoted header's own
	 * checksum moves opposite to the address, so the ICMP checksum over
	 * both stays the same; for IPv6 the address change is summed in. */
	if (p->family == ADDR_FAMILY_V4) {
		__be32 from, to;

		__builtin_memcpy(&from, q->saddr, 4);
		__builtin_memcpy(&to, s->iv.addr, 4);
		if (bpf_l3_csum_replace(skb, q->l3off + offsetof(struct iphdr, check), from, to, 4) ||
		    bpf_skb_store_bytes(skb, q->l3off + offsetof(struct iphdr, saddr), &to, 4, 0))
			return DROP(REASON_DROP_MALFORMED);
	} else {
		__s64 diff;

		__builtin_memcpy(s->from, q->saddr, 16);
		__builtin_memcpy(s->to, s->iv.addr, 16);
		diff = bpf_csum_diff((__be32 *)s->from, 16, (__be32 *)s->to, 16, 0);
		if (bpf_l4_csum_replace(skb, icmp_csum, 0, diff, 0) ||
		    bpf_skb_store_bytes(skb, q->l3off + offsetof(struct ipv6hdr, saddr), s->to, 16, 0))
			return DROP(REASON_DROP_MALFORMED);
	}
	if (q->sport != s->iv.port) {
		__be16 port = s->iv.port;

		if (bpf_l4_csum_replace(skb, icmp_csum, q->sport, port, 2) ||
		    bpf_skb_store_bytes(skb, l4_port_off(q->proto, q->l4off, 1), &port, 2, 0))
			return DROP(REASON_DROP_MALFORMED);
	}
	return to_pod(skb, ep, REASON_REV_SNAT, why);
}

/* A packet routed to a pod of this node (its address is the destination:
 * another node's pod, a router or host with a route to the node's pod
 * range): straight in, unless netfilter translated its flow. */
static __always_inline int routed_in(struct __sk_buff *skb, struct nat_scratch *s, enum pkt_reason *why)
{
	struct endpoint_info *ep = pod_of(s->p.daddr, s->p.family);

	if (!ep)
		return TC_ACT_OK; /* the node's own traffic */
	return deliver(skb, s, ep, REASON_ROUTED_IN, 0, why);
}

/* A packet from outside to a published port of the node (hostPort): to
 * the pod behind it, with the client's address kept. */
static __always_inline int hostport_in(struct __sk_buff *skb, struct nat_scratch *s, enum pkt_reason *why)
{
	struct hostport_target *t;
	struct endpoint_info *ep;
	int ret;

	if (!hostport_proto(s->p.proto) || !hostport_active())
		return routed_in(skb, s, why);
	t = hostport_match(s->p.family, s->p.proto, s->p.dport, s->p.daddr, 0);
	if (!t)
		return routed_in(skb, s, why);
	__builtin_memset(&s->res, 0, sizeof(s->res));
	__builtin_memcpy(s->res.addr, t->addr, 16);
	s->res.port = t->port;
	ep = pod_of(s->res.addr, s->p.family);
	if (!ep)
		return TC_ACT_OK; /* the pod is going away: the stack answers */
	if (hostport_dnat(skb, s, 0))
		return DROP(REASON_DROP_MALFORMED);
	/* The pod's view, for its ingress policy. */
	__builtin_memcpy(s->p.daddr, s->res.addr, 16);
	s->p.dport = s->res.port;
	ret = policy_into_pod(skb, s, ep);
	if (ret)
		return ret;
	return to_pod(skb, ep, REASON_DNAT, why);
}

/* overlay_in decapsulates a packet of the overlay (another node's pod to
 * a pod of this node) here (lib/overlay.h) and redirects it into the pod,
 * as from_tunnel does after the VXLAN device: the UDP socket, the device's
 * receive path (its GRO cell, a second softirq pass) and a second tc hook
 * are skipped. Anything else goes on untouched, the device's way
 * (from_tunnel): what overlay_inner leaves to it, a destination not a pod
 * of this node, a flow netfilter translated. */
static __always_inline int overlay_in(struct __sk_buff *skb, struct nat_scratch *s, enum pkt_reason *why)
{
	struct endpoint_info *ep;
	__u32 off;
	int rc;

	off = overlay_inner(skb, s);
	if (!off)
		return TC_ACT_OK;
	ep = pod_of(s->p.daddr, s->p.family);
	if (!ep || flow_ingress(skb, s))
		return TC_ACT_OK;
	if (overlay_decap(skb, s, off))
		return TC_ACT_OK;
	rc = policy_into_pod(skb, s, ep);
	if (rc)
		return rc;
	return to_pod(skb, ep, REASON_TUNNEL_DECAP, why);
}

/* node_may_own: a connection of the node may hold the tuple of reply p,
 * whose masqueraded flow kept the pod's port (ov): a socket lookup is
 * worth it. A UDP flow has no state to tell; a TCP flow's may be the
 * node's when the pod's connection is not established (still opening, or
 * closing: TestMasqueradeKeptPortNodeLater) or when a SYN-ACK answers a
 * connection of the node from the same port to the same peer. Every other
 * reply of an established connection is the pod's: no second connection
 * can have its tuple. The socket lookup (a hash and the listeners) is
 * then saved for most of a TCP flow's replies. */
static __always_inline int node_may_own(const struct nat_entry *ov, const struct nat_pkt *p)
{
	return p->proto != IPPROTO_TCP || ov->state != NAT_STATE_ESTABLISHED || (p->tcp_flags & TCP_FLAG_SYN);
}

/* Replies to masqueraded flows first: a live flow's tuple is more specific
 * than a published port. */
static __always_inline int rev_snat(struct __sk_buff *skb, enum pkt_reason *why)
{
	struct nat_scratch *s = scratch_get();
	struct nat_entry *iv, *ov;
	struct endpoint_info *ep;
	__u64 now;
	int rc, fast;

	*why = REASON_PASS;
	if (!s)
		return TC_ACT_OK;
	__builtin_memset(&s->p, 0, sizeof(s->p));
	rc = nat_parse(skb, &s->p);
	if (rc != 0 || s->p.later_frag)
		return TC_ACT_OK;
	if (overlay_packet(skb, &s->p))
		return overlay_in(skb, s, why);
	if (is_icmp_error(&s->p))
		return rev_icmp_error(skb, s, why);
	if (s->p.proto != IPPROTO_TCP && s->p.proto != IPPROTO_UDP && !nat_is_echo_reply(&s->p))
		return hostport_in(skb, s, why);

	__builtin_memset(&s->in, 0, sizeof(s->in));
	s->in.family = s->p.family;
	s->in.proto = s->p.proto;
	s->in.dir = NAT_DIR_IN;
	s->in.sport = is_icmp(s->p.proto) ? 0 : s->p.sport;
	s->in.dport = s->p.dport;
	__builtin_memcpy(s->in.saddr, s->p.saddr, 16);
	__builtin_memcpy(s->in.daddr, s->p.daddr, 16);

	now = bpf_ktime_get_ns();
	ov = nat_in_lookup(&s->in, &iv, now, &s->tmp);
	if (!ov)
		return hostport_in(skb, s, why); /* else routed in, or the node's own traffic */
	/* A kept port may since have been taken by a connection of the node:
	 * the node's socket wins, it is never hijacked. */
	if ((ov->flags & NAT_F_KEPT) && node_may_own(ov, &s->p) && node_socket(skb, &s->in, 0, &s->tuple)) {
		/* Its later replies are looked at too (the flow no longer
		 * counts as established), and the pod's entry ends soon. */
		if (s->p.proto == IPPROTO_TCP && ov->state == NAT_STATE_ESTABLISHED)
			ov->state = NAT_STATE_CLOSING;
		return TC_ACT_OK;
	}
	ep = pod_of(iv->addr, s->p.family);
	if (!ep)
		return TC_ACT_OK;
	/* A TCP flow from_container translates is on the fast path (it set
	 * NAT_F_FAST; to_netdev clears it at every packet it sees of the
	 * flow: one the stack forwarded, a new connection's SYN), and so is
	 * one set up in BPF (NAT_F_BYPASS, lib/flow.h): its flow need not be
	 * looked up. */
	fast = s->p.proto == IPPROTO_TCP && (ov->flags & (NAT_F_FAST | NAT_F_BYPASS));
	nat_track(ov, &s->p, 1, now);
	__builtin_memcpy(&s->iv, iv, sizeof(s->iv));
	if (nat_rewrite(skb, &s->p, 0, s->iv.addr, s->iv.port, s))
		return DROP(REASON_DROP_MALFORMED);
	/* The pod's view of the packet, for its flow: a Service netfilter
	 * translated goes on through the stack. */
	__builtin_memcpy(s->p.daddr, s->iv.addr, 16);
	s->p.dport = s->iv.port;
	return deliver(skb, s, ep, REASON_REV_SNAT, fast, why);
}

SEC("tc")
int from_netdev(struct __sk_buff *skb)
{
	enum pkt_reason why = REASON_PASS;
	int ret = rev_snat(skb, &why);

	return verdict(skb, ret, why, PKT_DIR_INGRESS);
}

char __license[] SEC("license") = "GPL";
