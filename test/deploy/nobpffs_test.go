package deploy_test

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/kubetest"
	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/cluster"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// getIn sends GET path to addr from network namespace n (the dial there:
// http.Client dials on another goroutine) and returns the status and body.
func getIn(n ns.NetNS, addr, path string) (int, string, error) {
	var conn net.Conn
	if err := n.Do(func(ns.NetNS) (err error) {
		conn, err = net.DialTimeout("tcp", addr, 2*time.Second)
		return err
	}); err != nil {
		return 0, "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return 0, "", err
	}
	if err := req.Write(conn); err != nil {
		return 0, "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// readyzBody is what the agent's /readyz answers, as a probe reads it.
type readyzBody struct {
	Ready  bool   `json:"ready"`
	Reason string `json:"reason"`
	Routes int    `json:"routes"`
	Policy *struct {
		Running bool   `json:"running"`
		Synced  bool   `json:"synced"`
		Problem string `json:"problem"`
		Retries int    `json:"retries"`
	} `json:"policy"`
}

// TestAgentWithoutBPFFS runs the agent binary as a hand-run agent, or a
// manifest that does not mount the plugin's bpfRoot, would: its bpfRoot on
// no bpffs, network policies on (the default). The policies cannot start,
// and that stops nothing else: in mode direct the agent routes the other
// node all the same; in mode vxlan it keeps running, its tunnel endpoints
// failing and retried. It reports the policies (/readyz not ready, saying
// why; ebpf_cni_policy_up 0). Once a bpffs is mounted there, it starts
// them: a pod that ADD left closed (its namespace had policies) is opened,
// no policy selecting it; in mode vxlan the tunnel endpoints are written;
// ebpf_cni_policy_up 1, ready.
func TestAgentWithoutBPFFS(t *testing.T) {
	testutil.RequireRoot(t)
	bin := agentBinary(t)
	for _, mode := range []string{"direct", "vxlan"} {
		t.Run(mode, func(t *testing.T) { agentWithoutBPFFS(t, bin, mode) })
	}
}

func agentWithoutBPFFS(t *testing.T, bin, mode string) {
	a := &simNode{name: "node-a", ip4: net.ParseIP("192.0.2.11"), ip6: net.ParseIP("2001:db8:ffff::11"),
		podCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}}
	b := &simNode{name: "node-b", ip4: net.ParseIP("192.0.2.12"), ip6: net.ParseIP("2001:db8:ffff::12"),
		podCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("fd00:10:244:2::/64")}}
	node, h := lonelyNode(t, a.ip4.String(), a.ip6.String())
	var api *kubetest.Server
	require.NoError(t, node.NS.Do(func(ns.NetNS) (err error) { api, err = kubetest.New(); return err }))
	t.Cleanup(api.Close)
	api.Apply(a.object())
	api.Apply(b.object())

	// bpfRoot under a directory of the test's file system: a bpffs is
	// mounted on mnt later.
	mnt := filepath.Join(t.TempDir(), "bpffs")
	require.NoError(t, os.Mkdir(mnt, 0o700))
	bpfRoot, stateDir := filepath.Join(mnt, "ebpf-cni"), t.TempDir()
	const health, metrics = "127.0.0.1:9965", "127.0.0.1:9967" // the node's loopback
	logs := &syncBuffer{}
	cmd := exec.Command(bin, "run", "-kubeconfig", kubeconfig(t, api), "-node", a.name, "-mode", mode,
		"-bpf-root", bpfRoot, "-state-dir", stateDir, "-health-addr", health, "-metrics-addr", metrics)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	exited := startIn(t, node.NS, cmd, logs)
	// running fails the wait it is called in when the agent has exited.
	running := func(c *assert.CollectT) bool {
		select {
		case <-exited:
			require.FailNow(c, "the agent exited", "%s", logs)
			return false
		default:
			return true
		}
	}
	readyz := func(c *assert.CollectT) (int, readyzBody) {
		code, body, err := getIn(node.NS, health, "/readyz")
		require.NoError(c, err)
		var s readyzBody
		require.NoError(c, json.Unmarshal([]byte(body), &s), body)
		return code, s
	}
	scrape := func(c *assert.CollectT) string {
		code, body, err := getIn(node.NS, metrics, "/metrics")
		require.NoError(c, err)
		require.Equal(c, http.StatusOK, code)
		return body
	}
	routes := func() int {
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

	// Without the bpffs: the routes (mode direct), the policies reported.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		running(c)
		code, s := readyz(c)
		require.Equal(c, http.StatusServiceUnavailable, code)
		require.NotNil(c, s.Policy)
		assert.False(c, s.Policy.Running)
		assert.Contains(c, s.Policy.Problem, "not on a bpf filesystem")
		assert.Positive(c, s.Policy.Retries)
		if mode == "direct" {
			assert.Equal(c, 2, s.Routes)
			assert.Contains(c, s.Reason, "network policies not enforced, retrying:")
		} else {
			assert.Contains(c, s.Reason, "not on a bpf filesystem", "the tunnel endpoints' failure")
		}
		assert.Contains(c, scrape(c), "\nebpf_cni_policy_up 0\n")
	}, 30*time.Second, 50*time.Millisecond, "the agent without a bpffs:\n%s", logs)
	if mode == "direct" {
		require.Equal(t, 2, routes(), "node-b's ranges routed without a bpffs")
	}
	require.Contains(t, logs.String(), "network policies not enforced: the controller cannot start, retrying")
	_, err := os.Stat(bpfRoot)
	require.ErrorIs(t, err, os.ErrNotExist, "nothing made under a bpfRoot that is no bpffs")

	// The bpffs comes, and a pod with it, as ADD leaves one in a namespace
	// with policies: closed both ways until the agent writes its state.
	testutil.MountBPFFS(t, mnt)
	const ifindex = 4242
	pm, err := policy.Open(nodetest.Handle(t, bpfRoot, stateDir))
	require.NoError(t, err)
	defer pm.Close()
	require.NoError(t, pm.SetEndpoint(ifindex, policy.EndpointState{Ingress: uint8(policy.StateClosed), Egress: uint8(policy.StateClosed)}))
	addEndpoint(t, bpfRoot, ifindex, "x", "a", "10.244.1.7")

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		running(c)
		_, has, err := pm.Endpoint(ifindex)
		require.NoError(c, err)
		assert.False(c, has, "the pod opened (no state: open both ways), no policy selecting it")
		code, s := readyz(c)
		assert.Equal(c, http.StatusOK, code, "%+v", s)
		require.NotNil(c, s.Policy)
		assert.True(c, s.Policy.Running)
		assert.True(c, s.Policy.Synced)
		assert.Empty(c, s.Policy.Problem)
		m := scrape(c)
		assert.Contains(c, m, "\nebpf_cni_policy_up 1\n")
		assert.Contains(c, m, "\nebpf_cni_agent_ready 1\n")
	}, 90*time.Second, 100*time.Millisecond, "the agent after the bpffs came:\n%s", logs)
	if mode == "direct" {
		require.Equal(t, 2, routes())
	} else {
		require.Equal(t, 2, tunnels(), "node-b's ranges tunnelled once the bpffs came")
	}
}

// addEndpoint writes endpoint_devs and endpoint_pods of a pod as ADD does.
func addEndpoint(t *testing.T, bpfRoot string, ifindex uint32, namespace, name, ip string) {
	t.Helper()
	ms, err := maps.OpenPinned(bpfRoot, maps.CniMapEndpointDevs, maps.CniMapEndpointPods)
	require.NoError(t, err)
	defer func() {
		for _, m := range ms {
			m.Close()
		}
	}()
	var d maps.CniEndpointDev
	a := netip.MustParseAddr(ip).As4()
	d.Ip4[0] = binary.NativeEndian.Uint32(a[:])
	d.N_ip4 = 1
	require.NoError(t, ms[maps.CniMapEndpointDevs].Put(ifindex, &d))
	var p maps.CniEndpointPod
	maps.CString(p.Namespace[:], namespace)
	maps.CString(p.Name[:], name)
	maps.CString(p.Uid[:], fmt.Sprintf("%s-%s", namespace, name))
	require.NoError(t, ms[maps.CniMapEndpointPods].Put(ifindex, &p))
}
