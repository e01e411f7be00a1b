/* owner: shared */
/* Router duties of the datapath when it forwards a packet itself. */
#ifndef EBPF_CNI_LIB_L3_H
#define EBPF_CNI_LIB_L3_H

#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_endian.h>

/* ip_decrease_ttl of the kernel: RFC 1624 incremental checksum update, so
 * no helper call invalidates the packet pointers. */
static __always_inline void ipv4_dec_ttl(struct iphdr *ip)
{
	__u32 check = (__u32)ip->check;

	check += (__u32)bpf_htons(0x0100);
	ip->check = (__sum16)(check + (check >= 0xFFFF));
	ip->ttl--;
}

/* l3_hop does a router's hop on the IP header after eth: 1 when TTL / hop
 * limit was decremented, 0 when it is spent (the stack answers with time
 * exceeded), -1 when the header is cut short. */
static __always_inline int l3_hop(void *eth_end, void *data_end, __be16 proto)
{
	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = eth_end;

		if ((void *)(ip + 1) > data_end)
			return -1;
		if (ip->ttl <= 1)
			return 0;
		ipv4_dec_ttl(ip);
		return 1;
	}
	{
		struct ipv6hdr *ip6 = eth_end;

		if ((void *)(ip6 + 1) > data_end)
			return -1;
		if (ip6->hop_limit <= 1)
			return 0;
		ip6->hop_limit--;
		return 1;
	}
}

static __always_inline int ipv6_is_link_local_or_unspec(const struct in6_addr *a)
{
	if ((a->s6_addr[0] == 0xfe) && ((a->s6_addr[1] & 0xc0) == 0x80))
		return 1;
	return !(a->s6_addr32[0] | a->s6_addr32[1] | a->s6_addr32[2] | a->s6_addr32[3]);
}

static __always_inline int ipv6_is_multicast(const struct in6_addr *a)
{
	return a->s6_addr[0] == 0xff;
}

#endif
