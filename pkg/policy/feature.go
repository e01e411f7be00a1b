package policy

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

// Feature is NetworkPolicy on the plugin's side: a pod's first state,
// written before the endpoint's entries make the pod reachable, and its
// state and drop counters taken away with it. What the pod may receive
// and send is the node agent's to write (pkg/agent), the programs'
// to enforce (bpf/lib/policy.h: the endpoint's, the uplinks' and the
// overlay's programs include it). It has no keys and no programs of its
// own.
type Feature struct{ feature.Base }

var _ feature.Feature = Feature{}

// Name is the feature's name (and the owner of bpf/lib/policy.h).
func (Feature) Name() string { return "policy" }

// Parse: the feature has no keys; the pod's namespace (K8S_POD_NAMESPACE
// in CNI_ARGS) is in the record.
func (Feature) Parse([]byte) (feature.Pod, error) { return pod{}, nil }

type pod struct{}

func (pod) Needs() feature.Needs { return feature.Needs{} }

// Check: after ADD the state is the agent's to change; nothing to compare.
func (pod) Check(*node.Node, *feature.Endpoint) []string { return nil }

func fail(err error) error {
	return feature.Fail(errcode.BPFFS, "writing the pod's NetworkPolicy state", err)
}

// Add writes the pod's first state before anything can reach it (the
// endpoint's entries come after it: features.Before): closed for the
// directions its namespace's policies isolate, until the agent writes its
// rules. Written for every pod: a pod left open deletes a stale state of
// its host ifindex.
func (pod) Add(n *node.Node, ep *feature.Endpoint, undo *feature.Undo) error {
	m, err := MapsOf(n)
	if err != nil {
		return fail(err)
	}
	undo.Push(func() error { return m.DeleteEndpoint(uint32(ep.HostIfIndex)) })
	return fail(start(m, ep))
}

// start writes the first state of ep.
func start(m *Maps, ep *feature.Endpoint) error {
	ns := ""
	if ep.Pod != nil {
		ns = ep.Pod.Namespace
	}
	st, err := m.StartState(ns)
	if err == nil {
		err = m.SetEndpoint(uint32(ep.HostIfIndex), st)
	}
	if err != nil {
		return fmt.Errorf("endpoint %s: %w", ep.ContainerID, err)
	}
	return nil
}

// Del removes the endpoint's state and drop counters (its rules are the
// agent's to remove: an LPM trie cannot be searched by endpoint without a
// walk of it all; GC sweeps them where no agent does). DEL runs it after
// the endpoint's entries and the host veth are gone: an endpoint_devs
// entry of its ifindex by then is a new pod's, and so is the state.
func (Feature) Del(n *node.Node, ep *feature.Endpoint) error {
	if ep.HostIfIndex == 0 || n.CheckBPFFS() != nil {
		return nil
	}
	if taken, err := reused(n, ep); err != nil || taken {
		return err
	}
	m, err := pinnedOf(n, maps.CniMapPolicyEndpoints, maps.CniMapPolicyDrops)
	if err != nil {
		return err
	}
	return m.DeleteEndpoint(uint32(ep.HostIfIndex))
}

// reused says whether the host ifindex of ep belongs to another endpoint
// now: endpoint_devs has an entry of it with another host MAC.
func reused(n *node.Node, ep *feature.Endpoint) (bool, error) {
	devs, err := n.PinnedMap(maps.CniMapEndpointDevs)
	if err != nil || devs == nil {
		return false, err
	}
	var d maps.CniEndpointDev
	err = devs.Lookup(uint32(ep.HostIfIndex), &d)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading %s[%d]: %w", maps.CniMapEndpointDevs, ep.HostIfIndex, err)
	}
	mac, _ := net.ParseMAC(ep.HostMAC)
	return !bytes.Equal(d.HostMac[:], mac), nil
}

// GC sweeps what endpoints that are gone left: their states and drop
// counters, and the rules the agent wrote for them (it removes them itself
// when it runs; a node whose agent is gone has them swept here).
func (Feature) GC(n *node.Node, live *feature.Live, dryRun bool) ([]string, error) {
	if n.CheckBPFFS() != nil {
		return nil, nil
	}
	m, err := pinnedOf(n, maps.CniMapPolicyEndpoints, maps.CniMapPolicyDrops, maps.CniMapPolicyRules)
	if err != nil {
		return nil, err
	}
	sw := &feature.Sweep{DryRun: dryRun}
	if err := gcStates(m, live, sw); err != nil {
		return nil, err
	}
	if err := gcRules(m, live, sw); err != nil {
		return nil, err
	}
	return sw.Result()
}

// gcStates sweeps the states and drop counters of endpoints that are gone.
func gcStates(m *Maps, live *feature.Live, sw *feature.Sweep) error {
	states := map[uint32]EndpointState{}
	if m.EndpointMap != nil {
		var err error
		if states, err = m.EndpointStates(); err != nil {
			return err
		}
	}
	for i := range states {
		if !live.IfIndex(int(i)) {
			sw.Remove(fmt.Sprintf("%s[%d]", maps.CniMapPolicyEndpoints, i), func() error { return m.DeleteEndpoint(i) })
		}
	}
	if m.DropMap == nil {
		return nil
	}
	counted, err := m.DropEndpoints()
	if err != nil {
		return err
	}
	for i := range counted {
		if _, state := states[i]; !state && !live.IfIndex(int(i)) {
			sw.Remove(fmt.Sprintf("%s[%d]", maps.CniMapPolicyDrops, i), func() error { return m.DeleteEndpoint(i) })
		}
	}
	return nil
}

// gcRules sweeps the rules of endpoints that are gone.
func gcRules(m *Maps, live *feature.Live, sw *feature.Sweep) error {
	if m.RuleMap == nil {
		return nil
	}
	rules, err := m.ReadRules()
	if err != nil {
		return err
	}
	for i, byDir := range rules {
		if live.IfIndex(int(i)) {
			continue
		}
		for d, entries := range byDir {
			prefixes := make([]netip.Prefix, len(entries))
			for j, e := range entries {
				prefixes[j] = e.Prefix
			}
			sw.Remove(fmt.Sprintf("%s[%d %s] (%d entries)", maps.CniMapPolicyRules, i, d, len(entries)), func() error {
				return m.DeleteRules(i, d, prefixes)
			})
		}
	}
	return nil
}

// Repair writes a live endpoint's first state again, as ADD did, where the
// endpoint's own restore is about to write its entries again (endpoint_devs
// lacks them: maps lost with the bpffs and not rescued), so that the pod is
// not reachable open where its namespace's policies isolate it. It names
// nothing: a pod open both ways has no state either, so none is missing.
func (Feature) Repair(n *node.Node, rp *feature.Repair) ([]string, error) {
	ep := rp.Endpoint
	if ep == nil || rp.DryRun || ep.MAC == "" {
		return nil, nil
	}
	devs, err := n.Map(maps.CniMapEndpointDevs)
	if err != nil {
		return nil, err
	}
	var d maps.CniEndpointDev
	if devs.Lookup(uint32(ep.HostIfIndex), &d) == nil {
		return nil, nil
	}
	m, err := MapsOf(n)
	if err != nil {
		return nil, err
	}
	return nil, start(m, ep)
}

// Commands: policy.
func (Feature) Commands() []*view.Command { return []*view.Command{command} }

// Columns: POLICY and POLICY DROPS of ebpf-cni endpoints.
func (Feature) Columns() *view.Columns { return columns }
