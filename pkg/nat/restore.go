package nat

import (
	"net"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/uplink"
)

// applied is what Apply was given for an endpoint's network, kept in the
// endpoint's record: a bpffs remounted under live pods loses masq_nets,
// masq_skip and nat_timeouts when no program that survived kept them (tcx
// links die with their pins), and Restore writes them again from it.
type applied struct {
	Skip         []string             `json:"skip,omitempty"`
	OwnRanges    bool                 `json:"ownRanges,omitempty"` // Skip nil: the network's own ranges
	Cluster      []string             `json:"cluster,omitempty"`
	MasqueradeIP string               `json:"masqueradeIP,omitempty"`
	Uplinks      []string             `json:"uplinks,omitempty"`
	PortMin      uint16               `json:"portMin,omitempty"`
	PortMax      uint16               `json:"portMax,omitempty"`
	Timeouts     maps.CniNatLifetimes `json:"timeouts"`
	Mode         attach.Mode          `json:"mode"`
}

func appliedOf(s *Settings, mode attach.Mode) *applied {
	a := &applied{OwnRanges: s.Skip == nil, Uplinks: s.Uplinks, PortMin: s.PortMin, PortMax: s.PortMax, Timeouts: s.Timeouts, Mode: mode}
	for _, n := range s.Skip {
		a.Skip = append(a.Skip, n.String())
	}
	for _, n := range s.Cluster {
		a.Cluster = append(a.Cluster, n.String())
	}
	if s.MasqueradeIP != nil {
		a.MasqueradeIP = s.MasqueradeIP.String()
	}
	return a
}

func (a *applied) settings() *Settings {
	s := &Settings{Enabled: true, Uplinks: a.Uplinks, PortMin: a.PortMin, PortMax: a.PortMax, Timeouts: a.Timeouts, MasqueradeIP: net.ParseIP(a.MasqueradeIP)}
	cidrs := func(in []string) []*net.IPNet {
		out := []*net.IPNet{}
		for _, c := range in {
			if _, n, err := net.ParseCIDR(c); err == nil {
				out = append(out, n)
			}
		}
		return out
	}
	if !a.OwnRanges {
		s.Skip = cidrs(a.Skip)
	}
	s.Cluster = cidrs(a.Cluster)
	return s
}

// Repair, for the node, records the uplinks' programs again from the
// kernel (uplink.Rebuild); for an endpoint it writes the network's
// masquerade settings again: as ADD applied them from the network's
// configuration for a record rebuilt in that network (kept in the record;
// without admission: the pod lives already, refusing it would mend
// nothing), else from the record. It tells nothing: the settings are
// written whole, the same values each time.
func (Feature) Repair(n *node.Node, rp *feature.Repair) ([]string, error) {
	if rp.DryRun {
		return nil, nil
	}
	ep := rp.Endpoint
	if ep == nil {
		return nil, uplink.Rebuild(n)
	}
	if p, ok := rp.Pod.(pod); ok && rp.Rebuilt {
		return nil, p.add(n, ep, nil)
	}
	var a applied
	ok, err := ep.Record.Feature(name, &a)
	if !ok || err != nil || ep.Network == "" {
		return nil, err
	}
	return nil, Apply(n, ep.Network, a.settings(), ep.Nets(), a.Mode)
}
