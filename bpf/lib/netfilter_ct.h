/* owner: shared */
/* The node's netfilter conntrack, asked through its kfuncs
 * (bpf_skb_ct_lookup): the flows feature learns from it whether netfilter
 * translated a flow (lib/flow.h), NetworkPolicy whether a packet the stack
 * translated back is a reply (lib/policy.h). Only TCP and UDP: the kfuncs
 * know no other protocol. */
#ifndef EBPF_CNI_LIB_NETFILTER_CT_H
#define EBPF_CNI_LIB_NETFILTER_CT_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include "../include/types.h"
#include "pkt.h"

/* Set by the loader (pkg/programs, setKernelFeatures): the kernel has the
 * conntrack kfuncs (nf_conntrack built in, or its module loaded), and the
 * size of its struct bpf_ct_opts (12 before kernel 6.10, 16 since). Without
 * them the calls below are dead code the verifier never sees. */
#ifdef EBPF_CNI_MAPS_ONLY
/* maps.c: map specs and types only, no .rodata. */
#define have_conntrack 0
#define ct_opts_size 12
#else
volatile const __u32 have_conntrack = 0;
volatile const __u32 ct_opts_size = 12;
#endif

/* The kernel's struct bpf_ct_opts in its longest form; a kernel that knows
 * the 12-byte form reads only that. */
struct bpf_ct_opts___ebpfcni {
	__s32 netns_id;
	__s32 error;
	__u8 l4proto;
	__u8 dir; /* out: the direction of the entry the tuple matched */
	__u16 ct_zone_id;
	__u8 ct_zone_dir;
	__u8 reserved[3];
};

/* The one field of the kernel's struct nf_conn we read (CO-RE). */
struct nf_conn___ebpfcni {
	unsigned long status;
} __attribute__((preserve_access_index));

extern struct nf_conn___ebpfcni *bpf_skb_ct_lookup(struct __sk_buff *skb, struct bpf_sock_tuple *tuple,
						   __u32 tuple__sz, struct bpf_ct_opts___ebpfcni *opts,
						   __u32 opts__sz) __ksym __weak;
extern void bpf_ct_release(struct nf_conn___ebpfcni *ct) __ksym __weak;

#define IPS_SRC_NAT_ (1 << 4)
#define IPS_DST_NAT_ (1 << 5)
#define IP_CT_DIR_REPLY_ 1

/* What flow_ct found. */
#define FLOW_CT_NONE (-1) /* no entry, or no conntrack */
#define FLOW_CT_NAT 1     /* the entry is translated */
#define FLOW_CT_REPLY 2   /* the packet travels in the entry's reply direction */

/* flow_ct asks conntrack about packet p (its tuple as it travels, or
 * reversed: the tuple of a packet the other way). */
static __always_inline int flow_ct_dir(struct __sk_buff *skb, const struct nat_pkt *p, struct bpf_sock_tuple *t,
				       int reverse)
{
	struct bpf_ct_opts___ebpfcni opts = { .netns_id = -1 /* BPF_F_CURRENT_NETNS */ };
	struct nf_conn___ebpfcni *ct;
	__u32 size;
	int r;

	if (!have_conntrack)
		return FLOW_CT_NONE;
	opts.l4proto = p->proto;
	if (reverse)
		size = sock_tuple(t, p->family, p->daddr, p->saddr, p->dport, p->sport);
	else
		size = sock_tuple(t, p->family, p->saddr, p->daddr, p->sport, p->dport);
	ct = bpf_skb_ct_lookup(skb, t, size, &opts, ct_opts_size);
	if (!ct)
		return FLOW_CT_NONE;
	r = (ct->status & (IPS_SRC_NAT_ | IPS_DST_NAT_)) ? FLOW_CT_NAT : 0;
	if (opts.dir == IP_CT_DIR_REPLY_)
		r |= FLOW_CT_REPLY;
	bpf_ct_release(ct);
	return r;
}

static __always_inline int flow_ct(struct __sk_buff *skb, const struct nat_pkt *p, struct bpf_sock_tuple *t)
{
	return flow_ct_dir(skb, p, t, 0);
}

static __always_inline int flow_tracked(__u8 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP;
}

#endif
