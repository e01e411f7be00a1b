/* How a handler's result becomes a tc verdict: the one place where drops
 * and forwarding decisions are counted.
 *
 * Handlers return either a tc action (>= 0) and set *why, or a negative
 * enum pkt_reason for a drop. */
#ifndef EBPF_CNI_LIB_VERDICT_H
#define EBPF_CNI_LIB_VERDICT_H

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include "../include/types.h"
#include "counters.h"

#define DROP(reason) (-(int)(reason))

static __always_inline int verdict(struct __sk_buff *skb, int ret, enum pkt_reason why)
{
	if (ret < 0) {
		count_packet(skb, (enum pkt_reason)(-ret));
		return TC_ACT_SHOT;
	}
	count_packet(skb, why);
	return ret;
}

#endif
