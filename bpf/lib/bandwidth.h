/* owner: feature bandwidth */
/* Bandwidth limits: a policer per endpoint and direction, in BPF.
 *
 * The algorithm is GCRA (the virtual-scheduling form of a token bucket).
 * Its whole state is tat, the time at which the bucket would be full again:
 * a packet conforms when tat runs at most tau (the burst, as time) ahead of
 * now, and then pushes tat by its cost (its bytes at the configured rate).
 * One 64-bit word of state means every CPU can police the same pod at the
 * same time without a lock: each reads tat, computes the new value and
 * publishes it with a compare-and-swap; a CPU that loses the race re-reads
 * and retries, and after a few lost races it charges with an atomic add, so
 * no packet is ever let through uncharged.
 *
 * The test is on the state before the packet ("is the bucket in debt
 * beyond the burst?"), not "are there tokens for the whole packet": a GSO
 * packet of 64 KB is never starved by a burst smaller than itself; it
 * borrows, and the next packets wait for the debt to drain. Over any
 * interval the bytes let through are at most rate * interval + burst + one
 * packet, and the recovery credit (below) within its window after a drop.
 *
 * Recovery credit. On a veth the round trip is tens of microseconds, so
 * TCP cannot be slowed by its window: below about 1 Gbit/s it overdrives
 * any rate and lives on losses. When a drop streak takes a whole flight,
 * TCP stalls until its loss probe or retransmission timer (milliseconds to
 * hundreds of them), and a plain token bucket throws that time away: with a
 * small burst the flow lands far below the rate. So for a while after a
 * drop (BW_RECOVERY_WINDOW_NS) the bucket also keeps up to `recovery` ns
 * of unused time as credit, which the flow or a new one of the pod spends
 * when it resumes; after an idle without a drop there is only the burst. The
 * long-term rate is exact either way: every packet let through is charged. */
#ifndef EBPF_CNI_LIB_BANDWIDTH_H
#define EBPF_CNI_LIB_BANDWIDTH_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/in.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "../include/types.h"
#include "skb.h"

/* With fq pacing (BW_F_EDT) a packet is held back rather than dropped, up
 * to this far beyond the burst; fq's own horizon is 10 s. */
#define BW_EDT_HORIZON_NS 1000000000ULL

/* How long after a drop a quiet flow counts as stalled rather than idle:
 * past TCP's first retransmission timeouts (200 ms, 400 ms). */
#define BW_RECOVERY_WINDOW_NS 2000000000ULL

/* Races lost before a CPU charges with an atomic add instead. */
#define BW_CAS_TRIES 4

/* Host veth ifindex -> the pod's buckets. An entry exists only for pods
 * with a limit, and the programs look it up only when the endpoint's flags
 * say so (EP_F_BW_EGRESS, EP_F_BW_INGRESS). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* memory grows with limited pods, not with the cap */
	__uint(max_entries, 16384);           /* as endpoint_devs */
	__type(key, __u32);
	__type(value, struct bw_state);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} bw_buckets SEC(".maps");

/* The bytes a packet puts on an IP link: its IP packet, and for a GSO
 * packet the IP and transport headers of every segment it will become
 * (as tbf charges a GSO packet its segments' headers). */
static __always_inline __u64 bw_bytes(struct __sk_buff *skb)
{
	void *data = skb_data(skb);
	void *data_end = skb_data_end(skb);
	struct ethhdr *eth = data;
	__u64 len = skb->len > ETH_HLEN ? skb->len - ETH_HLEN : skb->len;
	__u32 segs = skb->gso_segs;
	__u32 hdr = 0;
	__u8 proto = 0;
	void *l4;

	if (segs <= 1)
		return len;
	if ((void *)(eth + 1) > data_end)
		return len;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > data_end)
			return len;
		hdr = ip->ihl * 4;
		proto = ip->protocol;
		l4 = (void *)ip + hdr;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end)
			return len;
		hdr = sizeof(*ip6);
		proto = ip6->nexthdr;
		l4 = ip6 + 1;
	} else {
		return len;
	}
	if (proto == IPPROTO_TCP) {
		struct tcphdr *tcp = l4;

		if ((void *)(tcp + 1) > data_end)
			return len;
		hdr += tcp->doff * 4;
	} else if (proto == IPPROTO_UDP) {
		hdr += 8;
	}
	if (segs > 0xffff)
		segs = 0xffff;
	return len + (__u64)(segs - 1) * hdr;
}

/* Early drop: from half the burst in debt, a packet is dropped with a
 * probability that grows to 1 at the full burst. A flight TCP sent back
 * to back then loses some packets, not all: the ones let through bring
 * acknowledgements (SACK), so TCP recovers at once instead of waiting for a
 * timer. Past the burst every packet is dropped, so the burst still bounds
 * what passes back to back. */
static __always_inline int bw_over(__u64 debt, __u64 tau)
{
	__u64 half = tau / 2;

	if (debt > tau)
		return 1;
	if (debt <= half || !half)
		return 0;
	/* (debt - half) / half, against a 16-bit random number. */
	return ((debt - half) << 16) / half > (bpf_get_prandom_u32() & 0xffff);
}

/* bw_police charges the packet to b: 0 when it conforms, 1 when it is
 * over the rate (the caller drops it; it is not charged). With BW_F_EDT
 * the packet is not dropped but gets its departure time, for fq. */
static __always_inline int bw_police(struct __sk_buff *skb, struct bw_bucket *b, int edt)
{
	__u64 bytes = bw_bytes(skb);
	__u64 now = bpf_ktime_get_ns();
	__u64 cost = (bytes * b->ns_per_byte) >> BW_NS_SHIFT;
	__u64 tau = b->tau;
	__u64 floor = now;
	__u64 tat, start;
	int i;

	if (!b->ns_per_byte)
		return 0; /* no limit in this direction */
	edt = edt && (b->flags & BW_F_EDT);
	if (edt)
		tau += BW_EDT_HORIZON_NS;
	if (now - *(volatile __u64 *)&b->last_drop < BW_RECOVERY_WINDOW_NS && now > b->recovery)
		floor = now - b->recovery;
	for (i = 0; i < BW_CAS_TRIES; i++) {
		tat = *(volatile __u64 *)&b->tat;
		start = tat > floor ? tat : floor;
		if (start > now && bw_over(start - now, tau)) {
			*(volatile __u64 *)&b->last_drop = now;
			__sync_fetch_and_add(&b->drops, 1);
			__sync_fetch_and_add(&b->drop_bytes, bytes);
			return 1;
		}
		if (__sync_val_compare_and_swap(&b->tat, tat, start + cost) == tat)
			goto charged;
	}
	/* Other CPUs keep moving tat: it is at or past now, so adding the
	 * cost is what the swap would have done. */
	start = __sync_fetch_and_add(&b->tat, cost);
charged:
	if (edt && start > now)
		skb->tstamp = start;
	return 0;
}

static __always_inline struct bw_state *bw_lookup(__u32 ifindex)
{
	return bpf_map_lookup_elem(&bw_buckets, &ifindex);
}

/* Police what a pod sends; 1: drop. */
static __always_inline int bw_egress(struct __sk_buff *skb, __u32 flags)
{
	struct bw_state *s;

	if (!(flags & EP_F_BW_EGRESS))
		return 0;
	s = bw_lookup(skb->ifindex);
	return s ? bw_police(skb, &s->egress, 0) : 0;
}

/* Police what is delivered to the pod behind host veth ifindex; 1: drop.
 * edt: the packet leaves through the host veth's qdisc (the stack path),
 * where fq, if there, honours a departure time. */
static __always_inline int bw_ingress(struct __sk_buff *skb, __u32 ifindex, __u32 flags, int edt)
{
	struct bw_state *s;

	if (!(flags & EP_F_BW_INGRESS))
		return 0;
	s = bw_lookup(ifindex);
	return s ? bw_police(skb, &s->ingress, edt) : 0;
}

#endif
