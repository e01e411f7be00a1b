package bandwidth

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sort"
	"time"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// Flags are the endpoint flags (enum endpoint_flags) the limits need: the
// programs look the bucket up only for a direction that has one.
func (l *Limits) Flags() uint32 {
	var f uint32
	if l != nil && l.Egress.Rate > 0 {
		f |= uint32(maps.CniEndpointFlagsEP_F_BW_EGRESS)
	}
	if l != nil && l.Ingress.Rate > 0 {
		f |= uint32(maps.CniEndpointFlagsEP_F_BW_INGRESS)
	}
	return f
}

// bucket is the initial state of one direction: full (tat 0).
func bucket(l Limit, edt bool) maps.CniBwBucket {
	if l.Rate == 0 {
		return maps.CniBwBucket{}
	}
	b := maps.CniBwBucket{Rate: l.Rate, Burst: l.Burst, Recovery: uint64(recoveryCredit)}
	// ns per byte = 8e9 / rate, with BW_NS_SHIFT fraction bits.
	b.NsPerByte = (uint64(8_000_000_000) << maps.CniBwConstBW_NS_SHIFT) / l.Rate
	// tau = burst * 1e9 / rate ns, in 128 bits: a 4 GiB burst at 1 kbit/s
	// is longer than 64 bits of nanoseconds; it saturates.
	hi, lo := bits.Mul64(l.Burst, 1_000_000_000)
	if hi >= l.Rate {
		b.Tau = math.MaxInt64
	} else {
		b.Tau, _ = bits.Div64(hi, lo, l.Rate)
		b.Tau = min(b.Tau, math.MaxInt64)
	}
	if edt {
		b.Flags |= uint64(maps.CniBwFlagsBW_F_EDT)
	}
	return b
}

// recoveryCredit is how much unused time a flow stalled by drops keeps as
// credit (bpf/lib/bandwidth.h): TCP's first retransmission timeout.
var recoveryCredit = 500 * time.Millisecond

// Table is the pinned bw_buckets map.
type Table struct{ m *ebpf.Map }

// TableOf is the bucket map of the call's node (which closes it).
func TableOf(n *node.Node) (*Table, error) {
	m, err := n.Map(maps.CniMapBwBuckets)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", maps.CniMapBwBuckets, err)
	}
	return &Table{m: m}, nil
}

// Put writes full buckets for the pod behind host veth ifindex. edt: the
// host veth has fq, so the stack path paces its ingress instead of
// dropping.
func (t *Table) Put(ifindex int, l *Limits, edt bool) error {
	v := maps.CniBwState{Egress: bucket(l.Egress, false), Ingress: bucket(l.Ingress, edt)}
	if err := t.m.Put(uint32(ifindex), &v); err != nil {
		return fmt.Errorf("writing %s[%d]: %w", maps.CniMapBwBuckets, ifindex, err)
	}
	return nil
}

// Has reports whether the pod behind host veth ifindex has its buckets.
func (t *Table) Has(ifindex int) bool {
	var v maps.CniBwState
	return t.m.Lookup(uint32(ifindex), &v) == nil
}

// Delete removes the pod's buckets; gone already is success.
func (t *Table) Delete(ifindex int) error {
	if err := t.m.Delete(uint32(ifindex)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("deleting %s[%d]: %w", maps.CniMapBwBuckets, ifindex, err)
	}
	return nil
}

// Check names every difference between the pod's buckets and l.
func (t *Table) Check(ifindex int, l *Limits) []string {
	var v maps.CniBwState
	err := t.m.Lookup(uint32(ifindex), &v)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		if l.Any() {
			return []string{fmt.Sprintf("no %s entry for ifindex %d (limits configured)", maps.CniMapBwBuckets, ifindex)}
		}
		return nil
	}
	if err != nil {
		return []string{fmt.Sprintf("reading %s[%d]: %v", maps.CniMapBwBuckets, ifindex, err)}
	}
	var problems []string
	for _, d := range []struct {
		name string
		got  maps.CniBwBucket
		want Limit
	}{{"egress", v.Egress, l.Egress}, {"ingress", v.Ingress, l.Ingress}} {
		want := bucket(d.want, false)
		if d.got.Rate != want.Rate || d.got.Burst != want.Burst || d.got.NsPerByte != want.NsPerByte || d.got.Tau != want.Tau {
			problems = append(problems, fmt.Sprintf("%s[%d] %s is rate %d burst %d, want rate %d burst %d",
				maps.CniMapBwBuckets, ifindex, d.name, d.got.Rate, d.got.Burst, want.Rate, want.Burst))
		}
	}
	return problems
}

// State is one pod's buckets, for dumps.
type State struct {
	IfIndex int
	maps.CniBwState
}

// List returns every entry, by ifindex.
func (t *Table) List() ([]State, error) {
	var out []State
	var k uint32
	var v maps.CniBwState
	it := t.m.Iterate()
	for it.Next(&k, &v) {
		out = append(out, State{int(k), v})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterating %s: %w", maps.CniMapBwBuckets, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].IfIndex < out[j].IfIndex })
	return out, nil
}
