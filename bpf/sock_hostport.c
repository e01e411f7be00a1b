//go:build ignore

/* Hooks: socket-address hooks of the node's cgroup (connect, sendmsg,
 * recvmsg, getpeername; IPv4 and IPv6).
 *
 * hostPort from the node itself: a socket of the node's netns that connects
 * or sends to a published port on one of the node's addresses, 127.0.0.1 or
 * ::1 is pointed at the pod behind it before any packet exists, so the
 * kernel routes to the pod directly (no NAT on the way). Replies and
 * getpeername show the address and port the program asked for. Sockets of
 * other netns (the pods', whose loopback is their own) are left alone. */

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "include/types.h"
#include "lib/hostport.h"

#define SOCK_ALLOW 1

static __always_inline int node_netns(void *ctx)
{
	struct hostport_settings *c = hostport_cfg();

	return c && c->active && c->netns_cookie == bpf_get_netns_cookie(ctx);
}

static __always_inline void rev_key(struct sock_rev_key *k, struct bpf_sock_addr *ctx, __u8 family, __u8 proto,
				    const __u8 *addr, __be16 port)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->cookie = bpf_get_socket_cookie(ctx);
	k->family = family;
	k->proto = proto;
	k->port = port;
	__builtin_memcpy(k->addr, addr, 16);
}

/* set_addr writes addr (of family) into ctx: an IPv4 address into an IPv6
 * hook's context as v4-mapped (a dual-stack socket talking IPv4). */
static __always_inline void set_addr(struct bpf_sock_addr *ctx, int v6hook, __u8 family, const __u8 *addr)
{
	__u32 a[4];

	if (!v6hook) {
		__builtin_memcpy(a, addr, 4);
		ctx->user_ip4 = a[0];
		return;
	}
	if (family == ADDR_FAMILY_V4) {
		a[0] = 0;
		a[1] = 0;
		a[2] = bpf_htonl(0xffff);
		__builtin_memcpy(&a[3], addr, 4);
	} else {
		__builtin_memcpy(a, addr, 16);
	}
	ctx->user_ip6[0] = a[0];
	ctx->user_ip6[1] = a[1];
	ctx->user_ip6[2] = a[2];
	ctx->user_ip6[3] = a[3];
}

/* to_pod points the destination of ctx, addr:port, at the pod that
 * publishes it, and remembers what was asked for. */
static __always_inline int to_pod(struct bpf_sock_addr *ctx, int v6hook, __u8 family, const __u8 *addr, int loopback)
{
	struct hostport_target *t;
	struct sock_rev_key k;
	struct sock_rev v = {};
	__u8 proto = ctx->protocol;
	__be16 port = (__be16)ctx->user_port;

	if (!hostport_proto(proto) || !node_netns(ctx))
		return 0;
	t = hostport_match(family, proto, port, addr, loopback);
	if (!t)
		return 0;
	rev_key(&k, ctx, family, proto, t->addr, t->port);
	__builtin_memcpy(v.addr, addr, 16);
	v.port = port;
	bpf_map_update_elem(&sock_revnat, &k, &v, BPF_ANY);
	set_addr(ctx, v6hook, family, t->addr);
	ctx->user_port = (__u32)t->port;
	return 0;
}

/* from_pod shows the address the socket asked for instead of the pod's. */
static __always_inline void from_pod(struct bpf_sock_addr *ctx, int v6hook, __u8 family, const __u8 *addr)
{
	struct sock_rev_key k;
	struct sock_rev *v;

	if (!hostport_proto(ctx->protocol) || !node_netns(ctx))
		return;
	rev_key(&k, ctx, family, ctx->protocol, addr, (__be16)ctx->user_port);
	v = bpf_map_lookup_elem(&sock_revnat, &k);
	if (!v)
		return;
	set_addr(ctx, v6hook, family, v->addr);
	ctx->user_port = (__u32)v->port;
}

static __always_inline void addr4(struct bpf_sock_addr *ctx, __u8 *a, int *loopback)
{
	__u32 ip = ctx->user_ip4;

	__builtin_memset(a, 0, 16);
	__builtin_memcpy(a, &ip, 4);
	*loopback = a[0] == 127;
}

/* addr6 reads an IPv6 hook's address: a v4-mapped one (a dual-stack
 * socket talking IPv4) as the IPv4 address it stands for. */
static __always_inline __u8 addr6(struct bpf_sock_addr *ctx, __u8 *a, int *loopback)
{
	__u32 w[4];

	w[0] = ctx->user_ip6[0];
	w[1] = ctx->user_ip6[1];
	w[2] = ctx->user_ip6[2];
	w[3] = ctx->user_ip6[3];
	__builtin_memset(a, 0, 16);
	if (!w[0] && !w[1] && w[2] == bpf_htonl(0xffff)) {
		__builtin_memcpy(a, &w[3], 4);
		*loopback = a[0] == 127;
		return ADDR_FAMILY_V4;
	}
	__builtin_memcpy(a, w, 16);
	*loopback = !w[0] && !w[1] && !w[2] && w[3] == bpf_htonl(1);
	return ADDR_FAMILY_V6;
}

static __always_inline int out4(struct bpf_sock_addr *ctx)
{
	__u8 a[16];
	int lo;

	addr4(ctx, a, &lo);
	to_pod(ctx, 0, ADDR_FAMILY_V4, a, lo);
	return SOCK_ALLOW;
}

static __always_inline int out6(struct bpf_sock_addr *ctx)
{
	__u8 a[16];
	int lo;

	to_pod(ctx, 1, addr6(ctx, a, &lo), a, lo);
	return SOCK_ALLOW;
}

static __always_inline int in4(struct bpf_sock_addr *ctx)
{
	__u8 a[16];
	int lo;

	addr4(ctx, a, &lo);
	from_pod(ctx, 0, ADDR_FAMILY_V4, a);
	return SOCK_ALLOW;
}

static __always_inline int in6(struct bpf_sock_addr *ctx)
{
	__u8 a[16];
	int lo;

	from_pod(ctx, 1, addr6(ctx, a, &lo), a);
	return SOCK_ALLOW;
}

SEC("cgroup/connect4")
int hostport_connect4(struct bpf_sock_addr *ctx) { return out4(ctx); }

SEC("cgroup/connect6")
int hostport_connect6(struct bpf_sock_addr *ctx) { return out6(ctx); }

SEC("cgroup/sendmsg4")
int hostport_sendmsg4(struct bpf_sock_addr *ctx) { return out4(ctx); }

SEC("cgroup/sendmsg6")
int hostport_sendmsg6(struct bpf_sock_addr *ctx) { return out6(ctx); }

SEC("cgroup/recvmsg4")
int hostport_recvmsg4(struct bpf_sock_addr *ctx) { return in4(ctx); }

SEC("cgroup/recvmsg6")
int hostport_recvmsg6(struct bpf_sock_addr *ctx) { return in6(ctx); }

SEC("cgroup/getpeername4")
int hostport_peername4(struct bpf_sock_addr *ctx) { return in4(ctx); }

SEC("cgroup/getpeername6")
int hostport_peername6(struct bpf_sock_addr *ctx) { return in6(ctx); }

char __license[] SEC("license") = "GPL";
