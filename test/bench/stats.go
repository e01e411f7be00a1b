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
// direction: above 1 EBPF is better. nil when a figure is missing or zero.
func advantage(r Row) *float64 {
	if r.Better == "lower" {
		return ratio(r.Ref, r.EBPF)
	}
	return ratio(r.EBPF, r.Ref)
}

// verdict compares EBPF with REF: "better", "worse", or "noise" when the
// difference is smaller than the spread either measured (or, where both
// are single runs with no spread, under 10%); "" without both.
func verdict(r Row) string {
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
