package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestClosingNoteGroupsByCause: the "where EBPF loses" list says each
// cause once, with every row it explains, worse rows apart from rows within
// noise, and leaves out rows where EBPF is better.
func TestClosingNoteGroupsByCause(t *testing.T) {
	row := func(path, metric string, ref, ebpf, spread float64) Row {
		return Row{Path: path, Metric: metric, Unit: "%", Better: "lower", Ref: f(ref), EBPF: f(ebpf),
			Spread: map[string]*float64{REF: f(spread), EBPF: f(spread)}}
	}
	rows := []Row{
		row("bandwidth", "in_err_10mbit_pct", 4, 8, 5),
		row("bandwidth", "in_first_s_err_10mbit_pct", 4, 20, 5),
		row("bandwidth", "in_err_100mbit_pct", 4, 4.2, 20), // within noise
		row("bandwidth", "err_10mbit_pct", 4, 3, 5),        // EBPF better
		row("cni", "add_cold_ms", 60, 400, 5),
	}
	note := report{Rows: rows}.closingNote()
	t.Log(note)
	policed := causes["policed"]
	require.Equal(t, 1, strings.Count(note, policed.why), "the cause's explanation once")
	require.Equal(t, 1, strings.Count(note, "### "+policed.title))
	require.Equal(t, 1, strings.Count(note, causes["add_cold"].why))
	for _, m := range []string{"in_err_10mbit_pct", "in_first_s_err_10mbit_pct", "in_err_100mbit_pct", "add_cold_ms"} {
		require.Equal(t, 1, strings.Count(note, " "+m+"`"), "row %s listed once", m)
	}
	require.NotContains(t, note, "`bandwidth err_10mbit_pct`", "a row where EBPF is better is not a loss")
	worse, noise, _ := strings.Cut(note[strings.Index(note, "### "+policed.title):], "*Within noise:*")
	require.Contains(t, worse, "in_first_s_err_10mbit_pct")
	require.Contains(t, strings.SplitN(noise, "\n", 2)[0], "in_err_100mbit_pct")
	require.Equal(t, "unknown", causeOf(Row{Path: "new-path", Metric: "x"}), "a row no cause explains says so")
}

// TestCommittedReportIsRendered: the committed REPORT.md and plots are what
// the report code renders from the committed latest.json and machine.json,
// so a change to the report's text reaches the committed report. After
// changing report.go or plot.go: go run ./test/bench -render test/bench/results
func TestCommittedReportIsRendered(t *testing.T) {
	committed := filepath.Join("results")
	dir := t.TempDir()
	for _, f := range []string{"latest.json", "machine.json"} {
		b, err := os.ReadFile(filepath.Join(committed, f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
	require.NoError(t, renderResults(dir))
	pngs, err := filepath.Glob(filepath.Join(dir, "*.png"))
	require.NoError(t, err)
	for _, f := range append([]string{filepath.Join(dir, "REPORT.md")}, pngs...) {
		want, err := os.ReadFile(f)
		require.NoError(t, err)
		got, err := os.ReadFile(filepath.Join(committed, filepath.Base(f)))
		require.NoError(t, err, "%s is rendered but not committed", filepath.Base(f))
		require.True(t, bytes.Equal(want, got), "test/bench/results/%s is stale: go run ./test/bench -render test/bench/results", filepath.Base(f))
	}
	committedPNGs, err := filepath.Glob(filepath.Join(committed, "*.png"))
	require.NoError(t, err)
	require.Len(t, committedPNGs, len(pngs), "a committed plot the report no longer draws")
}

// TestMonitorComparison: the monitor path's verdicts compare the stream on
// with off: run time per packet against the 5% budget (undecided when the
// growth is within the noise), RR/CRR against the runs' noise.
func TestMonitorComparison(t *testing.T) {
	row := func(metric, better string, v, spread float64) Row {
		return Row{Path: monitorPath, Metric: metric, Unit: "x", Better: better, EBPF: f(v), Spread: map[string]*float64{EBPF: f(spread)}}
	}
	rows := []Row{
		row("bpf_rr_p_ns_pkt_off", "lower", 100, 2), row("bpf_rr_p_ns_pkt_on", "lower", 104, 2), // +4%: within
		row("bpf_crr_p_ns_pkt_off", "lower", 100, 2), row("bpf_crr_p_ns_pkt_on", "lower", 120, 2), // +20%: over
		row("bpf_x_ns_pkt_off", "lower", 100, 30), row("bpf_x_ns_pkt_on", "lower", 120, 30), // +20% in 30% noise
		row("rr_tps_off", "higher", 1000, 3), row("rr_tps_on", "higher", 980, 3), // -2%: noise
		row("crr_cps_off", "higher", 1000, 3), row("crr_cps_on", "higher", 800, 3), // -20%: worse
	}
	out := monitorComparison(rows)
	t.Log(out)
	line := func(base string) string {
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "| "+base+" |") {
				return l
			}
		}
		t.Fatalf("no line for %s", base)
		return ""
	}
	require.Contains(t, line("bpf_rr_p_ns_pkt"), "within the 5% budget")
	require.Contains(t, line("bpf_crr_p_ns_pkt"), "over the 5% budget")
	require.Contains(t, line("bpf_x_ns_pkt"), "less than the noise")
	require.Contains(t, line("rr_tps"), "within noise")
	require.Contains(t, line("crr_cps"), "worse")
	require.Contains(t, out, "**Over the 5% budget:** bpf_crr_p_ns_pkt.")
	require.Contains(t, out, "**Worse beyond noise with the stream on:** crr_cps.")
	require.Contains(t, out, "*Undecided:* bpf_x_ns_pkt")
	require.Empty(t, monitorComparison(rows[:0]), "nothing to say without the path")
}

func paired(ratio, lo, hi float64, rounds int, verdict string) *Paired {
	return &Paired{Ratio: ratio, CILow: f(lo), CIHigh: f(hi), Rounds: rounds, Verdict: verdict}
}

// TestReportPaired: a run with paired rounds shows each ratio as pooled
// with its interval, says better, worse or cannot tell from the interval
// and not from the medians, lists the rows it cannot tell apart, and
// judges concurrency by throughput against the aim.
func TestReportPaired(t *testing.T) {
	rows := []Row{
		// The medians favour EBPF; the rounds' ratios do not.
		{Path: "masquerade", Metric: "crr_cps", Unit: "conn/s", Better: "higher", Ref: f(5000), EBPF: f(5100), Raw: f(6000),
			Paired: map[string]*Paired{ebpfRef: paired(0.95, 0.92, 0.98, 20, isWorse), ebpfRaw: paired(0.83, 0.80, 0.86, 20, isWorse)}},
		{Path: "masquerade", Metric: "rr_tps", Unit: "tx/s", Better: "higher", Ref: f(20000), EBPF: f(19800), Raw: f(20500),
			Paired: map[string]*Paired{ebpfRef: paired(0.99, 0.90, 1.08, 5, cannotTell), ebpfRaw: paired(0.97, 0.93, 1.01, 5, cannotTell)}},
		// The medians favour EBPF, the pooled ratio is nominally worse.
		{Path: "masquerade", Metric: "tcp_gbps", Unit: "Gbit/s", Better: "higher", Ref: f(11.5), EBPF: f(12), Raw: f(13),
			Paired: map[string]*Paired{ebpfRef: paired(0.98, 0.94, 1.02, 5, cannotTell), ebpfRaw: paired(0.93, 0.90, 0.96, 5, isWorse)}},
		{Path: "masquerade", Metric: "cpu_us_per_conn", Unit: "µs", Better: "lower", Ref: f(180), EBPF: f(170), Raw: f(150),
			Paired: map[string]*Paired{ebpfRef: paired(0.94, 0.91, 0.97, 20, isBetter)}},
		{Path: "cni", Metric: "pods_per_s", Unit: "ADD+DEL/s", Better: "higher", Ref: f(4), EBPF: f(18), Raw: f(44),
			Paired: map[string]*Paired{ebpfRef: paired(4.5, 4.2, 4.8, 3, isBetter)}},
		{Path: "cni", Metric: "pods_per_s_c8", Unit: "ADD+DEL/s", Better: "higher", Ref: f(4.7), EBPF: f(32), Raw: f(170),
			Paired: map[string]*Paired{ebpfRef: paired(6.8, 6.5, 7.1, 3, isBetter),
				concKey(REF): paired(1.18, 0.97, 1.43, 3, cannotTell), concKey(EBPF): paired(1.80, 1.65, 1.96, 3, isBetter)}},
	}
	rp := report{Rows: rows, Profile: "full", Runs: 5, Dur: 3 * time.Second, CRRRounds: 20, CRRDur: 750 * time.Millisecond, CNIRounds: 3}
	md := rp.markdown()
	t.Log(md)
	for _, want := range []string{
		"5 rounds of 3s per RR and TCP figure, 20 of 750ms per CRR figure, 3 of the cni paths' churn",
		"every round runs the setups back to back, in an order that rotates",
		"| crr_cps | conn/s | higher | 5,000 | 5,100 | 6,000 | 0.95x (0.92–0.98) | 0.83x (0.80–0.86) | 10% | 1 run / 1 run / 1 run | 20 | ❌ worse | worse |",
		"| rr_tps | tx/s | higher | 20,000 | 19,800 | 20,500 | 0.99x (0.90–1.08) | 0.97x (0.93–1.01) |",
		"| 5 | ≈ cannot tell | cannot tell |",
		"| cpu_us_per_conn | µs | lower | 180 | 170 | 150 | 0.94x (0.91–0.97) | 1.13x |", // no pairs with RAW: the medians
		"| 20 | ✅ better |  |",
		"**Worse:** `masquerade crr_cps` 5,100 vs 5,000 conn/s (0.95x (0.92–0.98)).",
		"*Cannot tell:* `masquerade rr_tps` 19,800 vs 20,000 tx/s (0.99x (0.90–1.08)); `masquerade tcp_gbps` 12.0 vs 11.5 Gbit/s (0.98x (0.94–1.02)).",
		"Concurrency, judged by throughput: `pods_per_s_c8` over `pods_per_s`",
		"| REF | 1.18x (0.97–1.43) | 3 | cannot tell |  |",
		"| EBPF | 1.80x (1.65–1.96) | 3 | better | ✅ met (interval above 1.6x) |",
		"| RAW | 3.86x | – |  |  |", // no rounds: the medians, 170/44
	} {
		require.Contains(t, md, want)
	}
	require.NotContains(t, md, "`masquerade cpu_us_per_conn`", "a row better by its interval is not a loss")
	require.Equal(t, "datapath", causeOf(rows[0]), "worse by the interval is not the machine's spread")
	require.Equal(t, "spread", causeOf(rows[1]))
	require.Equal(t, "spread", causeOf(rows[2]))
	require.Equal(t, 1, strings.Count(md, "Concurrency, judged by throughput"), "on the path that has the rows")
	require.Contains(t, rp.summary(), "0.95x (0.92–0.98)")

	for _, tc := range []struct {
		p    *Paired
		want string
	}{
		{paired(1.5, 1.3, 1.7, 3, isBetter), cannotTell},
		{paired(1.4, 1.3, 1.5, 3, isBetter), "❌ missed (interval below 1.6x)"},
		{&Paired{Ratio: 1.8, Rounds: 1, Verdict: cannotTell}, cannotTell},
		{nil, ""},
	} {
		require.Equal(t, tc.want, aimCell(tc.p), "%+v", tc.p)
	}
}
