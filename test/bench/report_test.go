package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
