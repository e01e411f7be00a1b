/* owner: feature masquerade */
/* Masquerade: our own connection tracking and source NAT for pod traffic
 * leaving through an uplink (this kernel offers no conntrack to programs).
 *
 * Its flows live in the conntrack/NAT table (lib/conntrack.h), both
 * directions of each: the OUT entry, keyed by the pod's tuple, holds the
 * translated address and port, the state and the clock; the IN entry,
 * keyed by the tuple of the replies, points back at the pod and is valid
 * only while its OUT entry is. DEL/GC delete a pod's flows. */
#ifndef EBPF_CNI_LIB_NAT_H
#define EBPF_CNI_LIB_NAT_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "../include/types.h"
#include "addr.h"
#include "conntrack.h"
#include "pkt.h"
#include "published_ports.h"

#define NAT_PORT_TRIES 32 /* random probes into the range before giving up */

#define TCP_LISTEN_STATE 10 /* TCP_LISTEN of include/net/tcp_states.h */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, struct masq_net_key);
	__type(value, struct masq_net);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} masq_nets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 16384);
	__type(key, struct masq_skip_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} masq_skip SEC(".maps");

/* The key of the replies to a translated flow. */
static __always_inline void nat_in_key(struct nat_key *in, const struct nat_key *out, const __u8 *nat_addr,
				       __be16 nat_port)
{
	in->family = out->family;
	in->proto = out->proto;
	in->dir = NAT_DIR_IN;
	in->pad = 0;
	if (is_icmp(out->proto)) {
		in->sport = 0;
		in->dport = nat_port;
	} else {
		in->sport = out->dport;
		in->dport = nat_port;
	}
	__builtin_memcpy(in->saddr, out->daddr, 16);
	__builtin_memcpy(in->daddr, nat_addr, 16);
}

/* The pod's key of a flow found by its IN entry. */
static __always_inline void nat_out_key(struct nat_key *out, const struct nat_key *in, const struct nat_entry *v)
{
	out->family = in->family;
	out->proto = in->proto;
	out->dir = NAT_DIR_OUT;
	out->pad = 0;
	out->sport = v->port;
	out->dport = is_icmp(in->proto) ? 0 : in->sport;
	__builtin_memcpy(out->saddr, v->addr, 16);
	__builtin_memcpy(out->daddr, in->saddr, 16);
}

/* A socket of the node that a packet with the given IN tuple would reach:
 * listening (any != 0) or only connected/established ones. */
static __always_inline int node_socket(struct __sk_buff *skb, const struct nat_key *in, int any,
				       struct bpf_sock_tuple *tp)
{
	struct bpf_sock *sk;
	__u32 size;
	int owned;

	if (in->proto != IPPROTO_TCP && in->proto != IPPROTO_UDP)
		return 0;
	size = sock_tuple(tp, in->family, in->saddr, in->daddr, in->sport, in->dport);
	if (in->proto == IPPROTO_TCP) {
		sk = bpf_skc_lookup_tcp(skb, tp, size, BPF_F_CURRENT_NETNS, 0);
		if (!sk)
			return 0;
		owned = any || sk->state != TCP_LISTEN_STATE;
	} else {
		sk = bpf_sk_lookup_udp(skb, tp, size, BPF_F_CURRENT_NETNS, 0);
		if (!sk)
			return 0;
		owned = any || sk->dst_port != 0; /* connected */
	}
	bpf_sk_release(sk);
	return owned;
}

/* nat_in_lookup finds the live flow of a reply tuple: its IN entry and the
 * OUT entry that makes it valid. */
static __always_inline struct nat_entry *nat_in_lookup(const struct nat_key *in, struct nat_entry **in_entry,
							__u64 now, struct nat_key *tmp)
{
	struct nat_entry *iv, *ov;

	iv = bpf_map_lookup_elem(&nat, in);
	if (!iv)
		return NULL;
	nat_out_key(tmp, in, iv);
	ov = bpf_map_lookup_elem(&nat, tmp);
	if (!ov || ov->port != in->dport || !addr_equal(ov->addr, in->daddr) || nat_expired(ov, in->proto, now))
		return NULL;
	*in_entry = iv;
	return ov;
}

/* A translated port is taken while it is published on the address as a
 * hostPort (the published port's clients must reach its pod, never a
 * masqueraded flow), a live flow holds it, or a socket of the node could
 * receive its replies. */
static __always_inline int nat_port_taken(struct __sk_buff *skb, struct nat_scratch *s, __u64 now)
{
	struct nat_entry *iv;

	if (hostport_published(s->in.family, s->in.proto, s->in.dport, s->in.daddr))
		return 1;
	if (nat_in_lookup(&s->in, &iv, now, &s->tmp))
		return 1;
	return node_socket(skb, &s->in, 1, &s->tuple);
}

/* nat_own_in: the IN entry of s->in (an OUT entry cur's) points back at
 * the pod's tuple of s->out: a port a flow of another pod claimed after
 * cur expired is not the flow's to keep or to delete. */
static __always_inline struct nat_entry *nat_own_in(struct nat_scratch *s, const struct nat_entry *cur)
{
	struct nat_entry *iv;

	nat_in_key(&s->in, &s->out, cur->addr, cur->port);
	iv = bpf_map_lookup_elem(&nat, &s->in);
	if (!iv || iv->port != s->out.sport || !addr_equal(iv->addr, s->out.saddr))
		return NULL;
	return iv;
}

/* nat_renew starts the new flow s->out over in the entries of its
 * tuple's expired flow cur, which kept the pod's own port (NAT_F_KEPT) on
 * the address the flow leaves with now (s->addr) in the same network, when
 * that port is still free (as nat_create's first try asks: not published,
 * no socket of the node on it; its IN entry is still the flow's own): the
 * same translation nat_create would choose, without deleting two entries
 * and inserting two (a client reusing its ports on one destination, every
 * 10 seconds or more). 1 when renewed, into s->res. */
static __always_inline int nat_renew(struct __sk_buff *skb, struct nat_scratch *s, struct nat_entry *cur, __u32 net_id,
				     __u8 state, __u8 flags_new, __u64 now)
{
	struct nat_entry *iv;

	if (!(cur->flags & NAT_F_KEPT) || cur->port != s->out.sport || cur->net_id != net_id ||
	    !addr_equal(cur->addr, s->addr))
		return 0;
	iv = nat_own_in(s, cur);
	if (!iv || iv->net_id != net_id)
		return 0;
	if (hostport_published(s->in.family, s->in.proto, s->in.dport, s->in.daddr) ||
	    node_socket(skb, &s->in, 1, &s->tuple))
		return 0;
	iv->created = now;
	iv->last_seen = now;
	cur->state = state;
	cur->flags = NAT_F_KEPT | flags_new;
	cur->created = now;
	cur->last_seen = now;
	__builtin_memcpy(&s->res, cur, sizeof(s->res));
	return 1;
}

/* nat_create translates the new flow s->out: the pod's port when it is
 * free, else a random free one of the network's range, into s->res, with
 * flags (enum nat_flags) besides NAT_F_KEPT. The IN entry is claimed first
 * (BPF_NOEXIST), so two CPUs never hand out one port. */
static __always_inline int nat_create(struct __sk_buff *skb, struct nat_scratch *s, const struct masq_net *mn,
				      __u32 net_id, __u8 state, __u8 flags_new, __u64 now)
{
	struct nat_entry *cur;
	__u32 span, start, i;
	__u16 min = mn->port_min, max = mn->port_max;
	__be16 port = s->out.sport;
	__u8 flags = NAT_F_KEPT;

	if (!min || max < min) {
		min = 1024;
		max = 65535;
	}
	span = (__u32)max - min + 1;
	start = bpf_get_prandom_u32();
	__builtin_memset(&s->iv, 0, sizeof(s->iv));
	__builtin_memcpy(s->iv.addr, s->out.saddr, 16);
	s->iv.port = s->out.sport;
	s->iv.net_id = net_id;
	s->iv.created = now;
	s->iv.last_seen = now;

	for (i = 0; i <= NAT_PORT_TRIES; i++) {
		if (i > 0) {
			port = bpf_htons((__u16)(min + (start + i) % span));
			flags = 0;
		}
		nat_in_key(&s->in, &s->out, s->addr, port);
		if (nat_port_taken(skb, s, now))
			continue;
		if (!bpf_map_update_elem(&nat, &s->in, &s->iv, BPF_NOEXIST))
			goto claimed;
		/* An IN entry is there: a stale one (its flow expired) gives
		 * way, one another CPU claimed since does not. */
		if (nat_port_taken(skb, s, now))
			continue;
		bpf_map_delete_elem(&nat, &s->in);
		if (!bpf_map_update_elem(&nat, &s->in, &s->iv, BPF_NOEXIST))
			goto claimed;
	}
	return -1;

claimed:
	__builtin_memset(&s->res, 0, sizeof(s->res));
	__builtin_memcpy(s->res.addr, s->addr, 16);
	s->res.port = port;
	s->res.state = state;
	s->res.flags = flags | flags_new;
	s->res.net_id = net_id;
	s->res.created = now;
	s->res.last_seen = now;
	if (bpf_map_update_elem(&nat, &s->out, &s->res, BPF_NOEXIST)) {
		/* Another CPU translated the same flow meanwhile: use its port. */
		bpf_map_delete_elem(&nat, &s->in);
		cur = bpf_map_lookup_elem(&nat, &s->out);
		if (!cur)
			return -1;
		__builtin_memcpy(&s->res, cur, sizeof(s->res));
	}
	return 0;
}

#endif
