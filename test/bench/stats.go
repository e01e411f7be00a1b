package main

import (
	"math"
	"slices"
)

// The three setups every row compares.
const (
	REF  = "ref"
	EBPF = "ebpf"
	RAW  = "raw"
)

var setups = []string{REF, EBPF, RAW}

// median of xs (the mean of the middle two for an even count); NaN if empty.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// percentile by nearest rank: the smallest sample with at least p of the
// samples at or below it (p in 0..1); NaN if empty. p99 of fewer than 100
// samples is their maximum, which is what a tail figure should say.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := int(math.Ceil(p * float64(len(s))))
	if rank < 1 {
		rank = 1
	}
	return s[rank-1]
}

// spreadPct is how noisy repeated runs were: (max-min)/median in percent;
// nil with fewer than two runs or a zero median.
func spreadPct(xs []float64) *float64 {
	if len(xs) < 2 {
		return nil
	}
	m := median(xs)
	if m == 0 || math.IsNaN(m) {
		return nil
	}
	v := (slices.Max(xs) - slices.Min(xs)) / math.Abs(m) * 100
	return &v
}

// ratio a/b; nil when either is missing or b is zero.
func ratio(a, b *float64) *float64 {
	if a == nil || b == nil || *b == 0 {
		return nil
	}
	v := *a / *b
	return &v
}

// gapClosed is the share of the distance from REF to RAW that EBPF covers,
// (EBPF-REF)/(RAW-REF), whichever direction is better: 1 means EBPF reaches
// the raw limit, 0 means no better than REF, below 0 worse than REF, above
// 1 beyond the limit. nil when a figure is missing or REF equals RAW.
func gapClosed(ref, ebpf, raw *float64) *float64 {
	if ref == nil || ebpf == nil || raw == nil || *raw == *ref {
		return nil
	}
	v := (*ebpf - *ref) / (*raw - *ref)
	return &v
}

// singleRunNoise is the difference, in percent, below which two single runs
// are not told apart.
const singleRunNoise = 10.0

// advantage is how many times better EBPF is than REF, whatever the metric's
// direction: above 1 EBPF is better. From the pooled ratio where the rounds
// gave one, else from the medians; nil when a figure is missing or zero.
func advantage(r Row) *float64 {
	return advantageOf(r, ebpfRef, r.Ref)
}

// advantageOf is advantage against the setup of the Paired key k, whose
// median is den.
func advantageOf(r Row, k string, den *float64) *float64 {
	v := ratio(r.EBPF, den)
	if p := r.Paired[k]; p != nil {
		v = &p.Ratio
	}
	if v == nil || *v == 0 {
		return nil
	}
	if r.Better == "lower" {
		inv := 1 / *v
		return &inv
	}
	return v
}

// verdict compares EBPF with REF: from the interval of the ratio judged by
// rounds where there is one (better, worse or cannot tell), else as
// before rounds were paired (noiseVerdict).
func verdict(r Row) string {
	if p := r.Paired[ebpfRef]; p != nil {
		return p.Verdict
	}
	return noiseVerdict(r)
}

// noiseVerdict compares EBPF with REF as the bench did before it paired
// rounds, for a latest.json of that time (and a row whose rounds gave no
// ratio): "better", "worse", or "noise" when the difference of the medians
// is smaller than the spread either measured (or, where both are single
// runs with no spread, under 10%); "" without both.
func noiseVerdict(r Row) string {
	adv := advantage(r)
	if adv == nil {
		return ""
	}
	diff := math.Abs(*adv-1) * 100
	noise := singleRunNoise
	if r.Spread[REF] != nil || r.Spread[EBPF] != nil {
		noise = 0
	}
	for _, s := range []string{REF, EBPF} {
		if p := r.Spread[s]; p != nil && *p > noise {
			noise = *p
		}
	}
	switch {
	case diff <= noise || diff < 1:
		return "noise"
	case *adv > 1:
		return "better"
	default:
		return "worse"
	}
}

// roundOrder is the order the n setups of a path run in round i: starting
// at setup i mod n and going up the list (wrapping around), or down it in
// every other cycle of n rounds. Over 2n rounds each setup takes each
// place equally often and runs before each other setup as often as after
// it, so neither the machine's drift nor a warm cache always favours the
// same one.
func roundOrder(n, round int) []int {
	step := 1
	if (round/n)%2 == 1 {
		step = n - 1 // -1 mod n
	}
	out := make([]int, n)
	for i := range out {
		out[i] = (round + i*step) % n
	}
	return out
}

// inRoundOrder is xs (the setups of a path, or their pairs) in the order
// of round.
func inRoundOrder[T any](xs []T, round int) []T {
	out := make([]T, 0, len(xs))
	for _, i := range roundOrder(len(xs), round) {
		out = append(out, xs[i])
	}
	return out
}

// t975 are the 0.975 quantiles of Student's t distribution for 1 to 30
// degrees of freedom (t975[df-1]): the half-width of a two-sided 95%
// interval in standard errors.
var t975 = []float64{
	12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
	2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
	2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
}

// tQuantile975 is the 0.975 quantile of Student's t with df degrees of
// freedom (df ≥ 1): from the table up to 30, beyond it from the
// Cornish-Fisher expansion around the normal quantile, which is within
// 1e-5 there.
func tQuantile975(df int) float64 {
	if df < 1 {
		return math.NaN()
	}
	if df <= len(t975) {
		return t975[df-1]
	}
	const z = 1.959963984540054 // the normal distribution's 0.975 quantile
	v := float64(df)
	z3, z5, z7 := z*z*z, z*z*z*z*z, z*z*z*z*z*z*z
	return z + (z3+z)/(4*v) + (5*z5+16*z3+3*z)/(96*v*v) + (3*z7+19*z5+17*z3-15*z)/(384*v*v*v)
}

// Verdicts of a ratio judged by its interval.
const (
	isBetter   = "better"
	isWorse    = "worse"
	cannotTell = "cannot tell"
)

// judge says whether an interval [lo, hi] of a ratio lies wholly on the
// good side of at (1 for EBPF against another setup), wholly on the bad
// side, or straddles it; which side is good follows the metric's
// direction ("higher" or "lower").
func judge(lo, hi, at float64, direction string) string {
	above, below := lo > at, hi < at
	if direction == "lower" {
		above, below = below, above
	}
	switch {
	case above:
		return isBetter
	case below:
		return isWorse
	default:
		return cannotTell
	}
}

// sample is one figure of a setup; round is the round it was measured in,
// or -1 when it was not measured beside the other setups (then it pairs
// with nothing).
type sample struct {
	round int
	v     float64
}

// Paired is a ratio judged by pairs: num's figure over den's within each
// round both were measured in, pooled.
type Paired struct {
	// Ratio is the geometric mean of the rounds' ratios.
	Ratio float64 `json:"ratio"`
	// CILow and CIHigh bound its 95% confidence interval, from the rounds'
	// log-ratios and Student's t; null with a single round.
	CILow  *float64 `json:"ci_low"`
	CIHigh *float64 `json:"ci_high"`
	// Rounds is how many rounds gave a ratio.
	Rounds int `json:"rounds"`
	// Verdict is "better" when the whole interval is on the good side of
	// 1 for the metric's direction, "worse" when it is wholly on the bad
	// side, "cannot tell" otherwise (and with a single round).
	Verdict string `json:"verdict"`
}

// pairRatio pools num/den over the rounds both have a positive figure in
// (a ratio of a zero has no logarithm); nil when there is none. direction
// is the metric's ("higher" or "lower").
func pairRatio(num, den []sample, direction string) *Paired {
	dens := map[int]float64{}
	for _, s := range den {
		if s.v > 0 {
			dens[s.round] = s.v
		}
	}
	var logs []float64
	for _, s := range num {
		if d, ok := dens[s.round]; ok && s.round >= 0 && s.v > 0 {
			logs = append(logs, math.Log(s.v/d))
		}
	}
	n := len(logs)
	if n == 0 {
		return nil
	}
	mean := 0.0
	for _, l := range logs {
		mean += l
	}
	mean /= float64(n)
	p := &Paired{Ratio: math.Exp(mean), Rounds: n, Verdict: cannotTell}
	if n < 2 {
		return p
	}
	ss := 0.0
	for _, l := range logs {
		ss += (l - mean) * (l - mean)
	}
	half := tQuantile975(n-1) * math.Sqrt(ss/float64(n-1)/float64(n))
	lo, hi := math.Exp(mean-half), math.Exp(mean+half)
	p.CILow, p.CIHigh = &lo, &hi
	p.Verdict = judge(lo, hi, 1, direction)
	return p
}
