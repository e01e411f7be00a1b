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
