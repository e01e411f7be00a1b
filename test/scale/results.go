package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// scalePath is the rows' path, as in test/bench's latest.json.
const scalePath = "scale"

// row is a row of test/bench's latest.json (test/bench/results.go's Row):
// the figure in the EBPF column, REF and RAW null (no reference setup runs
// an agent).
type row struct {
	Path   string              `json:"path"`
	Metric string              `json:"metric"`
	Unit   string              `json:"unit"`
	Better string              `json:"better"`
	Ref    *float64            `json:"ref"`
	EBPF   *float64            `json:"ebpf"`
	Raw    *float64            `json:"raw"`
	Runs   map[string]int      `json:"runs,omitempty"`
	Spread map[string]*float64 `json:"spread_pct,omitempty"`
	Null   map[string]string   `json:"null_reason,omitempty"`
}

// rowDefs are the rows, in the report's order, with their units.
var rowDefs = []struct{ metric, unit string }{
	{"agent_first_sync_s", "s"},
	{"agent_rss_mb_idle", "MB"},
	{"agent_cpu_cores_idle", "cores"},
	{"agent_rss_mb_30k_policies", "MB"},
	{"policy_apply_p50_ms_30k", "ms"},
	{"policy_apply_p99_ms_30k", "ms"},
	{"peer_label_p99_ms", "ms"},
	{"node_routes_p99_ms", "ms"},
	{"churn_agent_cpu_cores", "cores"},
	{"watch_bytes_per_pod_change", "B"},
}

type results struct {
	vals   map[string]float64
	failed []string
	notes  []string
}

func newResults() *results { return &results{vals: map[string]float64{}} }

func (r *results) set(metric string, v float64) { r.vals[metric] = v }

func (r *results) fail(format string, args ...any) {
	r.failed = append(r.failed, fmt.Sprintf(format, args...))
}

func round4(v float64) float64 {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return v
	}
	var out float64
	_, _ = fmt.Sscanf(fmt.Sprintf("%.4g", v), "%g", &out)
	return out
}

// write puts latest.json and machine.json into the results directory.
func (h *harness) write() error {
	if err := os.MkdirAll(h.cfg.out, 0o755); err != nil {
		return err
	}
	var rows []row
	for _, d := range rowDefs {
		r := row{Path: scalePath, Metric: d.metric, Unit: d.unit, Better: "lower", Runs: map[string]int{}, Spread: map[string]*float64{},
			Null: map[string]string{"ref": "not applicable: no reference setup runs a node agent", "raw": "not applicable: no node agent"}}
		if v, ok := h.res.vals[d.metric]; ok {
			v = round4(v)
			r.EBPF = &v
			r.Runs["ebpf"] = 1
		} else {
			r.Null["ebpf"] = "not measured"
		}
		rows = append(rows, r)
	}
	if err := writeJSON(filepath.Join(h.cfg.out, "latest.json"), rows); err != nil {
		return err
	}
	note := fmt.Sprintf("%d nodes, %d pods in %d namespaces, %d NetworkPolicies; %d agents (mode vxlan) with %d plugin-made pods each; %d changes per latency; churn %d creations and deletions/s for %s; figures over the agents: medians (RSS, CPU, bytes), latencies pooled",
		h.m.nodes, h.m.pods, h.m.namespaces, h.m.policies, h.cfg.agents, h.cfg.realPods, h.cfg.changes, h.cfg.churnRate, h.cfg.churnFor)
	if h.cfg.note != "" {
		note += "; " + h.cfg.note
	}
	if len(h.res.notes) > 0 {
		note += "; " + strings.Join(h.res.notes, "; ")
	}
	failed := append([]string{}, h.res.failed...)
	versions := [][2]string{{"cpu", cpuModel()}, {"cpus", fmt.Sprint(runtime.NumCPU())}, {"kernel", command("uname", "-sr")},
		{"go", runtime.Version()}, {"ebpf-cni-agent", command(filepath.Join(h.cfg.bin, "ebpf-cni-agent"), "version")},
		{"kube-apiserver", command(filepath.Join(h.cfg.k8sDir, "kube-apiserver"), "--version")}, {"etcd", firstLine(command("etcd", "--version"))},
		{"load average at start", h.loadAvg}}
	meta := map[string]any{"profile": "scale", "date": time.Now().UTC().Format(time.RFC3339), "elapsed_s": int(time.Since(h.start).Seconds()),
		"ebpf_features": []string{"policy", "vxlan"}, "runs": 1, "run_seconds": h.cfg.idle.Seconds(), "failed": failed, "note": note, "versions": versions}
	if err := writeJSON(filepath.Join(h.cfg.out, "machine.json"), meta); err != nil {
		return err
	}
	h.logf("wrote %s", filepath.Join(h.cfg.out, "latest.json"))
	for _, r := range rows {
		v := "-"
		if r.EBPF != nil {
			v = fmt.Sprint(*r.EBPF)
		}
		fmt.Printf("%-28s %10s %s\n", r.Metric, v, r.Unit)
	}
	for _, f := range failed {
		fmt.Printf("FAILED: %s\n", f)
	}
	return nil
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func command(name string, args ...string) string {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

func firstLine(s string) string { l, _, _ := strings.Cut(s, "\n"); return l }

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "model name"); ok {
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
		}
	}
	return "unknown"
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func median(xs []float64) float64 { return percentile(xs, 0.5) }
