package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// phasesPath holds EBPF's own breakdown of the cni path's ADDs and DELs:
// the plugin's phase timings (EBPF_CNI_TIMING, pkg/plugin/timing.go), the
// median of each phase per round, at concurrency 1 and 8.
const phasesPath = "cni-phases"

// phasesOwn is why REF and RAW have no figure on a phase row.
const phasesOwn = "the phases are ebpf-cni's own (EBPF_CNI_TIMING)"

// timingEnv is pkg/plugin's TimingEnv; libcni passes the bench's
// environment on to the plugins it runs.
const timingEnv = "EBPF_CNI_TIMING"

// churnTimed is churn, with EBPF's phase timings of the cni path recorded
// under phasesPath; "outside" is what the caller's ADD took beyond the
// plugin's own total (the exec, the Go runtime's start, libcni).
func (b *bench) churnTimed(path string, s *setup, conc, round int) (adds, dels []float64, wall time.Duration, err error) {
	if path != "cni" || s.name != EBPF {
		return b.churn(s, conc, b.cfg.cniPairs)
	}
	file := filepath.Join(b.tmp, fmt.Sprintf("timing-%d-%d", round, conc))
	if err := os.Setenv(timingEnv, file); err != nil {
		return nil, nil, 0, err
	}
	adds, dels, wall, err = b.churn(s, conc, b.cfg.cniPairs)
	_ = os.Unsetenv(timingEnv)
	if err != nil {
		return nil, nil, 0, err
	}
	suffix := ""
	if conc > 1 {
		suffix = "_c8"
	}
	calls, order, err := readTimings(file, "-churn-")
	if err != nil {
		return nil, nil, 0, err
	}
	for _, k := range order {
		b.res.add(phasesPath, k+"_ms"+suffix, "ms", "lower", EBPF, median(calls[k]))
	}
	for _, verb := range []struct {
		name string
		wall []float64
	}{{"add", adds}, {"del", dels}} {
		if t := calls[verb.name+"_total"]; len(t) > 0 && len(verb.wall) > 0 {
			k := verb.name + "_outside"
			order = append(order, k)
			b.res.add(phasesPath, k+"_ms"+suffix, "ms", "lower", EBPF, median(verb.wall)-median(t))
		}
	}
	for _, r := range []string{REF, RAW} {
		for _, k := range order { // outside included
			b.res.skip(phasesPath, k+"_ms"+suffix, "ms", "lower", r, phasesOwn)
		}
	}
	return adds, dels, wall, nil
}

// delPhases records, as rows del_<phase>_ms of path, the medians of the
// phases of EBPF's DELs timed into file (EBPF_CNI_TIMING), and del_outside_ms:
// the median of the caller's DELs (dels) less the plugin's own total.
func (b *bench) delPhases(path, file string, dels []float64) error {
	if len(dels) == 0 {
		return nil
	}
	calls, order, err := readTimings(file, "")
	if err != nil {
		return err
	}
	var keys []string
	for _, k := range order {
		if strings.HasPrefix(k, "del_") {
			keys = append(keys, k)
			b.res.add(path, k+"_ms", "ms", "lower", EBPF, median(calls[k]))
		}
	}
	if t := calls["del_total"]; len(t) > 0 {
		keys = append(keys, "del_outside")
		b.res.add(path, "del_outside_ms", "ms", "lower", EBPF, median(dels)-median(t))
	}
	for _, r := range []string{REF, RAW} {
		for _, k := range keys {
			b.res.skip(path, k+"_ms", "ms", "lower", r, phasesOwn)
		}
	}
	return nil
}

// readTimings reads the timing lines of the calls whose container ID
// contains idPart ("ebpf-cni ADD <id>/<ifname> total=<ms> <phase>=<ms>...
// outcome=ok"): each "<verb>_<phase>" (verb in lower case) with its
// values, in the order the phases first appear. Failed calls are left out.
func readTimings(file, idPart string) (map[string][]float64, []string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the phase timings: %w", err)
	}
	defer f.Close()
	calls := map[string][]float64{}
	var order []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || fields[0] != "ebpf-cni" || !strings.Contains(fields[2], idPart) || fields[len(fields)-1] != "outcome=ok" {
			continue
		}
		verb := strings.ToLower(fields[1])
		for _, kv := range fields[3 : len(fields)-1] {
			name, val, ok := strings.Cut(kv, "=")
			v, err := strconv.ParseFloat(val, 64)
			if !ok || err != nil {
				return nil, nil, fmt.Errorf("phase timing %q of %q", kv, sc.Text())
			}
			k := verb + "_" + name
			if _, seen := calls[k]; !seen {
				order = append(order, k)
			}
			calls[k] = append(calls[k], v)
		}
	}
	return calls, order, sc.Err()
}

// phaseTable is the markdown of phasesPath's rows: one line per phase,
// ADD and DEL at concurrency 1 and 8.
func phaseTable(rows []Row) string {
	type cols struct{ c1, c8 *float64 }
	vals := map[string]*cols{}
	var order []string
	for _, r := range rows {
		if r.Path != phasesPath {
			continue
		}
		k, c8 := strings.CutSuffix(r.Metric, "_c8")
		k = strings.TrimSuffix(k, "_ms")
		if vals[k] == nil {
			vals[k] = &cols{}
			order = append(order, k)
		}
		if c8 {
			vals[k].c8 = r.EBPF
		} else {
			vals[k].c1 = r.EBPF
		}
	}
	var b strings.Builder
	b.WriteString("| call | phase | EBPF, ms | EBPF, 8 in parallel, ms |\n| --- | --- | ---: | ---: |\n")
	for _, verb := range []string{"add", "del", "status"} {
		for _, k := range order {
			phase, ok := strings.CutPrefix(k, verb+"_")
			if !ok {
				continue
			}
			if slices.Contains([]string{"total", "outside"}, phase) {
				phase = "**" + phase + "**"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", strings.ToUpper(verb), phase, cell(vals[k].c1), cell(vals[k].c8))
		}
	}
	return b.String()
}
