/* owner: shared */
/* How a handler's result becomes a tc verdict: the one place where drops
 * and forwarding decisions are counted.
 *
 * Handlers return either a tc action (>= 0) and set *why, or a negative
 * enum pkt_reason for a drop. A packet for the stack (TC_ACT_OK) leaves
 * as TC_ACT_UNSPEC (TCX_NEXT): whatever else is on the hook still sees it,
 * a later tcx program or another plugin's legacy filters (lib/qdisc.h);
 * with nothing there, the stack gets it all the same. */
#ifndef EBPF_CNI_LIB_VERDICT_H
#define EBPF_CNI_LIB_VERDICT_H

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include "../include/types.h"
#include "counters.h"
#include "events.h"

#define DROP(reason) (-(int)(reason))

/* dir is the program's hook (enum pkt_dir): the same for every packet a
 * program sees. */
static __always_inline int verdict(struct __sk_buff *skb, int ret, enum pkt_reason why,
				   enum pkt_dir dir)
{
	event_report(skb, ret, why, dir);
	if (ret < 0) {
		count_packet(skb, (enum pkt_reason)(-ret), dir);
		return TC_ACT_SHOT;
	}
	count_packet(skb, why, dir);
	return ret == TC_ACT_OK ? TC_ACT_UNSPEC : ret;
}

#endif
