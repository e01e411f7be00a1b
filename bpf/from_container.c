//go:build ignore

/* Hook: tc ingress of the host end of a pod's veth (packets leaving the pod).
 *
 * Stage 1 of the datapath: every packet is accounted and handed to the
 * stack. Forwarding, anti-spoofing and NAT arrive with the datapath issues;
 * this program proves the toolchain (bpf2go, load, pin, attach, test run). */

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

#include "include/types.h"
#include "lib/counters.h"
#include "lib/ipam.h"

SEC("tc")
int from_container(struct __sk_buff *skb)
{
	count_packet(skb, REASON_PASS);
	return TC_ACT_OK;
}

char __license[] SEC("license") = "GPL";
