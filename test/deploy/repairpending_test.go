package deploy_test

import (
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/conflisttest"
	"github.com/ebpf-cni/ebpf-cni/internal/kubetest"
	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// TestAgentReportsPendingRepair: the agent runs the plugin's repair as a
// dry run for its metrics. A pod whose netns goes without a DEL, on a node
// where nothing repairs (no STATUS, no ADD), shows as
// ebpf_cni_repair_pending{kind="reclaim"} 1, and nothing changes: its
// record stays until a CNI STATUS reclaims it, after which the gauge is 0.
func TestAgentReportsPendingRepair(t *testing.T) {
	bin := agentBinary(t)
	n := testutil.NewNode(t, false)
	list := n.List(t, conflisttest.Options{Name: "pending"})
	self := &simNode{name: "node-a", ip4: nettest.NodeIP4, ip6: nettest.NodeIP6,
		podCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:244:1::/64")}}
	var api *kubetest.Server
	require.NoError(t, n.NS.Do(func(ns.NetNS) (err error) { api, err = kubetest.New(); return err }))
	t.Cleanup(api.Close)
	api.Apply(self.object())

	live := testutil.AddPod(t, n.CNI, list, "live")
	gone, err := n.CNI.AddPod(list, "gone", nil)
	require.NoError(t, err)
	require.NoError(t, n.CNI.Status(list), "STATUS before the agent: nothing pending")

	const health, metrics = "127.0.0.1:9975", "127.0.0.1:9977" // the node's loopback
	logs := &syncBuffer{}
	cmd := exec.Command(bin, "run", "-kubeconfig", kubeconfig(t, api), "-node", self.name, "-mode", "direct",
		"-bpf-root", n.BPFRoot, "-state-dir", n.StateDir, "-health-addr", health, "-metrics-addr", metrics)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	exited := startIn(t, n.NS, cmd, logs)
	pending := func(c *assert.CollectT, kind string) string {
		select {
		case <-exited:
			require.FailNow(c, "the agent exited", "%s", logs)
		default:
		}
		code, body, err := getIn(n.NS, metrics, "/metrics")
		require.NoError(c, err)
		require.Equal(c, http.StatusOK, code)
		return metricLine(body, `ebpf_cni_repair_pending{kind="`+kind+`"}`)
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, "0", pending(c, "reclaim"))
		assert.Equal(c, "0", pending(c, "rebuild"))
		assert.Equal(c, "0", pending(c, "problem"))
	}, 30*time.Second, 100*time.Millisecond, "a node in order:\n%s", logs)

	nettest.CloseNetNS(gone.NS)
	hostVeth := veth.HostName("gone", "eth0")
	require.Eventually(t, func() bool {
		gone := true
		_ = n.NS.Do(func(ns.NetNS) error { gone = !veth.Exists(hostVeth); return nil })
		return gone
	}, time.Minute, 20*time.Millisecond, "the kernel removed the gone pod's veth")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, "1", pending(c, "reclaim"), "the gone pod, reported")
	}, 30*time.Second, 100*time.Millisecond, "after the pod went:\n%s", logs)
	records := func() int {
		names, err := node.RecordNames(n.StateDir)
		require.NoError(t, err)
		return len(names)
	}
	require.Equal(t, 2, records(), "the agent's dry run changed nothing")

	require.NoError(t, n.CNI.Status(list), "STATUS reclaims the gone pod")
	require.Equal(t, 1, records())
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, "0", pending(c, "reclaim"))
	}, 30*time.Second, 100*time.Millisecond, "after STATUS:\n%s", logs)
	require.NoError(t, n.CNI.DelPod(list, live))
}

// metricLine is the value of the series named exactly so (name with its
// labels) in a /metrics body, "" when there is none.
func metricLine(body, series string) string {
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
