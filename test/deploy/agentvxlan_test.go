package deploy_test

import (
	"net/netip"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/cluster"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// tunnelsTo lists this node's tunnel endpoints (the plugin's map, as
// `ebpf-cni tunnels` shows them) to the ranges of peer.
func (s *simNode) tunnelsTo(peer *simNode) []string {
	ts, err := cluster.OpenTunnels(nodetest.Handle(s.t, s.bpfRoot, s.stateDir))
	require.NoError(s.t, err)
	defer ts.Close()
	list, err := ts.List()
	require.NoError(s.t, err)
	var out []string
	for _, x := range list {
		if slices.ContainsFunc(peer.podCIDRs, func(c netip.Prefix) bool { return c.String() == x.PodCIDR.String() }) {
			out = append(out, x.String())
		}
	}
	return out
}

// fullSize6 pings from one pod to another over IPv6 with a packet of the
// pods' whole MTU, not to be fragmented.
func fullSize6(from, to *nettest.Pod, mtu int) error {
	_, err := nettest.Run(from.NS, "ping", "-6", "-n", "-q", "-c", "1", "-W", "1", "-M", "do", "-s", strconv.Itoa(mtu-40-8), to.IP(6).String())
	return err
}

// TestAgentTwoNodesVXLAN is the Must-hold of the deployment issue for
// vxlan mode: two simulated nodes of a cluster that do not share a segment
// (node1 on the cluster's LAN, node2 behind its router: nothing between
// them routes pod addresses), the conflist in mode vxlan (agentTwoNodes
// says the rest). Both ranges go over the IPv4 underlay, whose overhead
// the plugin took off the pods' MTU: an IPv6 packet of the pods' full MTU
// crosses (it would not over the IPv6 underlay).
func TestAgentTwoNodesVXLAN(t *testing.T) {
	testutil.RequireRoot(t)
	c, err := nettest.NewCluster(1, true)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	require.True(t, c.Nodes[1].Far, "node2 is behind the router")
	a, b := newOverlayNode(t, c.Nodes[0]), newOverlayNode(t, c.Nodes[1])
	agentTwoNodes(t, a, b,
		[]string{"10.244.2.0/24 via 198.51.100.12", "fd00:244:0:2::/64 via 198.51.100.12"},
		[]string{"10.244.1.0/24 via 192.0.2.11", "fd00:244:0:1::/64 via 192.0.2.11"},
		func(podA, podB *nettest.Pod) {
			mtu := 1500 - cluster.OverheadIPv4
			require.NoError(t, fullSize6(podA, podB, mtu), "an IPv6 packet of the pods' MTU crosses the overlay")
			require.NoError(t, fullSize6(podB, podA, mtu))
		})
}

// BenchmarkNodeToTunnel measures the time from a Node object's creation
// on the API server to its tunnel endpoints in the plugin's map, and from
// its deletion to their removal (one op = both), with a real agent,
// client-go over HTTP, the pinned map and the agent's record.
func BenchmarkNodeToTunnel(b *testing.B) {
	// The state directory on tmpfs, as /run is on a node: the agent
	// writes its record there at every change.
	bpfRoot, stateDir := testutil.BPFFS(b), b.TempDir()
	require.NoError(b, unix.Mount("tmpfs", stateDir, "tmpfs", 0, "size=1m,mode=0700"))
	b.Cleanup(func() { _ = unix.Unmount(stateDir, unix.MNT_DETACH) })
	v, err := agent.NewVXLAN(nodetest.Handle(b, bpfRoot, stateDir), 4)
	require.NoError(b, err)
	// Read without the cluster lock, which the agent takes.
	pinned, err := maps.OpenPinned(bpfRoot, maps.CniMapClusterRoutes)
	require.NoError(b, err)
	m := pinned[maps.CniMapClusterRoutes]
	b.Cleanup(func() { m.Close() })
	benchNodeTo(b, v, "tunnel", func() int {
		l, err := cluster.ListTunnels(m)
		require.NoError(b, err)
		return len(l)
	})
}
