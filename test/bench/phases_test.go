package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// The timing lines of the churn's calls become one sample per phase; the
// resident pod's and failed calls are left out; the report has a line per
// phase of ADD and DEL with both concurrencies.
func TestPhaseTimings(t *testing.T) {
	file := filepath.Join(t.TempDir(), "timing")
	require.NoError(t, os.WriteFile(file, []byte(
		"ebpf-cni ADD ebpf-3/eth0 total=9.0 start=1.0 veth=8.0 outcome=ok\n"+
			"ebpf-cni ADD ebpf-churn-4/eth0 total=5.0 start=0.2 veth=2.0 outcome=ok\n"+
			"ebpf-cni ADD ebpf-churn-5/eth0 total=7.0 start=0.4 veth=3.0 outcome=ok\n"+
			"ebpf-cni ADD ebpf-churn-6/eth0 total=70.0 start=40 veth=30 outcome=error\n"+
			"ebpf-cni DEL ebpf-churn-4/eth0 total=20.0 start=0.1 teardown=19.0 outcome=ok\n"), 0o644))
	calls, order, err := readTimings(file, "-churn-")
	require.NoError(t, err)
	require.Equal(t, []string{"add_total", "add_start", "add_veth", "del_total", "del_start", "del_teardown"}, order)
	require.Equal(t, []float64{2.0, 3.0}, calls["add_veth"])
	require.Equal(t, []float64{19.0}, calls["del_teardown"])

	rs := newResults()
	for _, suffix := range []string{"", "_c8"} {
		for _, k := range order {
			rs.add(phasesPath, k+"_ms"+suffix, "ms", "lower", EBPF, median(calls[k]))
		}
	}
	table := phaseTable(rs.Rows())
	require.Contains(t, table, "| ADD | veth | 2.50 | 2.50 |")
	require.Contains(t, table, "| DEL | teardown | 19.0 | 19.0 |")
	require.Contains(t, table, "| ADD | **total** |")

	require.NoError(t, os.WriteFile(file, []byte("ebpf-cni ADD ebpf-churn-1/eth0 total=x outcome=ok\n"), 0o644))
	_, _, err = readTimings(file, "-churn-")
	require.ErrorContains(t, err, "total=x")
}
