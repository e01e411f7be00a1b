/* owner: shared */
/* The live event stream: drops (and, on request, sampled flow starts and
 * ends) reported through a ring buffer while a reader (`ebpf-cni monitor`)
 * holds the lease in events_config. verdict() (lib/verdict.h) is the one
 * caller in the tc programs (event_report).
 *
 * Cost when nobody reads: one lookup of an array map (the verifier inlines
 * it) and one load per packet. A reader writes an expiry (lease) and renews
 * it every second; a program that finds it expired sets it to 0, so a
 * killed reader switches the stream off by itself.
 *
 * Every event goes through a per-CPU token bucket (GCRA, as the bandwidth
 * buckets, without atomics: each CPU has its own): at most one event every
 * ns_per_event per CPU after a burst. What the bucket refused is counted as
 * suppressed, what the ring had no room for as lost (events_stats, per CPU,
 * by drop reason), so events + suppressed + lost is every packet the stream
 * was asked to report. */
#ifndef EBPF_CNI_LIB_EVENTS_H
#define EBPF_CNI_LIB_EVENTS_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h> /* before TCP_FLAG_*, which its enum names too */
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "../include/types.h"
#include "skb.h"

#ifndef TCP_FLAG_FIN
#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10
#endif

#ifndef likely
#define likely(x) __builtin_expect(!!(x), 1)
#endif
#ifndef unlikely
#define unlikely(x) __builtin_expect(!!(x), 0)
#endif

#define EVENTS_RING_BYTES (1 << 20) /* ~12,000 events: 80 bytes and an 8-byte header each */
/* A submit wakes the reader only once this much waits in the ring: a
 * wakeup is an interrupt (a VM exit in a guest) that would cost more than
 * the rest of the event. The reader polls the ring at least every 100 ms
 * (pkg/events), so an event is on screen within that. */
#define EVENTS_WAKEUP_BYTES (64 << 10)

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, EVENTS_RING_BYTES);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct event_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} events_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct event_stats);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} events_stats SEC(".maps");

static __always_inline struct event_config *event_config_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&events_config, &zero);
}

/* event_leased: the lease in cfg has not expired (the caller saw it set).
 * An expired one is cleared, unless the reader renewed it meanwhile. */
static __always_inline int event_leased(struct event_config *cfg, __u64 now)
{
	__u64 lease = cfg->lease;

	if (likely(now < lease))
		return 1;
	if (lease)
		__sync_val_compare_and_swap(&cfg->lease, lease, 0);
	return 0;
}

/* event_admit takes a token from this CPU's bucket: 0 when it is empty. */
static __always_inline int event_admit(struct event_config *cfg, struct event_stats *st, __u64 now)
{
	__u64 tat = st->tat;

	if (tat < now)
		tat = now;
	if (tat - now > cfg->burst)
		return 0;
	st->tat = tat + cfg->ns_per_event;
	return 1;
}

static __always_inline struct event_stats *event_stats_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&events_stats, &zero);
}

enum event_gate { EVENT_OFF, EVENT_SUPPRESSED, EVENT_ADMITTED };

/* event_gate decides on an event the caller has found worth reporting
 * while the lease was seen set: off (expired), suppressed (the caller
 * counts it in *st) or admitted; *now is the event's time. */
static __always_inline enum event_gate event_gate(struct event_config *cfg, struct event_stats **st, __u64 *now)
{
	*now = bpf_ktime_get_ns();
	if (!event_leased(cfg, *now))
		return EVENT_OFF;
	*st = event_stats_get();
	if (!*st)
		return EVENT_OFF;
	return event_admit(cfg, *st, *now) ? EVENT_ADMITTED : EVENT_SUPPRESSED;
}

/* event_parse fills what the headers tell (direct packet access, bounded:
 * a header outside the linear data is left out). Returns 1 when ports
 * were read. */
static __always_inline int event_parse(struct __sk_buff *skb, struct event *ev)
{
	void *end = skb_data_end(skb);
	struct ethhdr *eth = skb_data(skb);
	void *l4;

	if ((void *)(eth + 1) > end)
		return 0;
	__builtin_memcpy(ev->mac, eth->h_source, ETH_ALEN);
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > end)
			return 0;
		ev->family = ADDR_FAMILY_V4;
		ev->proto = ip->protocol;
		__builtin_memcpy(ev->saddr, &ip->saddr, 4);
		__builtin_memcpy(ev->daddr, &ip->daddr, 4);
		if (ip->frag_off & bpf_htons(0x3fff)) { /* MF or an offset */
			ev->flags |= EVENT_F_FRAG;
			if (ip->frag_off & bpf_htons(0x1fff))
				return 0;
		}
		l4 = (void *)ip + ((ip->ihl & 0xf) << 2);
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > end)
			return 0;
		ev->family = ADDR_FAMILY_V6;
		ev->proto = ip6->nexthdr;
		__builtin_memcpy(ev->saddr, &ip6->saddr, 16);
		__builtin_memcpy(ev->daddr, &ip6->daddr, 16);
		l4 = ip6 + 1;
	} else if (eth->h_proto == bpf_htons(ETH_P_ARP)) {
		/* Ethernet/IPv4 ARP: 8 bytes of header, then sender MAC and
		 * address, target MAC and address. */
		__u8 *arp = (void *)(eth + 1);

		if ((void *)(arp + 28) > end)
			return 0;
		ev->family = ADDR_FAMILY_V4;
		ev->flags |= EVENT_F_ARP;
		__builtin_memcpy(ev->saddr, arp + 14, 4);
		__builtin_memcpy(ev->daddr, arp + 24, 4);
		return 0;
	} else {
		return 0;
	}
	if (ev->proto != IPPROTO_TCP && ev->proto != IPPROTO_UDP && ev->proto != IPPROTO_SCTP)
		return 0;
	if (l4 + 14 > end) {
		if (ev->proto == IPPROTO_TCP || l4 + 4 > end)
			return 0;
	} else if (ev->proto == IPPROTO_TCP) {
		ev->tcp_flags = *(__u8 *)(l4 + 13);
	}
	ev->sport = *(__be16 *)l4;
	ev->dport = *(__be16 *)(l4 + 2);
	return 1;
}

static __always_inline void event_submit(struct event *ev)
{
	bpf_ringbuf_submit(ev, bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= EVENTS_WAKEUP_BYTES ?
				   BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
}

/* event_put reserves, fills and submits one event; 0 when the ring is
 * full. */
static __always_inline int event_put(struct __sk_buff *skb, enum event_type type, __u16 reason,
				     enum pkt_dir dir, __u64 now)
{
	struct event *ev = bpf_ringbuf_reserve(&events, sizeof(*ev), 0);

	if (!ev)
		return 0;
	__builtin_memset(ev, 0, sizeof(*ev));
	ev->time = now;
	ev->ifindex = skb->ifindex;
	ev->len = skb->len;
	ev->reason = reason;
	ev->type = type;
	ev->dir = dir;
	event_parse(skb, ev);
	event_submit(ev);
	return 1;
}

/* event_drop reports a drop while the stream is on. */
static __always_inline void event_drop(struct __sk_buff *skb, enum pkt_reason reason, enum pkt_dir dir)
{
	struct event_config *cfg = event_config_get();
	struct event_stats *st = NULL;
	__u32 idx = reason;
	__u64 now;

	if (likely(!cfg || !cfg->lease))
		return;
	asm volatile("" : "+r"(idx)); /* bound the register it indexes with (lib/counters.h) */
	if (idx >= REASON_MAX)
		return;
	switch (event_gate(cfg, &st, &now)) {
	case EVENT_OFF:
		return;
	case EVENT_SUPPRESSED:
		st->suppressed[idx]++;
		return;
	case EVENT_ADMITTED:
		if (!event_put(skb, EVENT_DROP, reason, dir, now))
			st->lost[idx]++;
	}
}

/* event_flow reports a sampled flow's start or end while the stream is on
 * with EVENT_CF_FLOWS: a TCP SYN without ACK (start), FIN or RST (end), a
 * UDP packet the datapath hands to netfilter as a new flow (start). A flow
 * is sampled when a hash of its addresses and ports that is the same both
 * ways is 0 mod flow_sample: its start and end are both reported or
 * neither. */
static __always_inline void event_flow(struct __sk_buff *skb, enum pkt_reason why, enum pkt_dir dir)
{
	struct event_config *cfg = event_config_get();
	enum event_type type = EVENT_FLOW_START;
	struct ethhdr *eth;
	struct event_stats *st = NULL;
	__u32 h, n, ports;
	void *end, *l4;
	__u8 proto, f;
	__u64 now;

	if (likely(!cfg || !(cfg->flags & EVENT_CF_FLOWS) || !cfg->lease))
		return;
	/* Every packet comes here while flows are on: only the headers that
	 * decide, the rest is read for the packets reported. */
	end = skb_data_end(skb);
	eth = skb_data(skb);
	if ((void *)(eth + 1) > end)
		return;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > end || (ip->frag_off & bpf_htons(0x1fff)))
			return;
		proto = ip->protocol;
		h = ip->saddr ^ ip->daddr;
		l4 = (void *)ip + ((ip->ihl & 0xf) << 2);
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > end)
			return;
		proto = ip6->nexthdr;
		h = ip6->saddr.s6_addr32[0] ^ ip6->saddr.s6_addr32[3] ^ ip6->daddr.s6_addr32[0] ^ ip6->daddr.s6_addr32[3];
		l4 = ip6 + 1;
	} else {
		return;
	}
	if (proto == IPPROTO_TCP) {
		if (l4 + 14 > end)
			return;
		f = *(__u8 *)(l4 + 13);
		if (f & (TCP_FLAG_FIN | TCP_FLAG_RST))
			type = EVENT_FLOW_END;
		else if ((f & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != TCP_FLAG_SYN)
			return;
	} else if (proto != IPPROTO_UDP || why != REASON_FLOW_NEW || l4 + 4 > end) {
		return;
	}
	n = cfg->flow_sample;
	if (n > 1) {
		/* The same both ways: addresses and ports XORed. */
		ports = *(__u32 *)l4;
		h ^= ((ports ^ (ports >> 16)) & 0xffff) << 8 ^ proto;
		h *= 0x9e3779b1; /* Fibonacci hashing: the high bits mix every input bit */
		if ((h >> 16) % n)
			return;
	}
	switch (event_gate(cfg, &st, &now)) {
	case EVENT_OFF:
		return;
	case EVENT_SUPPRESSED:
		st->flow_suppressed++;
		return;
	case EVENT_ADMITTED:
		if (!event_put(skb, type, why, dir, now))
			st->flow_lost++;
	}
}

/* event_report is verdict()'s: a drop (ret < 0, as DROP() makes it) or a
 * packet the program let through. */
static __always_inline void event_report(struct __sk_buff *skb, int ret, enum pkt_reason why, enum pkt_dir dir)
{
	if (ret < 0)
		event_drop(skb, (enum pkt_reason)(-ret), dir);
	else
		event_flow(skb, why, dir);
}

#endif
