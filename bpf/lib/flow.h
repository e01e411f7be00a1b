/* owner: feature flows */
/* Flow tracking: coexistence with the node's netfilter (kube-proxy).
 *
 * kube-proxy translates Services (ClusterIP, NodePort, externalIPs) in the
 * node's netfilter; our redirects skip it. The rule: a flow goes through
 * the stack in both directions exactly when netfilter translated it, and
 * every other flow keeps the fast path in both directions. Never half and
 * half: conntrack would then see one direction only and call the other
 * INVALID, which kube-proxy drops.
 *
 * How a flow is known (flows, keyed by the pod's tuple):
 *  - A pod's first packet to a destination that is neither a pod of this
 *    node nor in the cluster's pod ranges goes to the stack (FLOW_PENDING):
 *    netfilter sees it, creates its conntrack entry and translates it if a
 *    rule says so. A TCP packet other than a SYN has no first packet to
 *    wait for: conntrack is asked at once. Except while the node agent's
 *    lease on the set of destinations netfilter may translate runs
 *    (lib/xlat.h): a destination outside that set makes the flow FLOW_FAST
 *    with FLOW_F_BYPASS at its first packet, which takes the fast path; a
 *    UDP one asks the set again at every packet instead of conntrack.
 *  - The next packet of the flow in either direction asks conntrack
 *    (bpf_skb_ct_lookup): translated (IPS_SRC_NAT or IPS_DST_NAT) is
 *    FLOW_STACK, anything else FLOW_FAST. A flow without an entry stays
 *    FLOW_PENDING, its packets on the stack path, until netfilter let one
 *    of them through: netfilter may have dropped or rejected it (a Service
 *    without endpoints), and only a packet that meets netfilter again can
 *    be translated once the Service has one. Two signs that it did:
 *    to_netdev sees the pod's packet (of TCP, the SYN) leave the node
 *    (after POSTROUTING, where conntrack confirms its entries: no entry
 *    there means conntrack does not track the flow, FLOW_FAST with
 *    FLOW_F_UNTRACKED), or a reply arrives (no entry: FLOW_FAST).
 *  - A FLOW_FAST UDP flow the pod opened asks conntrack at every packet
 *    (unless FLOW_F_UNTRACKED, which lasts a second): when its entry is
 *    gone (kube-proxy deletes a Service's UDP entries when its endpoints
 *    change; an idle entry times out) it is FLOW_PENDING again, so that
 *    netfilter decides anew, as it would for a bridge's packet.
 *  - A packet for a pod from outside whose flow is unknown: conntrack
 *    decides too (the reply of a flow netfilter DNATed on this node keeps
 *    the pod's address as destination but not the tuple the pod sent), and
 *    the flow is FLOW_F_INBOUND unless conntrack saw the pod open it:
 *    to_netdev never masquerades an inbound flow's replies.
 *  - to_container marks every flow the stack delivers to a pod FLOW_STACK:
 *    its packets toward the pod keep coming through the stack (another
 *    plugin's NAT, an interface without our programs), so its replies go
 *    there too.
 * Only TCP and UDP are tracked (conntrack's kfuncs know no other). ICMP
 * echo keeps the fast path (kube-proxy does not translate it); every other
 * protocol (SCTP, ICMP errors) and IPv4 fragments go through the stack both
 * ways, where conntrack relates them to their flows. */
#ifndef EBPF_CNI_LIB_FLOW_H
#define EBPF_CNI_LIB_FLOW_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include "../include/types.h"
#include "conntrack.h"
#include "netfilter_ct.h"
#include "pkt.h"
#include "xlat.h"

#define FLOW_MAX_ENTRIES 65536

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, FLOW_MAX_ENTRIES);
	__type(key, struct flow_key);
	__type(value, struct flow_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} flows SEC(".maps");

/* flow_key_of is the flow key of p: a packet the pod sends (from_pod), or
 * one for the pod (its tuple reversed). */
static __always_inline void flow_key_of(struct flow_key *k, const struct nat_pkt *p, int from_pod)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->family = p->family;
	k->proto = p->proto;
	k->sport = from_pod ? p->sport : p->dport;
	k->dport = from_pod ? p->dport : p->sport;
	__builtin_memcpy(k->saddr, from_pod ? p->saddr : p->daddr, 16);
	__builtin_memcpy(k->daddr, from_pod ? p->daddr : p->saddr, 16);
}

/* flow_untracked_stack: p cannot be tracked; 1 when it goes to the stack. */
static __always_inline int flow_untracked_stack(const struct nat_pkt *p)
{
	if (p->frag)
		return 1;
	if (flow_tracked(p->proto))
		return 0;
	return !nat_is_echo_request(p) && !nat_is_echo_reply(p);
}

/* flow_get finds p's flow unless it is stale: idle beyond the masquerade's
 * lifetime of its protocol (UDP, established TCP), or a TCP connection that
 * starts anew on the tuple of a settled one (*stale). It refreshes the clock at most
 * once a second (the LRU needs no more, and a write a packet would bounce
 * the entry between CPUs), and then forgets that conntrack did not track
 * the flow. */
static __always_inline struct flow_entry *flow_get(const struct flow_key *k, const struct nat_pkt *p, __u64 now,
					      __u8 *stale)
{
	struct flow_entry *e = bpf_map_lookup_elem(&flows, k);
	struct nat_entry life = { .state = NAT_STATE_ESTABLISHED };

	*stale = 0;
	if (!e)
		return NULL;
	if (flow_syn(p) && e->verdict != FLOW_PENDING) {
		*stale = 1;
		return NULL;
	}
	if (now > e->last_seen && now - e->last_seen > NSEC_PER_SEC) {
		if (now - e->last_seen > nat_lifetime(&life, p->proto))
			return NULL;
		e->last_seen = now;
		/* Conntrack may have become active in the netns since (kube-proxy
		 * started): ask it again, once a second at most. */
		if (e->flags & FLOW_F_UNTRACKED)
			e->flags &= ~FLOW_F_UNTRACKED;
	}
	return e;
}

static __always_inline void flow_put(const struct flow_key *k, struct flow_entry *v, __u8 verdict, __u8 flags,
				     __u64 now)
{
	__builtin_memset(v, 0, sizeof(*v));
	v->verdict = verdict;
	v->flags = flags;
	v->pending = verdict == FLOW_PENDING;
	v->last_seen = now;
	bpf_map_update_elem(&flows, k, v, BPF_ANY);
}

/* The verdict of a flow from what flow_ct found. */
static __always_inline __u8 flow_verdict_of(int ct)
{
	return ct != FLOW_CT_NONE && (ct & FLOW_CT_NAT) ? FLOW_STACK : FLOW_FAST;
}

/* Outcomes of flow_find. */
#define FLOW_FIND_STACK 1 /* untracked, to the stack */
#define FLOW_FIND_FAST 2  /* untracked, the fast path */
#define FLOW_FIND_DONE 3  /* tracked: *e is the flow's entry, or NULL */

/* flow_find looks up the flow of s->p, as the pod sends it (from_pod) or
 * as it comes to the pod. */
static __always_inline int flow_find(struct nat_scratch *s, int from_pod, struct flow_entry **e, __u64 *now)
{
	if (flow_untracked_stack(&s->p))
		return FLOW_FIND_STACK;
	if (!flow_tracked(s->p.proto))
		return FLOW_FIND_FAST;
	*now = bpf_ktime_get_ns();
	flow_key_of(&s->fk, &s->p, from_pod);
	*e = flow_get(&s->fk, &s->p, *now, &s->stale);
	return FLOW_FIND_DONE;
}

/* flow_egress decides for a pod's packet s->p to a destination netfilter
 * may translate (not a pod of this node, not in the cluster's ranges):
 * 1 hands it to the stack (*why says why), 0 keeps the fast path. */
static __always_inline int flow_egress(struct __sk_buff *skb, struct nat_scratch *s, enum pkt_reason *why)
{
	struct nat_pkt *p = &s->p;
	struct flow_entry *e = NULL;
	__u64 now = 0;
	int ct, found;

	*why = REASON_STACK_REPLY;
	found = flow_find(s, 1, &e, &now);
	if (found != FLOW_FIND_DONE)
		return found == FLOW_FIND_STACK;
	if (!e) {
		if (p->proto == IPPROTO_TCP && !(p->tcp_flags & TCP_FLAG_SYN)) {
			struct nat_entry *o = nat_out_live(s, now);

			/* Set up in BPF and masqueraded: its NAT entry holds
			 * its verdict (NAT_F_BYPASS), fast. */
			if (o && (o->flags & NAT_F_BYPASS))
				return 0;
			/* Mid-stream (its entry was evicted, or it predates us):
			 * there is no first packet to wait for. A packet in the
			 * entry's reply direction answers a flow opened toward
			 * the pod. */
			ct = flow_ct(skb, p, &s->tuple);
			flow_put(&s->fk, &s->fe, flow_verdict_of(ct),
				 ct != FLOW_CT_NONE && (ct & FLOW_CT_REPLY) ? FLOW_F_INBOUND : 0, now);
			return s->fe.verdict == FLOW_STACK;
		}
		if (xlat_bypass(p->family, p->daddr, now)) {
			/* Nothing netfilter may translate (the agent's lease
			 * runs, lib/xlat.h): settled at once, its first packet
			 * on the fast path too. A TCP flow stays fast for its
			 * life: where to_netdev masquerades it, its NAT OUT
			 * entry says so (TC_INDEX_BYPASS: NAT_F_BYPASS) and
			 * it gets no entry here; where it does not, to_netdev
			 * writes this one (flow_bypass_put). */
			if (flow_syn(p)) {
				if (s->stale)
					bpf_map_delete_elem(&flows, &s->fk); /* an earlier connection's */
				skb->tc_index = TC_INDEX_BYPASS;
				return 0;
			}
			flow_put(&s->fk, &s->fe, FLOW_FAST, FLOW_F_BYPASS, now);
			return 0;
		}
		flow_put(&s->fk, &s->fe, FLOW_PENDING, 0, now);
		*why = REASON_FLOW_NEW;
		return 1;
	}
	if (e->verdict == FLOW_PENDING) {
		/* Until netfilter let one of its packets through (flow_left, or
		 * a reply), every packet meets it: the first ones may have been
		 * dropped or rejected (a Service without endpoints, kube-proxy
		 * not synced yet), and a later one may be translated. */
		ct = flow_ct(skb, p, &s->tuple);
		if (ct == FLOW_CT_NONE) {
			if (e->pending < 255)
				e->pending++;
			*why = REASON_FLOW_NEW;
			return 1;
		}
		e->verdict = flow_verdict_of(ct);
	} else if (e->verdict == FLOW_FAST && p->proto == IPPROTO_UDP && (e->flags & FLOW_F_BYPASS)) {
		/* Set up without the stack: conntrack has no entry to ask.
		 * The set is asked instead: a destination that became one
		 * netfilter may translate (a new externalIP), or a lease that
		 * ran out, sends the flow to meet netfilter, as kube-proxy's
		 * cleanup of a Service's UDP entries does below. */
		if (!xlat_bypass(p->family, p->daddr, now)) {
			e->verdict = FLOW_PENDING;
			e->flags &= ~FLOW_F_BYPASS;
			e->pending = 1;
			*why = REASON_FLOW_NEW;
			return 1;
		}
	} else if (e->verdict == FLOW_FAST && p->proto == IPPROTO_UDP &&
		   !(e->flags & (FLOW_F_INBOUND | FLOW_F_UNTRACKED))) {
		/* A UDP flow conntrack no longer knows: kube-proxy deleted its
		 * entry (the Service's endpoints changed), or it timed out.
		 * Back to the stack, where netfilter decides anew. TCP is not
		 * asked: kube-proxy cleans up UDP flows only, and a packet of
		 * an established TCP flow skips the stack for good. */
		if (flow_ct(skb, p, &s->tuple) == FLOW_CT_NONE) {
			e->verdict = FLOW_PENDING;
			e->pending = 1;
			*why = REASON_FLOW_NEW;
			return 1;
		}
	}
	return e->verdict == FLOW_STACK;
}

/* flow_left settles the pending flow of a pod's packet s->p (not
 * translated by netfilter: it carries the pod's tuple) that is leaving the
 * node through an uplink (to_netdev: tc egress, after netfilter's
 * POSTROUTING, where conntrack confirms a new entry). The stack let it
 * through: an entry makes the flow's verdict; none means conntrack does not
 * track it (not active in the node's netns, or a NOTRACK rule), and no
 * packet of it is waited for again. */
static __always_inline void flow_left(struct __sk_buff *skb, struct nat_scratch *s)
{
	struct flow_entry *e;
	int ct;

	if (s->p.frag || !flow_tracked(s->p.proto))
		return;
	flow_key_of(&s->fk, &s->p, 1);
	e = bpf_map_lookup_elem(&flows, &s->fk);
	if (!e || e->verdict != FLOW_PENDING)
		return;
	ct = flow_ct(skb, &s->p, &s->tuple);
	if (ct == FLOW_CT_NONE) {
		e->flags |= FLOW_F_UNTRACKED;
		e->verdict = FLOW_FAST;
		return;
	}
	e->verdict = flow_verdict_of(ct);
}

/* flow_ingress decides for a packet s->p for a pod of this node that came
 * from outside it (after any translation of ours): 1 hands it to the stack,
 * whose conntrack translates it back, 0 delivers it straight. */
static __always_inline int flow_ingress(struct __sk_buff *skb, struct nat_scratch *s)
{
	struct nat_pkt *p = &s->p;
	struct flow_entry *e = NULL;
	__u64 now = 0;
	int ct, found;

	found = flow_find(s, 0, &e, &now);
	if (found != FLOW_FIND_DONE)
		return found == FLOW_FIND_STACK;
	/* A reply settles a pending flow (its first packet passed netfilter
	 * already); an unknown flow is settled here, inbound unless conntrack
	 * saw the pod open it. */
	ct = (!e || e->verdict == FLOW_PENDING) ? flow_ct(skb, p, &s->tuple) : FLOW_CT_NONE;
	if (!e) {
		flow_put(&s->fk, &s->fe, flow_verdict_of(ct),
			 ct != FLOW_CT_NONE && (ct & FLOW_CT_REPLY) ? 0 : FLOW_F_INBOUND, now);
		return s->fe.verdict == FLOW_STACK;
	}
	if (e->verdict == FLOW_PENDING)
		e->verdict = flow_verdict_of(ct);
	return e->verdict == FLOW_STACK;
}

/* flow_bypass_put: to_netdev does not masquerade the pod's SYN s->p,
 * which from_container set up in BPF (TC_INDEX_BYPASS): its verdict goes
 * here after all. */
static __always_inline void flow_bypass_put(struct nat_scratch *s, __u64 now)
{
	flow_key_of(&s->fk, &s->p, 1);
	flow_put(&s->fk, &s->fe, FLOW_FAST, FLOW_F_BYPASS, now);
}

/* flow_nat_slow: the flow of s->fk goes through the stack from now on;
 * its NAT OUT entry no longer says that it is fast (NAT_F_BYPASS,
 * NAT_F_FAST), so that its packets and replies look it up here. */
static __always_inline void flow_nat_slow(struct nat_scratch *s)
{
	struct nat_entry *o;

	__builtin_memset(&s->out, 0, sizeof(s->out));
	s->out.family = s->fk.family;
	s->out.proto = s->fk.proto;
	s->out.dir = NAT_DIR_OUT;
	s->out.sport = s->fk.sport;
	s->out.dport = s->fk.dport;
	__builtin_memcpy(s->out.saddr, s->fk.saddr, 16);
	__builtin_memcpy(s->out.daddr, s->fk.daddr, 16);
	o = bpf_map_lookup_elem(&nat, &s->out);
	if (o && (o->flags & (NAT_F_BYPASS | NAT_F_FAST)))
		o->flags &= ~(NAT_F_BYPASS | NAT_F_FAST);
}

/* flow_via_stack notes that s->p's flow goes through the stack in both
 * directions: the stack delivered it to the pod (from_pod 0: its next
 * packets will come that way too, so its replies must go there), or the
 * pod's packets are handed to another plugin's ingress qdisc and so to the
 * stack (from_pod 1: the replies must meet the same conntrack). A flow new
 * to us that the stack delivered was opened toward the pod. */
static __always_inline void flow_via_stack(struct nat_scratch *s, int from_pod, __u64 now)
{
	struct flow_entry *e;

	flow_key_of(&s->fk, &s->p, from_pod);
	e = bpf_map_lookup_elem(&flows, &s->fk);
	if (e) {
		if (now - e->last_seen > NSEC_PER_SEC)
			e->last_seen = now;
		if (e->verdict == FLOW_STACK)
			return;
		e->verdict = FLOW_STACK;
	} else {
		flow_put(&s->fk, &s->fe, FLOW_STACK, from_pod ? 0 : FLOW_F_INBOUND, now);
	}
	flow_nat_slow(s);
}

/* flow_is_stack: a flow the pod's packet s->p belongs to goes through the
 * stack (for pods whose endpoint carries EP_F_STACK). */
static __always_inline int flow_is_stack(struct nat_scratch *s)
{
	struct flow_entry *e;

	flow_key_of(&s->fk, &s->p, 1);
	e = bpf_map_lookup_elem(&flows, &s->fk);
	return e && e->verdict == FLOW_STACK;
}

/* flow_inbound: the pod's packet s->p answers a flow opened toward it. */
static __always_inline int flow_inbound(struct nat_scratch *s)
{
	struct flow_entry *e;

	if (!flow_tracked(s->p.proto))
		return 0;
	flow_key_of(&s->fk, &s->p, 1);
	e = bpf_map_lookup_elem(&flows, &s->fk);
	return e && (e->flags & FLOW_F_INBOUND);
}

#endif
