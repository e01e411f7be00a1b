/* owner: shared */
/* The conntrack/NAT table (nat) and its lifetimes (nat_timeouts): one LRU
 * table whose entries masquerade (NAT_DIR_OUT, NAT_DIR_IN: lib/nat.h) and
 * hostPort (NAT_DIR_DNAT: lib/hostport_nat.h) each write and read, with the
 * lifetimes the flows feature (lib/flow.h) holds its flows to as well. In
 * Go the building block pkg/conntrack; each feature flushes and collects
 * its own entries. Expired entries are treated as absent; the LRU evicts
 * under pressure. */
#ifndef EBPF_CNI_LIB_CONNTRACK_H
#define EBPF_CNI_LIB_CONNTRACK_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include "../include/types.h"
#include "pkt.h"

#define NAT_MAX_ENTRIES 131072 /* both directions: 65536 flows */

#define NSEC_PER_SEC 1000000000ULL

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, NAT_MAX_ENTRIES);
	__type(key, struct nat_key);
	__type(value, struct nat_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} nat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct nat_lifetimes);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} nat_timeouts SEC(".maps");

static __always_inline __u64 nat_lifetime(const struct nat_entry *e, __u8 proto)
{
	__u32 zero = 0, s = 0;
	struct nat_lifetimes *c = bpf_map_lookup_elem(&nat_timeouts, &zero);

	if (proto == IPPROTO_TCP) {
		if (e->state == NAT_STATE_ESTABLISHED)
			s = c ? c->tcp_established : 0;
		else if (e->state == NAT_STATE_CLOSING)
			s = c ? c->tcp_closing : 0;
		else
			s = c ? c->tcp_syn : 0;
		if (!s)
			s = e->state == NAT_STATE_ESTABLISHED ? NAT_DEFAULT_TCP_ESTABLISHED :
			    e->state == NAT_STATE_CLOSING     ? NAT_DEFAULT_TCP_CLOSING :
								NAT_DEFAULT_TCP_SYN;
	} else if (proto == IPPROTO_SCTP) {
		/* hostPort only: an association lives like a TCP connection. */
		s = c && c->tcp_established ? c->tcp_established : NAT_DEFAULT_TCP_ESTABLISHED;
	} else if (proto == IPPROTO_UDP) {
		s = c && c->udp ? c->udp : NAT_DEFAULT_UDP;
	} else {
		s = c && c->icmp ? c->icmp : NAT_DEFAULT_ICMP;
	}
	return (__u64)s * NSEC_PER_SEC;
}

static __always_inline int nat_expired(const struct nat_entry *e, __u8 proto, __u64 now)
{
	return now > e->last_seen && now - e->last_seen > nat_lifetime(e, proto);
}

/* The TCP state machine, as far as lifetimes need it. */
static __always_inline void nat_track(struct nat_entry *e, const struct nat_pkt *p, int reply, __u64 now)
{
	e->last_seen = now;
	if (reply && !(e->flags & NAT_F_REPLIED))
		e->flags |= NAT_F_REPLIED;
	if (p->proto != IPPROTO_TCP)
		return;
	if (p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)) {
		e->state = NAT_STATE_CLOSING;
	} else if (p->tcp_flags & TCP_FLAG_SYN) {
		if (!reply)
			e->state = NAT_STATE_SYN_SENT; /* the port reused for a new connection */
		else if (e->state == NAT_STATE_SYN_SENT)
			e->state = NAT_STATE_ESTABLISHED;
	} else if (reply && e->state == NAT_STATE_SYN_SENT) {
		e->state = NAT_STATE_ESTABLISHED;
	}
}

/* nat_out_key_of sets out to the OUT key (lib/nat.h) of the pod's packet p
 * (an echo request's identifier is its source port, its destination none). */
static __always_inline void nat_out_key_of(struct nat_key *out, const struct nat_pkt *p)
{
	__builtin_memset(out, 0, sizeof(*out));
	out->family = p->family;
	out->proto = p->proto;
	out->dir = NAT_DIR_OUT;
	out->sport = p->sport;
	out->dport = is_icmp(p->proto) ? 0 : p->dport;
	__builtin_memcpy(out->saddr, p->saddr, 16);
	__builtin_memcpy(out->daddr, p->daddr, 16);
}

/* nat_out_live finds the live OUT entry of the pod's packet s->p (into
 * s->out's key): a TCP packet other than a SYN, or a UDP one, of a flow
 * masqueraded already. */
static __always_inline struct nat_entry *nat_out_live(struct nat_scratch *s, __u64 now)
{
	struct nat_entry *cur;

	if (s->p.later_frag || (s->p.proto != IPPROTO_TCP && s->p.proto != IPPROTO_UDP) ||
	    (s->p.proto == IPPROTO_TCP && (s->p.tcp_flags & TCP_FLAG_SYN)))
		return NULL;
	nat_out_key_of(&s->out, &s->p);
	cur = bpf_map_lookup_elem(&nat, &s->out);
	if (!cur || nat_expired(cur, s->p.proto, now))
		return NULL;
	return cur;
}

/* nat_current: the live OUT entry cur's last packet was in the same second
 * (2^30 ns) as now: its translation stands, as netfilter's does for a
 * connection once set up. What could change it (the network's masquerade,
 * its nonMasqueradeCIDRs, the node's address) is looked at again by the
 * first packet of every second, and by every SYN, which to_netdev takes
 * through its whole path. */
static __always_inline int nat_current(const struct nat_entry *cur, __u64 now)
{
	return (now >> 30) == (cur->last_seen >> 30);
}

/* nat_established finds the OUT entry of the pod's packet s->p (into
 * s->out's key) when its flow was masqueraded already and its last packet
 * was in the same second as now (nat_current). TCP and UDP only. */
static __always_inline struct nat_entry *nat_established(struct nat_scratch *s, __u64 now)
{
	struct nat_entry *cur = nat_out_live(s, now);

	return cur && nat_current(cur, now) ? cur : NULL;
}

/* tc_index of a pod's packet from_container translated (nat_established)
 * and redirected out of an uplink: to_netdev, which sees it there, lets it
 * pass as it is. */
#define TC_INDEX_SNAT 0xeb0d

/* tc_index of a pod's TCP SYN from_container set up in BPF (lib/xlat.h:
 * FLOW_F_BYPASS) and redirected: to_netdev keeps that in the flow's OUT
 * entry (NAT_F_BYPASS) instead of an entry of flows (lib/flow.h), or, when
 * it does not masquerade the flow, writes that entry of flows itself. */
#define TC_INDEX_BYPASS 0xeb0e

#endif
