package deploy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/ebpf-cni/ebpf-cni/internal/kubetest"
	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/cluster"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// agentBinary builds ebpf-cni-agent (static, as make build does) into a
// directory of the test.
func agentBinary(t *testing.T) string {
	return testutil.Binary(t, "./cmd/ebpf-cni-agent", "ebpf-cni-agent")
}

// kubeconfig writes a kubeconfig for the test API server.
func kubeconfig(t *testing.T, api *kubetest.Server) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: %q}}]
users: [{name: test, user: {}}]
contexts: [{name: test, context: {cluster: test, user: test}}]
current-context: test
`, api.Config().Host)
	require.NoError(t, os.WriteFile(p, []byte(cfg), 0o600))
	return p
}

// containerEnv is the environment the DaemonSet gives container c on node.
func containerEnv(m *manifest, c corev1.Container, node string) []string {
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
			env = append(env, e.Name+"="+node)
		case e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil:
			if v, ok := m.config.Data[e.ValueFrom.ConfigMapKeyRef.Key]; ok {
				env = append(env, e.Name+"="+v)
			}
		default:
			env = append(env, e.Name+"="+e.Value)
		}
	}
	return env
}

// setpriv runs argv with the bounding set limited to caps: a process of
// uid 0 then holds exactly those, as in a container that drops ALL and
// adds them.
func setpriv(caps []corev1.Capability, argv ...string) []string {
	set := "-all"
	for _, c := range caps {
		set += ",+" + strings.ToLower(string(c))
	}
	return append([]string{"setpriv", "--bounding-set", set, "--inh-caps", "-all", "--"}, argv...)
}

func without(caps []corev1.Capability, drop corev1.Capability) []corev1.Capability {
	var out []corev1.Capability
	for _, c := range caps {
		if c != drop {
			out = append(out, c)
		}
	}
	return out
}

// TestManifestPrivileges runs the DaemonSet's two commands as the manifest
// runs them: the agent binary, its environment from the manifest and the
// ConfigMap, and exactly the capabilities the manifest grants (setpriv's
// bounding set). The init container's install, STATUS included, succeeds
// with BPF, PERFMON and NET_ADMIN and fails without any one of them. The
// agent's container has NET_ADMIN and BPF: in direct mode it routes with
// NET_ADMIN and cannot without it, in vxlan mode it writes the tunnel
// endpoints with BPF and cannot without it, and in each it drops the other
// unless it serves metrics (on by default), which read the plugin's maps
// with BPF: the direct agent's /metrics then reports its routes, desired
// and present, and the node's programs. (What a container adds
// beyond capabilities, seccomp and the mount namespace, is
// TestManifestUnderRuntime's.)
func TestManifestPrivileges(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Fatal("setpriv (util-linux) is missing")
	}
	m := loadManifest(t)
	install, run := m.containers()
	bin := agentBinary(t)

	api, err := kubetest.New()
	require.NoError(t, err)
	t.Cleanup(api.Close)
	a := &simNode{name: "node-a", ip4: net.ParseIP("192.0.2.11"), ip6: net.ParseIP("2001:db8:ffff::11"),
		podCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}}
	api.Apply(a.object())
	kc := kubeconfig(t, api)

	runInstall := func(caps []corev1.Capability) (string, error) {
		cniBin, cniConf := t.TempDir(), t.TempDir()
		argv := setpriv(caps, bin, "install", "-kubeconfig", kc, "-src", testutil.PluginDir(t),
			"-cni-bin-dir", cniBin, "-cni-conf-dir", cniConf, "-bpf-root", testutil.BPFFS(t), "-state-dir", t.TempDir())
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = containerEnv(m, install, "node-a")
		out, err := cmd.CombinedOutput()
		if err == nil {
			if _, serr := os.Stat(filepath.Join(cniConf, "10-ebpf-cni.conflist")); serr != nil {
				return string(out), serr
			}
		}
		return string(out), err
	}
	caps := install.SecurityContext.Capabilities.Add
	out, err := runInstall(caps)
	require.NoError(t, err, "install with %v:\n%s", caps, out)
	require.Contains(t, out, "plugin ready (STATUS)")
	for _, c := range caps {
		out, err := runInstall(without(caps, c))
		require.Error(t, err, "install succeeded without %s: the manifest grants more than needed\n%s", c, out)
		require.Contains(t, out, "the plugin's STATUS failed")
	}

	// The agent, in a node's network namespace on a segment, the API
	// server in that namespace's loopback.
	node, h := lonelyNode(t, a.ip4.String(), a.ip6.String())
	var local *kubetest.Server
	require.NoError(t, node.NS.Do(func(ns.NetNS) error { local, err = kubetest.New(); return err }))
	t.Cleanup(local.Close)
	local.Apply(a.object())
	local.Apply((&simNode{name: "node-b", ip4: net.ParseIP("192.0.2.12"), ip6: net.ParseIP("2001:db8:ffff::12"),
		podCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("fd00:10:244:2::/64")}}).object())
	lkc := kubeconfig(t, local)

	// The agent as the DaemonSet runs it, in mode (the ConfigMap's value
	// replaced), its tunnel endpoints in a bpffs of the test's.
	bpfRoot, stateDir := testutil.BPFFS(t), t.TempDir()
	// Each agent its own metrics port on the node's loopback: the ones
	// that cannot route keep running.
	port := 19966
	startAgent := func(mode string, caps []corev1.Capability, flags ...string) (*syncBuffer, int) {
		logs := &syncBuffer{}
		port++
		argv := setpriv(caps, append([]string{bin, "run", "-kubeconfig", lkc, "-health-addr", "", "-bpf-root", bpfRoot, "-state-dir", stateDir,
			"-metrics-addr", fmt.Sprintf("127.0.0.1:%d", port)}, flags...)...)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(containerEnv(m, run, "node-a"), agent.EnvMode+"="+mode)
		startIn(t, node.NS, cmd, logs)
		return logs, cmd.Process.Pid
	}
	ours := func() int {
		rs, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: agent.DefaultRouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		require.NoError(t, err)
		return len(rs)
	}
	tunnels := func() int {
		ts, err := cluster.OpenTunnels(nodetest.Handle(t, bpfRoot, stateDir))
		require.NoError(t, err)
		defer ts.Close()
		l, err := ts.List()
		require.NoError(t, err)
		return len(l)
	}
	// capEff is the effective set of a running process, by name.
	capEff := func(pid int) []string {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		require.NoError(t, err)
		var mask uint64
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
				mask, err = strconv.ParseUint(strings.TrimSpace(v), 16, 64)
				require.NoError(t, err)
			}
		}
		var out []string
		for name, c := range map[string]uint{"NET_ADMIN": unix.CAP_NET_ADMIN, "BPF": unix.CAP_BPF, "PERFMON": unix.CAP_PERFMON} {
			if mask&(1<<c) != 0 {
				out = append(out, name)
			}
		}
		require.Zero(t, mask&^(1<<unix.CAP_NET_ADMIN|1<<unix.CAP_BPF|1<<unix.CAP_PERFMON), "CapEff %x", mask)
		sort.Strings(out)
		return out
	}
	granted := run.SecurityContext.Capabilities.Add

	// Direct mode routes with NET_ADMIN and cannot without it; running,
	// it holds nothing else.
	logs, _ := startAgent("direct", without(granted, "NET_ADMIN"))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "operation not permitted") }, 20*time.Second, 20*time.Millisecond,
		"the agent without NET_ADMIN:\n%s", logs)
	require.Zero(t, ours())
	// Maps of the plugin for the metrics to read (as a node's first STATUS
	// makes them).
	pinned, err := maps.OpenPinned(bpfRoot, maps.CniMapNodeCounters, maps.CniMapNat)
	require.NoError(t, err)
	for _, m := range pinned {
		m.Close()
	}
	logs, pid := startAgent("direct", granted)
	require.Eventually(t, func() bool { return ours() == 2 }, 20*time.Second, 20*time.Millisecond, "the agent with %v:\n%s", granted, logs)
	require.Equal(t, []string{"BPF", "NET_ADMIN"}, capEff(pid), "the direct agent keeps NET_ADMIN, and BPF for its metrics")
	scrape := func() string {
		var body []byte
		var c net.Conn
		require.NoError(t, node.NS.Do(func(ns.NetNS) error { // the dial, in the node's netns
			var err error
			c, err = net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			return err
		}))
		defer c.Close()
		req, err := http.NewRequest(http.MethodGet, "/metrics", nil)
		require.NoError(t, err)
		req.Host = "node-a"
		require.NoError(t, req.Write(c))
		resp, err := http.ReadResponse(bufio.NewReader(c), req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err = io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(body)
	}
	require.Eventually(t, func() bool {
		s := scrape()
		return strings.Contains(s, "\nebpf_cni_agent_routes_present 2\n") && strings.Contains(s, "\nebpf_cni_agent_ready 1\n")
	}, 20*time.Second, 20*time.Millisecond, "the direct agent's metrics:\n%s", logs)
	s := scrape()
	require.Contains(t, s, "\nebpf_cni_agent_routes_desired 2\n")
	require.Contains(t, s, "\nebpf_cni_scrape_errors 0\n", "the maps are readable with the agent's capabilities")
	require.Contains(t, s, "\nebpf_cni_packets_total{direction=\"egress\",reason=\"redirect\"} 0\n")
	require.Contains(t, s, "\nebpf_cni_map_capacity{map=\"nat\"} 131072\n")
	logs, pid = startAgent("direct", granted, "-metrics-addr", "off")
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "ebpf-cni-agent starting") }, 20*time.Second, 20*time.Millisecond,
		"the agent without metrics:\n%s", logs) // it says so once its capabilities are dropped
	require.Equal(t, []string{"BPF", "NET_ADMIN"}, capEff(pid), "without metrics, the direct agent keeps BPF for the network policies")
	logs, pid = startAgent("direct", granted, "-metrics-addr", "off", "-network-policy=false")
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "ebpf-cni-agent starting") }, 20*time.Second, 20*time.Millisecond,
		"the agent without metrics and network policies:\n%s", logs)
	require.Equal(t, []string{"BPF", "NET_ADMIN"}, capEff(pid), "without metrics and network policies, the direct agent keeps BPF for the translated destinations")
	logs, pid = startAgent("direct", granted, "-metrics-addr", "off", "-network-policy=false", "-translated-destinations=false")
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "ebpf-cni-agent starting") }, 20*time.Second, 20*time.Millisecond,
		"the agent without metrics, network policies and translated destinations:\n%s", logs)
	require.Equal(t, []string{"NET_ADMIN"}, capEff(pid), "without metrics, network policies and translated destinations, the direct agent keeps NET_ADMIN only")

	// vxlan mode writes the tunnel endpoints with BPF, and without it
	// fails at start, saying why; running, it holds nothing else.
	logs, _ = startAgent("vxlan", without(granted, "BPF"))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "operation not permitted") }, 20*time.Second, 20*time.Millisecond,
		"the agent without BPF:\n%s", logs)
	require.Contains(t, logs.String(), "the plugin's tunnel endpoints")
	logs, pid = startAgent("vxlan", granted)
	require.Eventually(t, func() bool { return tunnels() == 2 }, 20*time.Second, 20*time.Millisecond, "the agent with %v:\n%s", granted, logs)
	require.Equal(t, []string{"BPF"}, capEff(pid), "the vxlan agent keeps BPF only")
}

// syncBuffer is a bytes.Buffer that a process writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startIn starts cmd in network namespace n, its output into logs, and
// kills it at cleanup; the channel closes when it exits.
func startIn(t *testing.T, n ns.NetNS, cmd *exec.Cmd, logs *syncBuffer) <-chan struct{} {
	t.Helper()
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, n.Do(func(ns.NetNS) error { return cmd.Start() }))
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	return exited
}
