/* owner: feature hostPort */
/* hostPort translation: the translated flows live in the conntrack/NAT
 * table (lib/conntrack.h) as NAT_DIR_DNAT entries keyed by the pod's reply
 * tuple; the forward direction is looked up in hostports (lib/hostport.h)
 * on every packet and never cached, so a pod that is deleted and recreated
 * never inherits a stale translation. */
#ifndef EBPF_CNI_LIB_HOSTPORT_NAT_H
#define EBPF_CNI_LIB_HOSTPORT_NAT_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include "../include/types.h"
#include "addr.h"
#include "conntrack.h"
#include "pkt.h"
#include "rewrite.h"

/* hostport_dnat sends s->p, a packet to a published port, to the pod
 * address and port in t (copied to s->res first: t points into a map
 * value). hairpin: the client is that pod itself, so the source becomes
 * the address it asked for, and the pod's replies come back here. The
 * DNAT entry lets the replies be translated back. */
static __always_inline int hostport_dnat(struct __sk_buff *skb, struct nat_scratch *s, int hairpin)
{
	struct nat_entry *cur;
	__u64 now = bpf_ktime_get_ns();
	struct nat_key *k = &s->in;

	__builtin_memset(k, 0, sizeof(*k));
	k->family = s->p.family;
	k->proto = s->p.proto;
	k->dir = NAT_DIR_DNAT;
	k->sport = s->res.port;
	k->dport = s->p.sport;
	__builtin_memcpy(k->saddr, s->res.addr, 16);
	__builtin_memcpy(k->daddr, hairpin ? s->p.daddr : s->p.saddr, 16);

	cur = bpf_map_lookup_elem(&nat, k);
	if (cur && cur->port == s->p.dport && addr_equal(cur->addr, s->p.daddr) && !nat_expired(cur, k->proto, now)) {
		nat_track(cur, &s->p, 0, now);
	} else {
		__builtin_memset(&s->iv, 0, sizeof(s->iv));
		__builtin_memcpy(s->iv.addr, s->p.daddr, 16);
		s->iv.port = s->p.dport;
		s->iv.state = s->p.proto != IPPROTO_TCP ? NAT_STATE_OPEN :
			      (s->p.tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN ? NAT_STATE_SYN_SENT :
												 NAT_STATE_ESTABLISHED;
		s->iv.flags = hairpin ? NAT_F_HAIRPIN : 0;
		s->iv.created = now;
		s->iv.last_seen = now;
		/* A later mapping of the same pod port to the same client wins. */
		bpf_map_update_elem(&nat, k, &s->iv, BPF_ANY);
	}

	if (nat_rewrite(skb, &s->p, 0, s->res.addr, s->res.port, s))
		return -1;
	if (hairpin && nat_rewrite(skb, &s->p, 1, s->p.daddr, s->p.sport, s))
		return -1;
	return 0;
}

/* hostport_rev translates a pod's reply s->p back: the source becomes the
 * address and hostPort the client asked for; a hairpin reply goes back to
 * the pod itself. 1 when translated, 0 when the packet is no such reply. */
static __always_inline int hostport_rev(struct __sk_buff *skb, struct nat_scratch *s)
{
	struct nat_entry *cur;
	struct nat_key *k = &s->in;
	__u64 now;

	__builtin_memset(k, 0, sizeof(*k));
	k->family = s->p.family;
	k->proto = s->p.proto;
	k->dir = NAT_DIR_DNAT;
	k->sport = s->p.sport;
	k->dport = s->p.dport;
	__builtin_memcpy(k->saddr, s->p.saddr, 16);
	__builtin_memcpy(k->daddr, s->p.daddr, 16);
	cur = bpf_map_lookup_elem(&nat, k);
	if (!cur)
		return 0;
	now = bpf_ktime_get_ns();
	if (nat_expired(cur, k->proto, now))
		return 0;
	nat_track(cur, &s->p, 1, now);
	__builtin_memcpy(&s->iv, cur, sizeof(s->iv));
	if ((s->iv.flags & NAT_F_HAIRPIN) && nat_rewrite(skb, &s->p, 0, s->p.saddr, s->p.dport, s))
		return -1;
	if (nat_rewrite(skb, &s->p, 1, s->iv.addr, s->iv.port, s))
		return -1;
	return 1;
}

#endif
