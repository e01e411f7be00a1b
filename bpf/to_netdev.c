//go:build ignore

/* Hook: tc egress of an uplink (the node's device towards the outside).
 *
 * Masquerade: a packet from a pod of a network with ipMasq, to a destination
 * outside the network's nonMasqueradeCIDRs, leaves with the node's address
 * (masqueradeIP, else the uplink's primary address). The pod's source port
 * is kept when no other flow and no socket of the node holds it for that
 * destination; otherwise it moves to a free port of the network's range.
 * Both paths out of a pod end here: the datapath's fib_lookup +
 * redirect_neigh, and the stack's forwarding. Replies of flows opened
 * toward a pod (lib/flow.h: FLOW_F_INBOUND) keep the pod's address.
 * A pod's packet of a pending flow leaving here passed netfilter: its flow
 * is settled (lib/flow.h: flow_left).
 * Everything else (the node's own traffic) passes untouched. */

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "include/types.h"
#include "lib/addr.h"
#include "lib/conntrack.h"
#include "lib/counters.h"
#include "lib/endpoint.h"
#include "lib/flow.h"
#include "lib/nat.h"
#include "lib/pkt.h"
#include "lib/policy.h"
#include "lib/rewrite.h"
#include "lib/scratch.h"
#include "lib/uplink.h"
#include "lib/verdict.h"

/* nat_fast_off: a packet of the flow reaches to_netdev untranslated (the
 * stack forwarded it, or from_container left it: a SYN, the first packet
 * of a second): its replies look its flow up again (from_netdev) until
 * from_container translates one again. */
static __always_inline void nat_fast_off(struct nat_entry *cur)
{
	if (cur->flags & NAT_F_FAST)
		cur->flags &= ~NAT_F_FAST;
}

/* snat_established translates a packet of a flow translated already whose
 * last packet was in the same second (lib/conntrack.h: nat_established):
 * three lookups (masq_nets, masq_skip, uplinks) fewer for most of a flow's
 * packets. 1 when it translated the packet, 0 when the whole path
 * decides, -1 when the rewrite failed. */
static __always_inline int snat_established(struct __sk_buff *skb, struct nat_scratch *s, __u32 net_id)
{
	__u64 now = bpf_ktime_get_ns();
	struct nat_entry *cur = nat_established(s, now);

	if (!cur || cur->net_id != net_id)
		return 0;
	nat_fast_off(cur);
	nat_track(cur, &s->p, 0, now);
	__builtin_memcpy(&s->res, cur, sizeof(s->res));
	return nat_rewrite(skb, &s->p, 1, s->res.addr, s->res.port, s) ? -1 : 1;
}

static __always_inline int snat(struct __sk_buff *skb, enum pkt_reason *why)
{
	struct nat_scratch *s = scratch_get();
	struct endpoint_info *ep;
	struct masq_net *mn;
	struct uplink_info *up;
	struct nat_entry *cur;
	__u32 ifindex = skb->ifindex, net_id;
	__u64 now;
	int rc, bypass = 0;

	*why = REASON_PASS;
	if (skb->tc_index == TC_INDEX_SNAT) {
		/* Translated by from_container already (its flow's packet of
		 * the same second), which decided it. */
		skb->tc_index = 0;
		*why = REASON_SNAT;
		return TC_ACT_OK;
	}
	if (skb->tc_index == TC_INDEX_BYPASS) {
		/* A pod's SYN from_container set up in BPF (lib/flow.h). */
		skb->tc_index = 0;
		bypass = 1;
	}
	if (!s)
		return TC_ACT_OK;
	__builtin_memset(&s->p, 0, sizeof(s->p));
	rc = nat_parse(skb, &s->p);
	if (rc != 0)
		return TC_ACT_OK; /* not IP; or broken, which the stack judges */
	bypass = bypass && flow_syn(&s->p);

	{
		struct endpoint_key ek = { .family = s->p.family };

		__builtin_memcpy(ek.addr, s->p.saddr, 16);
		ep = bpf_map_lookup_elem(&endpoints, &ek);
		if (!ep)
			return TC_ACT_OK; /* the node's own traffic */
		net_id = ep->net_id;
	}
	/* A pod's flow leaving the node: its egress policy decides it here
	 * when the stack forwarded it (after kube-proxy's translation);
	 * from_container's decisions are found (lib/policy.h). */
	if (policy_on()) {
		rc = policy_check(skb, &s->p, ep->ifindex, 0, 0);
		if (rc)
			return rc;
	}
	/* A pod's packet the stack let through, untranslated: its pending
	 * flow is settled (lib/flow.h). A TCP flow is pending until its SYN
	 * passed netfilter or a reply came: its other packets (from
	 * from_container's fast path, most of them) need no lookup. */
	if (!bypass && !(s->p.proto == IPPROTO_TCP && !(s->p.tcp_flags & TCP_FLAG_SYN)))
		flow_left(skb, s);
	rc = snat_established(skb, s, net_id);
	if (rc < 0)
		return DROP(REASON_DROP_MALFORMED);
	if (rc > 0) {
		*why = REASON_SNAT;
		return TC_ACT_OK;
	}
	{
		struct masq_net_key mk = { .net_id = net_id, .family = s->p.family };

		mn = bpf_map_lookup_elem(&masq_nets, &mk);
		if (!mn)
			goto unmasqueraded; /* no ipMasq for this network and family */
	}
	{
		struct masq_skip_key sk = { .net_id = net_id, .family = s->p.family };

		sk.prefixlen = 40 + (s->p.family == ADDR_FAMILY_V4 ? 32 : 128);
		__builtin_memcpy(sk.addr, s->p.daddr, 16);
		if (bpf_map_lookup_elem(&masq_skip, &sk))
			goto unmasqueraded; /* nonMasqueradeCIDRs */
	}

	__builtin_memset(s->addr, 0, 16);
	if (!addr_is_zero(mn->addr)) {
		__builtin_memcpy(s->addr, mn->addr, 16);
	} else {
		up = bpf_map_lookup_elem(&uplinks, &ifindex);
		if (!up)
			return DROP(REASON_DROP_NAT_NO_ADDR);
		if (s->p.family == ADDR_FAMILY_V4 && up->has4)
			__builtin_memcpy(s->addr, up->ip4, 4);
		else if (s->p.family == ADDR_FAMILY_V6 && up->has6)
			__builtin_memcpy(s->addr, up->ip6, 16);
		else
			return DROP(REASON_DROP_NAT_NO_ADDR);
	}

	if (s->p.later_frag) {
		/* Only the first fragment carries ports: the rest change address. */
		if (nat_rewrite(skb, &s->p, 1, s->addr, 0, s))
			return DROP(REASON_DROP_MALFORMED);
		*why = REASON_SNAT;
		return TC_ACT_OK;
	}
	/* An echo reply answers a ping toward the pod (routed to its address):
	 * with the pod's own address, as every reply of a flow opened toward
	 * a pod. */
	if (nat_is_echo_reply(&s->p))
		return TC_ACT_OK;
	if (s->p.proto != IPPROTO_TCP && s->p.proto != IPPROTO_UDP && !nat_is_echo_request(&s->p))
		return DROP(REASON_DROP_NAT_UNSUPPORTED);

	nat_out_key_of(&s->out, &s->p);

	now = bpf_ktime_get_ns();
	cur = bpf_map_lookup_elem(&nat, &s->out);
	if (cur && !nat_expired(cur, s->p.proto, now) && addr_equal(cur->addr, s->addr)) {
		__u64 seen = cur->last_seen;

		nat_fast_off(cur);
		if (flow_syn(&s->p)) {
			/* A new connection on the tuple: set up in BPF or not. */
			if (bypass)
				cur->flags |= NAT_F_BYPASS;
			else if (cur->flags & NAT_F_BYPASS)
				cur->flags &= ~NAT_F_BYPASS;
		}
		nat_track(cur, &s->p, 0, now);
		__builtin_memcpy(&s->res, cur, sizeof(s->res));
		/* The LRU may have evicted the IN entry alone (a flow without
		 * replies does not use it): put it back. Looked at when the
		 * flow was idle or its last packet was in another second
		 * (2^30 ns), not at every packet. */
		nat_in_key(&s->in, &s->out, s->res.addr, s->res.port);
		if ((now >> 30) != (seen >> 30) && !bpf_map_lookup_elem(&nat, &s->in)) {
			__builtin_memset(&s->iv, 0, sizeof(s->iv));
			__builtin_memcpy(s->iv.addr, s->out.saddr, 16);
			s->iv.port = s->out.sport;
			s->iv.net_id = s->res.net_id;
			s->iv.created = s->res.created;
			s->iv.last_seen = now;
			bpf_map_update_elem(&nat, &s->in, &s->iv, BPF_NOEXIST);
		}
	} else {
		__u8 state, flags_new = bypass ? NAT_F_BYPASS : 0;

		__u8 syn = s->p.proto == IPPROTO_TCP ? s->p.tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK) : 0;

		/* Replies of a connection opened toward the pod (routed to its
		 * address) leave with its address: masquerade is for the flows
		 * pods open. A SYN-ACK always is one, a SYN never (it opens
		 * one: no flow to look up). */
		if (syn == (TCP_FLAG_SYN | TCP_FLAG_ACK) || (syn != TCP_FLAG_SYN && flow_inbound(s)))
			return TC_ACT_OK;
		state = s->p.proto != IPPROTO_TCP ? NAT_STATE_OPEN :
			     (s->p.tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN ? NAT_STATE_SYN_SENT :
											       NAT_STATE_ESTABLISHED;

		if (cur) {
			/* Expired, or the node's address changed: start over,
			 * in the same entries where the translation stays. */
			if (nat_renew(skb, s, cur, net_id, state, flags_new, now))
				goto translate;
			if (nat_own_in(s, cur))
				bpf_map_delete_elem(&nat, &s->in);
			bpf_map_delete_elem(&nat, &s->out);
		}
		if (nat_create(skb, s, mn, net_id, state, flags_new, now))
			return DROP(REASON_DROP_NAT_NO_PORT);
	}

translate:

	if (nat_rewrite(skb, &s->p, 1, s->res.addr, s->res.port, s))
		return DROP(REASON_DROP_MALFORMED);
	*why = REASON_SNAT;
	return TC_ACT_OK;

unmasqueraded:
	/* Its verdict has no NAT entry to live in. */
	if (bypass)
		flow_bypass_put(s, bpf_ktime_get_ns());
	return TC_ACT_OK;
}

SEC("tc")
int to_netdev(struct __sk_buff *skb)
{
	enum pkt_reason why = REASON_PASS;
	int ret = snat(skb, &why);

	return verdict(skb, ret, why, PKT_DIR_EGRESS);
}

char __license[] SEC("license") = "GPL";
