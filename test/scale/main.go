// Command scale is make scale: ebpf-cni's node agent at 1,000 nodes /
// 30,000 pods against a real API server, outside CI, as root.
//
// etcd (Debian's) and the kube-apiserver make e2e builds run in a network
// namespace of their own (the segment: a bridge at 192.0.2.1); the harness
// fills them with nodes, namespaces, pods (their status written as a
// kubelet would) and NetworkPolicies; a few of the nodes are real: a
// network namespace on the segment each, a private bpffs, pods attached by
// the ebpf-cni plugin, and an ebpf-cni-agent process talking to the API
// server through a proxy that counts what it is sent. Then it measures
// (docs/scale.md) and writes the rows of path scale into -out as the bench
// writes its own (latest.json, machine.json; make scale renders REPORT.md).
// Nothing touches the machine's interfaces; everything made is removed on
// exit, on failure and on Ctrl-C.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
)

func init() { runtime.LockOSThread() } // the main goroutine's thread never changes namespace

type config struct {
	model
	agents, realPods int
	changes          int
	idle, churnFor   time.Duration
	churnRate        int
	bin, k8sDir, out string
	note             string
	agentEnv         []string
	keep             bool
}

type harness struct {
	cfg     config
	m       model
	dir     string // logs, certificates, the nodes' state
	etcdDir string
	seg     *nettest.Segment
	procs   []*exec.Cmd // etcd, kube-apiserver
	agents  []*agentNode
	pki     *pki
	apiURL  string
	client  *kubernetes.Clientset
	restCfg *rest.Config
	res     *results
	start   time.Time
	loadAvg string
	logMu   sync.Mutex
}

func (h *harness) logf(format string, args ...any) {
	h.logMu.Lock()
	defer h.logMu.Unlock()
	fmt.Fprintf(os.Stderr, "scale %6.1fs: %s\n", time.Since(h.start).Seconds(), fmt.Sprintf(format, args...))
}

func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func main() {
	var cfg config
	flag.IntVar(&cfg.nodes, "nodes", 1000, "Node objects")
	flag.IntVar(&cfg.pods, "pods", 30000, "Pod objects (with addresses), spread over the nodes and namespaces")
	flag.IntVar(&cfg.namespaces, "namespaces", 1000, "namespaces")
	flag.IntVar(&cfg.policies, "policies", 30000, "NetworkPolicies (spread over the namespaces)")
	flag.IntVar(&cfg.agents, "agents", 20, "real agents (nodes 0..N-1), each in a network namespace of its own")
	flag.IntVar(&cfg.realPods, "real-pods", 3, "pods per agent node attached by the plugin")
	flag.IntVar(&cfg.changes, "changes", 100, "changes per latency figure")
	flag.DurationVar(&cfg.idle, "idle", time.Minute, "how long the idle CPU is averaged over")
	flag.DurationVar(&cfg.churnFor, "churn", time.Minute, "how long the pod churn lasts")
	flag.IntVar(&cfg.churnRate, "churn-rate", 100, "pod creations (and as many deletions) per second, cluster-wide, during the churn")
	flag.StringVar(&cfg.bin, "bin", "bin", "directory of ebpf-cni, ebpf-ipam and ebpf-cni-agent (make build)")
	flag.StringVar(&cfg.k8sDir, "k8s", "/var/cache/ebpf-cni-e2e/kubernetes-v1.34.3", "directory of kube-apiserver (test/e2e/build.sh)")
	flag.StringVar(&cfg.out, "out", "test/bench/results/scale", "results directory (latest.json, machine.json)")
	flag.StringVar(&cfg.note, "note", "", "a note for machine.json (what else ran)")
	flag.BoolVar(&cfg.keep, "keep", false, "on failure, wait for Enter before removing everything (to look around)")
	flag.Parse()
	if os.Getuid() != 0 {
		fmt.Fprintln(os.Stderr, "scale: needs root (namespaces, bpffs mounts)")
		os.Exit(2)
	}
	if v := os.Getenv("SCALE_AGENT_ENV"); v != "" {
		cfg.agentEnv = []string{v}
	}
	var err error
	if cfg.bin, err = filepath.Abs(cfg.bin); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(2)
	}
	if cfg.agents > cfg.nodes || cfg.agents > 200 {
		fmt.Fprintln(os.Stderr, "scale: -agents: at most -nodes and 200 (their addresses are 192.0.2.10 and up)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	h := &harness{cfg: cfg, m: cfg.model, res: newResults(), start: time.Now()}
	err = h.run(ctx)
	if err != nil && cfg.keep && ctx.Err() == nil {
		fmt.Fprintf(os.Stderr, "scale: FAIL: %v\nscale: -keep: %s holds the logs; Enter removes everything\n", err, h.dir)
		_, _ = fmt.Scanln()
	}
	h.cleanup()
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "scale: FAIL: %v\n", err)
		os.Exit(1)
	}
}

func (h *harness) run(ctx context.Context) error {
	var err error
	if h.dir, err = os.MkdirTemp("", "ebpf-cni-scale."); err != nil {
		return err
	}
	if h.etcdDir, err = os.MkdirTemp("/dev/shm", "ebpf-cni-scale-etcd."); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(h.dir, "logs"), 0o755); err != nil {
		return err
	}
	h.logf("%d nodes, %d pods in %d namespaces, %d policies, %d agents with %d pods each; logs in %s",
		h.m.nodes, h.m.pods, h.m.namespaces, h.m.policies, h.cfg.agents, h.cfg.realPods, filepath.Join(h.dir, "logs"))
	if h.seg, err = nettest.NewSegment(); err != nil {
		return err
	}
	if err := h.controlPlane(ctx); err != nil {
		return err
	}
	if err := h.measure(ctx); err != nil {
		return err
	}
	return h.write()
}

// cleanup removes everything run made, whatever state it got to.
func (h *harness) cleanup() {
	for _, a := range h.agents {
		a.stop()
	}
	for _, a := range h.agents {
		a.close()
	}
	for i := len(h.procs) - 1; i >= 0; i-- {
		p := h.procs[i]
		_ = p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = p.Process.Kill()
			<-done
		}
	}
	if h.seg != nil {
		h.seg.Close()
	}
	if h.etcdDir != "" {
		_ = os.RemoveAll(h.etcdDir)
	}
	if h.dir != "" {
		_ = os.RemoveAll(h.dir)
	}
}
