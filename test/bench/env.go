package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/utils/sysctl"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/pkg/cgroup"
)

// CPUs the load is pinned to (the machine has two). The RR/CRR client and
// its echo server share one CPU: on this VM a wakeup across CPUs costs
// ~35 µs (an IPI and a halted vCPU), four times the whole same-CPU round
// trip, and it swings from run to run, burying the datapath's cost. iperf3
// puts sender and receiver on different CPUs, as throughput needs both.
const (
	serverCPU = 0 // iperf3 server
	clientCPU = 1 // iperf3 client, RR/CRR client and echo server
)

// bench holds everything a run made, so cleanup can remove it whatever
// state the run stopped in (success, failure, Ctrl-C).
type bench struct {
	cfg         config
	res         *Results
	tmp         string
	refBin      string       // Debian's reference plugins (cfg.ref), installed for the run
	runFS       string       // a tmpfs, as /run is on a node: EBPF's stateDirs (runDir)
	bpfs        string       // private bpffs mount
	cgroup      string       // cgroup v2 dir for the cgroup hooks; the bench runs in it
	leaveCgroup func() error // moves the bench back out

	mu    sync.Mutex
	done  bool
	procs []*exec.Cmd
	netns []ns.NetNS
	nodes []*nettest.Node
	// clusters: the cross-node paths' simulated clusters.
	clusters []*nettest.Cluster
	setups   map[string]*setup
	exe      string
	rawPod   *pod // RAW's namespace routed by the node
	// worldServers: setups whose world runs the echo server and iperf3.
	worldServers map[string]bool
	versions     [][2]string // what ran where: machine, kernel, tools, plugins
	failed       []string    // paths that failed, with their error
	elapsed      time.Duration
}

func newBench(cfg config) (*bench, error) {
	b := &bench{cfg: cfg, res: newResults(), setups: map[string]*setup{}}
	var err error
	if b.exe, err = os.Executable(); err != nil {
		return nil, err
	}
	if b.tmp, err = os.MkdirTemp("", "ebpf-cni-bench-"); err != nil {
		return nil, err
	}
	// The cgroup hooks (hostPort, pacing) attach to a cgroup of the
	// bench's own, never to the machine's: the bench joins it, so the
	// processes it starts in the pods are paced.
	if root, err := cgroup.V2Root(); err == nil {
		if b.cgroup, err = os.MkdirTemp(root, "ebpf-cni-bench-"); err != nil {
			return b, fmt.Errorf("creating the bench's cgroup: %w", err)
		}
		if b.leaveCgroup, err = cgroup.Join(b.cgroup); err != nil {
			return b, err
		}
	}
	if b.cfg.bin, err = installPlugins(b.cfg.bin, filepath.Join(b.tmp, "cni-bin"), "ebpf-cni", "ebpf-ipam", "loopback"); err != nil {
		return b, err
	}
	if b.refBin, err = installPlugins(b.cfg.ref, filepath.Join(b.tmp, "ref-bin"), refPlugins...); err != nil {
		return b, err
	}
	// ebpf-cni keeps its state in /run/ebpf-cni by default, a tmpfs on a
	// node (systemd mounts one on /run); host-local keeps REF's in
	// /var/lib/cni/networks, on the node's disk, as libcni keeps both
	// setups' result caches. Each keeps it where its default puts it: the
	// bench's temp dir is on this machine's disk.
	b.runFS = filepath.Join(b.tmp, "run")
	if err := os.Mkdir(b.runFS, 0o755); err != nil {
		return b, err
	}
	if err := unix.Mount("tmpfs", b.runFS, "tmpfs", 0, "size=256m,mode=0755"); err != nil {
		b.runFS = ""
		return b, fmt.Errorf("mounting a tmpfs for the plugin's state: %w", err)
	}
	b.bpfs = filepath.Join(b.tmp, "bpffs")
	if err := os.Mkdir(b.bpfs, 0o700); err != nil {
		return b, err
	}
	if err := unix.Mount("bpf", b.bpfs, "bpf", 0, ""); err != nil {
		b.bpfs = ""
		return b, fmt.Errorf("mounting a private bpffs: %w", err)
	}
	return b, nil
}

// cleanup kills the processes, removes the namespaces (and with them every
// veth, bridge, ifb, qdisc and iptables rule in them), unmounts the bpffs
// (unpinning programs, maps and links) and removes the temp dir. It runs
// once; later calls wait for the first.
func (b *bench) cleanup() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return
	}
	b.done = true
	for _, c := range b.procs {
		if c.Process != nil {
			_ = c.Process.Kill()
		}
	}
	for _, c := range b.procs {
		if c.Process != nil {
			_, _ = c.Process.Wait()
		}
	}
	for _, n := range b.netns {
		nettest.CloseNetNS(n)
	}
	for _, n := range b.nodes {
		n.Close()
	}
	for _, c := range b.clusters {
		c.Close()
	}
	if b.bpfs != "" {
		_ = unix.Unmount(b.bpfs, unix.MNT_DETACH)
	}
	if b.runFS != "" {
		_ = unix.Unmount(b.runFS, unix.MNT_DETACH)
	}
	if b.tmp != "" {
		_ = os.RemoveAll(b.tmp)
	}
	if b.leaveCgroup != nil {
		_ = b.leaveCgroup()
	}
	if b.cgroup != "" {
		_ = os.Remove(b.cgroup) // its programs went with the bpffs
	}
}

// track registers something for cleanup; it fails once cleanup has begun
// (Ctrl-C), so nothing is made after the teardown.
func (b *bench) track(f func()) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return fmt.Errorf("interrupted")
	}
	f()
	return nil
}

// newNS makes a namespace removed by cleanup, with client-friendly TCP
// settings: a wide ephemeral port range and TIME_WAIT reuse, so connection
// rate runs of tens of thousands of connections do not run out of ports.
func (b *bench) newNS() (ns.NetNS, error) {
	n, err := nettest.NewNetNS()
	if err != nil {
		return nil, err
	}
	if err := b.track(func() { b.netns = append(b.netns, n) }); err != nil {
		nettest.CloseNetNS(n)
		return nil, err
	}
	return n, clientSysctls(n)
}

// closeNS removes a namespace before the end of the run.
func (b *bench) closeNS(n ns.NetNS) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, x := range b.netns {
		if x == n {
			b.netns = append(b.netns[:i], b.netns[i+1:]...)
			break
		}
	}
	nettest.CloseNetNS(n)
}

func clientSysctls(n ns.NetNS) error {
	return n.Do(func(ns.NetNS) error {
		for k, v := range map[string]string{
			"net/ipv4/ip_local_port_range": "10000 65000",
			"net/ipv4/tcp_tw_reuse":        "1",
		} {
			if _, err := sysctl.Sysctl(k, v); err != nil {
				return fmt.Errorf("sysctl %s: %w", k, err)
			}
		}
		return nil
	})
}

// newNode makes a simulated node (node netns + uplink to a world netns).
func (b *bench) newNode() (*nettest.Node, error) {
	n, err := nettest.NewNode()
	if err != nil {
		return nil, err
	}
	if err := b.track(func() { b.nodes = append(b.nodes, n) }); err != nil {
		n.Close()
		return nil, err
	}
	return n, clientSysctls(n.World)
}

// closeNode removes a node before the end of the run.
func (b *bench) closeNode(n *nettest.Node) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, x := range b.nodes {
		if x == n {
			b.nodes = append(b.nodes[:i], b.nodes[i+1:]...)
			break
		}
	}
	n.Close()
}

// start runs a long-lived process inside n pinned to cpu (-1: not
// pinned); cleanup kills it.
func (b *bench) start(n ns.NetNS, cpu int, env []string, name string, args ...string) (*exec.Cmd, error) {
	var cmd *exec.Cmd
	if cpu >= 0 {
		cmd = exec.Command("taskset", append([]string{"-c", fmt.Sprint(cpu), name}, args...)...)
	} else {
		cmd = exec.Command(name, args...)
	}
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	err := n.Do(func(ns.NetNS) error { return cmd.Start() })
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	if err := b.track(func() { b.procs = append(b.procs, cmd) }); err != nil {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
		return nil, err
	}
	go func() { _ = cmd.Wait() }()
	return cmd, nil
}

// runCmd runs a command inside n pinned to cpu, with a time limit, and returns
// its stdout.
func (b *bench) runCmd(n ns.NetNS, cpu int, limit time.Duration, env []string, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	if cpu >= 0 {
		args = append([]string{"-c", fmt.Sprint(cpu), name}, args...)
		name = "taskset"
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := n.Do(func(ns.NetNS) error { return cmd.Run() })
	if err != nil {
		return stdout.Bytes(), fmt.Errorf("%s %s: %w: %s%s", name, strings.Join(args, " "), err, stderr.String(), stdout.String())
	}
	return stdout.Bytes(), nil
}

// startServer starts the echo server of tool.go on addr inside n and waits
// until it listens.
func (b *bench) startServer(n ns.NetNS, addr string) error {
	if _, err := b.start(n, clientCPU, []string{toolEnv + "=server " + addr}, b.exe); err != nil {
		return err
	}
	_, port, _ := net.SplitHostPort(addr)
	return waitListen(n, port)
}

// startIperf starts an iperf3 server on ip inside n and waits until it
// listens; -J makes it hand its per-second intervals (the receiver's view)
// to clients that ask with --get-server-output.
func (b *bench) startIperf(n ns.NetNS, ip net.IP, port int) error {
	if _, err := b.start(n, -1, nil, "iperf3", "-s", "-J", "-B", ip.String(), "-p", fmt.Sprint(port), "-A", fmt.Sprint(serverCPU)); err != nil {
		return err
	}
	return waitListen(n, fmt.Sprint(port))
}

func waitListen(n ns.NetNS, port string) error {
	for i := 0; i < 100; i++ {
		out, err := nettest.Run(n, "ss", "-Hltn", "sport = :"+port)
		if err == nil && strings.TrimSpace(out) != "" {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("nothing listens on port %s after 5 s", port)
}

// veth joins two namespaces with a veth pair: hostName in host, eth0 in
// pod, addresses on both, pod's default route via the host side when gw.
func veth(host, pod ns.NetNS, hostName string, hostIP, podIP *net.IPNet, gw bool) error {
	err := host.Do(func(ns.NetNS) error {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = hostName
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(pod.Fd()))}); err != nil {
			return fmt.Errorf("creating veth %s: %w", hostName, err)
		}
		l, err := netlink.LinkByName(hostName)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: hostIP, Flags: unix.IFA_F_NODAD}); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		return err
	}
	return pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: podIP, Flags: unix.IFA_F_NODAD}); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		if gw {
			return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: hostIP.IP})
		}
		return nil
	})
}

func cidr(ip string, bits int) *net.IPNet {
	return &net.IPNet{IP: net.ParseIP(ip).To4(), Mask: net.CIDRMask(bits, 32)}
}

// runDir is a directory for EBPF's stateDir under the bench's tmpfs (b.runFS).
func (b *bench) runDir(elem ...string) string {
	return filepath.Join(append([]string{b.runFS}, elem...)...)
}

// refPlugins are REF's chain (bridge with host-local, portmap, bandwidth).
var refPlugins = []string{"bridge", "host-local", "portmap", "bandwidth"}

// installPlugins copies the plugins named (those of them src has) from src
// into dir, as an installation does (the DaemonSet's install, make
// install, a package), and returns dir. Every setup's plugins are copied
// alike (Debian's too: REF's chain runs them from the bench's ref-bin), so
// that the page cache holds each binary the same way: how an exec faults
// its binary in depends on it. On the 6.18 bench machine (ext4, which
// caches a file written in one piece in large folios) an exec of ebpf-cni
// where the Go linker wrote it took 0.4-0.5 ms more wall time and about
// 0.9 ms more CPU (377 page faults against 297) than the same bytes
// copied; an exec of Debian's bridge from /usr/lib/cni, cached page by
// page, 0.25-0.28 ms more than a copy (docs/performance.md, the ninth
// pass).
func installPlugins(src, dir string, names ...string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for _, name := range names {
		data, err := os.ReadFile(filepath.Join(src, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("installing the plugins: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o755); err != nil {
			return "", fmt.Errorf("installing the plugins: %w", err)
		}
	}
	return dir, nil
}
