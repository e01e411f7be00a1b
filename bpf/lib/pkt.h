/* owner: shared */
/* The packet as the programs decide on it: struct nat_pkt (addresses,
 * protocol, ports, TCP flags, ICMP type; nat_parse) and struct nat_scratch,
 * the working space of one packet (its per-CPU map: lib/scratch.h). Every
 * feature reads a packet this way (masquerade, hostPort, flows, policy, the
 * overlay); the nat_ names are the masquerade's, where they began. */
#ifndef EBPF_CNI_LIB_PKT_H
#define EBPF_CNI_LIB_PKT_H

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

/* What the programs need of a packet. Offsets are from skb->data. */
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
	__u8 stale; /* flow_get: a SYN found its tuple's entry of an earlier connection */
	__u8 early; /* from_container: it translates the packet itself (s->res) */
	__u8 stack_pod; /* from_container: the pod's endpoint has EP_F_STACK */
	__u8 pad[5];
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

/* A TCP SYN without ACK: a connection starts, whatever the tuple did before. */
static __always_inline int flow_syn(const struct nat_pkt *p)
{
	return p->proto == IPPROTO_TCP && (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;
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

#endif
