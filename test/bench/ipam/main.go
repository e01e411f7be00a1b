// Command ipam measures ADD and DEL latency of ebpf-ipam against Debian's
// host-local, sequentially and in parallel, exec-ing both binaries exactly as
// a runtime does. It sends no packets; its state lives in a temporary
// directory and a private bpffs, removed on exit and on Ctrl-C.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

type sample struct{ add, del time.Duration }

type row struct {
	Plugin      string  `json:"plugin"`
	Mode        string  `json:"mode"` // sequential or parallel-N
	Count       int     `json:"count"`
	AddP50ms    float64 `json:"add_p50_ms"`
	AddP99ms    float64 `json:"add_p99_ms"`
	DelP50ms    float64 `json:"del_p50_ms"`
	DelP99ms    float64 `json:"del_p99_ms"`
	PairsPerSec float64 `json:"add_del_per_s"`
}

func main() {
	n := flag.Int("n", 1000, "ADD+DEL pairs per mode")
	par := flag.Int("parallel", 8, "workers in the parallel mode")
	bin := flag.String("bin", "bin", "directory holding ebpf-ipam")
	ref := flag.String("ref", "/usr/lib/cni", "directory holding Debian's host-local")
	out := flag.String("out", "test/bench/results/ipam.json", "JSON output")
	nRanges := flag.Int("ranges", 65536, "ranges (one range set of /30s) in the many-ranges row of ebpf-ipam; 0 skips it")
	onlyRanges := flag.Bool("only-ranges", false, "measure the many-ranges row only (and print it, writing no JSON)")
	flag.Parse()

	tmp, mnt, state, cleanup := scratch()
	defer cleanup()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() { <-sig; cleanup(); os.Exit(130) }()

	ipamBin := install(tmp, filepath.Join(*bin, "ebpf-ipam"))
	hostLocalBin := install(tmp, filepath.Join(*ref, "host-local"))
	plugins := []plugin{
		{"host-local", hostLocalBin, fmt.Sprintf(`"type":"host-local","subnet":"10.200.0.0/16","dataDir":%q`, filepath.Join(state, "host-local"))},
		{"ebpf-ipam", ipamBin, fmt.Sprintf(`"type":"ebpf-ipam","subnet":"10.200.0.0/16","bpfRoot":%q,"stateDir":%q`, filepath.Join(mnt, "root"), filepath.Join(state, "ebpf-ipam"))},
	}
	manyRanges := func() row {
		return manyRangesRow(ipamBin, *nRanges, filepath.Join(mnt, "root"), filepath.Join(state, "ebpf-ipam"))
	}
	if *onlyRanges {
		r := manyRanges()
		fmt.Printf("ebpf-ipam, one ADD+DEL with %d ranges (%d pairs): add p50 %.1f ms p99 %.1f ms, del p50 %.1f ms p99 %.1f ms\n",
			*nRanges, r.Count, r.AddP50ms, r.AddP99ms, r.DelP50ms, r.DelP99ms)
		return
	}
	fmt.Printf("ebpf-ipam vs host-local: %d ADD+DEL pairs sequential and %d-way parallel\n", *n, *par)
	for _, p := range plugins {
		fmt.Printf("  %-10s %s\n", p.name, version(p.path))
	}
	rows := measure(plugins, *n, *par)
	if *nRanges > 0 {
		rows = append(rows, manyRanges())
	}
	printRows(rows)
	check(os.MkdirAll(filepath.Dir(*out), 0o755))
	b, _ := json.MarshalIndent(rows, "", "  ")
	check(os.WriteFile(*out, append(b, '\n'), 0o644))
	fmt.Println("\nwrote", *out)
}

// scratch makes the temporary directory the bench works in, with a private
// bpffs (mnt) and a tmpfs for the plugins' files (state); cleanup unmounts
// and removes them.
func scratch() (tmp, mnt, state string, cleanup func()) {
	tmp, err := os.MkdirTemp("", "ipam-bench-")
	check(err)
	mnt = filepath.Join(tmp, "bpffs")
	check(os.Mkdir(mnt, 0o700))
	check(unix.Mount("bpf", mnt, "bpf", 0, ""))
	// Both plugins keep their files on one tmpfs, as /run is on a real node,
	// so the disk of the machine running the benchmark does not decide it.
	state = filepath.Join(tmp, "state")
	check(os.Mkdir(state, 0o700))
	check(unix.Mount("tmpfs", state, "tmpfs", 0, "size=64m"))
	return tmp, mnt, state, func() {
		_ = unix.Unmount(state, unix.MNT_DETACH)
		_ = unix.Unmount(mnt, unix.MNT_DETACH)
		_ = os.RemoveAll(tmp)
	}
}

// install copies the plugin binary src into dir and returns the copy's path.
// Both plugins run installed, copied as a node's install copies them
// (Debian's host-local too): how an exec faults its binary in depends
// on how the page cache holds it, and a binary where the Go linker wrote
// it, or one cached page by page, starts slower (docs/performance.md,
// the sixth and ninth passes).
func install(dir, src string) string {
	data, err := os.ReadFile(src)
	check(err)
	dst := filepath.Join(dir, filepath.Base(src))
	check(os.WriteFile(dst, data, 0o755))
	return dst
}

// plugin is an IPAM plugin measured: its binary and the body of its ipam
// configuration.
type plugin struct{ name, path, ipam string }

// measure runs n ADD+DEL pairs of each plugin sequentially, then with par
// workers, each after a warm-up.
func measure(plugins []plugin, n, par int) []row {
	var rows []row
	for _, mode := range []int{1, par} {
		for _, p := range plugins {
			stdin := []byte(fmt.Sprintf(`{"cniVersion":"1.0.0","name":"bench","type":"bench","ipam":{%s}}`, p.ipam))
			run(p.path, stdin, 20, 1) // warm-up: first ADD creates state
			start := time.Now()
			samples := run(p.path, stdin, n, mode)
			rows = append(rows, summarize(p.name, mode, samples, time.Since(start)))
		}
	}
	return rows
}

// manyRangesRow is the row of ebpf-ipam (at path) with n ranges.
func manyRangesRow(path string, n int, bpfRoot, stateDir string) row {
	// A configuration as large as a runtime may send: every ADD parses
	// and checks all its ranges. Few pairs: one is what is measured.
	stdin := manyRangesConf(n, bpfRoot, stateDir)
	start := time.Now()
	samples := run(path, stdin, 5, 1)
	r := summarize("ebpf-ipam", 1, samples, time.Since(start))
	r.Mode = fmt.Sprintf("%d-ranges", n)
	return r
}

// printRows prints the rows as a table.
func printRows(rows []row) {
	fmt.Printf("\n%-11s %-12s %9s %9s %9s %9s %12s\n", "plugin", "mode", "add p50", "add p99", "del p50", "del p99", "add+del/s")
	for _, r := range rows {
		fmt.Printf("%-11s %-12s %7.2fms %7.2fms %7.2fms %7.2fms %12.0f\n", r.Plugin, r.Mode, r.AddP50ms, r.AddP99ms, r.DelP50ms, r.DelP99ms, r.PairsPerSec)
	}
}

// manyRangesConf is an ebpf-ipam configuration of n /30 ranges in one
// range set, from 10.0.0.0 up.
func manyRangesConf(n int, bpfRoot, stateDir string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `{"cniVersion":"1.0.0","name":"bench-ranges","type":"bench","ipam":{"type":"ebpf-ipam","bpfRoot":%q,"stateDir":%q,"ranges":[[`, bpfRoot, stateDir)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		a := 10<<24 | i<<2
		fmt.Fprintf(&b, `{"subnet":"%d.%d.%d.%d/30"}`, a>>24&255, a>>16&255, a>>8&255, a&255)
	}
	b.WriteString("]]}}")
	return []byte(b.String())
}

// run performs n ADD+DEL pairs spread over workers.
func run(path string, stdin []byte, n, workers int) []sample {
	var (
		mu  sync.Mutex
		out []sample
		wg  sync.WaitGroup
	)
	next := make(chan int)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				id := fmt.Sprintf("bench-%d-%d", workers, i)
				t0 := time.Now()
				call(path, "ADD", id, stdin)
				t1 := time.Now()
				call(path, "DEL", id, stdin)
				s := sample{t1.Sub(t0), time.Since(t1)}
				mu.Lock()
				out = append(out, s)
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}

func call(path, cmd, id string, stdin []byte) {
	c := exec.Command(path)
	c.Env = []string{"CNI_COMMAND=" + cmd, "CNI_CONTAINERID=" + id, "CNI_NETNS=/var/run/netns/bench", "CNI_IFNAME=eth0", "CNI_PATH=/nonexistent"}
	c.Stdin = bytes.NewReader(stdin)
	var stdout bytes.Buffer
	c.Stdout = &stdout
	if err := c.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "%s %s %s: %v: %s\n", filepath.Base(path), cmd, id, err, stdout.String())
		os.Exit(1)
	}
}

func summarize(name string, workers int, s []sample, wall time.Duration) row {
	pct := func(d []time.Duration, p float64) float64 {
		slices.Sort(d)
		return float64(d[int(p*float64(len(d)-1))]) / 1e6
	}
	var adds, dels []time.Duration
	for _, x := range s {
		adds, dels = append(adds, x.add), append(dels, x.del)
	}
	mode := "sequential"
	if workers > 1 {
		mode = fmt.Sprintf("parallel-%d", workers)
	}
	return row{Plugin: name, Mode: mode, Count: len(s),
		AddP50ms: pct(adds, .50), AddP99ms: pct(adds, .99), DelP50ms: pct(dels, .50), DelP99ms: pct(dels, .99),
		PairsPerSec: float64(len(s)) / wall.Seconds()}
}

func version(path string) string {
	c := exec.Command(path)
	var stderr bytes.Buffer
	c.Stderr = &stderr
	_ = c.Run()
	return strings.SplitN(strings.TrimSpace(stderr.String()), "\n", 2)[0]
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "ipam bench:", err)
		os.Exit(1)
	}
}
