package plugin

import (
	"errors"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/repair"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// The node ends its responsibility for the pod ranges it hands addresses
// of (docs/datapath.md): an unreachable route per range, the pods' host
// routes more specific, added with the range's first pod and removed with
// its last, under the node's ranges lock (repair.RangesLock).

// ensureRanges adds the unreachable routes of the pod's ranges; its host
// routes must exist already. If the ADD fails later, the undo removes the
// host veth first, then every range that has no pod left.
func ensureRanges(n *node.Node, undo *feature.Undo, hostName string, ips []*current.IPConfig) error {
	ranges := veth.PodRanges(ips)
	if len(ranges) == 0 {
		return nil
	}
	l, err := n.Lock(repair.RangesLock)
	if err != nil {
		return cniError(errcode.LinkSetup, "locking the pod ranges", err)
	}
	defer l.Unlock()
	undo.Push(func() error {
		return errors.Join(veth.DeleteHost(hostName), repair.ReleaseRanges(n, ranges))
	})
	if err := veth.EnsureRanges(ranges); err != nil {
		return cniError(errcode.LinkSetup, "routing the pod ranges", err)
	}
	return nil
}
