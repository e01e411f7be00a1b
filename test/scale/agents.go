package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebpf-cni/ebpf-cni/internal/conflisttest"
	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// segmentGW4 is the segment's gateway: the control plane's address.
var segmentGW4 = nettest.SegmentGW4

// agentNode is one of the nodes a real agent stands for: node i of the
// model, in a network namespace on the segment, with a private bpffs, a few
// pods attached by the real plugin, and the agent process.
type agentNode struct {
	i                 int
	name              string
	ip4, ip6          netip.Addr
	n                 *nettest.Node
	dir, mnt          string
	bpfRoot, stateDir string
	cni               *nettest.CNI
	list              *libcni.NetworkConfigList
	pods              []*realPod
	cmd               *exec.Cmd
	proxy             *proxy
	started           time.Time

	nd     *node.Node // the harness's handle on its maps (no lock)
	pm     *policy.Maps
	routes *ebpf.Map // cluster_routes
}

// realPod is a pod of the model attached by the plugin on its node.
type realPod struct {
	k       int
	pod     *nettest.Pod
	ip      netip.Addr
	ifindex uint32
	obj     *corev1.Pod
}

// addNode makes agent node i: its namespace on the segment, its bpffs and
// its pods (the model's pods k = i + nodes*m, m < realPods, attached with
// the pod's namespace, name and uid as containerd passes them).
func (h *harness) addNode(ctx context.Context, i int) (*agentNode, error) {
	a := &agentNode{i: i, name: nodeName(i), ip4: netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)}),
		ip6: netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0xff, 0xff, 15: byte(10 + i)}), dir: filepath.Join(h.dir, "nodes", nodeName(i))}
	h.agents = append(h.agents, a) // cleaned up whatever happens next
	var err error
	if a.n, err = h.seg.AddNode(a.ip4.AsSlice(), a.ip6.AsSlice()); err != nil {
		return nil, fmt.Errorf("node %d: %w", i, err)
	}
	a.mnt = filepath.Join(a.dir, "bpffs")
	a.stateDir = filepath.Join(a.dir, "state")
	for _, d := range []string{a.mnt, a.stateDir, filepath.Join(a.dir, "cni-cache")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	if err := unix.Mount("bpf", a.mnt, "bpf", 0, ""); err != nil {
		a.mnt = ""
		return nil, fmt.Errorf("mounting a bpffs for node %d: %w", i, err)
	}
	a.bpfRoot = filepath.Join(a.mnt, "ebpf-cni")
	conf, err := conflisttest.Bytes(conflisttest.Options{Name: "scale", BPFRoot: a.bpfRoot, StateDir: a.stateDir,
		Subnets: []string{podCIDR(i).String()}, Keys: map[string]any{"clusterCIDRs": []string{clusterCIDR.String()}}})
	if err != nil {
		return nil, err
	}
	if a.list, err = libcni.ConfListFromBytes(conf); err != nil {
		return nil, err
	}
	a.cni = nettest.NewCNI(a.n, []string{h.cfg.bin}, filepath.Join(a.dir, "cni-cache"))
	for m := 0; m < h.cfg.realPods; m++ {
		k := i + h.m.nodes*m
		if k >= h.m.pods {
			break
		}
		p, err := h.client.CoreV1().Pods(nsName(h.m.podNS(k))).Get(ctx, podName(k), metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		pod, err := a.cni.AddPodArgs(a.list, fmt.Sprintf("scale-%05d", k), nil,
			[][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", p.Namespace}, {"K8S_POD_NAME", p.Name}, {"K8S_POD_UID", string(p.UID)}})
		if err != nil {
			return nil, fmt.Errorf("node %d: ADD of pod %s/%s: %w", i, p.Namespace, p.Name, err)
		}
		rp := &realPod{k: k, pod: pod, obj: p}
		rp.ip, _ = netip.AddrFromSlice(pod.IP(4))
		rp.ip = rp.ip.Unmap()
		a.pods = append(a.pods, rp)
		err = a.n.NS.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName(veth.HostName(pod.RT.ContainerID, pod.RT.IfName))
			if err == nil {
				rp.ifindex = uint32(l.Attrs().Index)
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("node %d: the host veth of %s: %w", i, p.Name, err)
		}
	}
	if a.nd, err = node.Open(node.Options{BPFRoot: a.bpfRoot, StateDir: a.stateDir, Objects: features.Objects(), Tag: features.Tag(), Lock: node.Unlocked}); err != nil {
		return nil, err
	}
	if a.pm, err = policy.Open(a.nd); err != nil {
		return nil, err
	}
	if a.routes, err = a.nd.Map(maps.CniMapClusterRoutes); err != nil {
		return nil, err
	}
	// The kubelet's part: the pods' addresses in their status.
	for _, rp := range a.pods {
		p := rp.obj
		p.Status = podStatus(rp.ip)
		if _, err := h.client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			return nil, fmt.Errorf("status of pod %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	return a, nil
}

// startAgent starts the node's agent (mode vxlan: its tunnel endpoints are
// entries of the pinned cluster_routes, whatever the nodes' addresses),
// talking to the API server through its own counting proxy.
func (h *harness) startAgent(a *agentNode) error {
	var err error
	if a.proxy == nil {
		if a.proxy, err = h.newProxy(7000 + a.i); err != nil {
			return err
		}
	}
	kc := filepath.Join(a.dir, "kubeconfig")
	if err := h.pki.kubeconfig(kc, "https://"+a.proxy.addr); err != nil {
		return err
	}
	a.started = time.Now()
	a.cmd, err = startIn(a.n.NS, filepath.Join(h.dir, "logs", a.name+".log"), h.cfg.agentEnv, filepath.Join(h.cfg.bin, "ebpf-cni-agent"), "run",
		"-node", a.name, "-kubeconfig", kc, "-mode", "vxlan", "-bpf-root", a.bpfRoot, "-state-dir", a.stateDir,
		"-health-addr", "127.0.0.1:9965", "-metrics-addr", "127.0.0.1:9966")
	return err
}

// stop ends the agent: SIGTERM, SIGKILL after 5 s.
func (a *agentNode) stop() {
	if a.cmd == nil || a.cmd.Process == nil {
		return
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = a.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = a.cmd.Process.Kill()
		<-done
	}
	a.cmd = nil
}

// close removes everything of the node but its namespace (the segment's).
func (a *agentNode) close() {
	a.stop()
	if a.nd != nil {
		a.nd.Close()
	}
	for _, p := range a.pods {
		_ = a.cni.DelPod(a.list, p.pod)
	}
	if a.proxy != nil {
		a.proxy.close()
	}
	if a.mnt != "" {
		_ = unix.Unmount(a.mnt, unix.MNT_DETACH)
	}
}

// status is the agent's /readyz answer (nil while it does not answer).
func (a *agentNode) status() *agent.Status {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: nsDialer(a.n.NS), DisableKeepAlives: true}}
	resp, err := c.Get("http://127.0.0.1:9965/readyz")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var s agent.Status
	if json.NewDecoder(resp.Body).Decode(&s) != nil {
		return nil
	}
	return &s
}

// metrics is the agent's /metrics.
func (a *agentNode) metrics() (string, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: nsDialer(a.n.NS), DisableKeepAlives: true}}
	resp, err := c.Get("http://127.0.0.1:9966/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// tunnel reads the agent's tunnel endpoint of cidr: the node address it
// points at (invalid: none). The trie answers the longest prefix holding
// the range's address, so an entry of a shorter one (the cluster's range,
// written by ADD) has no tunnel flag and counts as none.
func (a *agentNode) tunnel(cidr netip.Prefix) netip.Addr {
	b := cidr.Addr().As4()
	k := maps.CniClusterKey{Prefixlen: uint32(32 + cidr.Bits()), Family: 4}
	copy(k.Addr[:], b[:])
	var v maps.CniClusterRoute
	if err := a.routes.Lookup(&k, &v); err != nil || v.Flags&maps.CniClusterFlagsCLUSTER_F_TUNNEL == 0 {
		return netip.Addr{}
	}
	if v.NodeFamily == 4 {
		return netip.AddrFrom4([4]byte(v.Node[:4]))
	}
	return netip.AddrFrom16(v.Node)
}

// tunnels counts the agent's tunnel endpoints.
func (a *agentNode) tunnels() int {
	n := 0
	var k maps.CniClusterKey
	var v maps.CniClusterRoute
	it := a.routes.Iterate()
	for it.Next(&k, &v) {
		if v.Flags&maps.CniClusterFlagsCLUSTER_F_TUNNEL != 0 {
			n++
		}
	}
	return n
}

// hasPort: endpoint ifindex's rule for prefix p in direction d allows TCP
// port (an LPM lookup: the longest prefix holding p's address).
func (a *agentNode) hasPort(ifindex uint32, d policy.Direction, p netip.Prefix, port int) bool {
	k := policy.Key(ifindex, d, p)
	var r policy.Rule
	if err := a.pm.RuleMap.Lookup(&k, &r); err != nil {
		return false
	}
	if r.Flags&uint8(maps.CniPolicyRuleFlagsPOLICY_F_ALL_PORTS) != 0 {
		return true
	}
	for i := 0; i < int(r.N_ports) && i < len(r.Ports); i++ {
		if r.Ports[i].Proto == 6 && int(r.Ports[i].First) <= port && port <= int(r.Ports[i].Last) {
			return true
		}
	}
	return false
}

// procStat is a process's CPU time (user+system) and resident memory.
type procStat struct {
	cpu time.Duration
	rss int64 // bytes
}

// clockTick is USER_HZ, what /proc/<pid>/stat counts in.
const clockTick = 100

func statOf(pid int) (procStat, error) {
	var s procStat
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	// After the command's parenthesis: fields 3.. (utime is 14, stime 15).
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	if len(f) < 13 {
		return s, errors.New("short /proc stat")
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	s.cpu = time.Duration(ut+st) * time.Second / clockTick
	st2, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	for _, line := range strings.Split(string(st2), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			s.rss = kb << 10
		}
	}
	return s, nil
}

func (a *agentNode) stat() (procStat, error) {
	if a.cmd == nil || a.cmd.Process == nil {
		return procStat{}, errors.New(a.name + ": no agent running")
	}
	return statOf(a.cmd.Process.Pid)
}

// proxy forwards an agent's connections to the API server and counts the
// bytes the API server sends it (TLS records: what crosses the wire).
type proxy struct {
	addr string
	l    net.Listener
	down atomic.Int64
}

func (h *harness) newProxy(port int) (*proxy, error) {
	p := &proxy{addr: net.JoinHostPort(segmentGW4.String(), strconv.Itoa(port))}
	err := h.seg.NS.Do(func(ns.NetNS) error {
		var err error
		p.l, err = net.Listen("tcp", p.addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("proxy on %s: %w", p.addr, err)
	}
	dial := nsDialer(h.seg.NS)
	upstream := net.JoinHostPort(segmentGW4.String(), strconv.Itoa(apiPort))
	go func() {
		for {
			c, err := p.l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := dial(context.Background(), "tcp", upstream)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c); _ = u.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(countingWriter{c, &p.down}, u)
			}()
		}
	}()
	return p, nil
}

func (p *proxy) close() { _ = p.l.Close() }

type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n.Add(int64(n))
	return n, err
}
