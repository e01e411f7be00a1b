//go:build ignore

/* The kernel's drops of pods' packets, for `ebpf-cni monitor`: a tracing
 * program on the kfree_skb tracepoint (its reason argument exists since
 * Linux 5.17), loaded and attached by the monitor only while it runs, so it
 * costs nothing otherwise.
 *
 * A packet the datapath let into a pod may still be dropped by the pod's
 * own stack: a hostPort that the pod publishes but does not listen on
 * (TCP answers with a reset and frees the SYN as NO_SOCKET), a full socket
 * buffer, a bad checksum. The datapath cannot see those; the tracepoint
 * does, with the kernel's enum skb_drop_reason. A freed packet belongs to
 * a pod when its device is in the pod's network namespace: pod_devs, which
 * the monitor fills, maps (netns inode, ifindex) to the pod's host veth
 * ifindex, so the event names the pod as the datapath's do. The events go
 * through the same lease, rate limit and ring buffer (lib/events.h). */

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "include/types.h"
#include "lib/events.h"

/* The few kernel fields read, relocated by CO-RE against the running
 * kernel's BTF. */
struct ns_common {
	unsigned int inum;
} __attribute__((preserve_access_index));

struct net {
	struct ns_common ns;
} __attribute__((preserve_access_index));

typedef struct {
	struct net *net;
} possible_net_t;

struct net_device {
	int ifindex;
	possible_net_t nd_net;
} __attribute__((preserve_access_index));

struct sk_buff {
	struct net_device *dev;
	unsigned int len;
	unsigned char *head;
	__u16 transport_header;
	__u16 network_header;
	__be16 protocol;
} __attribute__((preserve_access_index));

/* A device in a pod's network namespace. */
struct pod_dev_key {
	__u32 netns; /* the namespace's inode number */
	__u32 ifindex;
};

/* Filled by the monitor: a pod's devices -> its host veth ifindex; the
 * key with ifindex 0 stands for every other device of the namespace. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384); /* as endpoint_devs */
	__type(key, struct pod_dev_key);
	__type(value, __u32);
} pod_devs SEC(".maps");

/* kfree_skb(skb, location, reason[, rx_sk since 6.11]) */
SEC("tp_btf/kfree_skb")
int kfree_skb(__u64 *ctx)
{
	struct sk_buff *skb = (struct sk_buff *)ctx[0];
	__u32 reason = (__u32)ctx[2];
	struct event_config *cfg = event_config_get();
	struct pod_dev_key key = {};
	struct net_device *dev;
	struct event_stats *st = NULL;
	unsigned char *head;
	struct event *ev;
	__u32 *host;
	__u16 nh, th;
	__u64 now;

	if (!cfg || !cfg->lease || !skb)
		return 0;
	dev = BPF_CORE_READ(skb, dev);
	if (!dev)
		return 0;
	key.netns = BPF_CORE_READ(dev, nd_net.net, ns.inum);
	key.ifindex = BPF_CORE_READ(dev, ifindex);
	host = bpf_map_lookup_elem(&pod_devs, &key);
	if (!host) {
		key.ifindex = 0;
		host = bpf_map_lookup_elem(&pod_devs, &key);
		if (!host)
			return 0;
	}
	switch (event_gate(cfg, &st, &now)) {
	case EVENT_OFF:
		return 0;
	case EVENT_SUPPRESSED:
		st->kernel_suppressed++;
		return 0;
	case EVENT_ADMITTED:
		break;
	}
	ev = bpf_ringbuf_reserve(&events, sizeof(*ev), 0);
	if (!ev) {
		st->kernel_lost++;
		return 0;
	}
	__builtin_memset(ev, 0, sizeof(*ev));
	ev->time = now;
	ev->ifindex = *host;
	ev->len = BPF_CORE_READ(skb, len);
	ev->reason = reason;
	ev->type = EVENT_KERNEL_DROP;
	ev->dir = PKT_DIR_MAX; /* the monitor tells by the pod's addresses */
	head = BPF_CORE_READ(skb, head);
	nh = BPF_CORE_READ(skb, network_header);
	th = BPF_CORE_READ(skb, transport_header);
	if (nh != 0xffff) {
		__be16 proto = BPF_CORE_READ(skb, protocol);
		__u8 b[40];

		if (proto == bpf_htons(ETH_P_IP) && !bpf_probe_read_kernel(b, 20, head + nh)) {
			ev->family = ADDR_FAMILY_V4;
			ev->proto = b[9];
			__builtin_memcpy(ev->saddr, b + 12, 4);
			__builtin_memcpy(ev->daddr, b + 16, 4);
			if (th == 0xffff || th == nh)
				th = nh + ((b[0] & 0xf) << 2);
			if (b[6] & 0x1f || b[7]) /* not the first fragment: no ports */
				th = 0xffff;
		} else if (proto == bpf_htons(ETH_P_IPV6) && !bpf_probe_read_kernel(b, 40, head + nh)) {
			ev->family = ADDR_FAMILY_V6;
			ev->proto = b[6];
			__builtin_memcpy(ev->saddr, b + 8, 16);
			__builtin_memcpy(ev->daddr, b + 24, 16);
			if (th == 0xffff || th == nh)
				th = nh + 40;
		} else {
			th = 0xffff;
		}
		if (th != 0xffff && (ev->proto == IPPROTO_TCP || ev->proto == IPPROTO_UDP || ev->proto == IPPROTO_SCTP) &&
		    !bpf_probe_read_kernel(b, 14, head + th)) {
			__builtin_memcpy(&ev->sport, b, 2);
			__builtin_memcpy(&ev->dport, b + 2, 2);
			if (ev->proto == IPPROTO_TCP)
				ev->tcp_flags = b[13];
		}
	}
	event_submit(ev);
	return 0;
}

char __license[] SEC("license") = "GPL";
