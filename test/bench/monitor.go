package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/events"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// The monitor path: pod-to-pod RR and CRR of EBPF with the live event
// stream off and on (a reader holding the lease and draining the ring,
// flows on at monitor's defaults), alternated within every run so both see the same machine; and the programs' run
// time per packet (BPF run-time statistics) for both. Each metric is a
// pair of rows, <metric>_off and <metric>_on; REF and RAW have no stream.
const monitorPath = "monitor"

var monitorMetrics = []metricDecl{
	{"rr_tps", "tx/s", "higher"}, {"rr_p50_us", "µs", "lower"}, {"crr_cps", "conn/s", "higher"}, {"crr_p99_us", "µs", "lower"},
}

// streamStates are the two states of the stream.
var streamStates = []string{"off", "on"}

// inRunOrder is the order run measures its states in: as listed in run 0,
// rotated by one in each next run, so none always comes first or last
// (warmer caches, a drifting machine); two states alternate.
func inRunOrder(states []string, run int) []string {
	out := make([]string, 0, len(states))
	for i := range states {
		out = append(out, states[(i+run)%len(states)])
	}
	return out
}

// monitorReader is a reader of the setup's stream, as `ebpf-cni monitor
// --flows --sample 1` would be, that decodes and counts the events
// instead of printing them.
type monitorReader struct {
	mu     sync.Mutex
	s      *events.Stream
	on     bool
	events int
	done   chan struct{}
	wg     sync.WaitGroup
	ms     map[string]*ebpf.Map
}

func newMonitorReader(bpfRoot string) (*monitorReader, error) {
	ms, err := maps.OpenPinned(bpfRoot, events.Maps...)
	if err != nil {
		return nil, err
	}
	s, err := events.Open(ms[maps.CniMapEvents], ms[maps.CniMapEventsConfig], ms[maps.CniMapEventsStats], maps.Dir(bpfRoot))
	if err != nil {
		for _, m := range ms {
			m.Close()
		}
		return nil, err
	}
	r := &monitorReader{s: s, ms: ms, done: make(chan struct{})}
	r.wg.Add(1)
	go r.drain()
	return r, nil
}

// drain reads the ring and renews the lease every second while on.
func (r *monitorReader) drain() {
	defer r.wg.Done()
	renew := time.Now().Add(time.Second)
	for {
		select {
		case <-r.done:
			return
		default:
		}
		if time.Now().After(renew) {
			r.mu.Lock()
			if r.on {
				_ = r.s.Renew()
			}
			r.mu.Unlock()
			renew = time.Now().Add(time.Second)
		}
		if _, err := r.s.Read(time.Now().Add(100 * time.Millisecond)); err == nil {
			r.mu.Lock()
			r.events++
			r.mu.Unlock()
		} else if !errors.Is(err, os.ErrDeadlineExceeded) {
			return
		}
	}
}

func (r *monitorReader) set(on bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on = on
	if on {
		return r.s.Start(events.Options{Flows: true, FlowSample: events.DefaultFlowSample})
	}
	return r.s.Off()
}

func (r *monitorReader) close() (events int, st events.Stats, err error) {
	close(r.done)
	r.wg.Wait()
	st, err = r.s.Stats()
	err = errors.Join(err, r.s.Close())
	for _, m := range r.ms {
		m.Close()
	}
	return r.events, st, err
}

func (b *bench) monitor() error {
	const why = "not applicable: the event stream is ebpf-cni's"
	b.declareStates(monitorPath, streamStates, monitorMetrics, why, why)
	s := b.setups[EBPF]
	b.logf("monitor: %d runs of %s (RR and CRR, then again with BPF run-time statistics) with the event stream off and on", b.cfg.runs, b.cfg.dur)
	client, _, err := b.addPod(s, nil)
	if err != nil {
		return err
	}
	server, _, err := b.addPod(s, nil)
	if err != nil {
		return err
	}
	if err := b.startServer(server.ns, addr(server.ip, echoPort)); err != nil {
		return err
	}
	r, err := newMonitorReader(s.bpfRoot)
	if err != nil {
		return fmt.Errorf("reading the event stream: %w", err)
	}
	closed := false
	defer func() {
		if !closed {
			_, _, _ = r.close()
		}
	}()
	target := addr(server.ip, echoPort)
	for run := range b.cfg.runs {
		for _, st := range inRunOrder(streamStates, run) {
			if err := r.set(st == "on"); err != nil {
				return err
			}
			if err := b.stateLoad(monitorPath, st, run, client.ns, target); err != nil {
				return err
			}
		}
		b.logf("  monitor run %d/%d done", run+1, b.cfg.runs)
	}
	// Run time per packet, in separate runs with the statistics on (they
	// cost a few ns per program run, the same with the stream off and on).
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return fmt.Errorf("enabling BPF run-time statistics: %w", err)
	}
	defer stats.Close()
	for run := range b.cfg.runs {
		for _, st := range inRunOrder(streamStates, run) {
			if err := r.set(st == "on"); err != nil {
				return err
			}
			if err := b.stateBPFStats(monitorPath, streamStates, st, run, s.bpfRoot, client.ns, target); err != nil {
				return err
			}
		}
	}
	closed = true
	n, st, err := r.close()
	if err != nil {
		return err
	}
	b.logf("  monitor: the reader drained %d events; the rate limit suppressed %d flow events, the ring lost %d", n, st.FlowSuppressed, st.FlowLost)
	return nil
}

// declareStates declares the pair of rows <metric>_<state> of each of
// metrics on path, which REF and RAW skip for refWhy and rawWhy.
func (b *bench) declareStates(path string, states []string, metrics []metricDecl, refWhy, rawWhy string) {
	for _, m := range metrics {
		for _, st := range states {
			b.res.declare(path, m.name+"_"+st, m.unit, m.better)
			b.res.skip(path, m.name+"_"+st, m.unit, m.better, REF, refWhy)
			b.res.skip(path, m.name+"_"+st, m.unit, m.better, RAW, rawWhy)
		}
	}
}

// stateLoad measures EBPF's RR and CRR from client to target in state st
// of path in round run: its part of each set of rows, paired by round with
// the other states'.
func (b *bench) stateLoad(path, st string, run int, client ns.NetNS, target string) error {
	rr, err := b.load("rr", client, target, b.cfg.dur)
	if err != nil {
		return fmt.Errorf("%s %s rr: %w", path, st, err)
	}
	crr, err := b.load("crr", client, target, b.cfg.dur)
	if err != nil {
		return fmt.Errorf("%s %s crr: %w", path, st, err)
	}
	b.res.addRound(path, "rr_tps_"+st, "tx/s", "higher", EBPF, run, rr.perSec())
	b.res.addRound(path, "rr_p50_us_"+st, "µs", "lower", EBPF, run, rr.P50us)
	b.res.addRound(path, "crr_cps_"+st, "conn/s", "higher", EBPF, run, crr.perSec())
	b.res.addRound(path, "crr_p99_us_"+st, "µs", "lower", EBPF, run, crr.P99us)
	return nil
}

// stateBPFStats measures the run time per packet of the programs under
// bpfRoot for RR and CRR from client to target in state st of path in round
// run, with BPF run-time statistics already on: its part of each set of
// rows bpf_<mode>_<program>_ns_pkt_<state>.
func (b *bench) stateBPFStats(path string, states []string, st string, run int, bpfRoot string, client ns.NetNS, target string) error {
	for _, mode := range []string{"rr", "crr"} {
		// 1000 runs at least: not a program on the path, run by a
		// stray neighbour solicitation.
		perPkt, err := nsPerRun(bpfRoot, 1000, func() error {
			_, err := b.load(mode, client, target, b.cfg.dur)
			return err
		})
		if err != nil {
			return fmt.Errorf("%s %s bpf stats %s: %w", path, st, mode, err)
		}
		for name, nsPkt := range perPkt {
			metric := "bpf_" + mode + "_" + name + "_ns_pkt_" + st
			for _, pair := range states { // the pair of rows side by side
				b.res.declare(path, "bpf_"+mode+"_"+name+"_ns_pkt_"+pair, "ns", "lower")
			}
			b.res.addRound(path, metric, "ns", "lower", EBPF, run, nsPkt)
			b.res.skip(path, metric, "ns", "lower", REF, noBPF)
			b.res.skip(path, metric, "ns", "lower", RAW, noBPF)
		}
	}
	return nil
}

// monitorBudget is the growth of the programs' run time per packet the
// stream may cost while a reader is attached (issue 28).
const monitorBudget = 5.0

// monitorComparison is the report's verdict on the monitor path: each
// on/off pair of rows side by side, the run-time growth per packet against
// monitorBudget and RR/CRR against the runs' noise.
func monitorComparison(rows []Row) string {
	return stateComparison(rows, monitorPath, "off", "on", "the stream on", monitorBudget)
}

// stateComparison puts each pair of rows <metric>_<base> and <metric>_<with>
// of path side by side: the growth of a program's run time per packet
// (bpf_ rows) against budget (percent; 0: no budget, the figures only), the
// other rows against the runs' noise. what names the difference ("the
// stream on").
func stateComparison(rows []Row, path, base, with, what string, budget float64) string {
	byMetric := map[string]Row{}
	var bases []string
	for _, r := range rows {
		if r.Path != path || r.EBPF == nil {
			continue
		}
		byMetric[r.Metric] = r
		if m, ok := strings.CutSuffix(r.Metric, "_"+base); ok {
			bases = append(bases, m)
		}
	}
	if len(bases) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| metric | unit | %s | %s | %s/%s | noise (%s / %s) | verdict |\n| --- | --- | ---: | ---: | ---: | --- | --- |\n", base, with, with, base, base, with)
	var over, unsure, worse []string
	compared := 0
	for _, m := range bases {
		off, okOff := byMetric[m+"_"+base]
		on, okOn := byMetric[m+"_"+with]
		if !okOff || !okOn || *off.EBPF == 0 {
			continue
		}
		compared++
		c := judgeState(off, on, on.Paired[stateKey(with, base)], strings.HasPrefix(m, "bpf_"), budget)
		switch c.verdict {
		case stateOver:
			over = append(over, m)
		case stateUnsure:
			unsure = append(unsure, m)
		case stateWorse:
			worse = append(worse, m)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s / %s | %s |\n", m, off.Unit, cell(off.EBPF), cell(on.EBPF), c.change,
			spreadCell(off), spreadCell(on), c.text)
	}
	if compared == 0 {
		return ""
	}
	b.WriteString("\n")
	switch {
	case len(over) == 0 && len(worse) == 0 && len(unsure) == 0 && budget > 0:
		fmt.Fprintf(&b, "With %s, every program's run time per packet grew by at most %.0f%% and RR/CRR stayed within the runs' noise.\n\n", what, budget)
	case len(over) == 0 && len(worse) == 0 && len(unsure) == 0:
		fmt.Fprintf(&b, "With %s, RR and CRR stayed within the runs' noise.\n\n", what)
	default:
		if len(unsure) > 0 {
			fmt.Fprintf(&b, "*Undecided:* %s grew by more than %.0f%% but by less than the runs' noise: measure again on a quiet machine.\n\n", strings.Join(unsure, ", "), budget)
		}
		if len(over) > 0 {
			fmt.Fprintf(&b, "**Over the %.0f%% budget:** %s.\n\n", budget, strings.Join(over, ", "))
		}
		if len(worse) > 0 {
			fmt.Fprintf(&b, "**Worse beyond noise with %s:** %s.\n\n", what, strings.Join(worse, ", "))
		}
	}
	return b.String()
}

// The verdicts of judgeState that the summary under a state comparison
// lists.
const (
	stateOK = iota
	stateOver
	stateUnsure
	stateWorse
)

// stateCell is a row of a state comparison: the change, its words, and
// its verdict.
type stateCell struct {
	change, text string
	verdict      int
}

// judgeState judges a pair of state rows: by p, the ratio of their rounds
// (with its 95% interval), when they were measured in the same rounds;
// else by their medians against the larger of their spreads. A bpf_ row
// (run time per packet) is held to budget percent (0: figures only); the
// others are better or worse only when the interval (or the difference of
// the medians) lies beyond 1x (beyond the noise).
func judgeState(off, on Row, p *Paired, runTime bool, budget float64) stateCell {
	change := (*on.EBPF / *off.EBPF - 1) * 100
	cellText := fmt.Sprintf("%+.1f%%", change)
	lo, hi := change, change // the change's bounds, in percent
	noise := 0.0
	if p != nil {
		change = (p.Ratio - 1) * 100
		cellText = fmt.Sprintf("%+.1f%%", change)
		lo, hi = change, change
		if p.CILow != nil {
			lo, hi = (*p.CILow-1)*100, (*p.CIHigh-1)*100
			cellText += fmt.Sprintf(" (%+.1f – %+.1f)", lo, hi)
		}
	} else {
		noise = singleRunNoise
		if off.Spread[EBPF] != nil || on.Spread[EBPF] != nil {
			noise = 0
			for _, s := range []*float64{off.Spread[EBPF], on.Spread[EBPF]} {
				if s != nil && *s > noise {
					noise = *s
				}
			}
		}
	}
	// worseLo and worseHi bound how much worse "with" is, in percent.
	worseLo, worseHi := lo-noise, hi+noise
	if off.Better == "higher" {
		worseLo, worseHi = -hi-noise, -lo+noise
	}
	worseBy := (worseLo + worseHi) / 2
	sc := stateCell{change: cellText}
	switch {
	case runTime && budget <= 0:
		sc.text = "(run time per packet)"
	case runTime && worseLo > budget:
		sc.text, sc.verdict = fmt.Sprintf("❌ over the %.0f%% budget", budget), stateOver
	case runTime && worseBy > budget:
		sc.text, sc.verdict = fmt.Sprintf("? over the %.0f%% budget by less than the noise", budget), stateUnsure
	case runTime:
		sc.text = fmt.Sprintf("✅ within the %.0f%% budget", budget)
	case worseLo <= 0 && worseHi >= 0 || math.Abs(change) < 1:
		sc.text = "≈ within noise"
	case worseLo > 0:
		sc.text, sc.verdict = "❌ worse", stateWorse
	default:
		sc.text = "✅ better"
	}
	return sc
}

func spreadCell(r Row) string {
	if p := r.Spread[EBPF]; p != nil {
		return fmt.Sprintf("%.0f%%", *p)
	}
	return "1 run"
}
