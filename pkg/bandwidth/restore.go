package bandwidth

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// recorded is what ADD keeps of a limited pod in its record: its limits
// (a bpffs remount takes bw_buckets where no surviving program kept it:
// tcx links die with their pins) and the cgroup the pacing hook attaches
// to (its attachment set is lost with the stateDir).
type recorded struct {
	Limits *Limits `json:"limits"`
	Cgroup string  `json:"cgroup,omitempty"`
}

// stateOf is the pod's bandwidth as the record tells it or, for a pod
// recorded without it (an older build's, or a record rebuilt from the
// kernel), as its buckets do; nil when it has no limits.
func stateOf(n *node.Node, ep *feature.Endpoint) (*recorded, error) {
	var st recorded
	if ok, err := ep.Record.Feature(name, &st); ok || err != nil {
		return &st, err
	}
	m, err := n.PinnedMap(maps.CniMapBwBuckets)
	if err != nil || m == nil {
		return nil, err
	}
	var v maps.CniBwState
	if err := m.Lookup(uint32(ep.HostIfIndex), &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading %s[%d]: %w", maps.CniMapBwBuckets, ep.HostIfIndex, err)
	}
	l := &Limits{Egress: Limit{Rate: v.Egress.Rate, Burst: v.Egress.Burst}, Ingress: Limit{Rate: v.Ingress.Rate, Burst: v.Ingress.Burst}}
	if !l.Any() {
		return nil, nil
	}
	return &recorded{Limits: l}, nil
}

// Repair makes a limited pod limited and paced again after a bpffs loss:
// its buckets from the record where bw_buckets lost them, its netns entry
// in local_netns (found through its veth's peer where the record names no
// netns), and the pacing hook on the recorded cgroup; a record rebuilt
// from the kernel in the calling network gets that network's cgroup first.
// Each line says what was missing. Nothing node-wide: the pacing hook
// goes back with the first limited pod.
func (Feature) Repair(n *node.Node, rp *feature.Repair) ([]string, error) {
	ep := rp.Endpoint
	if ep == nil {
		return nil, nil
	}
	st, err := stateOf(n, ep)
	if err != nil || st == nil {
		return nil, err
	}
	if p, ok := rp.Pod.(pod); ok && rp.Rebuilt && st.Cgroup == "" {
		// The pacing hook goes back where the configuration puts it.
		if st.Cgroup, err = p.keys.Resolve(); err != nil {
			return nil, err
		}
		if err := ep.SetFeature(name, st); err != nil {
			return nil, err
		}
	}
	var lines []string
	var errs []error
	missing := func(line string, fix func() error) {
		lines = append(lines, line)
		if !rp.DryRun {
			errs = append(errs, fix())
		}
	}
	t, err := TableOf(n)
	if err != nil {
		return nil, err
	}
	if !t.Has(ep.HostIfIndex) {
		missing(fmt.Sprintf("its limits are not in %s: the pod is not limited", maps.CniMapBwBuckets), func() error {
			return t.Put(ep.HostIfIndex, st.Limits, false)
		})
	}
	nt, err := NetnsOf(n)
	if err != nil {
		return lines, errors.Join(append(errs, err)...)
	}
	if ok, err := nt.Registered(ep.HostIfIndex); err != nil {
		errs = append(errs, err)
	} else if !ok {
		missing(fmt.Sprintf("its netns is not in %s: its TCP is not paced", maps.CniMapLocalNetns), func() error { return register(nt, ep) })
	}
	if !Pacing(n) {
		missing("the pacing hook is not attached to the cgroup: the pod's TCP is policed, not paced", func() error {
			return StartPacing(n, cgroupOf(n, st))
		})
	}
	return lines, errors.Join(errs...)
}

// register records the pod's netns in local_netns: the record's path, or
// the namespace of its host veth's peer.
func register(nt *Netns, ep *feature.Endpoint) error {
	path := ep.NetNS
	if path == "" || !node.IsNetNS(path) {
		if path = veth.PeerNetNS(ep.Host); path == "" {
			return fmt.Errorf("the netns of the pod behind %s is not found (its record names %q)", ep.HostIfName, ep.NetNS)
		}
	}
	podNS, err := ns.GetNS(path)
	if err != nil {
		return err
	}
	defer podNS.Close()
	return nt.Register(podNS, ep.HostIfIndex)
}

// cgroupOf is where the pacing hook goes back: the record's cgroup, the
// pacing set's (recorded by the first limited pod's ADD), else the default
// (the unified hierarchy's root).
func cgroupOf(n *node.Node, st *recorded) string {
	if st.Cgroup != "" {
		return st.Cgroup
	}
	if sets, err := n.AttachmentSets("cgroup"); err == nil {
		for _, s := range sets {
			if s.Name == cgroupSet && s.Cgroup != "" {
				return s.Cgroup
			}
		}
	}
	cg, _ := attach.ResolveCgroup("", n.StateDir())
	return cg
}
