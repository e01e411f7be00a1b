package main

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func f(v float64) *float64 { return &v }

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{-1, -3}, -2},
	} {
		require.Equal(t, tc.want, median(tc.in), "%v", tc.in)
	}
	require.True(t, math.IsNaN(median(nil)))
	in := []float64{3, 1, 2}
	median(in)
	require.Equal(t, []float64{3, 1, 2}, in, "median must not reorder its input")
}

func TestPercentile(t *testing.T) {
	hundred := make([]float64, 100)
	for i := range hundred {
		hundred[i] = float64(100 - i) // 100..1, unsorted
	}
	require.Equal(t, 50.0, percentile(hundred, .50))
	require.Equal(t, 99.0, percentile(hundred, .99))
	require.Equal(t, 100.0, percentile(hundred, 1))
	require.Equal(t, 1.0, percentile(hundred, 0))
	// p99 of fewer than 100 samples is the largest: a tail figure must not
	// hide the worst sample it has.
	require.Equal(t, 10.0, percentile([]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, .99))
	require.Equal(t, 7.0, percentile([]float64{7}, .99))
	require.True(t, math.IsNaN(percentile(nil, .5)))
}

func TestSpreadPct(t *testing.T) {
	require.Nil(t, spreadPct(nil))
	require.Nil(t, spreadPct([]float64{5}), "one run has no spread")
	require.Nil(t, spreadPct([]float64{0, 0}), "zero median")
	require.InDelta(t, 20.0, *spreadPct([]float64{90, 100, 110}), 1e-9)
	require.InDelta(t, 0.0, *spreadPct([]float64{4, 4}), 1e-9)
}

func TestRatioAndGap(t *testing.T) {
	require.Nil(t, ratio(nil, f(1)))
	require.Nil(t, ratio(f(1), nil))
	require.Nil(t, ratio(f(1), f(0)))
	require.InDelta(t, 1.5, *ratio(f(3), f(2)), 1e-9)

	for _, tc := range []struct {
		name           string
		ref, ebpf, raw *float64
		want           *float64
	}{
		{"missing ebpf", f(10), nil, f(20), nil},
		{"missing raw", f(10), f(15), nil, nil},
		{"missing ref", nil, f(15), f(20), nil},
		{"raw equals ref", f(10), f(15), f(10), nil},
		{"half way, higher is better", f(10), f(15), f(20), f(.5)},
		{"at the limit", f(10), f(20), f(20), f(1)},
		{"worse than ref", f(10), f(5), f(20), f(-.5)},
		{"half way, lower is better", f(40), f(30), f(20), f(.5)},
		{"beyond the limit", f(40), f(10), f(20), f(1.5)},
	} {
		got := gapClosed(tc.ref, tc.ebpf, tc.raw)
		if tc.want == nil {
			require.Nil(t, got, tc.name)
			continue
		}
		require.NotNil(t, got, tc.name)
		require.InDelta(t, *tc.want, *got, 1e-9, tc.name)
	}
}

func TestAdvantageAndVerdict(t *testing.T) {
	hi := Row{Better: "higher", Ref: f(100), EBPF: f(150)}
	require.InDelta(t, 1.5, *advantage(hi), 1e-9)
	require.Equal(t, "better", verdict(hi))
	lo := Row{Better: "lower", Ref: f(100), EBPF: f(150)}
	require.InDelta(t, 2.0/3, *advantage(lo), 1e-9)
	require.Equal(t, "worse", verdict(lo))
	lo.Spread = map[string]*float64{EBPF: f(60)}
	require.Equal(t, "noise", verdict(lo), "a difference inside the runs' spread is noise")
	require.Equal(t, "", verdict(Row{Better: "higher", Ref: f(1)}), "no EBPF figure, no verdict")
	require.Equal(t, "noise", verdict(Row{Better: "higher", Ref: f(100), EBPF: f(100.5)}))
}

func TestRowsNullHandling(t *testing.T) {
	rs := newResults()
	rs.declare("p", "m", "ms", "lower")
	rs.add("p", "m", "ms", "lower", REF, 10)
	rs.add("p", "m", "ms", "lower", REF, 12)
	rs.add("p", "m", "ms", "lower", REF, 11)
	rs.add("p", "m", "ms", "lower", RAW, 2)
	rs.skip("p", "m", "ms", "lower", EBPF, notImplemented)
	rs.add("p", "first", "x", "higher", EBPF, 1) // declared later, listed later
	rows := rs.Rows()
	require.Len(t, rows, 2)
	r := rows[0]
	require.Equal(t, "m", r.Metric)
	require.Equal(t, 11.0, *r.Ref)
	require.Nil(t, r.EBPF)
	require.Equal(t, 2.0, *r.Raw)
	require.Equal(t, notImplemented, r.Null[EBPF])
	require.Equal(t, 3, r.Runs[REF])
	require.InDelta(t, 18.18, *r.Spread[REF], .01)
	require.Nil(t, r.Spread[RAW], "one run has no spread")
	require.Equal(t, "not measured", rows[1].Null[REF])
}

func TestReport(t *testing.T) {
	rows := []Row{
		{Path: "cni", Metric: "add_p50_ms", Unit: "ms", Better: "lower", Ref: f(30), EBPF: f(45), Raw: f(2),
			Spread: map[string]*float64{REF: f(5), EBPF: f(5)}},
		{Path: "pod-to-pod", Metric: "rr_tps", Unit: "tx/s", Better: "higher", Ref: f(30000), EBPF: f(36000), Raw: f(37000)},
		{Path: "masquerade", Metric: "rr_tps", Unit: "tx/s", Better: "higher", Ref: f(30000), Raw: f(37000),
			Null: map[string]string{EBPF: notImplemented}},
	}
	rp := report{Rows: rows, Profile: "quick", Runs: 3, Note: "a quick run"}
	md := rp.markdown()
	for _, want := range []string{
		"## cni", "## pod-to-pod", "## masquerade", "> a quick run",
		"| add_p50_ms | ms | lower | 30.0 | 45.0 | 2.00 | 1.50x | 22.50x | -54% |", // gap (45-30)/(2-30)
		"| rr_tps | tx/s | higher | 30,000 | 36,000 | 37,000 | 1.20x | 0.97x | 86% |",
		"EBPF: " + notImplemented + " (rr_tps)",
		"**Worse:** `cni add_p50_ms` 45.0 vs 30.0 ms (1.50x).",
		"Not measured for EBPF, " + notImplemented + ": masquerade.",
	} {
		require.Contains(t, md, want)
	}
	require.NotContains(t, md, "`pod-to-pod rr_tps`", "a win is not listed as a loss")
	require.True(t, strings.Contains(rp.summary(), "pod-to-pod"))
}

func TestFmtNum(t *testing.T) {
	for v, want := range map[float64]string{12345.6: "12,346", 123.4: "123", 12.34: "12.3", 1.234: "1.23", 0.01234: "0.0123", 0: "0", -2500: "-2,500"} {
		require.Equal(t, want, fmtNum(v), "%v", v)
	}
}
