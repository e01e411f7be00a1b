package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// machineMeta is machine.json: the run's settings and what it ran on.
// On disk it is one flat object (the versions are keys beside the
// settings, as scripts read it); "versions" keeps their order for
// re-rendering.
type machineMeta struct {
	Profile    string
	Date       string // RFC 3339, UTC
	ElapsedS   int
	Features   []string
	Runs       int
	RunSeconds float64
	CRRRounds  int     // 0 in a machine.json from before CRR had rounds of its own
	CRRSeconds float64 // the length of a CRR round
	CNIRounds  int
	Failed     []string
	Note       string
	Versions   [][2]string
}

// metaKeys are machine.json's own keys; every other key is a version.
var metaKeys = []string{"profile", "date", "elapsed_s", "ebpf_features", "runs", "run_seconds", "crr_rounds", "crr_run_seconds", "cni_rounds",
	"failed", "note", "versions"}

// versionOrder is the order machineInfo (and the bench) list the versions
// in, for a machine.json written before "versions" kept it.
var versionOrder = []string{"cpu", "cpus", "memory", "kernel", "iptables", "iperf3", "go", "ebpf-cni", "ebpf-ipam",
	"reference plugins", "ebpf-cni attachMode", "rr/crr load generator", "bridge-nf-call-iptables (REF node)"}

func (m machineMeta) flat() map[string]any {
	out := map[string]any{"profile": m.Profile, "date": m.Date, "elapsed_s": m.ElapsedS, "ebpf_features": m.Features,
		"runs": m.Runs, "run_seconds": m.RunSeconds, "failed": m.Failed, "versions": m.Versions}
	if m.CRRRounds > 0 {
		out["crr_rounds"], out["crr_run_seconds"], out["cni_rounds"] = m.CRRRounds, m.CRRSeconds, m.CNIRounds
	}
	if m.Note != "" {
		out["note"] = m.Note
	}
	for _, kv := range m.Versions {
		out[kv[0]] = kv[1]
	}
	return out
}

func readMeta(path string) (machineMeta, error) {
	var m machineMeta
	b, err := os.ReadFile(path)
	if err != nil {
		return m, err
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return m, fmt.Errorf("decoding %s: %w", path, err)
	}
	fields := map[string]any{"profile": &m.Profile, "date": &m.Date, "elapsed_s": &m.ElapsedS, "ebpf_features": &m.Features,
		"runs": &m.Runs, "run_seconds": &m.RunSeconds, "crr_rounds": &m.CRRRounds, "crr_run_seconds": &m.CRRSeconds, "cni_rounds": &m.CNIRounds,
		"failed": &m.Failed, "note": &m.Note, "versions": &m.Versions}
	for k, dst := range fields {
		if v, ok := raw[k]; ok {
			if err := json.Unmarshal(v, dst); err != nil {
				return m, fmt.Errorf("decoding %s: %s: %w", path, k, err)
			}
		}
	}
	if m.Versions == nil {
		var rest []string
		for k := range raw {
			if !slices.Contains(metaKeys, k) {
				rest = append(rest, k)
			}
		}
		slices.SortFunc(rest, func(a, b string) int {
			ia, ib := slices.Index(versionOrder, a), slices.Index(versionOrder, b)
			if ia < 0 {
				ia = len(versionOrder)
			}
			if ib < 0 {
				ib = len(versionOrder)
			}
			return cmp.Or(cmp.Compare(ia, ib), strings.Compare(a, b))
		})
		for _, k := range rest {
			var v string
			_ = json.Unmarshal(raw[k], &v)
			m.Versions = append(m.Versions, [2]string{k, v})
		}
	}
	return m, nil
}

// report is the report of rows measured in the run m describes.
func (m machineMeta) report(rows []Row) report {
	date, _ := time.Parse(time.RFC3339, m.Date)
	return report{Rows: rows, Profile: m.Profile, Note: m.Note, Features: m.Features, Versions: m.Versions, Runs: m.Runs,
		Dur: time.Duration(m.RunSeconds * float64(time.Second)), CRRRounds: m.CRRRounds,
		CRRDur: time.Duration(m.CRRSeconds * float64(time.Second)), CNIRounds: m.CNIRounds, Elapsed: time.Duration(m.ElapsedS) * time.Second,
		Failed: m.Failed, Date: date}
}

// publish draws the plots and writes REPORT.md into dir.
func (rp *report) publish(dir string) error {
	// Plots of an earlier run that this one does not redraw would be stale.
	old, _ := filepath.Glob(filepath.Join(dir, "*.png"))
	for _, f := range old {
		_ = os.Remove(f)
	}
	plots, err := writePlots(dir, rp.Rows)
	if err != nil {
		return fmt.Errorf("plots: %w", err)
	}
	rp.Plots = plots
	return os.WriteFile(filepath.Join(dir, "REPORT.md"), []byte(rp.markdown()), 0o644)
}

// renderResults re-renders REPORT.md and the plots of a results directory
// from its latest.json and machine.json, measuring nothing: a change to
// the report's text or plots is applied to the committed results without
// running the bench again.
func renderResults(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "latest.json"))
	if err != nil {
		return err
	}
	var rows []Row
	if err := json.Unmarshal(b, &rows); err != nil {
		return fmt.Errorf("decoding latest.json: %w", err)
	}
	meta, err := readMeta(filepath.Join(dir, "machine.json"))
	if err != nil {
		return err
	}
	rep := meta.report(rows)
	if err := rep.publish(dir); err != nil {
		return err
	}
	fmt.Printf("rendered %s/REPORT.md and %v from latest.json and machine.json\n", dir, rep.Plots)
	return nil
}
