package deploy_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"

	"github.com/ebpf-cni/ebpf-cni/internal/kubetest"
	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/cluster"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// tunnelsTo lists this node's tunnel endpoints (the plugin's map, as
// `ebpf-cni tunnels` shows them) to the ranges of peer.
func (s *simNode) tunnelsTo(peer *simNode) []string {
	ts, err := cluster.OpenTunnels(s.bpfRoot, s.stateDir)
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

func (s *simNode) waitTunnels(peer *simNode, n int) {
	s.t.Helper()
	require.Eventually(s.t, func() bool { return len(s.tunnelsTo(peer)) == n }, 10*time.Second, time.Millisecond, "tunnels on %s to %s: %v", s.name, peer.name, s.tunnelsTo(peer))
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
// them routes pod addresses), the plugins configured by the production
// writer in mode vxlan (masquerade on, clusterCIDRs, the overlay), an agent
// in each fed by an API server. Pods on the two nodes do not reach each
// other until the Node objects exist, then do both ways (IPv4 and IPv6,
// full-size IPv6 packets included) with their own addresses; with an agent
// stopped its tunnel endpoints stay, ADD, CHECK, STATUS and DEL still
// succeed and pods keep talking; deleting a Node object removes its
// endpoints from the other node and its pods become unreachable.
func TestAgentTwoNodesVXLAN(t *testing.T) {
	testutil.RequireRoot(t)
	c, err := nettest.NewCluster(1, true)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	require.True(t, c.Nodes[1].Far, "node2 is behind the router")
	a, b := newOverlayNode(t, c.Nodes[0]), newOverlayNode(t, c.Nodes[1])
	podA := testutil.AddPod(t, a.cni, a.list, "pod-a")
	podB := testutil.AddPod(t, b.cni, b.list, "pod-b")
	require.Error(t, reachable(podA, podB), "pods of different nodes reach each other without tunnel endpoints")

	api, err := kubetest.New()
	require.NoError(t, err)
	t.Cleanup(api.Close)
	client, err := kubernetes.NewForConfig(api.Config())
	require.NoError(t, err)
	agentA, agentB := a.startAgent(client), b.startAgent(client)

	api.Apply(a.object())
	require.Eventually(t, func() bool { return agentA.Status().Ready }, 10*time.Second, time.Millisecond, "%+v", agentA.Status())
	start := time.Now()
	api.Apply(b.object())
	a.waitTunnels(b, 2)
	t.Logf("node2's Node object to its tunnel endpoints on node1: %v (BenchmarkNodeToTunnel measures it)", time.Since(start))
	b.waitTunnels(a, 2)
	// Both ranges over the IPv4 underlay, whose overhead the plugin took
	// off the pods' MTU.
	require.ElementsMatch(t, []string{"10.244.2.0/24 via 198.51.100.12", "fd00:244:0:2::/64 via 198.51.100.12"}, a.tunnelsTo(b))
	require.ElementsMatch(t, []string{"10.244.1.0/24 via 192.0.2.11", "fd00:244:0:1::/64 via 192.0.2.11"}, b.tunnelsTo(a))
	require.Eventually(t, func() bool { return agentA.Status().Ready && agentB.Status().Ready }, 10*time.Second, 10*time.Millisecond,
		"a: %+v b: %+v", agentA.Status(), agentB.Status())
	require.Equal(t, "vxlan", agentA.Status().Mode)

	require.NoError(t, reachable(podA, podB))
	require.NoError(t, reachable(podB, podA))
	for _, fam := range []int{4, 6} {
		require.True(t, podA.IP(fam).Equal(sourceSeen(t, podA, podB, fam)), "pod B sees pod A's own address (IPv%d)", fam)
		require.True(t, podB.IP(fam).Equal(sourceSeen(t, podB, podA, fam)), "pod A sees pod B's own address (IPv%d)", fam)
	}
	mtu := 1500 - cluster.OverheadIPv4
	require.NoError(t, fullSize6(podA, podB, mtu), "an IPv6 packet of the pods' MTU crosses the overlay")
	require.NoError(t, fullSize6(podB, podA, mtu))

	// Agent of node 1 down: nothing of the pod path depends on it.
	a.stop()
	require.Len(t, a.tunnelsTo(b), 2, "stopping the agent removed its tunnel endpoints")
	require.NoError(t, reachable(podA, podB))
	podA2 := testutil.AddPod(t, a.cni, a.list, "pod-a2")
	require.NoError(t, a.cni.Check(a.list, podA2.RT))
	require.NoError(t, a.cni.Status(a.list))
	require.NoError(t, reachable(podA, podA2), "pods of one node talk with the agent down")
	require.NoError(t, reachable(podA2, podB))
	require.NoError(t, reachable(podB, podA2))
	require.NoError(t, a.cni.DelPod(a.list, podA2))
	require.NoError(t, reachable(podA, podB))

	// Back up, it finds its endpoints current; node2's Node goes: node1
	// withdraws the endpoints to it, and pod B is out of reach.
	agentA = a.startAgent(client)
	require.Eventually(t, func() bool { return agentA.Status().Ready }, 10*time.Second, 10*time.Millisecond, "%+v", agentA.Status())
	require.Equal(t, 2, agentA.Status().Routes, "the restarted agent knows its endpoints")
	require.True(t, api.Delete(b.name))
	a.waitTunnels(b, 0)
	require.Error(t, reachable(podA, podB), "pod B reachable after its Node was deleted")
	require.Len(t, b.tunnelsTo(a), 2, "node1's Node is still there")
	_, err = nettest.Ping(a.node.NS, podA.IP(4), 1)
	require.NoError(t, err, "node1 reaches its own pod")
}

// BenchmarkNodeToTunnel measures the time from a Node object's creation
// on the API server to its tunnel endpoints in the plugin's map, and from
// its deletion to their removal (one op = both), with a real agent,
// client-go over HTTP, the pinned map and the agent's record.
func BenchmarkNodeToTunnel(b *testing.B) {
	testutil.RequireRoot(b)
	// The state directory on tmpfs, as /run is on a node: the agent
	// writes its record there at every change.
	bpfRoot, stateDir := testutil.BPFFS(b), b.TempDir()
	require.NoError(b, unix.Mount("tmpfs", stateDir, "tmpfs", 0, "size=1m,mode=0700"))
	b.Cleanup(func() { _ = unix.Unmount(stateDir, unix.MNT_DETACH) })
	api, err := kubetest.New()
	require.NoError(b, err)
	b.Cleanup(api.Close)
	client, err := kubernetes.NewForConfig(api.Config())
	require.NoError(b, err)
	v, err := agent.NewVXLAN(bpfRoot, stateDir, 4)
	require.NoError(b, err)
	ag, err := agent.New(client, v, agent.Config{NodeName: "self", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = ag.Run(ctx); close(done) }()
	b.Cleanup(func() { cancel(); <-done })
	// Read without the cluster lock, which the agent takes.
	pinned, err := maps.OpenPinned(bpfRoot, maps.CniMapClusterRoutes)
	require.NoError(b, err)
	m := pinned[maps.CniMapClusterRoutes]
	b.Cleanup(func() { m.Close() })
	count := func() int {
		l, err := cluster.ListTunnels(m)
		require.NoError(b, err)
		return len(l)
	}
	wait := func(n int) {
		for deadline := time.Now().Add(10 * time.Second); count() != n; time.Sleep(100 * time.Microsecond) {
			if time.Now().After(deadline) {
				b.Fatalf("tunnel endpoints: %d, want %d", count(), n)
			}
		}
	}
	peer := &simNode{name: "peer", ip4: net.ParseIP("198.51.100.12"), ip6: net.ParseIP("2001:db8:2::12"),
		podCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("fd00:244:0:2::/64")}}
	api.Apply((&simNode{name: "self", ip4: net.ParseIP("192.0.2.11"), podCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}).object())
	var add, del time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		api.Apply(peer.object())
		wait(2)
		t1 := time.Now()
		api.Delete("peer")
		wait(0)
		add, del = add+t1.Sub(t0), del+time.Since(t1)
	}
	b.ReportMetric(float64(add.Microseconds())/float64(b.N), "µs-to-tunnel")
	b.ReportMetric(float64(del.Microseconds())/float64(b.N), "µs-to-removal")
}
