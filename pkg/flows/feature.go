package flows

import (
	"net"

	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/podflush"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

// Feature is Services coexistence: the flow table through which the
// programs let netfilter (kube-proxy) see and translate the flows it
// wants. Every pod has it; it has no keys. Its state is per flow, so what
// it does is forget the flows of pods that are gone.
type Feature struct{ feature.Base }

var _ feature.Feature = Feature{}

// Name is the feature's name.
func (Feature) Name() string { return "flows" }

// Parse: the feature has no keys.
func (Feature) Parse([]byte) (feature.Pod, error) { return pod{}, nil }

type pod struct{}

func (pod) Needs() feature.Needs                                   { return feature.Needs{} }
func (pod) Add(*node.Node, *feature.Endpoint, *feature.Undo) error { return nil }
func (pod) Check(*node.Node, *feature.Endpoint) []string           { return nil }

// of is the node's table, nil when it is not pinned (no pod ran).
func of(n *node.Node) (*Table, error) {
	if n.CheckBPFFS() != nil {
		return nil, nil
	}
	m, err := n.PinnedMap(maps.CniMapFlows)
	if err != nil || m == nil {
		return nil, err
	}
	return &Table{m: m}, nil
}

// Del deletes the pod's flows: a pod that gets its address later inherits
// no verdict.
func (Feature) Del(n *node.Node, ep *feature.Endpoint) error {
	if len(ep.Addrs()) == 0 {
		return nil
	}
	t, err := of(n)
	if err != nil || t == nil {
		return err
	}
	pods := make([]podflush.Pod, 0, len(ep.Addrs()))
	for _, ip := range ep.Addrs() {
		pods = append(pods, podflush.Pod{IP: ip, Tables: maps.CniFlushTablesFLUSH_FLOWS})
	}
	_, err = podflush.Flush(n, podflush.Flows, pods, func() (int, error) { return t.FlushPod(ep.Addrs()) })
	return err
}

// Programs: the programs of a DEL's flush of this table and the NAT
// table, which every node needs (pkg/podflush).
func (Feature) Programs() []programs.Object { return podflush.Objects() }

// GC deletes the flows of pods that are gone.
func (Feature) GC(n *node.Node, live *feature.Live, dryRun bool) ([]string, error) {
	t, err := of(n)
	if err != nil || t == nil {
		return nil, err
	}
	return t.GC(live.IP, dryRun)
}

// Release empties the table with the node's last endpoint.
func (Feature) Release(n *node.Node) error {
	t, err := of(n)
	if err != nil || t == nil {
		return err
	}
	_, err = t.prune(func(_ net.IP) bool { return true })
	return err
}

// Commands: flows.
func (Feature) Commands() []*view.Command { return []*view.Command{command} }
