/* owner: feature policy */
/* NetworkPolicy: the node agent writes, the programs enforce, with no
 * agent on the packet path (docs/networkpolicy.md).
 *
 * The agent compiles, for each endpoint of this node and each direction,
 * the union of the rules of the policies that select it into policy_rules:
 * an LPM trie keyed by (endpoint, direction, peer prefix) whose value holds
 * the ports the peers of that prefix may use (every overlapping rule merged
 * in, ipBlock's except as more specific prefixes with fewer rights). One
 * lookup decides a new flow, however many policies there are.
 *
 * A flow is decided on its first packet, in each direction by the hook
 * that knows its final addresses (after kube-proxy's translation):
 *  - egress of a pod: from_container for a destination that is a pod of
 *    this node or in the cluster's pod ranges; to_netdev, to_tunnel or
 *    to_container for what the node's stack forwards (a Service's backend,
 *    the world). What the stack delivers to the node itself is not
 *    subject to policy: traffic between a pod and its node is always
 *    allowed (the API's rule);
 *  - ingress of a pod: every redirect into it from outside (lib/deliver.h)
 *    and from another pod (from_container), and to_container for what the
 *    stack delivers. The node's own traffic to its pods (kubelet's probes,
 *    host-network pods) is never subject to policy.
 * An allowed flow is remembered in policy_flows, one entry per direction,
 * so its next packets and its replies pass with one lookup; a reply the
 * stack translated back (a Service's) is recognised by conntrack. The
 * entry holds the generations of the rules it was decided under: when the
 * agent changes an endpoint's rules, its flows are decided again. Flows
 * between pods that were not isolated are not remembered: when one end
 * becomes isolated, a packet of theirs that cannot open a flow (a TCP
 * packet other than a SYN, an echo reply) is decided the other way too
 * (policy_midflow), so that the replies of what a pod opened before pass.
 *
 * ADD starts a pod whose namespace has policies (policy_namespaces) with
 * those directions POLICY_CLOSED: nothing passes until the agent has
 * written its rules. Denied packets are dropped silently (as the API
 * allows) and counted by reason and in policy_drops. */
#ifndef EBPF_CNI_LIB_POLICY_H
#define EBPF_CNI_LIB_POLICY_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "../include/types.h"
#include "endpoint.h"
#include "netfilter_ct.h"
#include "pkt.h"
#include "verdict.h"
#ifndef EBPF_CNI_MAPS_ONLY
#include "scratch.h" /* a program object's own slot: not in maps.c */
#endif

#define POLICY_MAX_ENDPOINTS 16384 /* as endpoint_devs */
#define POLICY_MAX_RULES (1 << 20)
#define POLICY_MAX_FLOWS 131072

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct policy_settings);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} policy_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, POLICY_MAX_ENDPOINTS);
	__type(key, __u32);
	__type(value, struct policy_endpoint);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} policy_endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* required for LPM tries */
	__uint(max_entries, POLICY_MAX_RULES);
	__type(key, struct policy_key);
	__type(value, struct policy_rule);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} policy_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, POLICY_MAX_FLOWS);
	__type(key, struct policy_flow_key);
	__type(value, struct policy_flow);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} policy_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 2 * POLICY_MAX_ENDPOINTS);
	__type(key, struct policy_drop_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} policy_drops SEC(".maps");

/* Read by ADD and the CLI only. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 16384);
	__type(key, struct policy_ns_key);
	__type(value, struct policy_ns);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} policy_namespaces SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct policy_source);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} policy_sources SEC(".maps"); /* was policy_names, without tier and priority */

#ifndef EBPF_CNI_MAPS_ONLY

/* policy_on: some endpoint of the node may be isolated. An array lookup the
 * verifier inlines: what a node without policies pays. */
static __always_inline int policy_on(void)
{
	__u32 zero = 0;
	struct policy_settings *c = bpf_map_lookup_elem(&policy_config, &zero);

	return c && c->active;
}

static __always_inline struct policy_endpoint *policy_ep(__u32 ifindex)
{
	if (!ifindex)
		return NULL;
	return bpf_map_lookup_elem(&policy_endpoints, &ifindex);
}

/* policy_any: a or b is set. Ints, not pointers: clang would OR the
 * pointers, which the verifier refuses. */
static __always_inline int policy_any(const void *a, const void *b)
{
	int x = a != NULL, y = b != NULL;

	asm volatile("" : "+r"(x));
	asm volatile("" : "+r"(y));
	return x | y;
}

/* ICMP errors belong to the flows they quote, which were decided; the API
 * governs ports, and ICMP errors carry none. */
static __always_inline int policy_icmp_error(const struct nat_pkt *p)
{
	if (p->proto == IPPROTO_ICMP)
		return p->icmp_type == 3 || p->icmp_type == 4 || p->icmp_type == 5 || p->icmp_type == 11 ||
		       p->icmp_type == 12;
	if (p->proto == IPPROTO_ICMPV6_)
		return p->icmp_type >= 1 && p->icmp_type <= 4;
	return 0;
}

/* policy_rule_allows: the rules of endpoint ifindex for dir let peer
 * (family as p's) use proto/port (host byte order). */
static __always_inline int policy_rule_allows(__u32 ifindex, __u8 dir, __u8 family, const __u8 *peer, __u8 proto,
					      __u16 port, int later_frag)
{
	struct policy_key k = { .ifindex = ifindex, .dir = dir, .family = family };
	struct policy_rule *r;
	int i, except;

	k.prefixlen = 64 + (family == ADDR_FAMILY_V4 ? 32 : 128);
	__builtin_memcpy(k.addr, peer, 16);
	r = bpf_map_lookup_elem(&policy_rules, &k);
	if (!r)
		return 0;
	if (r->flags & POLICY_F_ALL_PORTS)
		return 1;
	except = (r->flags & POLICY_F_EXCEPT_PORTS) != 0;
	/* A protocol without ports is in no range: what no range lists. */
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP && proto != IPPROTO_SCTP)
		return except;
	/* A later IPv4 fragment has no ports: only a rule without ports
	 * covers it, or one that allows what it does not list and denies no
	 * range of the fragment's protocol. */
	if (later_frag && !except)
		return 0;
#pragma unroll
	for (i = 0; i < POLICY_MAX_PORTS; i++) {
		if (i >= r->n_ports)
			break;
		if (r->ports[i].proto != proto)
			continue;
		if (later_frag) {
			if (r->ports[i].src & POLICY_PORT_DENIED)
				return 0;
			continue;
		}
		if (port >= r->ports[i].first && port <= r->ports[i].last)
			return !(r->ports[i].src & POLICY_PORT_DENIED);
	}
	return except;
}

/* The state of a direction: POLICY_OPEN without an entry. */
static __always_inline __u8 policy_state_of(const struct policy_endpoint *e, __u8 dir)
{
	if (!e)
		return POLICY_OPEN;
	return dir == PKT_DIR_INGRESS ? e->ingress : e->egress;
}

static __always_inline int policy_dir_allows(const struct policy_endpoint *e, __u32 ifindex, __u8 dir,
					     const struct nat_pkt *p, const __u8 *peer, __u16 port)
{
	__u8 st = policy_state_of(e, dir);

	if (st == POLICY_OPEN)
		return 1;
	if (st != POLICY_ENFORCE)
		return 0;
	return policy_rule_allows(ifindex, dir, p->family, peer, p->proto, port, p->later_frag);
}

static __always_inline void policy_count_drop(__u32 ifindex, __u32 dir)
{
	struct policy_drop_key k = { .ifindex = ifindex, .dir = dir };
	__u64 one = 1, *c;

	c = bpf_map_lookup_elem(&policy_drops, &k);
	if (c) {
		*c += 1; /* per CPU */
		return;
	}
	bpf_map_update_elem(&policy_drops, &k, &one, BPF_NOEXIST);
}

static __always_inline void policy_flow_key_of(struct policy_flow_key *k, const struct nat_pkt *p, int reverse)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->family = p->family;
	k->proto = p->proto;
	k->sport = reverse ? p->dport : p->sport;
	k->dport = reverse ? p->sport : p->dport;
	__builtin_memcpy(k->saddr, reverse ? p->daddr : p->saddr, 16);
	__builtin_memcpy(k->daddr, reverse ? p->saddr : p->daddr, 16);
}

/* policy_midflow: p cannot open a flow: a TCP packet other than a SYN
 * (the SYN-ACK of a handshake among them), an ICMP echo reply. */
static __always_inline int policy_midflow(const struct nat_pkt *p)
{
	if (p->proto == IPPROTO_TCP)
		return !p->later_frag && !flow_syn(p);
	return nat_is_echo_reply(p);
}

/* Flags of policy_check. */
#define POLICY_TRUSTED_SRC 1 /* the node itself sends it: no ingress rule applies (it is recorded) */
#define POLICY_CT_REPLY 2    /* ask conntrack whether an unknown packet is a reply (the stack delivered it) */

/* policy_decide decides a flow opened from src (endpoint src_if, 0: not a
 * pod of this node) to dst: saddr/daddr/dport are the opening direction's.
 * 0: allowed; else the drop reason (negative), counted for the endpoint
 * that denied it when count is set. */
static __always_inline int policy_decide(const struct nat_pkt *p, const struct policy_endpoint *se, __u32 src_if,
					 const struct policy_endpoint *de, __u32 dst_if, const __u8 *saddr,
					 const __u8 *daddr, __be16 dport, int trusted, int count)
{
	__u16 port = bpf_ntohs(dport);

	if (!policy_dir_allows(se, src_if, PKT_DIR_EGRESS, p, daddr, port)) {
		if (count)
			policy_count_drop(src_if, PKT_DIR_EGRESS);
		return DROP(REASON_DROP_POLICY_EGRESS);
	}
	if (!trusted && !policy_dir_allows(de, dst_if, PKT_DIR_INGRESS, p, saddr, port)) {
		if (count)
			policy_count_drop(dst_if, PKT_DIR_INGRESS);
		return DROP(REASON_DROP_POLICY_INGRESS);
	}
	return 0;
}

/* policy_remember records an allowed flow opened as p travels (reverse 0)
 * or opposite to it (reverse 1): both directions' keys. */
static __always_inline void policy_remember(const struct nat_pkt *p, int reverse, __u32 src_if, __u32 dst_if,
					    const struct policy_endpoint *se, const struct policy_endpoint *de)
{
	struct policy_flow_key k;
	struct policy_flow f = {
		.src_ifindex = src_if,
		.dst_ifindex = dst_if,
		.egress_gen = se ? se->egress_gen : 0,
		.ingress_gen = de ? de->ingress_gen : 0,
	};

	policy_flow_key_of(&k, p, reverse);
	bpf_map_update_elem(&policy_flows, &k, &f, BPF_ANY);
	f.reply = 1;
	policy_flow_key_of(&k, p, !reverse);
	bpf_map_update_elem(&policy_flows, &k, &f, BPF_ANY);
}

/* policy_check_eps decides packet p, which comes from the endpoint src_if
 * (0: not a pod of this node; se its state) and goes to dst_if (de).
 * 0: it passes; else the drop reason (negative). */
static __always_inline int policy_check_eps(struct __sk_buff *skb, const struct nat_pkt *p, __u32 src_if,
					    struct policy_endpoint *se, __u32 dst_if, struct policy_endpoint *de,
					    int flags)
{
	struct policy_endpoint *ie, *re;
	struct policy_flow_key k;
	struct policy_flow *f;
	int rc, reply, midflow, evicted = 0;

	if (!policy_any(se, de))
		return 0;
	if (policy_icmp_error(p))
		return 0;

	policy_flow_key_of(&k, p, 0);
	f = bpf_map_lookup_elem(&policy_flows, &k);
	reply = f ? f->reply : 0;
	if (!f) {
		/* The LRU may have evicted this direction's entry alone: the
		 * other direction's tells which way the flow was opened. */
		policy_flow_key_of(&k, p, 1);
		f = bpf_map_lookup_elem(&policy_flows, &k);
		if (f) {
			reply = !f->reply;
			evicted = 1;
		}
	}
	/* A SYN starts a connection, whatever its tuple carried before: it is
	 * never a reply (a peer the rules deny cannot reuse the tuple of a
	 * flow the pod opened to reach it). */
	if (f && reply && flow_syn(p))
		f = NULL;
	if (f) {
		/* The flow's opener and peer, as this hook sees them. */
		ie = reply ? de : se;
		re = reply ? se : de;
		/* Decided under the rules in force, and neither side closed
		 * since (ADD closes a new pod with generation 0, which a flow
		 * of an earlier pod of the same ifindex may carry). */
		if ((ie ? ie->egress_gen : 0) == f->egress_gen && (re ? re->ingress_gen : 0) == f->ingress_gen &&
		    policy_state_of(ie, PKT_DIR_EGRESS) != POLICY_CLOSED && policy_state_of(re, PKT_DIR_INGRESS) != POLICY_CLOSED) {
			if (evicted)
				policy_remember(p, reply, reply ? dst_if : src_if, reply ? src_if : dst_if, ie, re);
			return 0;
		}
		if (reply) {
			/* The rules changed: decide the flow again as it was
			 * opened, the other way. */
			rc = policy_decide(p, de, dst_if, se, src_if, p->daddr, p->saddr, p->sport,
					   flags & POLICY_TRUSTED_SRC, 1);
			if (rc)
				return rc;
			policy_remember(p, 1, dst_if, src_if, de, se);
			return 0;
		}
	} else if (flags & POLICY_CT_REPLY) {
		/* A reply the stack translated back (a Service's): its tuple
		 * is not the one the flow was decided with. Reversed, it is
		 * the tuple of the flow's opening packet as conntrack stored
		 * it (before translation). */
		struct bpf_sock_tuple t;

		if (flow_tracked(p->proto)) {
			int ct = flow_ct_dir(skb, p, &t, 1);

			if (ct != FLOW_CT_NONE && !(ct & FLOW_CT_REPLY))
				return 0;
		}
	}
	midflow = !f && policy_midflow(p);
	rc = policy_decide(p, se, src_if, de, dst_if, p->saddr, p->daddr, p->dport, flags & POLICY_TRUSTED_SRC,
			   !midflow);
	if (rc && midflow) {
		/* A packet no flow's first, of a flow nothing remembers: it was
		 * opened while neither end was isolated (or both its entries
		 * were evicted), by an end nobody knows. It may be a reply:
		 * decided as opened the other way, allowed so, remembered so;
		 * denied both ways, it is counted as its own way's denial. */
		if (!policy_decide(p, de, dst_if, se, src_if, p->daddr, p->saddr, p->sport, flags & POLICY_TRUSTED_SRC,
				   0)) {
			policy_remember(p, 1, dst_if, src_if, de, se);
			return 0;
		}
		if (rc == DROP(REASON_DROP_POLICY_EGRESS))
			policy_count_drop(src_if, PKT_DIR_EGRESS);
		else
			policy_count_drop(dst_if, PKT_DIR_INGRESS);
		return rc;
	}
	if (rc)
		return rc;
	policy_remember(p, 0, src_if, dst_if, se, de);
	return 0;
}

/* policy_check is policy_check_eps with the endpoints' states looked up. */
static __always_inline int policy_check(struct __sk_buff *skb, const struct nat_pkt *p, __u32 src_if, __u32 dst_if,
					int flags)
{
	return policy_check_eps(skb, p, src_if, policy_ep(src_if), dst_if, policy_ep(dst_if), flags);
}

/* The programs' calls, one per place a flow is decided (the table of
 * docs/networkpolicy.md, "Where each direction is decided"). */

/* policy_into_pod decides s->p (the pod's view of it, after any
 * translation of ours) under the ingress policy of the pod behind ep: a
 * redirect into the pod from outside (lib/deliver.h). 0: on; else a drop
 * reason. */
static __always_inline int policy_into_pod(struct __sk_buff *skb, struct nat_scratch *s, const struct endpoint_info *ep)
{
	if (!policy_on())
		return 0;
	return policy_check(skb, &s->p, 0, ep->ifindex, 0);
}

/* policy_stack_to_pod decides what the stack delivers to the pod behind
 * host veth ifindex (to_container), after any translation of netfilter's:
 * its ingress policy, and the egress policy of the pod of this node that
 * sent it, which from_container left to the stack (a Service). The node's
 * own packets (received on no device: no ingress ifindex) are never
 * subject to policy; a reply netfilter translated back is known to
 * conntrack. Call it when policy_on(). */
static __always_inline int policy_stack_to_pod(struct __sk_buff *skb, __u32 ifindex)
{
	struct nat_scratch *s = scratch_get();
	__u32 from = skb->ingress_ifindex;

	if (!s)
		return 0;
	__builtin_memset(&s->p, 0, sizeof(s->p));
	if (nat_parse(skb, &s->p))
		return 0;
	return policy_check(skb, &s->p, from, ifindex, POLICY_CT_REPLY | (from ? 0 : POLICY_TRUSTED_SRC));
}

/* policy_stack_from_pod decides a pod's packet the stack forwards into
 * the overlay (to_tunnel), after kube-proxy's translation: its egress
 * policy. What is not a pod's (the node's own, or translated to it)
 * passes. */
static __always_inline int policy_stack_from_pod(struct __sk_buff *skb)
{
	struct nat_scratch *s;
	struct endpoint_info *ep;
	struct endpoint_key ek = {};

	if (!policy_on())
		return 0;
	s = scratch_get();
	if (!s)
		return 0;
	__builtin_memset(&s->p, 0, sizeof(s->p));
	if (nat_parse(skb, &s->p))
		return 0;
	ek.family = s->p.family;
	__builtin_memcpy(ek.addr, s->p.saddr, 16);
	ep = bpf_map_lookup_elem(&endpoints, &ek);
	if (!ep)
		return 0;
	return policy_check(skb, &s->p, ep->ifindex, 0, 0);
}

#ifdef POLICY_FINAL_DST
/* policy_from_pod_decide decides the packet of the pod behind the host
 * veth it came in on (from_container) when its destination is final:
 * dst_if (a pod of this node), or one the program defines
 * POLICY_FINAL_DST(p) true for before it includes this header (the
 * cluster's pod ranges: another feature's map, which this header does not
 * include). Anything else may be a Service: the stack translates it first,
 * and it is decided where it leaves the node; what the stack delivers to
 * the node itself is not subject to policy. 0: on; else a drop reason. */
static __always_inline int policy_from_pod_decide(struct __sk_buff *skb, __u32 dst_if)
{
	__u32 src_if = skb->ifindex;
	struct policy_endpoint *se, *de;
	struct nat_scratch *s;

	if (!policy_on())
		return 0;
	se = policy_ep(src_if);
	de = policy_ep(dst_if);
	if (!policy_any(se, de))
		return 0;
	s = scratch_get();
	if (!s)
		return DROP(REASON_DROP_MALFORMED);
	__builtin_memset(&s->p, 0, sizeof(s->p));
	if (nat_parse(skb, &s->p))
		return 0; /* not IP: the link's own */
	if (!dst_if && !POLICY_FINAL_DST(&s->p))
		return 0;
	return policy_check_eps(skb, &s->p, src_if, se, dst_if, de, 0);
}
#endif

/* policy_known is rc, a decision (0 or a drop reason) that a global
 * function returned, as the constant it is: to the verifier a global
 * function's result is any number. */
static __always_inline int policy_known(int rc)
{
	if (rc == DROP(REASON_DROP_POLICY_EGRESS))
		return DROP(REASON_DROP_POLICY_EGRESS);
	if (rc == DROP(REASON_DROP_POLICY_INGRESS))
		return DROP(REASON_DROP_POLICY_INGRESS);
	return rc ? DROP(REASON_DROP_MALFORMED) : 0;
}

#endif /* EBPF_CNI_MAPS_ONLY */

#endif
