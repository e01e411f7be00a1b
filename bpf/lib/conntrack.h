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

#endif
