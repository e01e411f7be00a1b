// Command bench measures ebpf-cni side by side with Debian's reference chain
// and the raw-veth limit, on one machine in one run (see
// shared/BENCHMARK.md and `make bench`):
//
//	REF   bridge (isGateway, ipMasq) + host-local + portmap + bandwidth, iptables
//	EBPF  ebpf-cni + ebpf-ipam with the features of ebpfFeatures on
//	RAW   two namespaces joined by one veth (or a namespace routed by the node)
//
// Pods are network namespaces attached through the real plugin binaries with
// libcni inside simulated nodes (a node netns with an uplink veth to a world
// netns); no packet leaves the namespaces made here. Everything (processes,
// namespaces, the private bpffs, temp files) is removed on exit, on failure
// and on Ctrl-C. It writes latest.json, machine.json, REPORT.md and PNG plots
// to -out.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// config is one run's profile and where things are.
type config struct {
	profile      string
	bin, ref     string // plugin directories
	out          string
	features     []string // EBPF features on
	paths        []string // paths to run, in order
	runs         int      // rounds of every RR and TCP figure (and of the figures without rounds of their own)
	dur          time.Duration
	crrRounds    int // rounds of every CRR figure: shorter, more of them
	crrDur       time.Duration
	cniPairs     int // ADD+DEL pairs per round and concurrency
	cniRounds    int
	resident     int // pods each setup keeps attached during the churn
	hostportN    []int
	hostportReps int // timed ADD+DEL of one more mapping, per N
	bwRates      []int
	bwRuns       int
	bwSecs       int
	note         string // said at the top of REPORT.md (e.g. how loaded the machine was)
	hold         bool   // set the paths up, print how to drive them, wait for ^C (profiling)
	noXlat       bool   // EBPF without the node agent's translated destinations (xlat.go)
	log          io.Writer
	started      time.Time
}

var allPaths = []string{"cni", "cni-upstream", "pod-to-pod", "monitor", "policy", "masquerade", "hostport", "bandwidth", "cross-node", "cross-node-vxlan", "masquerade-services"}

// crrDone is how many CRR rounds are done by the end of round run of RR
// and TCP: they are spread evenly between them.
func (c config) crrDone(run int) int {
	return (run + 1) * c.crrRounds / c.runs
}

// profile returns the settings of a named profile: full takes 32-34
// minutes on 2 vCPUs (33m18s and 34m1s measured with every path,
// 2026-11-28 and 29, before CRR had rounds of its own: its 20 rounds of
// 0.75 s take the time 5 of 3 s took; 32m18s on a quiet machine on
// 2026-11-29 with them), quick about 7 with the same rows,
// smoke is quick with tiny counts for make test. CRR gets many short
// rounds because its ratios should tell 3% apart: 20 of 0.75 s gave 95%
// intervals of ±1.6-3.2% on a loaded machine (docs/performance.md).
func profile(name string) (config, error) {
	c := config{profile: name, paths: allPaths, resident: 1, hostportN: []int{10, 1000, 5000, 10000},
		bwRates: []int{10, 100, 1000}, features: ebpfFeatures}
	switch name {
	case "full":
		c.runs, c.dur, c.cniPairs, c.cniRounds, c.hostportReps, c.bwRuns, c.bwSecs = 5, 3*time.Second, 60, 3, 7, 3, 5
		c.crrRounds, c.crrDur = 20, 750*time.Millisecond
	case "quick":
		c.runs, c.dur, c.cniPairs, c.cniRounds, c.hostportReps, c.bwRuns, c.bwSecs = 3, time.Second, 20, 3, 3, 1, 3
		c.crrRounds, c.crrDur = 6, 750*time.Millisecond
	case "smoke":
		c.runs, c.dur, c.cniPairs, c.cniRounds, c.hostportReps, c.bwRuns, c.bwSecs = 1, 300*time.Millisecond, 2, 1, 1, 1, 1
		c.crrRounds, c.crrDur = 2, 300*time.Millisecond
		c.hostportN, c.bwRates = []int{10, 20}, []int{100}
	default:
		return c, fmt.Errorf("unknown profile %q (full, quick, smoke)", name)
	}
	return c, nil
}

func main() {
	toolMain()
	prof := flag.String("profile", envOr("BENCH", "full"), "full, quick or smoke (default from $BENCH)")
	bin := flag.String("bin", "bin", "directory holding ebpf-cni and ebpf-ipam")
	ref := flag.String("ref", "/usr/lib/cni", "directory holding Debian's reference plugins")
	out := flag.String("out", "test/bench/results", "directory for latest.json, REPORT.md and the plots")
	features := flag.String("ebpf-features", strings.Join(ebpfFeatures, ","), "EBPF features on: masq,hostport,bandwidth (those ebpf-cni implements)")
	paths := flag.String("paths", strings.Join(allPaths, ","), "paths to measure")
	runs := flag.Int("runs", 0, "override the profile's rounds of RR and TCP (and of the figures without rounds of their own)")
	crrRounds := flag.Int("crr-rounds", 0, "override the profile's rounds of CRR")
	crrDur := flag.Duration("crr-dur", 0, "override the length of a CRR round")
	hostportN := flag.String("hostport-n", "", "override the profile's mapping counts (comma-separated)")
	note := flag.String("note", "", "a note for the top of REPORT.md, e.g. what else ran on the machine")
	resident := flag.Int("resident", 1, "pods each setup keeps attached while the cni paths churn (a node in service has tens to a hundred)")
	hold := flag.Bool("hold", false, "profiling: set the first traffic path of -paths up, print the commands that drive its load, and wait for ^C instead of measuring")
	xlat := flag.Bool("translated-destinations", true, "EBPF as the DaemonSet runs it: the destinations kube-proxy translates written and leased as the node agent does, so that new flows to the world skip netfilter; false: every new flow's first packet meets netfilter")
	render := flag.String("render", "", "measure nothing: re-render REPORT.md and the plots of this results directory from its latest.json and machine.json")
	sites := flag.String("bpf-sites", "", "measure nothing: attribute the samples of `perf script -F ip,sym,symoff` output (this file, - for stdin) to the source lines and maps of the BPF programs loaded now (profile a -hold path, then run this before ^C)")
	leaf := flag.String("leaf", "", "with -bpf-sites: only the samples whose innermost frame is this kernel symbol (lookup_nulls_elem_raw: hash lookups)")
	top := flag.Int("top", 30, "with -bpf-sites: the lines with the most samples to print")
	flag.Parse()
	if *sites != "" {
		if err := runBPFSites(*sites, *leaf, *top); err != nil {
			fail(err)
		}
		return
	}
	if *render != "" {
		if err := renderResults(*render); err != nil {
			fail(err)
		}
		return
	}
	if os.Geteuid() != 0 {
		fail(errors.New("needs root (sudo make bench)"))
	}
	cfg, err := profile(*prof)
	if err != nil {
		fail(err)
	}
	cfg.log, cfg.out = os.Stdout, *out
	if cfg.bin, err = filepath.Abs(*bin); err != nil {
		fail(err)
	}
	cfg.ref, cfg.note, cfg.hold = *ref, *note, *hold
	if cfg.noXlat = !*xlat; cfg.noXlat {
		cfg.note = strings.TrimSpace("EBPF without the translated destinations (-translated-destinations=false). " + cfg.note)
	}
	if cfg.features, err = parseList(*features, allFeatures); err != nil {
		fail(fmt.Errorf("-ebpf-features: %w", err))
	}
	if cfg.paths, err = parseList(*paths, allPaths); err != nil {
		fail(fmt.Errorf("-paths: %w", err))
	}
	if *runs > 0 {
		cfg.runs = *runs
	}
	if *crrRounds > 0 {
		cfg.crrRounds = *crrRounds
	}
	if *crrDur > 0 {
		cfg.crrDur = *crrDur
	}
	if *resident < 0 {
		fail(fmt.Errorf("-resident: %d is not a count", *resident))
	}
	cfg.resident = *resident
	if cfg.resident != 1 {
		// The report has no field for it: the note says it.
		cfg.note = strings.TrimSpace(fmt.Sprintf("cni paths beside %d resident pods. %s", cfg.resident, cfg.note))
	}
	if *hostportN != "" {
		if cfg.hostportN, err = parseCounts(*hostportN); err != nil {
			fail(fmt.Errorf("-hostport-n: %w", err))
		}
	}
	if err := measure(cfg); err != nil {
		fail(err)
	}
}

// parseCounts reads a comma-separated list of positive counts.
func parseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive count", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// measure runs the bench of cfg and removes all it made, also when
// interrupted (then it exits 130).
func measure(cfg config) error {
	b, err := newBench(cfg)
	if err != nil {
		if b != nil {
			b.cleanup()
		}
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sig
		fmt.Fprintf(os.Stderr, "\n%s: removing the namespaces, processes and bpffs this run made\n", s)
		b.cleanup()
		os.Exit(130)
	}()
	err = b.run()
	b.cleanup()
	return err
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func parseList(s string, allowed []string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !slices.Contains(allowed, f) {
			return nil, fmt.Errorf("unknown %q (one of %s)", f, strings.Join(allowed, ", "))
		}
		out = append(out, f)
	}
	return out, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.cfg.log, "[%6.1fs] %s\n", time.Since(b.cfg.started).Seconds(), fmt.Sprintf(format, args...))
}

// run measures every path of the profile and writes the results; a path
// that fails is reported and the others still run.
func (b *bench) run() error {
	b.cfg.started = time.Now()
	b.versions = machineInfo(b.cfg)
	b.logf("profile %s; EBPF features on: %s", b.cfg.profile, featureList(b.cfg.features))
	for _, kv := range b.versions {
		b.logf("  %-22s %s", kv[0], kv[1])
	}
	if err := b.newSetups(); err != nil {
		return err
	}
	b.versions = append(b.versions, [2]string{"bridge-nf-call-iptables (REF node)", bridgeNF(b.setups[REF].node.NS)})
	steps := map[string]func() error{"cni": b.cniPath, "cni-upstream": b.cniUpstream, "pod-to-pod": b.podToPod, monitorPath: b.monitor, policyPath: b.policy, "masquerade": b.masquerade,
		"hostport": b.hostport, "bandwidth": b.bandwidth,
		"cross-node":          func() error { return b.crossNode("cross-node", false) },
		"cross-node-vxlan":    func() error { return b.crossNode("cross-node-vxlan", true) },
		"masquerade-services": b.masqueradeServices}
	var errs []error
	for _, p := range b.cfg.paths {
		if err := steps[p](); err != nil {
			if b.interrupted() {
				return err
			}
			b.logf("%s failed: %v", p, err)
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			b.failed = append(b.failed, fmt.Sprintf("%s: %v", p, err))
		}
	}
	b.elapsed = time.Since(b.cfg.started)
	if err := b.write(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (b *bench) interrupted() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.done
}

func featureList(f []string) string {
	if len(f) == 0 {
		return "none (L3 datapath only)"
	}
	return strings.Join(f, ", ")
}

// write puts latest.json, machine.json, REPORT.md and the plots in out.
func (b *bench) write() error {
	if err := os.MkdirAll(b.cfg.out, 0o755); err != nil {
		return err
	}
	rows := b.res.Rows()
	if err := writeJSON(filepath.Join(b.cfg.out, "latest.json"), rows); err != nil {
		return err
	}
	now := time.Now().UTC()
	features, failed := append([]string{}, b.cfg.features...), append([]string{}, b.failed...) // [] rather than null
	meta := machineMeta{Profile: b.cfg.profile, Date: now.Format(time.RFC3339), ElapsedS: int(math.Round(b.elapsed.Seconds())),
		Features: features, Runs: b.cfg.runs, RunSeconds: b.cfg.dur.Seconds(), CRRRounds: b.cfg.crrRounds, CRRSeconds: b.cfg.crrDur.Seconds(),
		CNIRounds: b.cfg.cniRounds, Failed: failed, Note: b.cfg.note, Versions: b.versions}
	if err := writeJSON(filepath.Join(b.cfg.out, "machine.json"), meta.flat()); err != nil {
		return err
	}
	rep := meta.report(rows)
	if err := rep.publish(b.cfg.out); err != nil {
		return err
	}
	b.logf("wrote %s", strings.Join(append([]string{"latest.json", "machine.json", "REPORT.md"}, rep.Plots...), ", "))
	fmt.Fprint(b.cfg.log, rep.summary())
	return nil
}
