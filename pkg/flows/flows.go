// Package flows reads and cleans the datapath's flow table: what it knows
// of pods' flows that netfilter (kube-proxy's Services, a chained portmap)
// may translate, and of flows opened toward pods (bpf/lib/flow.h). The
// programs write it; DEL, GC and the operator CLI read and prune it.
package flows

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

// VerdictNames names enum flow_verdict for people.
var VerdictNames = map[maps.CniFlowVerdict]string{
	maps.CniFlowVerdictFLOW_PENDING: "pending",
	maps.CniFlowVerdictFLOW_FAST:    "fast",
	maps.CniFlowVerdictFLOW_STACK:   "stack",
}

// Flow is one entry: a flow as the pod sends it.
type Flow struct {
	Proto      uint8
	Pod        net.IP
	PodPort    uint16
	Remote     net.IP
	RemotePort uint16
	Verdict    maps.CniFlowVerdict
	Inbound    bool // opened toward the pod: never masqueraded
	Untracked  bool // left the node without a conntrack entry (for a second, conntrack is not asked)
	Bypass     bool // set up in BPF: its first packet did not meet netfilter (the agent's set, xlat.go)
	Idle       time.Duration
}

// Table is the pinned flow table.
type Table struct{ m *ebpf.Map }

// Open is the call's node's table, created on first use (the node closes
// it).
func Open(n *node.Node) (*Table, error) {
	m, err := n.Map(maps.CniMapFlows)
	if err != nil {
		return nil, fmt.Errorf("opening the flow table: %w", err)
	}
	return &Table{m}, nil
}

type entry = maps.Entry[maps.CniFlowKey, maps.CniFlowEntry]

func (t *Table) entries() ([]entry, error) {
	es, err := maps.Entries[maps.CniFlowKey, maps.CniFlowEntry](t.m)
	if err != nil {
		return nil, fmt.Errorf("reading the flow table: %w", err)
	}
	return es, nil
}

// List returns every flow.
func (t *Table) List() ([]Flow, error) { return List(t.m) }

// List reads every flow of a flows map (opened read-only by the CLI).
func List(m *ebpf.Map) ([]Flow, error) {
	es, err := maps.Entries[maps.CniFlowKey, maps.CniFlowEntry](m)
	if err != nil {
		return nil, fmt.Errorf("reading the flow table: %w", err)
	}
	now := maps.Monotonic()
	out := make([]Flow, 0, len(es))
	for _, e := range es {
		f := Flow{Proto: e.Key.Proto, Pod: maps.IP(e.Key.Family, e.Key.Saddr), PodPort: maps.Port(e.Key.Sport),
			Remote: maps.IP(e.Key.Family, e.Key.Daddr), RemotePort: maps.Port(e.Key.Dport),
			Verdict: e.Value.Verdict, Inbound: e.Value.Flags&maps.CniFlowFlagsFLOW_F_INBOUND != 0,
			Untracked: e.Value.Flags&maps.CniFlowFlagsFLOW_F_UNTRACKED != 0, Bypass: e.Value.Flags&maps.CniFlowFlagsFLOW_F_BYPASS != 0}
		if now > e.Value.LastSeen {
			f.Idle = time.Duration(now - e.Value.LastSeen)
		}
		out = append(out, f)
	}
	return out, nil
}

// prune deletes the entries whose pod drop says so; it returns how many.
func (t *Table) prune(drop func(pod net.IP) bool) (int, error) {
	n, err := maps.DeleteMatching(t.m, func(k *maps.CniFlowKey, _ *maps.CniFlowEntry) bool { return drop(maps.IP(k.Family, k.Saddr)) })
	if err != nil {
		return n, fmt.Errorf("pruning the flow table: %w", err)
	}
	return n, nil
}

// FlushPod deletes the flows of the pod's addresses: a pod that gets one
// of them later inherits no verdict.
func (t *Table) FlushPod(ips []net.IP) (int, error) {
	return t.prune(func(pod net.IP) bool {
		for _, x := range ips {
			if pod.Equal(x) {
				return true
			}
		}
		return false
	})
}

// GC finds the flows of pods that are not live (the LRU ages the others)
// and, unless dryRun, deletes them; one line each, so a dry run lists
// what a real run removes.
func (t *Table) GC(live func(ip net.IP) bool, dryRun bool) ([]string, error) {
	es, err := t.entries()
	if err != nil {
		return nil, err
	}
	var found []string
	var errs []error
	for _, e := range es {
		pod := maps.IP(e.Key.Family, e.Key.Saddr)
		if live(pod) {
			continue
		}
		if !dryRun {
			if err := t.m.Delete(&e.Key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("deleting a flow of %s: %w", pod, err))
				continue
			}
		}
		found = append(found, describe(&e, "pod gone"))
	}
	return found, errors.Join(errs...)
}

// describe is GC's line for a flow.
func describe(e *entry, why string) string {
	proto := view.ProtoName(e.Key.Proto)
	ap := func(addr [16]uint8, port uint16) string {
		return view.AddrPort(maps.IP(e.Key.Family, addr), maps.Port(port))
	}
	return fmt.Sprintf("%s %s %s -> %s, %s (%s)", maps.CniMapFlows, proto, ap(e.Key.Saddr, e.Key.Sport), ap(e.Key.Daddr, e.Key.Dport),
		VerdictNames[e.Value.Verdict], why)
}
