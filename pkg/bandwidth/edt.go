package bandwidth

import (
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/rtnl"
)

// fqFlowLimit is fq's per-flow (and total) packet limit on a host veth
// with EDT. fq's default per flow, 100 packets, would drop a flow's
// packets long before the second the bucket lets them wait
// (BW_EDT_HORIZON_NS in bpf/lib/bandwidth.h): 100 packets of 1500 bytes
// are 24 ms at 50 Mbit/s, and an outside TCP sender, whose window soon
// holds more, lost packets, halved its window and fell below the rate for
// a while (seen on Debian 12's 6.1: 74 retransmissions and a first second
// of 20.6 Mbit/s at 50). The veth carries one pod's traffic, so one flow
// may hold what fq allows all flows by default.
const fqFlowLimit = 10000

// EnableEDT tries to give the host veth an fq root qdisc, so the traffic
// the node's stack delivers to the pod is paced by departure time
// (skb->tstamp, set by to_container) instead of dropped. It reports whether
// fq is there: a kernel without sch_fq (this project's development machine)
// refuses, and the token bucket alone enforces the limit. The qdisc goes
// with the veth. Redirected traffic (bpf_redirect_peer) skips every qdisc of
// the host veth and is always policed.
func EnableEDT(host netlink.Link) bool {
	q := &netlink.Fq{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: host.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
		Pacing:     1, PacketLimit: fqFlowLimit, FlowPacketLimit: fqFlowLimit,
		HorizonDropPolicy: netlink.HORIZON_DROP_POLICY_DEFAULT,
	}
	return rtnl.H().QdiscReplace(q) == nil
}
