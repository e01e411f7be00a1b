/* Masquerade: our own connection tracking and source NAT for pod traffic
 * leaving through an uplink (this kernel offers no conntrack to programs).
 *
 * One LRU table holds both directions of every flow: the OUT entry, keyed by
 * the pod's tuple, holds the translated address and port, the state and the
 * clock; the IN entry, keyed by the tuple of the replies, points back at the
 * pod and is valid only while its OUT entry is. Expired entries are treated
 * as absent; the LRU evicts under pressure and DEL/GC delete a pod's flows. */
#ifndef EBPF_CNI_LIB_NAT_H
#define EBPF_CNI_LIB_NAT_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "../include/types.h"
#include "addr.h"
#include "hostport.h"
#include "skb.h"

#define NAT_MAX_ENTRIES 131072 /* both directions: 65536 flows */
#define NAT_PORT_TRIES 32      /* random probes into the range before giving up */

#define NSEC_PER_SEC 1000000000ULL

#define IPPROTO_ICMPV6_ 58
#define ICMP_ECHOREPLY_ 0
#define ICMP_DEST_UNREACH_ 3
#define ICMP_ECHO_ 8
#define ICMP_TIME_EXCEEDED_ 11
#define ICMP_PARAMETERPROB_ 12
#define ICMPV6_DEST_UNREACH_ 1
#define ICMPV6_PKT_TOOBIG_ 2
#define ICMPV6_TIME_EXCEED_ 3
#define ICMPV6_PARAMPROB_ 4
#define ICMPV6_ECHO_REQUEST_ 128
#define ICMPV6_ECHO_REPLY_ 129

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10
#define TCP_LISTEN_STATE 10 /* TCP_LISTEN of include/net/tcp_states.h */

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

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct uplink_info);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} uplinks SEC(".maps");

/* What the NAT code needs of a packet. Offsets are from skb->data. */
struct nat_pkt {
	__u8 family; /* enum addr_family */
	__u8 proto;
	__u8 later_frag; /* an IPv4 fragment other than the first: no L4 header */
	__u8 tcp_flags;
	__u8 icmp_type;
	__u8 frag;       /* an IPv4 fragment, the first included */
	__u8 pad[2];
	__u32 l3off;
	__u32 l4off;
	__be16 sport; /* TCP/UDP ports; ICMP echo: the identifier in both */
	__be16 dport;
	__u8 saddr[16];
	__u8 daddr[16];
};

/* Per-CPU scratch space: the keys and entries one packet needs do not fit
 * the 512-byte stack together. A tc program runs to completion on its CPU
 * with bottom halves off, so one slot per CPU and program is enough; each
 * program object has its own (lib/scratch.h). */
struct nat_scratch {
	struct nat_pkt p;
	struct nat_pkt q; /* the packet an ICMP error quotes */
	struct nat_key out;
	struct nat_key in;
	struct nat_key tmp;
	struct nat_entry res;
	struct nat_entry iv;
	struct bpf_sock_tuple tuple;
	struct flow_key fk;
	struct flow_entry fe;
	__u8 addr[16];
	__u8 from[16];
	__u8 to[16];
};

static __always_inline int is_icmp(__u8 proto)
{
	return proto == IPPROTO_ICMP || proto == IPPROTO_ICMPV6_;
}

/* nat_parse_at reads the addresses and the L4 fields the NAT needs of the
 * frame at off (a constant once inlined: 0, or the inner frame of an
 * encapsulated packet); < 0 when the packet is too short for what its
 * headers claim (or, at off > 0, when its headers are not in the linear
 * part). Protocols other than TCP, UDP, SCTP and ICMP leave the ports
 * zero. nat_parse parses the packet itself. */
static __always_inline int nat_parse_at(struct __sk_buff *skb, struct nat_pkt *p, const int off)
{
	void *data = skb_data(skb);
	void *data_end = skb_data_end(skb);
	struct ethhdr *eth = data + off;

	if ((void *)(eth + 1) > data_end)
		return -1;
	p->l3off = off + ETH_HLEN;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		__u16 frag;

		if ((void *)(ip + 1) > data_end || ip->ihl < 5)
			return -1;
		p->family = ADDR_FAMILY_V4;
		p->proto = ip->protocol;
		p->l4off = off + ETH_HLEN + ip->ihl * 4;
		__builtin_memcpy(p->saddr, &ip->saddr, 4);
		__builtin_memcpy(p->daddr, &ip->daddr, 4);
		frag = bpf_ntohs(ip->frag_off);
		p->frag = (frag & 0x3FFF) != 0; /* more fragments, or an offset */
		if (frag & 0x1FFF) {
			p->later_frag = 1;
			return 0;
		}
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end)
			return -1;
		p->family = ADDR_FAMILY_V6;
		p->proto = ip6->nexthdr; /* extension headers: not translated */
		p->l4off = off + ETH_HLEN + sizeof(*ip6);
		__builtin_memcpy(p->saddr, &ip6->saddr, 16);
		__builtin_memcpy(p->daddr, &ip6->daddr, 16);
	} else {
		return 1; /* not IP */
	}

	switch (p->proto) {
	case IPPROTO_TCP: {
		__u8 hdr[14];

		if (bpf_skb_load_bytes(skb, p->l4off, hdr, sizeof(hdr)))
			return -1;
		__builtin_memcpy(&p->sport, hdr, 2);
		__builtin_memcpy(&p->dport, hdr + 2, 2);
		p->tcp_flags = hdr[13];
		break;
	}
	case IPPROTO_UDP:
	case IPPROTO_SCTP: {
		__be16 ports[2];

		if (bpf_skb_load_bytes(skb, p->l4off, ports, sizeof(ports)))
			return -1;
		p->sport = ports[0];
		p->dport = ports[1];
		break;
	}
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6_: {
		__u8 hdr[8];

		if (bpf_skb_load_bytes(skb, p->l4off, hdr, sizeof(hdr)))
			return -1;
		p->icmp_type = hdr[0];
		__builtin_memcpy(&p->sport, hdr + 4, 2);
		p->dport = p->sport;
		break;
	}
	}
	return 0;
}

static __always_inline int nat_parse(struct __sk_buff *skb, struct nat_pkt *p)
{
	return nat_parse_at(skb, p, 0);
}

static __always_inline int nat_is_echo_request(const struct nat_pkt *p)
{
	return (p->proto == IPPROTO_ICMP && p->icmp_type == ICMP_ECHO_) ||
	       (p->proto == IPPROTO_ICMPV6_ && p->icmp_type == ICMPV6_ECHO_REQUEST_);
}

static __always_inline int nat_is_echo_reply(const struct nat_pkt *p)
{
	return (p->proto == IPPROTO_ICMP && p->icmp_type == ICMP_ECHOREPLY_) ||
	       (p->proto == IPPROTO_ICMPV6_ && p->icmp_type == ICMPV6_ECHO_REPLY_);
}

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

/* sock_tuple fills tp with a tuple of family (addresses of 16 bytes, IPv4
 * in the first 4) for the socket and conntrack lookups; returns its size. */
static __always_inline __u32 sock_tuple(struct bpf_sock_tuple *tp, __u8 family, const __u8 *saddr, const __u8 *daddr,
					__be16 sport, __be16 dport)
{
	__builtin_memset(tp, 0, sizeof(*tp));
	if (family == ADDR_FAMILY_V4) {
		__builtin_memcpy(&tp->ipv4.saddr, saddr, 4);
		__builtin_memcpy(&tp->ipv4.daddr, daddr, 4);
		tp->ipv4.sport = sport;
		tp->ipv4.dport = dport;
		return sizeof(tp->ipv4);
	}
	__builtin_memcpy(tp->ipv6.saddr, saddr, 16);
	__builtin_memcpy(tp->ipv6.daddr, daddr, 16);
	tp->ipv6.sport = sport;
	tp->ipv6.dport = dport;
	return sizeof(tp->ipv6);
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

/* nat_create translates the new flow s->out: the pod's port when it is
 * free, else a random free one of the network's range, into s->res. The IN
 * entry is claimed first (BPF_NOEXIST), so two CPUs never hand out one port. */
static __always_inline int nat_create(struct __sk_buff *skb, struct nat_scratch *s, const struct masq_net *mn,
				      __u32 net_id, __u8 state, __u64 now)
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
		/* A stale IN entry (its flow expired) gives way. */
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
	s->res.flags = flags;
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
