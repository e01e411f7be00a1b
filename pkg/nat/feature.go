package nat

import (
	"errors"
	"github.com/ebpf-cni/ebpf-cni/pkg/clusterranges"
	"github.com/ebpf-cni/ebpf-cni/pkg/conntrack"
	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
	"github.com/ebpf-cni/ebpf-cni/pkg/uplink"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

// Feature is masquerade (ipMasq).
type Feature struct{ feature.Base }

var _ feature.Feature = Feature{}

// Name is the feature's name.
func (Feature) Name() string { return name }

// name keys the feature's state in endpoint records.
const name = "masquerade"

// Programs are the uplinks'.
func (Feature) Programs() []programs.Object { return uplink.Objects() }

// Parse reads ipMasq, nonMasqueradeCIDRs, masqueradeIP, uplinks,
// masqueradePortRange and natTimeouts.
func (Feature) Parse(conf []byte) (feature.Pod, error) {
	var c Config
	if err := feature.Decode(conf, &c); err != nil {
		return nil, err
	}
	s, err := c.Validate()
	if err != nil {
		return nil, err
	}
	// The cluster's pod ranges are never masqueraded.
	s.Cluster = clusterranges.Of(conf)
	return pod{s}, nil
}

type pod struct{ s *Settings }

func (pod) Needs() feature.Needs { return feature.Needs{} }

// Add makes masquerade ready for the pod's network: uplinks, settings.
// Nothing of it is the pod's own: the node's last endpoint takes it away.
// Its masqueradeIP must be the node's and agree with the network's in
// force (admission).
func (p pod) Add(n *node.Node, ep *feature.Endpoint, _ *feature.Undo) error {
	return p.add(n, ep, &admission{self: ep.HostIfName})
}

func (p pod) add(n *node.Node, ep *feature.Endpoint, a *admission) error {
	if !p.s.Enabled {
		return nil
	}
	if err := apply(n, ep.Network, p.s, ep.Nets(), ep.DeviceMode, a); err != nil {
		return feature.Fail(errcode.Masquerade, "setting up masquerade", err)
	}
	return ep.SetFeature(name, appliedOf(p.s, ep.DeviceMode))
}

// Check verifies that the uplinks carry this build's programs.
func (p pod) Check(n *node.Node, _ *feature.Endpoint) []string {
	if !p.s.Enabled {
		return nil
	}
	return uplink.Problems(n, "ipMasq")
}

// Del removes the pod's masqueraded flows from the conntrack/NAT table: a
// pod that gets the same address later inherits no state. It runs whether
// or not the pod had masquerade (DEL reads no configuration). The flush is
// queued: the teardown does it with hostPort's in one walk of the table.
func (Feature) Del(n *node.Node, ep *feature.Endpoint) error {
	conntrack.FlushPodLater(n, conntrack.Masquerade, ep.Addrs())
	return nil
}

// GC removes the masqueraded flows of pods that are gone and expired ones,
// and the settings of networks without endpoints.
func (Feature) GC(n *node.Node, live *feature.Live, dryRun bool) ([]string, error) {
	var found []string
	t, err := conntrack.Pinned(n)
	if err == nil && t != nil {
		found, err = t.GC(conntrack.Masquerade, live.IP, dryRun)
	}
	settings, ferr := ForgetNetworks(n, live.Network, dryRun)
	return append(found, settings...), errors.Join(err, ferr)
}

// Release takes masquerade off the node.
func (Feature) Release(n *node.Node) error { return Teardown(n) }

// Commands: nat.
func (Feature) Commands() []*view.Command { return []*view.Command{command} }
