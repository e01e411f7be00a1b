/* owner: shared */
/* Other tc users on a host veth: another plugin's qdiscs.
 *
 * The reference bandwidth plugin chained after ebpf-cni shapes a pod with
 * a tbf as the host veth's root qdisc (the pod's ingress) and an ingress
 * qdisc whose filter mirrors the pod's packets to an ifb with its own tbf
 * (the pod's egress). Our redirects would skip both: bpf_redirect_peer
 * never passes the host veth's root qdisc, and a redirect from tcx ends
 * the packet's ingress before any legacy filter runs.
 *
 * A daemonless plugin is not told when a later plugin adds qdiscs, so the
 * programs look for themselves: from_container reads the host veth's
 * qdiscs from the kernel's own structs (bpf_cast_to_kern_ctx, fields
 * relocated with CO-RE, a few loads a packet), and
 *  - with an ingress qdisc there, hands the pod's packets to its filters
 *    instead of redirecting them (they go on through the stack);
 *  - with a root qdisc that queues (tbf, htb, an operator's fq), marks the
 *    pod's endpoint (EP_F_QDISC), and every delivery to the pod goes
 *    through the host veth's egress, and so through that qdisc, instead
 *    of straight into the pod's netns (endpoint_redirect).
 * The mark follows the qdisc: from_container sets and clears it with the
 * pod's next packet. It keeps a copy of what it last set in the pod's
 * device entry (endpoint_dev, which it looks up for every packet anyway)
 * and looks up the address entries only when the copy disagrees with the
 * qdiscs (qdisc_relearn). The copy is from_container's alone: ebpf-cni
 * writes a device entry again after its address entries (endpoint.Put),
 * so a copy set in between goes back to unset and the next packet sets
 * the marks again. */
#ifndef EBPF_CNI_LIB_QDISC_H
#define EBPF_CNI_LIB_QDISC_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "../include/types.h"

/* The few kernel fields we read. The ___ebpfcni suffix keeps these apart
 * from the uapi names; CO-RE matches them to the kernel's struct sk_buff,
 * net_device, netdev_queue and Qdisc by the name before it. */
struct Qdisc___ebpfcni {
	void *enqueue; /* NULL for noqueue, a veth's default */
	unsigned int flags;
} __attribute__((preserve_access_index));

struct netdev_queue___ebpfcni {
	struct Qdisc___ebpfcni *qdisc_sleeping;
} __attribute__((preserve_access_index));

struct net_device___ebpfcni {
	struct Qdisc___ebpfcni *qdisc;
	struct netdev_queue___ebpfcni *ingress_queue;
} __attribute__((preserve_access_index));

struct sk_buff___ebpfcni {
	struct net_device___ebpfcni *dev;
} __attribute__((preserve_access_index));

/* Weak: kernels before 6.2 lack it (Debian 12's 6.1). There the loader
 * leaves bpf_ksym_exists() false and dev_qdiscs reads the same fields with
 * bpf_probe_read_kernel, which root's tc programs may call since 5.x. */
extern void *bpf_cast_to_kern_ctx(void *obj) __ksym __weak;

/* libbpf 1.1 (Debian 12) predates bpf_ksym_exists: the address of a weak
 * ksym the loader did not find is 0. */
#ifndef bpf_ksym_exists
#define bpf_ksym_exists(sym) (!!(sym))
#endif

/* TCQ_F_BUILTIN: noop_qdisc, what an ingress queue holds once its qdisc
 * is deleted. */
#define QDISC_F_BUILTIN 1

enum dev_qdisc {
	QDISC_ROOT = 1,    /* the root qdisc queues */
	QDISC_INGRESS = 2, /* an ingress or clsact qdisc (legacy filters) */
};

/* dev_qdiscs_probe: dev_qdiscs for kernels without bpf_cast_to_kern_ctx.
 * The context pointer is the kernel's sk_buff; the verifier lets a
 * privileged program hand it to bpf_probe_read_kernel (BPF_CORE_READ
 * relocates every offset, as the direct loads below). */
static __always_inline __u32 dev_qdiscs_probe(struct __sk_buff *skb)
{
	struct sk_buff___ebpfcni *k = (void *)skb;
	struct net_device___ebpfcni *dev = BPF_CORE_READ(k, dev);
	struct netdev_queue___ebpfcni *iq;
	struct Qdisc___ebpfcni *q;
	__u32 r = 0;

	if (!dev)
		return 0;
	q = BPF_CORE_READ(dev, qdisc);
	if (q && BPF_CORE_READ(q, enqueue))
		r |= QDISC_ROOT;
	iq = BPF_CORE_READ(dev, ingress_queue);
	if (iq) {
		q = BPF_CORE_READ(iq, qdisc_sleeping);
		if (q && !(BPF_CORE_READ(q, flags) & QDISC_F_BUILTIN))
			r |= QDISC_INGRESS;
	}
	return r;
}

/* dev_qdiscs: which of enum dev_qdisc the device skb is on has. */
static __always_inline __u32 dev_qdiscs(struct __sk_buff *skb)
{
	if (!bpf_ksym_exists(bpf_cast_to_kern_ctx))
		return dev_qdiscs_probe(skb);

	struct sk_buff___ebpfcni *k = bpf_cast_to_kern_ctx(skb);
	struct net_device___ebpfcni *dev = k->dev;
	struct netdev_queue___ebpfcni *iq;
	struct Qdisc___ebpfcni *q;
	__u32 r = 0;

	if (!dev)
		return 0;
	q = dev->qdisc;
	if (q && q->enqueue)
		r |= QDISC_ROOT;
	iq = dev->ingress_queue;
	if (iq) {
		q = iq->qdisc_sleeping;
		if (q && !(q->flags & QDISC_F_BUILTIN))
			r |= QDISC_INGRESS;
	}
	return r;
}

/* qdisc_learn keeps ep's EP_F_QDISC in step with the root qdisc q says
 * the pod's host veth has. A plain write, as for EP_F_STACK: it is a hint
 * the next packet corrects, and ebpf-cni replaces entries, never edits
 * them in place. */
static __always_inline void qdisc_learn(struct endpoint_info *ep, __u32 q)
{
	__u32 want = (q & QDISC_ROOT) ? EP_F_QDISC : 0;

	if ((ep->flags & EP_F_QDISC) != want)
		ep->flags ^= EP_F_QDISC;
}

/* tc_index of a packet endpoint_redirect sends through the host veth's
 * egress: to_container, which sees it there, knows it is ours and not the
 * stack's. */
#define TC_INDEX_DELIVERY 0xeb0c

#endif
