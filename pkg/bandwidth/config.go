// Package bandwidth is the per-pod rate limiting of ebpf-cni: its
// configuration (the keys of the reference bandwidth plugin), and the token
// buckets the programs police with (bw_buckets, bpf/lib/bandwidth.h).
package bandwidth

import (
	"encoding/json"
	"math"
	"strconv"

	"github.com/ebpf-cni/ebpf-cni/pkg/config"
)

// Entry is one set of limits, in the reference bandwidth plugin's keys:
// rates in bits per second, bursts in bits. A number is kept raw so a
// negative or fractional value is an error that names its key, not a
// decoding failure.
type Entry struct {
	IngressRate  *json.Number `json:"ingressRate,omitempty"`
	IngressBurst *json.Number `json:"ingressBurst,omitempty"`
	EgressRate   *json.Number `json:"egressRate,omitempty"`
	EgressBurst  *json.Number `json:"egressBurst,omitempty"`
}

func (e *Entry) empty() bool {
	return e == nil || (e.IngressRate == nil && e.IngressBurst == nil && e.EgressRate == nil && e.EgressBurst == nil)
}

// Limit is one direction's validated limit; Rate 0 means none.
type Limit struct {
	Rate  uint64 // bits per second
	Burst uint64 // bits: the most sent back to back above the rate
	// DefaultBurst: the configuration gave no usable burst (UnsetBurst or
	// more: a runtime's "not set"), so Burst is DefaultBurstBits(Rate).
	DefaultBurst bool
}

// Limits are a pod's validated limits.
type Limits struct {
	Egress, Ingress Limit
}

// Any reports whether a direction is limited.
func (l *Limits) Any() bool { return l != nil && (l.Egress.Rate > 0 || l.Ingress.Rate > 0) }

// Bounds of a rate: below 1 kbit/s a 64 KB packet would cost more than the
// bucket's 64-bit clock arithmetic holds; 1 Tbit/s is above any veth.
const (
	MinRate = 1_000
	MaxRate = 1_000_000_000_000
)

// UnsetBurst is the smallest burst read as "not set": kubelet sends
// math.MaxInt32 (256 MiB) when a pod sets only a rate, containerd's CRI
// math.MaxUint32 (512 MiB) for the kubernetes.io/ingress-bandwidth and
// egress-bandwidth annotations, CRI-O math.MaxUint32*8-1 (4 GiB; 8*MaxUint32
// before), others math.MaxUint64. Each means "no burst given"; honoured,
// any of them would let a pod send hundreds of MiB at full speed before the
// limit bites. Every burst from here up is the default burst: nobody asks
// for a quarter of a GiB at line rate on purpose, and a runtime's next
// "unlimited" spelling is covered too.
const UnsetBurst = math.MaxInt32

// maxBurstBits is the reference plugin's bound (burst/8 < 4 GiB), the
// largest burst a bucket must hold (bucket arithmetic is tested at it).
const maxBurstBits = 8 * (math.MaxUint32 - 1)

// Validate picks the limits of a call: the top-level keys when the
// configuration has any (the reference plugin's precedence), else
// runtimeConfig.bandwidth. Rate and burst come both or neither, are
// non-negative integers and bounded; zero means no limit.
func Validate(top, runtime *Entry) (*Limits, error) {
	e, prefix := top, ""
	if top.empty() {
		e, prefix = runtime, "runtimeConfig.bandwidth."
	}
	l := &Limits{}
	if e.empty() {
		return l, nil
	}
	var err error
	if l.Ingress, err = direction(prefix, "ingress", e.IngressRate, e.IngressBurst); err != nil {
		return nil, err
	}
	if l.Egress, err = direction(prefix, "egress", e.EgressRate, e.EgressBurst); err != nil {
		return nil, err
	}
	return l, nil
}

func direction(prefix, dir string, rate, burst *json.Number) (Limit, error) {
	rkey, bkey := prefix+dir+"Rate", prefix+dir+"Burst"
	r, err := number(rkey, rate)
	if err != nil {
		return Limit{}, err
	}
	b, err := number(bkey, burst)
	if err != nil {
		return Limit{}, err
	}
	switch {
	case r == 0 && b == 0:
		return Limit{}, nil
	case b == 0:
		return Limit{}, config.Invalid(bkey, "%s is set, so %s must be too (bits; 0 for both means no limit)", rkey, bkey)
	case r == 0:
		return Limit{}, config.Invalid(rkey, "%s is set, so %s must be too (bits per second; 0 for both means no limit)", bkey, rkey)
	case r < MinRate || r > MaxRate:
		return Limit{}, config.Invalid(rkey, "%d is outside %d..%d bits per second", r, MinRate, uint64(MaxRate))
	case b >= UnsetBurst:
		return Limit{Rate: r, Burst: DefaultBurstBits(r), DefaultBurst: true}, nil
	}
	return Limit{Rate: r, Burst: b}, nil
}

// number parses a non-negative integer (JSON may spell it 1e9).
func number(key string, n *json.Number) (uint64, error) {
	if n == nil {
		return 0, nil
	}
	s := n.String()
	if v, err := strconv.ParseUint(s, 10, 64); err == nil {
		return v, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || f != math.Trunc(f) {
		return 0, config.Invalid(key, "%s is not a non-negative integer", s)
	}
	if f >= math.MaxUint64 {
		return math.MaxUint64, nil // over any bound: the caller says which
	}
	return uint64(f), nil
}

// DefaultBurstBits is the burst of a limit configured without one: 200 ms
// at the rate, and never less than one 64 KiB GSO packet. Measured with
// iperf3 on veth: at 20 and 50 Mbit/s a 200 ms burst landed within 5% over
// 5 s, 10-50 ms bursts 5-16% below the rate (TCP stalls on drops, and a
// larger burst lets the flow make up more of that time).
func DefaultBurstBits(rate uint64) uint64 {
	return max(rate/5, 64*1024*8)
}
