package bandwidth

import (
	"github.com/vishvananda/netlink"
)

// EnableEDT tries to give the host veth an fq root qdisc, so the traffic
// the node's stack delivers to the pod is paced by departure time
// (skb->tstamp, set by to_container) instead of dropped. It reports whether
// fq is there: a kernel without sch_fq (this project's development machine)
// refuses, and the token bucket alone enforces the limit. The qdisc goes
// with the veth. Redirected traffic (bpf_redirect_peer) skips every qdisc of
// the host veth and is always policed.
func EnableEDT(host netlink.Link) bool {
	q := &netlink.GenericQdisc{QdiscType: "fq", QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: host.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT}}
	return netlink.QdiscReplace(q) == nil
}
