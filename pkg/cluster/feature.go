package cluster

import (
	"errors"

	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
	"github.com/ebpf-cni/ebpf-cni/pkg/uplink"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

// Feature is the cluster: its pod ranges (clusterCIDRs, never masqueraded
// and never taken for Services) and the VXLAN overlay to other nodes' pods.
type Feature struct{ feature.Base }

var _ feature.Feature = Feature{}

// Name is the feature's name.
func (Feature) Name() string { return "cluster" }

// Programs are the overlay device's and the uplinks' (packets routed to
// the node's pods go straight in through from_netdev).
func (Feature) Programs() []programs.Object { return append(objects(), uplink.Objects()...) }

// netConf is what the feature reads of a network configuration.
type netConf struct {
	Config
	Uplinks []string `json:"uplinks,omitempty"` // as uplink.Config: masquerade validates them
}

// Parse reads clusterCIDRs, overlay, vxlanPort and vxlanVNI (and uplinks,
// where routed traffic for the pods arrives).
func (Feature) Parse(conf []byte) (feature.Pod, error) {
	var c netConf
	if err := feature.Decode(conf, &c); err != nil {
		return nil, err
	}
	s, err := c.Config.Validate()
	if err != nil {
		return nil, err
	}
	return pod{s: s, uplinks: c.Uplinks}, nil
}

type pod struct {
	s       *Settings
	uplinks []string
}

// Needs: the overlay's overhead off the pods' MTU.
func (p pod) Needs() feature.Needs {
	if p.s.Enabled() && p.s.VXLAN {
		return feature.Needs{Overhead: Overhead()}
	}
	return feature.Needs{}
}

func fail(err error) error {
	return feature.Fail(errcode.Cluster, "setting up the cluster's routing", err)
}

// Add marks the cluster's ranges, gives the uplinks their programs and
// makes the overlay. Nothing of it is the pod's own: the node's last
// endpoint takes it away (Release), also after a failed first ADD.
func (p pod) Add(n *node.Node, ep *feature.Endpoint, _ *feature.Undo) error {
	if !p.s.Enabled() {
		return nil
	}
	if err := AddRanges(n, p.s.Ranges); err != nil {
		return fail(err)
	}
	ups, err := uplink.Find(p.uplinks)
	if err != nil {
		return fail(err)
	}
	if err := uplink.Ensure(n, ups, ep.DeviceMode); err != nil {
		return fail(err)
	}
	if p.s.VXLAN {
		return fail(ensureOverlay(n, p.s, ep.DeviceMode))
	}
	return nil
}

// Check names what is missing of the cluster's state.
func (p pod) Check(n *node.Node, _ *feature.Endpoint) []string {
	if !p.s.Enabled() {
		return nil
	}
	out := append(MissingRanges(n, p.s.Ranges), uplink.Problems(n, "clusterCIDRs")...)
	if p.s.VXLAN {
		out = append(out, overlayProblems(n, p.s)...)
	}
	return out
}

// Release takes the overlay and the ranges off the node, and the uplinks'
// programs (which masquerade and hostPort release too: idempotent).
func (Feature) Release(n *node.Node) error {
	return errors.Join(release(n), uplink.Release(n))
}

// Commands: tunnels.
func (Feature) Commands() []*view.Command { return []*view.Command{command} }
