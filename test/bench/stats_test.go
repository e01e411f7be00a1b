package main

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"slices"
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

// tCDF0 is P(0 < T < q) for Student's t with df degrees of freedom, by
// Simpson's rule over its density: an independent check of the table.
func tCDF0(df int, q float64) float64 {
	v := float64(df)
	lg1, _ := math.Lgamma((v + 1) / 2)
	lg2, _ := math.Lgamma(v / 2)
	c := math.Exp(lg1-lg2) / math.Sqrt(v*math.Pi)
	pdf := func(t float64) float64 { return c * math.Pow(1+t*t/v, -(v+1)/2) }
	const n = 4000 // even
	h := q / n
	sum := pdf(0) + pdf(q)
	for i := 1; i < n; i++ {
		w := 2.0
		if i%2 == 1 {
			w = 4
		}
		sum += w * pdf(float64(i)*h)
	}
	return sum * h / 3
}

// TestTQuantile975: the quantile is where 2.5% of Student's t lies beyond
// (found by bisection over the density), to the table's four decimals,
// for the table's degrees of freedom and the expansion's beyond it.
func TestTQuantile975(t *testing.T) {
	for _, df := range []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
		21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 35, 40, 60, 120, 1000} {
		lo, hi := 0.0, 20.0
		for range 40 {
			if mid := (lo + hi) / 2; tCDF0(df, mid) < 0.475 {
				lo = mid
			} else {
				hi = mid
			}
		}
		require.InDelta(t, lo, tQuantile975(df), 6e-5, "df %d", df)
	}
	for df := 2; df <= 200; df++ {
		require.Less(t, tQuantile975(df), tQuantile975(df-1), "the quantile shrinks with df (%d)", df)
	}
	require.InDelta(t, 1.96, tQuantile975(100000), 1e-4, "the normal's at infinity")
	require.True(t, math.IsNaN(tQuantile975(0)), "no interval from one round")
}

func TestJudge(t *testing.T) {
	for _, tc := range []struct {
		lo, hi    float64
		direction string
		want      string
	}{
		{1.02, 1.10, "higher", isBetter},
		{0.90, 0.99, "higher", isWorse},
		{0.98, 1.03, "higher", cannotTell},
		{1.00, 1.05, "higher", cannotTell}, // touching 1 is not above it
		{0.90, 0.99, "lower", isBetter},    // lower is better: below 1x wins
		{1.02, 1.10, "lower", isWorse},
		{0.98, 1.03, "lower", cannotTell},
		{0.95, 1.00, "lower", cannotTell},
	} {
		require.Equal(t, tc.want, judge(tc.lo, tc.hi, 1, tc.direction), "%v–%v %s", tc.lo, tc.hi, tc.direction)
	}
	require.Equal(t, isWorse, judge(1.3, 1.5, 1.6, "higher"), "against another mark than 1x")
	require.Equal(t, isBetter, judge(1.7, 1.9, 1.6, "higher"))
}

func rounds(vs ...float64) []sample {
	out := make([]sample, len(vs))
	for i, v := range vs {
		out[i] = sample{i, v}
	}
	return out
}

func TestPairRatio(t *testing.T) {
	// The machine halves and doubles its speed between rounds, EBPF stays
	// 10% ahead within each: the pooled ratio is 1.1 with no doubt,
	// though the medians' spread is far larger.
	p := pairRatio(rounds(110, 220, 55, 110), rounds(100, 200, 50, 100), "higher")
	require.InDelta(t, 1.1, p.Ratio, 1e-9)
	require.InDelta(t, 1.1, *p.CILow, 1e-9)
	require.InDelta(t, 1.1, *p.CIHigh, 1e-9)
	require.Equal(t, 4, p.Rounds)
	require.Equal(t, isBetter, p.Verdict)
	require.Equal(t, isWorse, pairRatio(rounds(110, 220, 55, 110), rounds(100, 200, 50, 100), "lower").Verdict, "a latency 10% higher")

	// Two rounds, ratios e^0.1 and e^-0.1: geometric mean 1, standard
	// error 0.1 (sd 0.1·√2 over √2), half-width t(1)·0.1 in logs.
	e := math.Exp(0.1)
	p = pairRatio(rounds(e, 1/e), rounds(1, 1), "higher")
	require.InDelta(t, 1.0, p.Ratio, 1e-12)
	require.InDelta(t, math.Exp(-12.7062*0.1), *p.CILow, 1e-9)
	require.InDelta(t, math.Exp(12.7062*0.1), *p.CIHigh, 1e-9)
	require.Equal(t, cannotTell, p.Verdict)

	// The geometric mean, not the ratio of means or of medians.
	p = pairRatio(rounds(2, 8), rounds(1, 1), "higher")
	require.InDelta(t, 4.0, p.Ratio, 1e-12)

	// Pairs by round, whatever order the figures came in; a figure of no
	// round, a round one side lacks and a zero pair with nothing.
	num := []sample{{2, 30}, {0, 10}, {1, 20}, {-1, 1000}, {3, 0}}
	den := []sample{{1, 10}, {2, 15}, {0, 5}, {3, 7}, {4, 9}, {-1, 1}}
	p = pairRatio(num, den, "higher")
	require.Equal(t, 3, p.Rounds)
	require.InDelta(t, 2.0, p.Ratio, 1e-12)
	require.InDelta(t, 2.0, *p.CILow, 1e-12)

	one := pairRatio(rounds(5), rounds(4), "higher")
	require.InDelta(t, 1.25, one.Ratio, 1e-12)
	require.Nil(t, one.CILow, "no interval from one round")
	require.Equal(t, cannotTell, one.Verdict, "one round cannot tell")
	require.Nil(t, pairRatio([]sample{{-1, 5}}, []sample{{-1, 4}}, "higher"), "figures of no round do not pair")
	require.Nil(t, pairRatio(rounds(5), nil, "higher"))
}

// TestPairRatioInterval: over many simulated runs, the 95% interval of
// rounds with noise holds the true ratio about 95% of the time (a wrong t
// or standard error moves this far off).
func TestPairRatioInterval(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const trials, n, truth = 4000, 5, 1.05
	held := 0
	for range trials {
		var num, den []sample
		for r := range n {
			drift := math.Exp(rng.NormFloat64() * 0.3) // the machine's speed this round
			num = append(num, sample{r, truth * drift * math.Exp(rng.NormFloat64()*0.03)})
			den = append(den, sample{r, drift * math.Exp(rng.NormFloat64()*0.03)})
		}
		p := pairRatio(num, den, "higher")
		if *p.CILow <= truth && truth <= *p.CIHigh {
			held++
		}
	}
	require.InDelta(t, 0.95, float64(held)/trials, 0.015)
}

func TestRoundOrder(t *testing.T) {
	for n := 1; n <= 4; n++ {
		place := map[[2]int]int{}  // {setup, place} -> rounds
		before := map[[2]int]int{} // {a, b} -> rounds a ran before b
		for round := range 2 * n {
			o := roundOrder(n, round)
			require.Len(t, o, n)
			require.Equal(t, round%n, o[0], "n %d: round %d starts at setup round mod n", n, round)
			seen := map[int]bool{}
			for i, s := range o {
				require.False(t, seen[s], "n %d round %d: %v repeats a setup", n, round, o)
				seen[s] = true
				place[[2]int{s, i}]++
				for _, later := range o[i+1:] {
					before[[2]int{s, later}]++
				}
			}
		}
		for a := range n {
			for i := range n {
				require.Equal(t, 2, place[[2]int{a, i}], "n %d: setup %d in place %d", n, a, i)
			}
			for b := range n {
				if a != b {
					require.Equal(t, n, before[[2]int{a, b}], "n %d: %d before %d in half the rounds", n, a, b)
				}
			}
		}
	}
	require.Equal(t, []string{"ebpf", "raw", "ref"}, inRoundOrder(setups, 1))
	require.Equal(t, []string{"ref", "raw", "ebpf"}, inRoundOrder(setups, 3), "the second cycle goes down the list")
}

// TestRowsPaired: the rows keep the medians and gain the ratios of the
// rounds: EBPF over REF and RAW where they shared rounds, none over a RAW
// measured apart, and a setup's throughput at concurrency 8 over its own
// at 1 in the same round; latest.json carries them.
func TestRowsPaired(t *testing.T) {
	rs := newResults()
	for round, v := range [][3]float64{{100, 120, 150}, {50, 61, 74}, {200, 236, 310}} { // REF, EBPF, RAW
		for i, s := range setups {
			rs.addRound("p", "crr_cps", "conn/s", "higher", s, round, v[i])
			rs.addRound("cni", "pods_per_s", "ADD+DEL/s", "higher", s, round, v[i]/10)
			rs.addRound("cni", "pods_per_s_c8", "ADD+DEL/s", "higher", s, round, v[i]/10*float64(2+round%2))
		}
		rs.addRound("h", "crr_cps", "conn/s", "higher", REF, round, v[0])
		rs.addRound("h", "crr_cps", "conn/s", "higher", EBPF, round, v[1])
		rs.add("h", "crr_cps", "conn/s", "higher", RAW, v[2]) // measured at another N
	}
	rows := rs.Rows()
	get := func(path, metric string) Row {
		i := slices.IndexFunc(rows, func(r Row) bool { return r.Path == path && r.Metric == metric })
		require.GreaterOrEqual(t, i, 0, "%s %s", path, metric)
		return rows[i]
	}
	r := get("p", "crr_cps")
	require.Equal(t, 120.0, *r.EBPF, "the median stays")
	ref := r.Paired[ebpfRef]
	require.NotNil(t, ref)
	require.Equal(t, 3, ref.Rounds)
	require.InDelta(t, math.Cbrt(1.2*1.22*1.18), ref.Ratio, 1e-3)
	require.Equal(t, isBetter, ref.Verdict)
	require.NotNil(t, r.Paired[ebpfRaw])
	require.Equal(t, isWorse, r.Paired[ebpfRaw].Verdict)
	require.NotContains(t, r.Paired, concKey(EBPF), "only a concurrency row has c8/c1")

	h := get("h", "crr_cps")
	require.NotNil(t, h.Paired[ebpfRef])
	require.NotContains(t, h.Paired, ebpfRaw, "a RAW measured apart pairs with nothing")

	c8 := get("cni", "pods_per_s_c8")
	for _, s := range setups {
		p := c8.Paired[concKey(s)]
		require.NotNil(t, p, s)
		require.InDelta(t, math.Cbrt(2*3*2), p.Ratio, 1e-3, s)
		require.Equal(t, 3, p.Rounds)
	}
	require.NotContains(t, get("cni", "pods_per_s").Paired, concKey(EBPF))

	out, err := json.Marshal(rows)
	require.NoError(t, err)
	var back []Row
	require.NoError(t, json.Unmarshal(out, &back))
	require.Len(t, back, len(rows))
	for i := range rows {
		require.Equal(t, rows[i].Paired, back[i].Paired, "latest.json keeps the paired ratios of %s", rows[i].Metric)
	}
	require.Contains(t, string(out), `"paired":{"ebpf/raw":{"ratio":`)
	for _, k := range []string{`"ci_low":`, `"ci_high":`, `"rounds":3`, `"verdict":"better"`, `"ebpf:c8/c1":`} {
		require.Contains(t, string(out), k)
	}
}

// TestCRRDone: the CRR rounds are spread evenly between the rounds of RR
// and TCP, and all of them run, whichever there are more of.
func TestCRRDone(t *testing.T) {
	for _, tc := range []struct {
		runs, crr int
		want      []int
	}{
		{5, 20, []int{4, 8, 12, 16, 20}},
		{3, 6, []int{2, 4, 6}},
		{3, 8, []int{2, 5, 8}},
		{5, 2, []int{0, 0, 1, 1, 2}},
		{1, 2, []int{2}},
	} {
		c := config{runs: tc.runs, crrRounds: tc.crr}
		var got []int
		for run := range tc.runs {
			got = append(got, c.crrDone(run))
		}
		require.Equal(t, tc.want, got, "%d runs, %d CRR rounds", tc.runs, tc.crr)
	}
}
