package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
)

// Every path runs its measurements in rounds, and within a round each
// setup in turn, back to back, in an order that changes from round to
// round (roundOrder): drift of the machine's load spreads over all setups
// instead of landing on one, and a ratio taken within a round compares
// figures measured seconds apart. The report pools those ratios
// (pairRatio).

var cniMetrics = func() []metricDecl {
	var out []metricDecl
	for _, suffix := range []string{"", "_c8"} {
		out = append(out,
			metricDecl{"add_p50_ms" + suffix, "ms", "lower"}, metricDecl{"add_p99_ms" + suffix, "ms", "lower"},
			metricDecl{"del_p50_ms" + suffix, "ms", "lower"}, metricDecl{"del_p99_ms" + suffix, "ms", "lower"},
			metricDecl{"pods_per_s" + suffix, "ADD+DEL/s", "higher"})
	}
	return append(out, metricDecl{"add_cold_ms", "ms", "lower"}, metricDecl{"load_ms", "ms", "lower"})
}()

// cniPath: ADD and DEL latency through libcni at concurrency 1 and 8 and
// ADD+DEL pairs per second; RAW is the limit, the same veth, address and
// route made in-process with netlink, with no plugin to exec and no IPAM.
func (b *bench) cniPath() error {
	ss := b.pick("cni", "", cniMetrics, true)
	b.res.skip("cni", "add_cold_ms", "ms", "lower", RAW, "not applicable: nothing to load")
	b.res.skip("cni", "load_ms", "ms", "lower", RAW, "not applicable: nothing to load")
	for _, m := range []string{"status_p50_ms_100pods", "status_p99_ms_100pods"} {
		b.res.skip("cni", m, "ms", "lower", REF, "Debian's 1.1.1 plugins have no STATUS (CNI 1.1.0)")
		b.res.skip("cni", m, "ms", "lower", RAW, "not applicable: no plugin")
	}
	return b.cniMeasure("cni", ss, b.refBin)
}

// cniUpstream is the cni path against the current upstream reference
// plugins (containernetworking/plugins at the version go.mod requires,
// built from the module) instead of Debian's 1.1.1: REF is that chain on
// a node of its own, EBPF is measured again beside it; RAW is cni's.
func (b *bench) cniUpstream() error {
	dir, err := b.upstreamPlugins()
	if err != nil {
		return err
	}
	for _, m := range cniMetrics {
		b.res.declare("cni-upstream", m.name, m.unit, m.better)
		b.res.skip("cni-upstream", m.name, m.unit, m.better, RAW, "not applicable: RAW is the cni path's")
	}
	ref, err := b.newSetupWith(REF, "upstream", dir)
	if err != nil {
		return err
	}
	defer b.closeNode(ref.node)
	return b.cniMeasure("cni-upstream", []*setup{ref, b.setups[EBPF]}, dir)
}

// upstreamPlugins builds the upstream reference plugins (bridge,
// host-local, portmap, bandwidth) into the bench's directory, once. They
// are `tool` lines of go.mod: that keeps their modules in go.sum, which
// `go mod tidy` would otherwise drop (nothing imports them).
func (b *bench) upstreamPlugins() (string, error) {
	build := filepath.Join(b.tmp, "upstream-build")
	const mod = "github.com/containernetworking/plugins/plugins/"
	cmd := exec.Command("go", "build", "-o", build+"/", mod+"main/bridge", mod+"ipam/host-local", mod+"meta/portmap", mod+"meta/bandwidth")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the upstream reference plugins: %v: %s", err, out)
	}
	return installPlugins(build, filepath.Join(b.tmp, "upstream-plugins"), refPlugins...)
}

// cniMeasure runs the cni metrics for ss (REF's fresh nodes take their
// plugins from refDir) under path.
func (b *bench) cniMeasure(path string, ss []*setup, refDir string) error {
	b.logf("%s: %d rounds of %d ADD+DEL pairs at concurrency 1 and 8 beside %d resident pods", path, b.cfg.cniRounds, b.cfg.cniPairs, b.cfg.resident)
	b.res.skip(path, "load_ms", "ms", "lower", REF, "not applicable: nothing to load (the bridge is made by the first ADD)")
	// The first ADD of a node loads (EBPF) or creates (REF: the bridge) what
	// every later ADD reuses: measured on fresh nodes, one per run.
	for run := range b.cfg.runs {
		for _, s := range inRoundOrder(ss, run) {
			if s.name == RAW {
				continue
			}
			d, load, err := b.coldAdd(s.name, fmt.Sprintf("%s-cold-%d", path, run), refDir)
			if err != nil {
				return err
			}
			b.res.addRound(path, "add_cold_ms", "ms", "lower", s.name, run, durMs(d))
			if s.name == EBPF {
				b.res.add(path, "load_ms", "ms", "lower", s.name, durMs(load))
			}
		}
	}
	for _, s := range ss {
		if s.name == EBPF && path == "cni" {
			if err := b.statusAt(path, s, 100); err != nil {
				return err
			}
		}
	}
	for round := range b.cfg.cniRounds {
		for _, conc := range []int{1, 8} {
			suffix := ""
			if conc > 1 {
				suffix = "_c8"
			}
			for _, s := range inRoundOrder(ss, round) {
				adds, dels, wall, err := b.churnTimed(path, s, conc, round)
				if err != nil {
					return err
				}
				b.res.addRound(path, "add_p50_ms"+suffix, "ms", "lower", s.name, round, percentile(adds, .50))
				b.res.addRound(path, "add_p99_ms"+suffix, "ms", "lower", s.name, round, percentile(adds, .99))
				b.res.addRound(path, "del_p50_ms"+suffix, "ms", "lower", s.name, round, percentile(dels, .50))
				b.res.addRound(path, "del_p99_ms"+suffix, "ms", "lower", s.name, round, percentile(dels, .99))
				// pods_per_s_c8 over pods_per_s of the same round is how
				// concurrency is judged (concurrencyOf).
				b.res.addRound(path, "pods_per_s"+suffix, "ADD+DEL/s", "higher", s.name, round, float64(len(adds))/wall.Seconds())
			}
		}
		b.logf("  round %d/%d done", round+1, b.cfg.cniRounds)
	}
	return nil
}

// coldAdd times the first ADD on a fresh node with fresh state, then
// removes that node. A node is fresh as its installation leaves it: for
// EBPF the DaemonSet's init container has run STATUS once, which loads the
// programs (load, timed on its own); REF has nothing to run.
func (b *bench) coldAdd(name, tag, refDir string) (add, load time.Duration, err error) {
	s, err := b.newSetupWith(name, tag, refDir)
	if err != nil {
		return 0, 0, err
	}
	defer b.closeNode(s.node)
	if name == EBPF {
		if load, err = b.status(s); err != nil {
			return 0, 0, err
		}
	}
	_, add, err = b.addPod(s, nil)
	return add, load, err
}

// status runs ebpf-cni's STATUS on the setup's node as the DaemonSet's init
// container does (pkg/agent warmUp): the plugin's configuration at CNI
// 1.1.0, in the node's netns; it returns how long it took.
func (b *bench) status(s *setup) (time.Duration, error) {
	var conf map[string]any
	if err := json.Unmarshal(s.list.Plugins[0].Bytes, &conf); err != nil {
		return 0, err
	}
	conf["cniVersion"], conf["name"] = "1.1.0", s.list.Name
	stdin, err := json.Marshal(conf)
	if err != nil {
		return 0, err
	}
	var d time.Duration
	err = s.node.NS.Do(func(ns.NetNS) error {
		cmd := exec.Command(filepath.Join(b.cfg.bin, "ebpf-cni"))
		cmd.Env = []string{"CNI_COMMAND=STATUS", "CNI_PATH=" + b.cfg.bin, "PATH=" + os.Getenv("PATH")}
		if t := os.Getenv(timingEnv); t != "" {
			cmd.Env = append(cmd.Env, timingEnv+"="+t)
		}
		cmd.Stdin = bytes.NewReader(stdin)
		t0 := time.Now()
		out, err := cmd.CombinedOutput()
		d = time.Since(t0)
		if err != nil {
			return fmt.Errorf("ebpf-cni STATUS: %v: %s", err, out)
		}
		return nil
	})
	return d, err
}

// statusAt times STATUS, as containerd 2.x runs it every 5 s, on the
// setup's node with n pods and nothing broken: each call compares the
// kernel with the records (heal.go). Whole calls (exec included), 30 of
// them; the pods are deleted after.
func (b *bench) statusAt(path string, s *setup, n int) error {
	b.logf("%s: STATUS with %d pods", path, n)
	pods := make([]*pod, 0, n)
	defer func() {
		for _, p := range pods {
			_, _ = s.detach(p)
			b.closeNS(p.ns)
		}
	}()
	for range n {
		p, _, err := b.addPod(s, nil)
		if err != nil {
			return err
		}
		pods = append(pods, p)
	}
	var ds []float64
	file := filepath.Join(b.tmp, "timing-status")
	if err := os.Setenv(timingEnv, file); err != nil {
		return err
	}
	defer os.Unsetenv(timingEnv)
	for range 30 {
		d, err := b.status(s)
		if err != nil {
			return err
		}
		ds = append(ds, durMs(d))
	}
	b.res.add(path, "status_p50_ms_100pods", "ms", "lower", s.name, percentile(ds, .50))
	b.res.add(path, "status_p99_ms_100pods", "ms", "lower", s.name, percentile(ds, .99))
	// Its phases (EBPF_CNI_TIMING), beside ADD's and DEL's.
	calls, order, err := readTimings(file, "")
	if err != nil {
		return err
	}
	for _, k := range order {
		b.res.add(phasesPath, k+"_ms", "ms", "lower", EBPF, median(calls[k]))
		for _, r := range []string{REF, RAW} {
			b.res.skip(phasesPath, k+"_ms", "ms", "lower", r, phasesOwn)
		}
	}
	return nil
}

var rawSeq atomic.Int64

// churn makes n namespaces (untimed), then ADDs and DELs each with conc
// workers; it returns the latencies in ms and the wall time of the ADD+DEL
// phase.
func (b *bench) churn(s *setup, conc, n int) (adds, dels []float64, wall time.Duration, err error) {
	nss := make([]ns.NetNS, n)
	for i := range nss {
		if nss[i], err = b.newNS(); err != nil {
			return nil, nil, 0, err
		}
	}
	defer func() {
		for _, x := range nss {
			b.closeNS(x)
		}
	}()
	// A node in service has pods: -resident of them (one by default) stay
	// for the whole churn, so no setup pays its first-pod or last-pod work
	// (REF: the bridge; EBPF: the masquerade programs on the uplink) on
	// every pair, and more show what the node's size costs a call (route
	// and address dumps grow with it). add_cold_ms has the first ADD on
	// its own.
	if s.name != RAW {
		for range b.cfg.resident {
			resident, _, err := b.addPod(s, nil)
			if err != nil {
				return nil, nil, 0, err
			}
			defer func() { _, _ = s.detach(resident) }()
		}
	}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
	)
	next := make(chan ns.NetNS)
	t0 := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range next {
				a, d, err := b.addDel(s, n)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					adds, dels = append(adds, durMs(a)), append(dels, durMs(d))
				}
				mu.Unlock()
			}
		}()
	}
	for _, x := range nss {
		next <- x
	}
	close(next)
	wg.Wait()
	wall = time.Since(t0)
	if len(errs) > 0 {
		return nil, nil, 0, errs[0]
	}
	return adds, dels, wall, nil
}

// addDel attaches and detaches netns n once.
func (b *bench) addDel(s *setup, n ns.NetNS) (add, del time.Duration, err error) {
	if s.name == RAW {
		return rawAddDel(s, n)
	}
	p, add, err := s.attach(n, fmt.Sprintf("%s-churn-%d", s.name, s.pods.Add(1)), nil)
	if err != nil {
		return 0, 0, err
	}
	del, err = s.detach(p)
	return add, del, err
}

// rawAddDel is what an interface plugin cannot avoid doing, done in-process:
// a veth into the pod, an address, link up, a default route; then delete it.
func rawAddDel(s *setup, n ns.NetNS) (add, del time.Duration, err error) {
	i := rawSeq.Add(1)
	host := fmt.Sprintf("rawc%d", i)
	podIP := cidr(fmt.Sprintf("10.232.%d.%d", (i/250)%250, i%250+2), 16)
	t0 := time.Now()
	if err := veth(s.node.NS, n, host, cidr("10.232.255.254", 32), podIP, false); err != nil {
		return 0, 0, err
	}
	err = n.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: cidr("0.0.0.0", 0), Scope: netlink.SCOPE_LINK})
	})
	add = time.Since(t0)
	if err != nil {
		return 0, 0, err
	}
	t1 := time.Now()
	err = s.node.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(host)
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	})
	return add, time.Since(t1), err
}

// p2pMetrics are the rows of traffic(), on pod-to-pod and masquerade.
var p2pMetrics = []metricDecl{
	{"rr_tps", "tx/s", "higher"}, {"rr_p50_us", "µs", "lower"}, {"rr_p99_us", "µs", "lower"},
	{"cpu_us_per_tx", "µs", "lower"},
	{"tcp_gbps", "Gbit/s", "higher"}, {"tcp2_gbps", "Gbit/s", "higher"},
	{"crr_cps", "conn/s", "higher"}, {"crr_p99_us", "µs", "lower"}, {"cpu_us_per_conn", "µs", "lower"},
}

// clientServer is one setup's client and server on a path.
type clientServer struct {
	setup          string
	client, server ns.NetNS
	target         net.IP // where the client connects
	echoPort       int
}

// podToPod: two pods of one node (RAW: two namespaces on one veth).
func (b *bench) podToPod() error {
	b.logf("pod-to-pod: %d rounds of %s (RR) and %ds (iperf3, 1 and 2 streams), %d of %s (CRR)", b.cfg.runs, b.cfg.dur, secsOf(b.cfg.dur),
		b.cfg.crrRounds, b.cfg.crrDur)
	ss := b.pick("pod-to-pod", "", p2pMetrics, true)
	var cs []clientServer
	for _, s := range ss {
		var client, server *pod
		var err error
		if s.name == RAW {
			client, server, err = b.rawPair()
		} else {
			if client, _, err = b.addPod(s, nil); err == nil {
				server, _, err = b.addPod(s, nil)
			}
		}
		if err != nil {
			return err
		}
		cs = append(cs, clientServer{s.name, client.ns, server.ns, server.ip, echoPort})
	}
	if err := b.serve(cs, true); err != nil {
		return err
	}
	if err := b.traffic("pod-to-pod", cs, true); err != nil {
		return err
	}
	return b.bpfStats("pod-to-pod", cs)
}

// serve starts the echo server (and iperf3) of every pair.
func (b *bench) serve(cs []clientServer, iperf bool) error {
	for _, c := range cs {
		if err := b.startServer(c.server, addr(c.target, c.echoPort)); err != nil {
			return fmt.Errorf("%s: %w", c.setup, err)
		}
		if iperf {
			if err := b.startIperf(c.server, c.target, iperfPort); err != nil {
				return fmt.Errorf("%s: %w", c.setup, err)
			}
		}
	}
	return nil
}

// traffic runs RR, CRR and (with tcp) iperf3 for every pair of cs, in
// rounds (the pairs in roundOrder): cfg.runs rounds of RR and TCP of
// cfg.dur, and cfg.crrRounds shorter rounds of CRR spread between them:
// issue 58's CRR targets need its ratios to ±3%, which 20 rounds of 0.75 s
// reached in the time 5 of 3 s took (docs/performance.md).
func (b *bench) traffic(path string, cs []clientServer, tcp bool) error {
	if b.cfg.hold {
		b.holdForProfiling(path, cs)
	}
	crr := 0
	for run := range b.cfg.runs {
		for _, c := range inRoundOrder(cs, run) {
			r, err := b.load("rr", c.client, addr(c.target, c.echoPort), b.cfg.dur)
			if err != nil {
				return fmt.Errorf("%s %s rr: %w", path, c.setup, err)
			}
			b.res.addRound(path, "rr_tps", "tx/s", "higher", c.setup, run, r.perSec())
			b.res.addRound(path, "rr_p50_us", "µs", "lower", c.setup, run, r.P50us)
			b.res.addRound(path, "rr_p99_us", "µs", "lower", c.setup, run, r.P99us)
			b.res.addRound(path, "cpu_us_per_tx", "µs", "lower", c.setup, run, r.cpuUsPerOp)
		}
		if tcp {
			for _, streams := range []int{1, 2} {
				metric := "tcp_gbps"
				if streams == 2 {
					metric = "tcp2_gbps"
				}
				for _, c := range inRoundOrder(cs, run) {
					r, err := b.iperf(c.client, c.target, streams, secsOf(b.cfg.dur))
					if err != nil {
						return fmt.Errorf("%s %s: %w", path, c.setup, err)
					}
					b.res.addRound(path, metric, "Gbit/s", "higher", c.setup, run, r.End.SumReceived.BitsPerSecond/1e9)
				}
			}
		}
		for ; crr < b.cfg.crrDone(run); crr++ {
			for _, c := range inRoundOrder(cs, crr) {
				r, err := b.load("crr", c.client, addr(c.target, c.echoPort), b.cfg.crrDur)
				if err != nil {
					return fmt.Errorf("%s %s crr: %w", path, c.setup, err)
				}
				b.res.addRound(path, "crr_cps", "conn/s", "higher", c.setup, crr, r.perSec())
				b.res.addRound(path, "crr_p99_us", "µs", "lower", c.setup, crr, r.P99us)
				b.res.addRound(path, "cpu_us_per_conn", "µs", "lower", c.setup, crr, r.cpuUsPerOp)
			}
		}
		b.logf("  %s round %d/%d done (CRR %d/%d)", path, run+1, b.cfg.runs, crr, b.cfg.crrRounds)
	}
	return nil
}

// masquerade: a pod to a host beyond the node's uplink (the world netns).
// RAW is a namespace routed by the node with no NAT and no rules.
func (b *bench) masquerade() error {
	b.logf("masquerade: %d rounds of RR and TCP, %d of CRR, pod to a host outside the node", b.cfg.runs, b.cfg.crrRounds)
	ss := b.pick("masquerade", "masq", p2pMetrics, true)
	var cs []clientServer
	for _, s := range ss {
		var client *pod
		var err error
		if s.name == RAW {
			client, err = b.rawRouted()
		} else {
			client, _, err = b.addPod(s, nil)
		}
		if err != nil {
			return err
		}
		if err := b.ensureWorldServers(s); err != nil {
			return err
		}
		cs = append(cs, clientServer{s.name, client.ns, s.node.World, nettest.WorldIP4, echoPort})
	}
	if err := b.traffic("masquerade", cs, true); err != nil {
		return err
	}
	return b.bpfStats("masquerade", cs)
}

// Host ports: the measured pod's mapping, and the fillers' range.
const (
	benchHostPort  = 18080
	probeHostPort  = 19000 // the pods whose ADD/DEL is timed at each N
	fillerHostPort = 20000
	fillerPerPod   = 10  // mappings per REF filler container
	ebpfPerPod     = 500 // mappings per EBPF filler pod
)

var hostportMetrics = []metricDecl{
	{"rr_tps", "tx/s", "higher"}, {"rr_p99_us", "µs", "lower"}, {"crr_cps", "conn/s", "higher"},
	{"crr_p99_us", "µs", "lower"}, {"add_p50_ms", "ms", "lower"}, {"del_p50_ms", "ms", "lower"},
}

func mappings(from, n, containerPort int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = map[string]any{"hostPort": from + i, "containerPort": containerPort, "protocol": "tcp"}
	}
	return out
}

// hostport: a client in the world to a hostPort of the node, with N
// mappings installed ahead of the measured one (portmap appends each pod's
// rules, so this is where the newest pod's mapping is); and the time to ADD
// and DEL a pod with one more mapping through the whole chain. RAW is the
// client reaching the routed namespace directly, with no mapping at all; it
// does not depend on N, so it is measured once and repeated on every row.
func (b *bench) hostport() error {
	b.logf("hostport: N = %v mappings, %d rounds of RR and %d of CRR each", b.cfg.hostportN, b.cfg.runs, b.cfg.crrRounds)
	var ss []*setup
	for _, n := range b.cfg.hostportN {
		ss = b.pick(fmt.Sprintf("hostport-%d", n), "hostport", hostportMetrics, true)
		for _, m := range []string{"add_p50_ms", "del_p50_ms"} {
			b.res.skip(fmt.Sprintf("hostport-%d", n), m, "ms", "lower", RAW, "not applicable: no mapping to add")
		}
	}
	cs, err := b.hostportPairs(ss)
	if err != nil {
		return err
	}
	installed := map[string]int{} // mappings of each setup but RAW: the measured pod's to begin with
	for _, s := range ss {
		if s.name != RAW {
			installed[s.name] = 1
		}
	}
	var raw rawRuns
	probe := 0
	for li, n := range b.cfg.hostportN {
		path := fmt.Sprintf("hostport-%d", n)
		if err := b.fillTo(ss, installed, n); err != nil {
			return err
		}
		if err := b.hostportTraffic(path, cs, li == 0, &raw); err != nil {
			return err
		}
		if err := b.hostportChurn(path, ss, &probe); err != nil {
			return err
		}
		b.logf("  %s done", path)
	}
	return nil
}

// hostportPairs attaches each setup's measured pod, with its mapping of
// benchHostPort (RAW: the routed namespace, reached directly), and starts
// its server; the client is the world.
func (b *bench) hostportPairs(ss []*setup) ([]clientServer, error) {
	var cs []clientServer
	for _, s := range ss {
		var p *pod
		var err error
		target, port := nettest.NodeIP4, benchHostPort
		if s.name == RAW {
			p, err = b.rawRouted()
			target, port = net.ParseIP("10.231.0.2").To4(), echoPort
		} else {
			p, _, err = b.addPod(s, map[string]any{"portMappings": mappings(benchHostPort, 1, echoPort)})
		}
		if err != nil {
			return nil, err
		}
		if err := b.startServer(p.ns, addr(p.ip, echoPort)); err != nil {
			return nil, err
		}
		cs = append(cs, clientServer{s.name, s.node.World, p.ns, target, port})
	}
	return cs, nil
}

// fillTo brings each setup of ss but RAW to n mappings; installed is
// how many each has.
func (b *bench) fillTo(ss []*setup, installed map[string]int, n int) error {
	for _, s := range ss {
		if s.name == RAW || installed[s.name] >= n {
			continue
		}
		t0 := time.Now()
		if err := b.fill(s, installed[s.name]-1, n-installed[s.name]); err != nil {
			return fmt.Errorf("installing mappings: %w", err)
		}
		installed[s.name] = n
		b.logf("  %s: %d mappings installed (%.1fs)", s.name, n, time.Since(t0).Seconds())
	}
	return nil
}

// rawRuns are RAW's (per second, p99) of RR and CRR in each round,
// measured at the first N: with no mapping, RAW does not depend on N.
type rawRuns struct{ rr, crr [][2]float64 }

// hostportTraffic runs RR and CRR for every pair of cs on path, in rounds
// as traffic does; RAW is measured into raw at the first N and repeated
// from it after, as figures of no round (they pair with nothing).
func (b *bench) hostportTraffic(path string, cs []clientServer, first bool, raw *rawRuns) error {
	one := func(c clientServer, mode string, round int, d time.Duration, keep *[][2]float64) ([2]float64, int, error) {
		if c.setup == RAW && !first {
			return (*keep)[round], -1, nil
		}
		r, err := b.load(mode, c.client, addr(c.target, c.echoPort), d)
		if err != nil {
			return [2]float64{}, 0, fmt.Errorf("%s %s %s: %w", path, c.setup, mode, err)
		}
		v := [2]float64{r.perSec(), r.P99us} // per second, p99
		if c.setup == RAW {
			*keep = append(*keep, v)
		}
		return v, round, nil
	}
	crr := 0
	for run := range b.cfg.runs {
		for _, c := range inRoundOrder(cs, run) {
			v, round, err := one(c, "rr", run, b.cfg.dur, &raw.rr)
			if err != nil {
				return err
			}
			b.res.addRound(path, "rr_tps", "tx/s", "higher", c.setup, round, v[0])
			b.res.addRound(path, "rr_p99_us", "µs", "lower", c.setup, round, v[1])
		}
		for ; crr < b.cfg.crrDone(run); crr++ {
			for _, c := range inRoundOrder(cs, crr) {
				v, round, err := one(c, "crr", crr, b.cfg.crrDur, &raw.crr)
				if err != nil {
					return err
				}
				b.res.addRound(path, "crr_cps", "conn/s", "higher", c.setup, round, v[0])
				b.res.addRound(path, "crr_p99_us", "µs", "lower", c.setup, round, v[1])
			}
		}
	}
	return nil
}

// hostportChurn times the ADD and DEL of a pod with one more mapping (the
// next host port from probeHostPort) through each setup's chain but RAW's,
// hostportReps times, and EBPF's DEL by phase.
func (b *bench) hostportChurn(path string, ss []*setup, probe *int) error {
	timing := filepath.Join(b.tmp, "timing-"+path)
	var dels []float64
	for rep := range b.cfg.hostportReps {
		for _, s := range inRoundOrder(ss, rep) {
			if s.name == RAW {
				continue
			}
			*probe++
			if s.name == EBPF {
				if err := os.Setenv(timingEnv, timing); err != nil {
					return err
				}
			}
			p, d, err := b.addPod(s, map[string]any{"portMappings": mappings(probeHostPort+*probe, 1, echoPort)})
			if err != nil {
				_ = os.Unsetenv(timingEnv)
				return err
			}
			dd, err := s.detach(p)
			_ = os.Unsetenv(timingEnv)
			if err != nil {
				return err
			}
			b.closeNS(p.ns)
			b.res.addRound(path, "add_p50_ms", "ms", "lower", s.name, rep, durMs(d))
			b.res.addRound(path, "del_p50_ms", "ms", "lower", s.name, rep, durMs(dd))
			if s.name == EBPF {
				dels = append(dels, durMs(dd))
			}
		}
	}
	return b.delPhases(path, timing, dels)
}

// fill installs k more mappings (host ports fillerHostPort+from...) ahead
// of the measured one. EBPF gets them the way a runtime would, as pods
// through its chain. REF gets them written in one iptables-restore, in
// exactly the layout portmap writes (a CNI-DN chain per container, an
// entry rule per container in CNI-HOSTPORT-DNAT), but inserted ahead of
// the measured pod's: portmap itself runs iptables once per rule, and each
// run reads the whole ruleset, so installing 10,000 mappings through it
// takes about 9 minutes on this machine; the add_p50_ms row shows that cost.
func (b *bench) fill(s *setup, from, k int) error {
	if s.name != REF {
		for done := 0; done < k; {
			m := min(ebpfPerPod, k-done)
			if _, _, err := b.addPod(s, map[string]any{"portMappings": mappings(fillerHostPort+from+done, m, 9)}); err != nil {
				return err
			}
			done += m
		}
		return nil
	}
	var rules strings.Builder
	rules.WriteString("*nat\n")
	for c := 0; c*fillerPerPod < k; c++ {
		chain := fmt.Sprintf("CNI-DN-bench%08d", from+c*fillerPerPod)
		fmt.Fprintf(&rules, ":%s - [0:0]\n", chain)
		var ports []string
		for i := c * fillerPerPod; i < min(k, (c+1)*fillerPerPod); i++ {
			p := fillerHostPort + from + i
			ports = append(ports, fmt.Sprint(p))
			fmt.Fprintf(&rules, "-A %s -s %s -p tcp -m tcp --dport %d -j CNI-HOSTPORT-SETMARK\n", chain, refSubnet, p)
			fmt.Fprintf(&rules, "-A %s -s 127.0.0.1/32 -p tcp -m tcp --dport %d -j CNI-HOSTPORT-SETMARK\n", chain, p)
			fmt.Fprintf(&rules, "-A %s -p tcp -m tcp --dport %d -j DNAT --to-destination 10.210.255.%d:9\n", chain, p, 1+(from+c)%250)
		}
		fmt.Fprintf(&rules, "-I CNI-HOSTPORT-DNAT 1 -p tcp -m comment --comment \"dnat name: ref id: filler-%d\" -m multiport --dports %s -j %s\n",
			from+c*fillerPerPod, strings.Join(ports, ","), chain)
	}
	rules.WriteString("COMMIT\n")
	return s.node.NS.Do(func(ns.NetNS) error {
		cmd := exec.Command("iptables-restore", "--noflush")
		cmd.Stdin = strings.NewReader(rules.String())
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("iptables-restore: %w: %s", err, out)
		}
		return nil
	})
}

// bwDirs are the two directions the bandwidth path measures: a pod
// limited to R sends to the world (egress; TCP from a pod, which EBPF
// paces at its source), and the world sends to a pod limited to R
// (ingress, iperf3 -R; an outside sender, which EBPF can only police).
var bwDirs = []struct {
	prefix, key string
	reverse     bool
}{{"", "egress", false}, {"in_", "ingress", true}}

// bandwidth: for each rate and direction, the error of the achieved rate
// against R over the whole run, in its first second and in its worst
// second, as the receiver saw them; and the round trip of pings from the
// pod to the world while iperf3 saturates the limit (latency under
// saturation: a shaper's queue adds to it, a policer or source pacing does
// not).
func (b *bench) bandwidth() error {
	b.logf("bandwidth: %v Mbit/s, %d runs of %ds", b.cfg.bwRates, b.cfg.bwRuns, b.cfg.bwSecs)
	var decl []metricDecl
	for _, d := range bwDirs {
		for _, r := range b.cfg.bwRates {
			decl = append(decl, metricDecl{fmt.Sprintf("%serr_%dmbit_pct", d.prefix, r), "%", "lower"},
				metricDecl{fmt.Sprintf("%sfirst_s_err_%dmbit_pct", d.prefix, r), "%", "lower"},
				metricDecl{fmt.Sprintf("%sworst_s_err_%dmbit_pct", d.prefix, r), "%", "lower"},
				metricDecl{fmt.Sprintf("%ssat_rtt_%dmbit_ms", d.prefix, r), "ms", "lower"})
		}
	}
	ss := b.pick("bandwidth", "bandwidth", decl, false)
	for _, s := range ss {
		if err := b.ensureWorldServers(s); err != nil {
			return err
		}
	}
	for _, d := range bwDirs {
		for _, rate := range b.cfg.bwRates {
			if err := b.bandwidthAt(ss, rate, d.prefix, d.key, d.reverse); err != nil {
				return err
			}
			b.logf("  %s %d Mbit/s done", d.key, rate)
		}
	}
	return nil
}

func (b *bench) bandwidthAt(ss []*setup, rate int, prefix, key string, reverse bool) error {
	bits := rate * 1_000_000
	// A 10 ms burst: large enough for tbf at every rate, small enough not
	// to flatter the first second.
	caps := map[string]any{"bandwidth": map[string]any{key + "Rate": bits, key + "Burst": max(bits/100, 64_000)}}
	pods := map[string]*pod{}
	for _, s := range ss {
		p, _, err := b.addPod(s, caps)
		if err != nil {
			return err
		}
		pods[s.name] = p
	}
	var extra []string
	if reverse {
		extra = []string{"-R"}
	}
	for run := range b.cfg.bwRuns {
		for _, s := range inRoundOrder(ss, run) {
			rtt := make(chan float64, 1)
			go func() { rtt <- b.pingMedian(pods[s.name].ns, nettest.WorldIP4, b.cfg.bwSecs) }()
			r, err := b.iperf(pods[s.name].ns, nettest.WorldIP4, 1, b.cfg.bwSecs, extra...)
			sat := <-rtt
			if err != nil {
				return fmt.Errorf("bandwidth %s %s: %w", key, s.name, err)
			}
			ivs := r.Server.Intervals // the receiver's view
			if reverse {
				ivs = r.Intervals
			}
			avg := r.End.SumReceived.BitsPerSecond
			first, worst := avg, 0.0
			var per []string
			for i, iv := range ivs {
				if iv.Sum.Seconds < 0.5 {
					continue // a trailing sliver says little
				}
				if i == 0 {
					first = iv.Sum.BitsPerSecond
				}
				worst = max(worst, errPct(iv.Sum.BitsPerSecond, float64(bits)))
				per = append(per, fmt.Sprintf("%.1f", iv.Sum.BitsPerSecond/1e6))
			}
			b.logf("    %s %s %d Mbit/s: per second %s Mbit/s, ping %.2f ms", s.name, key, rate, strings.Join(per, " "), sat)
			b.res.addRound("bandwidth", fmt.Sprintf("%serr_%dmbit_pct", prefix, rate), "%", "lower", s.name, run, errPct(avg, float64(bits)))
			b.res.addRound("bandwidth", fmt.Sprintf("%sfirst_s_err_%dmbit_pct", prefix, rate), "%", "lower", s.name, run, errPct(first, float64(bits)))
			b.res.addRound("bandwidth", fmt.Sprintf("%sworst_s_err_%dmbit_pct", prefix, rate), "%", "lower", s.name, run, worst)
			if sat > 0 {
				b.res.addRound("bandwidth", fmt.Sprintf("%ssat_rtt_%dmbit_ms", prefix, rate), "ms", "lower", s.name, run, sat)
			}
		}
	}
	return nil
}

// pingMedian pings dst from n during secs seconds (starting half a second
// in, when the flow is up) and returns the median round trip in ms; 0 when
// no reply came.
func (b *bench) pingMedian(n ns.NetNS, dst net.IP, secs int) float64 {
	time.Sleep(500 * time.Millisecond)
	count := max(1, (secs*1000-1000)/100)
	out, _ := nettest.Run(n, "ping", "-n", "-i", "0.1", "-c", fmt.Sprint(count), "-W", "1", dst.String())
	var rtts []float64
	for _, line := range strings.Split(out, "\n") {
		if _, after, ok := strings.Cut(line, "time="); ok {
			var v float64
			if _, err := fmt.Sscanf(after, "%f", &v); err == nil {
				rtts = append(rtts, v)
			}
		}
	}
	if len(rtts) == 0 {
		return 0
	}
	sort.Float64s(rtts)
	return rtts[len(rtts)/2]
}

func errPct(got, want float64) float64 {
	d := (got - want) / want * 100
	if d < 0 {
		return -d
	}
	return d
}

// ensureWorldServers starts the echo server and iperf3 in a setup's world
// once (the masquerade and bandwidth paths share them).
func (b *bench) ensureWorldServers(s *setup) error {
	b.mu.Lock()
	started := b.worldServers[s.name]
	if b.worldServers == nil {
		b.worldServers = map[string]bool{}
	}
	b.worldServers[s.name] = true
	b.mu.Unlock()
	if started {
		return nil
	}
	if err := b.startServer(s.node.World, addr(nettest.WorldIP4, echoPort)); err != nil {
		return err
	}
	return b.startIperf(s.node.World, nettest.WorldIP4, iperfPort)
}
