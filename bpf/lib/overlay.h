/* owner: feature cluster */
/* The overlay's encapsulation and decapsulation done by the core programs
 * themselves, past the VXLAN device (lib/cluster.h: the tunnel key and the
 * device's way): from_container writes the outer headers of a pod's packet
 * and sends it out of the uplink (overlay_send, encap_to_uplink);
 * from_netdev takes them off a packet of the overlay that arrives on the
 * uplink (overlay_packet, overlay_inner, overlay_decap). */
#ifndef EBPF_CNI_LIB_OVERLAY_H
#define EBPF_CNI_LIB_OVERLAY_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "../include/types.h"
#include "cluster.h"
#include "fib.h"
#include "l3.h"
#include "pkt.h"
#include "skb.h"
#include "uplink.h"
#include "verdict.h"

/* The outer UDP source port's range when the VXLAN device has none of its
 * own: the kernel's default ip_local_port_range, as udp_flow_src_port uses
 * it (the port is max - min wide from min). */
#define VXLAN_SPORT_MIN 32768
#define VXLAN_SPORT_MAX 60999

/* What encapsulation puts after the outer Ethernet header: IPv4, UDP,
 * VXLAN and the inner Ethernet header (the pod's frame's, as the device
 * would carry it; the other node rewrites it). */
struct vxlan_outer4 {
	struct iphdr ip;
	struct udphdr udp;
	__be32 vx[2];
	struct ethhdr inner;
};

/* Its length on the wire (sizeof pads it to the next four bytes). */
#define VXLAN_OUTER4_LEN (__builtin_offsetof(struct vxlan_outer4, inner) + ETH_HLEN)

/* ipv4_hdr_csum is the header checksum of an IPv4 header without options
 * (its check field zero). */
static __always_inline __u16 ipv4_hdr_csum(const struct iphdr *ip)
{
	const __u16 *w = (const __u16 *)ip;
	__u32 sum = 0;

#pragma unroll
	for (int i = 0; i < (int)(sizeof(*ip) / 2); i++)
		sum += w[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum;
}

/* encap_to_uplink's "not here": no drop reason has this value. */
#define VIA_DEVICE (-(int)REASON_MAX)

/* encap_to_uplink encapsulates a pod's packet for the overlay itself and
 * sends it out of the uplink the FIB picks toward the node of cr, as the
 * VXLAN device would (the same outer headers, source port and ECN), without
 * the device's transmit path, the stack's routing and netfilter of the
 * outer packet, or to_tunnel's run. GSO packets too (TCP's): the helper
 * marks them a UDP tunnel's, which segments them as the device's would be.
 * Over an IPv4 underlay whose uplink's address the uplinks map holds
 * (uplink.Ensure writes it on every ADD); anything else returns
 * VIA_DEVICE with the packet untouched, for the device (cluster_encap). */
static __always_inline int encap_to_uplink(struct __sk_buff *skb, const struct cluster_route *cr, enum pkt_reason *why)
{
	void *data = skb_data(skb);
	void *data_end = skb_data_end(skb);
	struct ethhdr *eth = data;
	struct overlay_settings *o = overlay_settings();
	struct bpf_fib_lookup p = {};
	struct vxlan_outer4 h = {};
	struct uplink_info *up;
	struct tcphdr *tcp;
	__u32 hash, len, seg, mtu = 0;
	__u8 ecn, proto;
	int rc;

	if (cr->node_family != ADDR_FAMILY_V4 || !o || !o->port)
		return VIA_DEVICE;
	if ((void *)(eth + 1) > data_end)
		return VIA_DEVICE;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > data_end)
			return VIA_DEVICE;
		ecn = ip->tos & 3;
		proto = ip->protocol;
		tcp = (void *)ip + ip->ihl * 4;
	} else {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end)
			return VIA_DEVICE;
		ecn = (ip6->flow_lbl[0] >> 4) & 3;
		proto = ip6->nexthdr;
		tcp = (void *)(ip6 + 1);
	}
	__builtin_memcpy(&h.inner, eth, sizeof(h.inner));
	len = skb->len - ETH_HLEN + VXLAN_OUTER4_LEN;
	if (len > 0xffff)
		return VIA_DEVICE;
	/* What one packet will be on the uplink: this one, or each segment of
	 * a GSO packet (TCP's; other GSO the device's way). */
	seg = len;
	if (skb->gso_size) {
		if (proto != IPPROTO_TCP || (void *)(tcp + 1) > data_end)
			return VIA_DEVICE;
		seg = VXLAN_OUTER4_LEN + ((void *)tcp - (void *)(eth + 1)) + tcp->doff * 4 + skb->gso_size;
	}

	p.family = AF_INET;
	p.ifindex = skb->ifindex;
	__builtin_memcpy(&p.ipv4_dst, cr->node, 4);
	rc = fib_lookup_cached(skb, &p);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return VIA_DEVICE;
	if (p.ifindex == skb->ifindex)
		return VIA_DEVICE;
	up = bpf_map_lookup_elem(&uplinks, &p.ifindex);
	if (!up || !up->has4)
		return VIA_DEVICE;
	/* Larger than the uplink's MTU (the pod's MTU leaves no room for the
	 * outer headers: an mtu key set too high): the device's way, which
	 * fragments the outer packet. bpf_check_mtu gives the MTU back. */
	bpf_check_mtu(skb, p.ifindex, &mtu, 0, 0);
	if (!mtu || seg > mtu)
		return VIA_DEVICE;

	h.ip.version = 4;
	h.ip.ihl = 5;
	h.ip.tos = ecn == 3 ? 2 : ecn; /* the inner ECN field; CE becomes ECT(0) */
	h.ip.tot_len = bpf_htons(len);
	h.ip.id = bpf_get_prandom_u32();
	h.ip.ttl = VXLAN_TTL;
	h.ip.protocol = IPPROTO_UDP;
	__builtin_memcpy(&h.ip.saddr, up->ip4, 4);
	__builtin_memcpy(&h.ip.daddr, cr->node, 4);
	h.ip.check = ipv4_hdr_csum(&h.ip);
	hash = bpf_get_hash_recalc(skb);
	hash ^= hash << 16;
	h.udp.source = bpf_htons((__u16)((((__u64)hash * (VXLAN_SPORT_MAX - VXLAN_SPORT_MIN)) >> 32) + VXLAN_SPORT_MIN));
	h.udp.dest = o->port;
	h.udp.len = bpf_htons(len - sizeof(h.ip));
	h.vx[0] = VXLAN_FLAG_VNI;
	h.vx[1] = o->vni_word;

	if (bpf_skb_adjust_room(skb, VXLAN_OUTER4_LEN, BPF_ADJ_ROOM_MAC,
				BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP |
					BPF_F_ADJ_ROOM_ENCAP_L2_ETH | BPF_F_ADJ_ROOM_ENCAP_L2(ETH_HLEN)))
		return VIA_DEVICE;
	if (bpf_skb_store_bytes(skb, ETH_HLEN, &h, VXLAN_OUTER4_LEN, BPF_F_RECOMPUTE_CSUM))
		return DROP(REASON_DROP_MALFORMED);
	data = skb_data(skb);
	data_end = skb_data_end(skb);
	eth = data;
	if ((void *)(eth + 1) > data_end)
		return DROP(REASON_DROP_MALFORMED);
	eth->h_proto = bpf_htons(ETH_P_IP);
	*why = REASON_TUNNEL_UPLINK;
	return fib_redirect(eth, &p, rc);
}

/* Into the overlay, as a router would: TTL, then the outer headers (here,
 * or the tunnel key and the VXLAN device). A spent TTL goes to the stack
 * (time exceeded). */
static __always_inline int overlay_send(struct __sk_buff *skb, const struct cluster_route *cr, enum pkt_reason *why)
{
	void *data = skb_data(skb);
	void *data_end = skb_data_end(skb);
	struct ethhdr *eth = data;
	int hop, ret;

	if ((void *)(eth + 1) > data_end)
		return DROP(REASON_DROP_MALFORMED);
	hop = l3_hop(eth + 1, data_end, eth->h_proto);
	if (hop < 0)
		return DROP(REASON_DROP_MALFORMED);
	if (hop == 0) {
		*why = REASON_PASS;
		return TC_ACT_OK;
	}
	ret = encap_to_uplink(skb, cr, why);
	if (ret != VIA_DEVICE)
		return ret;
	return cluster_encap(skb, cr, why);
}

/* overlay_packet: p (the outer headers, as nat_parse read them) is the
 * overlay's: UDP to the VXLAN device's port, with a VXLAN header of the
 * node's VNI. Never a masqueraded flow's or a hostPort's: the device's
 * socket holds that port on the node. */
static __always_inline int overlay_packet(struct __sk_buff *skb, const struct nat_pkt *p)
{
	struct overlay_settings *o;
	__be32 vx[2];

	if (p->proto != IPPROTO_UDP)
		return 0;
	o = overlay_settings();
	if (!o || !o->port || p->dport != o->port)
		return 0;
	if (bpf_skb_load_bytes(skb, p->l4off + sizeof(struct udphdr), vx, sizeof(vx)))
		return 0;
	return vx[0] == VXLAN_FLAG_VNI && vx[1] == o->vni_word;
}

/* Where the inner frame of an overlay packet starts, by outer family (outer
 * Ethernet, IP without options, UDP, VXLAN); what decapsulation removes
 * after the outer Ethernet header (IP, UDP, VXLAN, inner Ethernet) is as
 * long. */
#define OVERLAY_INNER4 (ETH_HLEN + sizeof(struct iphdr) + sizeof(struct udphdr) + VXLAN_HLEN)
#define OVERLAY_INNER6 (ETH_HLEN + sizeof(struct ipv6hdr) + sizeof(struct udphdr) + VXLAN_HLEN)

/* overlay_inner parses the inner frame of s->p, a packet of the overlay
 * (overlay_packet), into s->p, and returns where it starts: what
 * overlay_decap takes off. 0 leaves it to the device (from_tunnel): a GSO
 * packet (a shrunk packet keeps the tunnel's GSO type, which would break
 * its segmentation later; bulk TCP arrives so and is no worse off through
 * the device's GRO), an outer fragment, an outer header with options, an
 * inner packet of the other family or a later fragment. */
static __always_inline __u32 overlay_inner(struct __sk_buff *skb, struct nat_scratch *s)
{
	__u8 outer = s->p.family;
	__u32 off;
	int rc;

	if (skb->gso_size || s->p.frag)
		return 0;
	if (outer == ADDR_FAMILY_V4 && s->p.l4off == ETH_HLEN + sizeof(struct iphdr)) {
		off = OVERLAY_INNER4;
		__builtin_memset(&s->p, 0, sizeof(s->p));
		rc = nat_parse_at(skb, &s->p, OVERLAY_INNER4);
	} else if (outer == ADDR_FAMILY_V6 && s->p.l4off == ETH_HLEN + sizeof(struct ipv6hdr)) {
		off = OVERLAY_INNER6;
		__builtin_memset(&s->p, 0, sizeof(s->p));
		rc = nat_parse_at(skb, &s->p, OVERLAY_INNER6);
	} else {
		return 0;
	}
	if (rc || s->p.family != outer || s->p.later_frag)
		return 0;
	return off;
}

/* overlay_decap takes the outer headers off (overlay_inner's off): the
 * outer Ethernet header stays (same family: its type is right), what
 * follows it up to the inner IP header goes. s->p follows. Not 0: the
 * packet is as it was. */
static __always_inline int overlay_decap(struct __sk_buff *skb, struct nat_scratch *s, __u32 off)
{
	if (bpf_skb_adjust_room(skb, -(__s32)off, BPF_ADJ_ROOM_MAC, 0))
		return -1;
	s->p.l3off -= off;
	s->p.l4off -= off;
	return 0;
}

#endif
