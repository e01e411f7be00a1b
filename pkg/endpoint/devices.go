package endpoint

import "github.com/ebpf-cni/ebpf-cni/pkg/node"

// attachedDevices are the devices that carry a recorded attachment set (an
// uplink's programs, the overlay's device): the programs count their
// packets in device_counters too, so their entries there are no
// leftovers while the set is recorded; the release that detaches a set
// deletes its device's counters. A set that cannot be read keeps nothing.
func attachedDevices(n *node.Node) map[int]bool {
	out := map[int]bool{}
	sets, err := n.AttachmentSets("")
	if err != nil {
		return out
	}
	for _, s := range sets {
		if s.IfIndex != 0 {
			out[s.IfIndex] = true
		}
	}
	return out
}
