//go:build ignore

/* Hook: sock_ops of the node's cgroup.
 *
 * Source pacing for bandwidth limits. A token bucket can only drop, and on
 * a path whose round trip is shorter than a packet's time at the rate (a
 * veth: tens of microseconds against 1.2 ms per packet at 10 Mbit/s) TCP
 * cannot be slowed by its window: it overdrives the bucket, loses whole
 * flights and waits for its timers, so a policed flow lands below the rate
 * and unevenly. When the sender is on this node (a pod, or the node
 * itself), there is a better place: its own stack. When a TCP connection
 * is established, a socket of a pod with an egress limit, or one sending
 * to a pod of this node with an ingress limit, gets SO_MAX_PACING_RATE:
 * TCP then spaces its packets by departure time (its internal pacing, or
 * fq when the device has it), queues in its own send buffer instead of
 * losing packets, and lands on the rate from the first second.
 *
 * The token buckets still enforce the limit: a socket that lifts its
 * pacing, UDP, and senders elsewhere (policed at the node's edge) meet
 * them as before. Pacing counts TCP payload, the buckets IP packets, so
 * the pacing rate is the limit less the headers of each segment. */

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "include/types.h"
#include "lib/endpoint.h"
#include "lib/bandwidth.h"
#include "lib/pacing.h"

#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif
#ifndef SOL_SOCKET
#define SOL_SOCKET 1
#endif
#ifndef SO_MAX_PACING_RATE
#define SO_MAX_PACING_RATE 47
#endif

/* IP and TCP headers of a segment beyond its payload (mss_cache): the
 * timestamp option (12 bytes) is on by default. */
#define PACING_HDR4 (20 + 20 + 12)
#define PACING_HDR6 (40 + 20 + 12)

/* The ingress limit of the pod at the remote address, bits per second; 0
 * when the remote is not a limited pod of this node. addr4: the remote's
 * IPv4 address when the connection is IPv4 on the wire (a v4-mapped
 * address of a dual-stack socket included), else 0. */
static __always_inline __u64 remote_ingress(struct bpf_sock_ops *ctx, __be32 addr4)
{
	struct endpoint_info *ep;
	struct bw_state *s;

	if (addr4) {
		ep = endpoint_lookup4(addr4);
	} else {
		struct in6_addr a;

		a.in6_u.u6_addr32[0] = ctx->remote_ip6[0];
		a.in6_u.u6_addr32[1] = ctx->remote_ip6[1];
		a.in6_u.u6_addr32[2] = ctx->remote_ip6[2];
		a.in6_u.u6_addr32[3] = ctx->remote_ip6[3];
		ep = endpoint_lookup6(&a);
	}
	if (!ep || !(ep->flags & EP_F_BW_INGRESS))
		return 0;
	s = bw_lookup(ep->ifindex);
	return s ? s->ingress.rate : 0;
}

SEC("sockops")
int bw_pacing(struct bpf_sock_ops *ctx)
{
	__u64 cookie, rate = 0, r, pace;
	__u32 *owner, mss, hdr;
	struct bw_state *s;
	__be32 addr4;

	if (ctx->op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB && ctx->op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
		return 1;
	if (ctx->family == AF_INET)
		addr4 = ctx->remote_ip4;
	else if (ctx->family != AF_INET6)
		return 1;
	else if (ctx->remote_ip6[0] == 0 && ctx->remote_ip6[1] == 0 && ctx->remote_ip6[2] == bpf_htonl(0xffff))
		addr4 = ctx->remote_ip6[3]; /* v4-mapped: IPv4 on the wire */
	else
		addr4 = 0;
	cookie = bpf_get_netns_cookie(ctx);
	owner = bpf_map_lookup_elem(&local_netns, &cookie);
	if (!owner)
		return 1; /* not the node's, nor one of its pods' */
	/* The pod's own egress limit. */
	if (*owner) {
		s = bw_lookup(*owner);
		if (s)
			rate = s->egress.rate;
	}
	/* The ingress limit of the pod it talks to. */
	r = remote_ingress(ctx, addr4);
	hdr = addr4 ? PACING_HDR4 : PACING_HDR6;
	if (r && (!rate || r < rate))
		rate = r;
	if (!rate)
		return 1;
	mss = ctx->mss_cache;
	if (!mss)
		mss = 1000;
	/* bits/s of IP packets -> bytes/s of payload. */
	pace = rate / 8 * mss / (mss + hdr);
	if (pace > 0xfffffffeULL)
		return 1; /* beyond what the option holds: no pacing needed */
	{
		int v = (int)pace;

		bpf_setsockopt(ctx, SOL_SOCKET, SO_MAX_PACING_RATE, &v, sizeof(v));
	}
	return 1;
}

char __license[] SEC("license") = "GPL";
