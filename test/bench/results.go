package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
)

// Row is one line of latest.json: a metric on a path, the median over runs
// for each setup (null where the setup does not apply or was not measured),
// how noisy the runs were, and the ratios judged by rounds.
type Row struct {
	Path   string   `json:"path"`
	Metric string   `json:"metric"`
	Unit   string   `json:"unit"`
	Better string   `json:"better"` // "higher" or "lower"
	Ref    *float64 `json:"ref"`
	EBPF   *float64 `json:"ebpf"`
	Raw    *float64 `json:"raw"`
	// Runs is how many runs each median was taken over, by setup.
	Runs map[string]int `json:"runs,omitempty"`
	// Spread is (max-min)/median of the runs in percent, by setup.
	Spread map[string]*float64 `json:"spread_pct,omitempty"`
	// Null says why a setup has no figure, by setup.
	Null map[string]string `json:"null_reason,omitempty"`
	// Paired are the ratios judged by rounds (pairRatio), by ratio:
	// "ebpf/ref" and "ebpf/raw"; on a concurrency row (concurrencyOf) also
	// "<setup>:c8/c1", the setup's figure over its figure at concurrency 1
	// in the same round. Absent where no round measured both sides, and in
	// a latest.json written before rounds were paired.
	Paired map[string]*Paired `json:"paired,omitempty"`
}

// Keys of Row.Paired.
const (
	ebpfRef = EBPF + "/" + REF
	ebpfRaw = EBPF + "/" + RAW
)

// concKey is the key of Row.Paired for setup's ratio of concurrency 8 to 1.
func concKey(setup string) string { return setup + ":c8/c1" }

// stateKey is the key of Row.Paired for EBPF's figure in state st over its
// figure in state base in the same round (paths measured in states,
// statePaths).
func stateKey(st, base string) string { return EBPF + ":" + st + "/" + base }

// statePaths are the paths measured in states, each state's rows
// <metric>_<state>, with their states: the first is the base the others
// are judged against, round by round.
var statePaths = map[string][]string{monitorPath: streamStates, policyPath: policyStates}

// stateOf splits a state row's metric into the row of its base state and
// the state; ok false for a metric of no state, or of the base state.
func stateOf(path, metric string) (baseMetric, st string, ok bool) {
	states := statePaths[path]
	for _, s := range states[min(1, len(states)):] {
		if m, found := strings.CutSuffix(metric, "_"+s); found {
			return m + "_" + states[0], s, true
		}
	}
	return "", "", false
}

// concurrencyOf maps a row judged against the same setup's figure at
// concurrency 1 to that row's metric: pairs per second, a throughput, tell
// what running in parallel gains; the latencies at 8 against 1 do not.
var concurrencyOf = map[string]string{"pods_per_s_c8": "pods_per_s"}

func (r *Row) value(setup string) *float64 {
	switch setup {
	case REF:
		return r.Ref
	case EBPF:
		return r.EBPF
	default:
		return r.Raw
	}
}

func (r *Row) set(setup string, v *float64) {
	switch setup {
	case REF:
		r.Ref = v
	case EBPF:
		r.EBPF = v
	default:
		r.Raw = v
	}
}

// metricDef is a metric's unit and direction.
type metricDef struct{ unit, better string }

// Results collects samples per (path, metric, setup) in the order they were
// first declared, and turns them into rows.
type Results struct {
	mu      sync.Mutex
	order   []string // path\x00metric
	defs    map[string]metricDef
	samples map[string]map[string][]sample
	null    map[string]map[string]string
}

func newResults() *Results {
	return &Results{defs: map[string]metricDef{}, samples: map[string]map[string][]sample{},
		null: map[string]map[string]string{}}
}

func key(path, metric string) string { return path + "\x00" + metric }

// declare registers a row so it appears (in this order) even if no setup
// produces a figure for it.
func (rs *Results) declare(path, metric, unit, better string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	k := key(path, metric)
	if _, ok := rs.defs[k]; ok {
		return
	}
	rs.order = append(rs.order, k)
	rs.defs[k] = metricDef{unit, better}
	rs.samples[k] = map[string][]sample{}
	rs.null[k] = map[string]string{}
}

// add records one run's figure, taken apart from the other setups' (it
// pairs with none of them).
func (rs *Results) add(path, metric, unit, better, setup string, v float64) {
	rs.addRound(path, metric, unit, better, setup, -1, v)
}

// addRound records the figure of setup in round (from 0) of a row whose
// setups run back to back in each round: one figure per setup and round.
func (rs *Results) addRound(path, metric, unit, better, setup string, round int, v float64) {
	rs.declare(path, metric, unit, better)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	k := key(path, metric)
	rs.samples[k][setup] = append(rs.samples[k][setup], sample{round, v})
}

// skip says why setup has no figure for a row.
func (rs *Results) skip(path, metric, unit, better, setup, why string) {
	rs.declare(path, metric, unit, better)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.null[key(path, metric)][setup] = why
}

// values are the figures of samples.
func values(ss []sample) []float64 {
	out := make([]float64, len(ss))
	for i, s := range ss {
		out[i] = s.v
	}
	return out
}

// Rows turns the samples into medians and the ratios judged by rounds.
func (rs *Results) Rows() []Row {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var rows []Row
	for _, k := range rs.order {
		var path, metric string
		for i := range k {
			if k[i] == 0 {
				path, metric = k[:i], k[i+1:]
				break
			}
		}
		d := rs.defs[k]
		r := Row{Path: path, Metric: metric, Unit: d.unit, Better: d.better,
			Runs: map[string]int{}, Spread: map[string]*float64{}, Null: map[string]string{}}
		for _, s := range setups {
			xs := values(rs.samples[k][s])
			if len(xs) == 0 {
				why := rs.null[k][s]
				if why == "" {
					why = "not measured"
				}
				r.Null[s] = why
				continue
			}
			m := round(median(xs))
			r.set(s, &m)
			r.Runs[s] = len(xs)
			if sp := spreadPct(xs); sp != nil {
				v := round(*sp)
				r.Spread[s] = &v
			}
		}
		r.Paired = map[string]*Paired{}
		for name, den := range map[string]string{ebpfRef: REF, ebpfRaw: RAW} {
			if p := pairRatio(rs.samples[k][EBPF], rs.samples[k][den], d.better); p != nil {
				r.Paired[name] = p.rounded()
			}
		}
		if c1, ok := concurrencyOf[metric]; ok {
			for _, s := range setups {
				if p := pairRatio(rs.samples[k][s], rs.samples[key(path, c1)][s], d.better); p != nil {
					r.Paired[concKey(s)] = p.rounded()
				}
			}
		}
		if baseMetric, st, ok := stateOf(path, metric); ok {
			if p := pairRatio(rs.samples[k][EBPF], rs.samples[key(path, baseMetric)][EBPF], d.better); p != nil {
				r.Paired[stateKey(st, statePaths[path][0])] = p.rounded()
			}
		}
		if len(r.Paired) == 0 {
			r.Paired = nil
		}
		rows = append(rows, r)
	}
	return rows
}

// rounded is p with four significant digits, as the medians.
func (p *Paired) rounded() *Paired {
	q := *p
	q.Ratio = round(p.Ratio)
	if p.CILow != nil {
		lo, hi := round(*p.CILow), round(*p.CIHigh)
		q.CILow, q.CIHigh = &lo, &hi
	}
	return &q
}

// round keeps four significant digits, enough for figures this noisy.
func round(v float64) float64 {
	var out float64
	_, _ = fmt.Sscanf(fmt.Sprintf("%.4g", v), "%g", &out)
	return out
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
