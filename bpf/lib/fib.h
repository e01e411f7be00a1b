/* owner: shared */
/* Forwarding by the FIB's answer: what bpf_fib_lookup chose, out of the
 * device it chose. A pod's packet to the world or another node
 * (from_container) and the overlay's own encapsulated packet
 * (encap_to_uplink, lib/overlay.h) leave this way. */
#ifndef EBPF_CNI_LIB_FIB_H
#define EBPF_CNI_LIB_FIB_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_helpers.h>

#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif

/* A short-lived per-CPU cache of bpf_fib_lookup's successful answers, by
 * what the lookup is given (the input device, family, protocol, TOS or
 * flow label, source and destination): a connection's packets after its
 * first one, a few microseconds apart, reuse the answer instead of walking
 * the FIB and the neighbour table again (0.5 µs a packet on the
 * development VM). An answer is used within the jiffy it was found in
 * (bpf_ktime_get_coarse_ns: 1-10 ms), so a route, a neighbour's address or
 * a device's MTU that changes is seen as late as that, never later; and
 * only for a packet the egress device's MTU takes as it is (the helper's
 * own check: a larger one, GSO included, is looked up). Not pinned: each
 * program object has its own. */
#define FIB_CACHE_SLOTS 4

struct fib_cache_slot {
	__u64 tick; /* bpf_ktime_get_coarse_ns() of the lookup; 0: empty */
	__u32 iif;
	__u32 oif;
	__be32 flow; /* tos (IPv4) or flowinfo (IPv6), as bpf_fib_lookup has it */
	__u16 mtu;
	__u8 family;
	__u8 proto;
	__u32 src[4];
	__u32 dst[4];
	__u8 smac[ETH_ALEN];
	__u8 dmac[ETH_ALEN];
	__u32 pad;
};

struct fib_cache {
	struct fib_cache_slot slot[FIB_CACHE_SLOTS];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fib_cache);
} fib_cache SEC(".maps");

/* fib_cache_slot_of is the slot of p's destination in c. */
static __always_inline struct fib_cache_slot *fib_cache_slot_of(struct fib_cache *c, const struct bpf_fib_lookup *p)
{
	__u32 h = p->ipv6_dst[0] ^ p->ipv6_dst[3];

	h ^= h >> 16;
	h ^= h >> 8;
	return &c->slot[h & (FIB_CACHE_SLOTS - 1)];
}

static __always_inline int fib_cache_key_equal(const struct fib_cache_slot *e, const struct bpf_fib_lookup *p,
					       __u32 iif)
{
	return e->iif == iif && e->family == p->family && e->proto == p->l4_protocol && e->flow == p->flowinfo &&
	       !((e->dst[0] ^ p->ipv6_dst[0]) | (e->dst[1] ^ p->ipv6_dst[1]) | (e->dst[2] ^ p->ipv6_dst[2]) |
		 (e->dst[3] ^ p->ipv6_dst[3]) | (e->src[0] ^ p->ipv6_src[0]) | (e->src[1] ^ p->ipv6_src[1]) |
		 (e->src[2] ^ p->ipv6_src[2]) | (e->src[3] ^ p->ipv6_src[3]));
}

/* fib_lookup_cached is bpf_fib_lookup(skb, p, sizeof(*p), 0) for p with
 * no tot_len (the helper checks the skb against the egress device's MTU),
 * p->ifindex being skb->ifindex: from the cache when it has the answer.
 * A function of its own: its frame is not added to its callers' (6.1 gives
 * from_container no byte more), only to the deepest chain of calls. */
static __attribute__((noinline, unused)) int fib_lookup_cached(struct __sk_buff *skb, struct bpf_fib_lookup *p)
{
	__u32 zero = 0;
	struct fib_cache *c = bpf_map_lookup_elem(&fib_cache, &zero);
	struct fib_cache_slot *e;
	__u64 tick = bpf_ktime_get_coarse_ns();
	int rc;

	if (!c)
		return bpf_fib_lookup(skb, p, sizeof(*p), 0);
	e = fib_cache_slot_of(c, p);
	if (e->tick == tick && fib_cache_key_equal(e, p, skb->ifindex) &&
	    skb->len <= (__u32)e->mtu + ETH_HLEN + 4 /* VLAN_HLEN, as is_skb_forwardable */) {
		p->ifindex = e->oif;
		__builtin_memcpy(p->smac, e->smac, ETH_ALEN);
		__builtin_memcpy(p->dmac, e->dmac, ETH_ALEN);
		return BPF_FIB_LKUP_RET_SUCCESS;
	}
	/* The question, before the helper writes its answer over p (the
	 * gateway over the destination, the route's metric over the TOS). */
	e->tick = 0;
	e->iif = skb->ifindex;
	e->flow = p->flowinfo;
	e->family = p->family;
	e->proto = p->l4_protocol;
	__builtin_memcpy(e->src, p->ipv6_src, 16);
	__builtin_memcpy(e->dst, p->ipv6_dst, 16);
	rc = bpf_fib_lookup(skb, p, sizeof(*p), 0);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS)
		return rc;
	e->oif = p->ifindex;
	e->mtu = p->mtu_result;
	__builtin_memcpy(e->smac, p->smac, ETH_ALEN);
	__builtin_memcpy(e->dmac, p->dmac, ETH_ALEN);
	e->tick = tick;
	return rc;
}

/* fib_redirect sends the packet (eth its Ethernet header) out of the
 * device a successful bpf_fib_lookup p (rc) chose: to the next hop's MAC
 * the FIB gave, or, when the FIB had no neighbour entry for it
 * (BPF_FIB_LKUP_RET_NO_NEIGH), resolving that next hop on the way out. */
static __always_inline int fib_redirect(struct ethhdr *eth, const struct bpf_fib_lookup *p, int rc)
{
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		struct bpf_redir_neigh nh = { .nh_family = p->family };

		if (p->family == AF_INET)
			nh.ipv4_nh = p->ipv4_dst;
		else
			__builtin_memcpy(nh.ipv6_nh, p->ipv6_dst, 16);
		return bpf_redirect_neigh(p->ifindex, &nh, sizeof(nh), 0);
	}
	__builtin_memcpy(eth->h_dest, p->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, p->smac, ETH_ALEN);
	return bpf_redirect(p->ifindex, 0);
}

#endif
