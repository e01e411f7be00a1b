package main

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

type progStat struct {
	runtime time.Duration
	count   uint64
}

// progStats reads the run-time statistics of every program pinned under
// bpfRoot/programs, by program file name (the hook).
func progStats(bpfRoot string) (map[string]progStat, error) {
	out := map[string]progStat{}
	dir := filepath.Join(bpfRoot, "programs")
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		p, err := ebpf.LoadPinnedProgram(path, nil)
		if err != nil {
			return fmt.Errorf("opening %s: %w", path, err)
		}
		defer p.Close()
		st, err := p.Stats()
		if err != nil {
			return fmt.Errorf("stats of %s: %w", path, err)
		}
		s := out[d.Name()]
		s.runtime += st.Runtime
		s.count += st.RunCount
		out[d.Name()] = s
		return nil
	})
	return out, err
}

// nsPerRun runs load and returns the run time per run (per packet) of
// each program under bpfRoot/programs that ran at least min times
// meanwhile; the statistics must be on.
func nsPerRun(bpfRoot string, min uint64, load func() error) (map[string]float64, error) {
	before, err := progStats(bpfRoot)
	if err != nil {
		return nil, err
	}
	if err := load(); err != nil {
		return nil, err
	}
	after, err := progStats(bpfRoot)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for name, a := range after {
		if n := a.count - before[name].count; n >= min && n > 0 {
			out[name] = float64(a.runtime-before[name].runtime) / float64(n)
		}
	}
	return out, nil
}

// noBPF is why REF and RAW have no bpf_* rows.
const noBPF = "no BPF program on this path"

// bpfStats measures ns per packet of each EBPF program on path with BPF
// run-time statistics switched on only for these extra RR and CRR runs
// (they cost a few ns per run, so the other figures are taken with them
// off): rows bpf_<program>_ns_pkt (RR, as the pod-to-pod rows have always
// been named) and bpf_crr_<program>_ns_pkt.
func (b *bench) bpfStats(path string, cs []clientServer) error {
	var pair *clientServer
	for i := range cs {
		if cs[i].setup == EBPF {
			pair = &cs[i]
		}
	}
	if pair == nil {
		return nil
	}
	root := b.setups[EBPF].bpfRoot
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return fmt.Errorf("enabling BPF run-time statistics: %w", err)
	}
	defer stats.Close()
	for run := range b.cfg.runs {
		for _, kind := range []string{"rr", "crr"} {
			perPkt, err := nsPerRun(root, 1, func() error {
				_, err := b.load(kind, pair.client, addr(pair.target, pair.echoPort), b.cfg.dur)
				return err
			})
			if err != nil {
				return fmt.Errorf("bpf stats run: %w", err)
			}
			prefix := "bpf_"
			if kind == "crr" {
				prefix = "bpf_crr_"
			}
			for name, ns := range perPkt {
				metric := prefix + name + "_ns_pkt"
				b.res.add(path, metric, "ns", "lower", EBPF, ns)
				if run == 0 {
					b.res.skip(path, metric, "ns", "lower", REF, noBPF)
					b.res.skip(path, metric, "ns", "lower", RAW, noBPF)
				}
			}
		}
	}
	return nil
}
