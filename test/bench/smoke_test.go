package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// TestMain lets the bench re-execute this test binary as its load
// generator, and removes the plugin binaries the test built.
func TestMain(m *testing.M) {
	toolMain()
	testutil.Main(m)
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) { l.t.Log(string(p)); return len(p), nil }

// TestSmoke runs the whole suite with tiny counts (the smoke profile: every
// path, one run each), so it cannot rot; it writes to a temp dir, never to
// test/bench/results. It asserts what the suite must produce, not figures.
func TestSmoke(t *testing.T) {
	testutil.RequireRoot(t)
	cfg, err := profile("smoke")
	require.NoError(t, err)
	cfg.bin, cfg.ref, cfg.out, cfg.log = testutil.PluginDir(t), testutil.RefPluginDir(t), t.TempDir(), testLog{t}
	b, err := newBench(cfg)
	if b != nil {
		defer b.cleanup()
	}
	require.NoError(t, err)
	require.NoError(t, b.run())
	tmp := b.tmp
	b.cleanup()
	_, err = os.Stat(tmp)
	require.True(t, os.IsNotExist(err), "cleanup leaves the temp dir %s", tmp)

	raw, err := os.ReadFile(filepath.Join(cfg.out, "latest.json"))
	require.NoError(t, err)
	var rows []Row
	require.NoError(t, json.Unmarshal(raw, &rows))
	get := func(path, metric string) Row {
		for _, r := range rows {
			if r.Path == path && r.Metric == metric {
				return r
			}
		}
		t.Fatalf("no row %s %s", path, metric)
		return Row{}
	}
	for _, pm := range [][2]string{{"cni", "add_p50_ms"}, {"pod-to-pod", "rr_tps"}, {"pod-to-pod", "rr_p99_us"}, {"pod-to-pod", "tcp_gbps"}} {
		r := get(pm[0], pm[1])
		require.NotNil(t, r.Ref, "%v REF", pm)
		require.NotNil(t, r.EBPF, "%v EBPF", pm)
		require.NotNil(t, r.Raw, "%v RAW", pm)
	}
	// Every round ran the setups back to back: the ratios are paired, CRR
	// over its own rounds; hostPort's RAW pairs only at the first N.
	crr := get("pod-to-pod", "crr_cps")
	require.NotNil(t, crr.Paired[ebpfRef], "pod-to-pod crr_cps EBPF/REF paired")
	require.Equal(t, cfg.crrRounds, crr.Paired[ebpfRef].Rounds)
	require.Equal(t, cfg.crrRounds, crr.Paired[ebpfRaw].Rounds)
	require.NotNil(t, crr.Paired[ebpfRef].CILow, "two rounds give an interval")
	require.Equal(t, cfg.runs, get("masquerade", "rr_tps").Paired[ebpfRaw].Rounds)
	require.NotNil(t, get("cni", "pods_per_s_c8").Paired[concKey(EBPF)], "concurrency judged by throughput")
	require.NotNil(t, get("hostport-10", "crr_cps").Paired[ebpfRaw])
	require.NotContains(t, get("hostport-20", "crr_cps").Paired, ebpfRaw, "RAW measured at the first N only")
	require.NotNil(t, get("hostport-20", "crr_cps").Paired[ebpfRef])
	for _, st := range streamStates {
		for _, m := range []string{"rr_tps_", "crr_cps_", "bpf_rr_from_container_ns_pkt_"} {
			require.NotNil(t, get(monitorPath, m+st).EBPF, "monitor %s%s", m, st)
		}
	}
	for _, st := range policyStates {
		for _, m := range []string{"rr_tps_", "crr_cps_", "bpf_crr_from_container_ns_pkt_"} {
			require.NotNil(t, get(policyPath, m+st).EBPF, "policy %s%s", m, st)
		}
	}
	require.NotNil(t, get(policyPath, "agent_sync_p99_ms").EBPF, "policy agent_sync_p99_ms")
	for _, m := range []string{"bpf_to_netdev_ns_pkt", "bpf_crr_to_netdev_ns_pkt", "bpf_crr_from_netdev_ns_pkt"} {
		require.NotNil(t, get("masquerade", m).EBPF, "masquerade %s", m)
	}
	require.NotNil(t, get("pod-to-pod", "bpf_crr_from_container_ns_pkt").EBPF, "pod-to-pod bpf_crr_from_container_ns_pkt")
	for _, f := range ebpfFeatures {
		if f == "hostport" {
			require.NotNil(t, get("hostport-10", "crr_cps").EBPF, "EBPF serves hostPorts")
			require.NotNil(t, get("hostport-10", "del_teardown_ms").EBPF, "the phases of a hostPort DEL")
		}
	}
	for _, p := range []string{"masquerade", "hostport-10", "hostport-20", "bandwidth"} {
		found := false
		for _, r := range rows {
			if r.Path == p {
				found = true
				if r.Ref == nil && (r.Null[REF] == phasesOwn || r.Null[REF] == noBPF) {
					continue // EBPF's own DEL phases (EBPF_CNI_TIMING), its programs' run time
				}
				require.NotNil(t, r.Ref, "%s %s: REF measures every feature", p, r.Metric)
			}
		}
		require.True(t, found, "no rows for %s", p)
	}
	for _, f := range []string{"REPORT.md", "machine.json", "ratios.png", "summary.png", "hostport_crr_cps.png"} {
		_, err := os.Stat(filepath.Join(cfg.out, f))
		require.NoError(t, err, f)
	}

	// -render gives back the same report from the JSON alone.
	written, err := os.ReadFile(filepath.Join(cfg.out, "REPORT.md"))
	require.NoError(t, err)
	require.NoError(t, os.Remove(filepath.Join(cfg.out, "REPORT.md")))
	require.NoError(t, renderResults(cfg.out))
	rendered, err := os.ReadFile(filepath.Join(cfg.out, "REPORT.md"))
	require.NoError(t, err)
	require.Equal(t, string(written), string(rendered), "REPORT.md rendered from latest.json and machine.json")
}
