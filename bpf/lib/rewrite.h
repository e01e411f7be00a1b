/* owner: shared */
/* Rewriting a translated packet: its address and port on one side, the
 * IPv4 header and L4 checksums fixed incrementally. Masquerade (SNAT and
 * its reverse) and hostPort (DNAT and its reverse) translate with it. */
#ifndef EBPF_CNI_LIB_REWRITE_H
#define EBPF_CNI_LIB_REWRITE_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/stddef.h>
#include <bpf/bpf_helpers.h>
#include "../include/types.h"
#include "addr.h"
#include "pkt.h"

/* The offset of the L4 checksum, or 0 for protocols without one we fix. */
static __always_inline __u32 l4_csum_off(__u8 proto, __u32 l4off)
{
	switch (proto) {
	case IPPROTO_TCP:
		return l4off + 16;
	case IPPROTO_UDP:
		return l4off + 6;
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6_:
		return l4off + 2;
	}
	return 0;
}

/* The offset of the port (or echo identifier) on one side. */
static __always_inline __u32 l4_port_off(__u8 proto, __u32 l4off, int source)
{
	if (is_icmp(proto))
		return l4off + 4;
	return source ? l4off : l4off + 2;
}

/* nat_rewrite replaces the source (or destination) address and port of the
 * packet and fixes the IPv4 header and L4 checksums incrementally, so
 * offloaded (CHECKSUM_PARTIAL) and GSO packets stay right. */
static __always_inline int nat_rewrite(struct __sk_buff *skb, const struct nat_pkt *p, int source,
				       const __u8 *addr, __be16 port, struct nat_scratch *s)
{
	__u32 csum_off = p->later_frag ? 0 : l4_csum_off(p->proto, p->l4off);
	/* UDP over IPv4 may carry no checksum: leave a zero one alone. */
	__u64 mangled = p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	const __u8 *old_addr = source ? p->saddr : p->daddr;
	__be16 old_port = source ? p->sport : p->dport;

	if (p->family == ADDR_FAMILY_V4) {
		__be32 from, to;
		__u32 addr_off = p->l3off + (source ? offsetof(struct iphdr, saddr) : offsetof(struct iphdr, daddr));

		__builtin_memcpy(&from, old_addr, 4);
		__builtin_memcpy(&to, addr, 4);
		if (from != to) {
			/* ICMPv4 sums no pseudo-header: only TCP and UDP see it. */
			if (csum_off && p->proto != IPPROTO_ICMP &&
			    bpf_l4_csum_replace(skb, csum_off, from, to, BPF_F_PSEUDO_HDR | mangled | 4))
				return -1;
			if (bpf_l3_csum_replace(skb, p->l3off + offsetof(struct iphdr, check), from, to, 4))
				return -1;
			if (bpf_skb_store_bytes(skb, addr_off, &to, 4, 0))
				return -1;
		}
	} else {
		__u32 addr_off = p->l3off + (source ? offsetof(struct ipv6hdr, saddr) : offsetof(struct ipv6hdr, daddr));
		__s64 diff;

		__builtin_memcpy(s->from, old_addr, 16);
		__builtin_memcpy(s->to, addr, 16);
		if (!addr_equal(s->from, s->to)) {
			diff = bpf_csum_diff((__be32 *)s->from, 16, (__be32 *)s->to, 16, 0);
			if (csum_off && bpf_l4_csum_replace(skb, csum_off, 0, diff, BPF_F_PSEUDO_HDR | mangled))
				return -1;
			if (bpf_skb_store_bytes(skb, addr_off, s->to, 16, 0))
				return -1;
		}
	}

	if (p->later_frag || old_port == port)
		return 0;
	if (csum_off && bpf_l4_csum_replace(skb, csum_off, old_port, port, mangled | 2))
		return -1;
	return bpf_skb_store_bytes(skb, l4_port_off(p->proto, p->l4off, source), &port, 2, 0) ? -1 : 0;
}

#endif
