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

// bpfStats measures ns per packet of each EBPF program with BPF run-time
// statistics switched on only for these extra RR runs (they cost a few ns
// per run, so the other figures are taken with them off).
func (b *bench) bpfStats(cs []clientServer) error {
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
		perPkt, err := nsPerRun(root, 1, func() error {
			_, err := b.load("rr", pair.client, addr(pair.target, pair.echoPort), b.cfg.dur)
			return err
		})
		if err != nil {
			return fmt.Errorf("bpf stats run: %w", err)
		}
		for name, ns := range perPkt {
			metric := "bpf_" + name + "_ns_pkt"
			b.res.add("pod-to-pod", metric, "ns", "lower", EBPF, ns)
			if run == 0 {
				b.res.skip("pod-to-pod", metric, "ns", "lower", REF, "no BPF program on this path")
				b.res.skip("pod-to-pod", metric, "ns", "lower", RAW, "no BPF program on this path")
			}
		}
	}
	return nil
}
