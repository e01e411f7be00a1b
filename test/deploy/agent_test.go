package deploy_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ebpf-cni/ebpf-cni/internal/kubetest"
	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/conflist"
)

// The cluster of the two-node tests.
var (
	clusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")}
)

// simNode is one simulated Kubernetes node: a netns on the segment, its own
// bpffs and state, the plugins configured by the production writer, and an
// agent that can be started and stopped.
type simNode struct {
	t                 *testing.T
	name              string
	node              *nettest.Node
	ip4, ip6          net.IP
	podCIDRs          []netip.Prefix
	mode              conflist.Mode
	bpfRoot, stateDir string
	cni               *nettest.CNI
	list              *libcni.NetworkConfigList
	handle            netlinksafe.Handle
	stop              func()
}

func newSimNode(t *testing.T, seg *nettest.Segment, name string, i int) *simNode {
	t.Helper()
	ip4, ip6 := net.ParseIP(fmt.Sprintf("192.0.2.%d", 10+i)), net.ParseIP(fmt.Sprintf("2001:db8:ffff::%d", 10+i))
	node, err := seg.AddNode(ip4, ip6)
	require.NoError(t, err)
	s := &simNode{t: t, name: name, node: node, ip4: ip4, ip6: ip6, podCIDRs: []netip.Prefix{
		netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", i)), netip.MustParsePrefix(fmt.Sprintf("fd00:10:244:%d::/64", i)),
	}, mode: conflist.ModeDirect}
	s.install(clusterCIDRs)
	return s
}

// newOverlayNode is a node of a simulated cluster (nettest.Cluster: on its
// segment, or behind its router) in vxlan mode.
func newOverlayNode(t *testing.T, cn *nettest.ClusterNode) *simNode {
	t.Helper()
	s := &simNode{t: t, name: cn.Name, node: cn.Node, ip4: cn.IP4, ip6: cn.IP6, mode: conflist.ModeVXLAN}
	for _, n := range []*net.IPNet{cn.PodCIDR4, cn.PodCIDR6} {
		p, err := netip.ParsePrefix(n.String())
		require.NoError(t, err)
		s.podCIDRs = append(s.podCIDRs, p)
	}
	var ranges []netip.Prefix
	for _, n := range []*net.IPNet{nettest.ClusterCIDR4, nettest.ClusterCIDR6} {
		ranges = append(ranges, netip.MustParsePrefix(n.String()))
	}
	s.install(ranges)
	return s
}

// install configures the plugins as deployed, by the production writer:
// masquerade on, the cluster's ranges keeping the pods' own addresses.
func (s *simNode) install(clusterCIDRs []netip.Prefix) {
	t := s.t
	s.bpfRoot, s.stateDir = testutil.BPFFS(t), t.TempDir()
	b, err := conflist.Build(conflist.Options{CNIVersion: "1.1.0", PodCIDRs: s.podCIDRs, ClusterCIDRs: clusterCIDRs, Masquerade: true,
		Mode: s.mode, BPFRoot: s.bpfRoot, StateDir: s.stateDir})
	require.NoError(t, err)
	s.list, err = libcni.ConfListFromBytes(b)
	require.NoError(t, err)
	s.cni = nettest.NewCNI(s.node, []string{testutil.PluginDir(t)}, t.TempDir())
	s.handle, err = netlinksafe.NewHandleAt(netns.NsHandle(int(s.node.NS.Fd())))
	require.NoError(t, err)
	t.Cleanup(s.handle.Close)
}

// object is this node's Node object as kubelet and the node IPAM
// controller make it.
func (s *simNode) object() *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: s.name}}
	for _, c := range s.podCIDRs {
		n.Spec.PodCIDRs = append(n.Spec.PodCIDRs, c.String())
	}
	n.Spec.PodCIDR = n.Spec.PodCIDRs[0]
	n.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: s.ip4.String()},
		{Type: corev1.NodeInternalIP, Address: s.ip6.String()},
		{Type: corev1.NodeHostName, Address: s.name},
	}
	return n
}

// startAgent runs the agent of this node in its mode against the API
// server, until stopped: its routes in the node's netns, or its tunnel
// endpoints in the node's bpfRoot.
func (s *simNode) startAgent(client kubernetes.Interface) *agent.Agent {
	s.t.Helper()
	var routes agent.NodeRoutes
	var err error
	switch s.mode {
	case conflist.ModeDirect:
		routes, err = agent.NewDirect(s.handle, agent.DefaultRouteProtocol)
	case conflist.ModeVXLAN:
		underlay := 0
		require.NoError(s.t, s.node.NS.Do(func(ns.NetNS) error { underlay = agent.UnderlayFamily(); return nil }))
		routes, err = agent.NewVXLAN(nodetest.Handle(s.t, s.bpfRoot, s.stateDir), underlay)
	}
	require.NoError(s.t, err)
	a, err := agent.New(client, routes, agent.Config{NodeName: s.name, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(s.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = a.Run(ctx); close(done) }()
	s.stop = func() { cancel(); <-done; s.stop = nil }
	s.t.Cleanup(func() {
		if s.stop != nil {
			s.stop()
		}
	})
	return a
}

// entriesTo lists this node's routes (mode direct) or tunnel endpoints
// (mode vxlan) to the ranges of peer.
func (s *simNode) entriesTo(peer *simNode) []string {
	if s.mode == conflist.ModeVXLAN {
		return s.tunnelsTo(peer)
	}
	return s.routesTo(peer)
}

func (s *simNode) waitEntries(peer *simNode, n int) {
	s.t.Helper()
	require.Eventually(s.t, func() bool { return len(s.entriesTo(peer)) == n }, 10*time.Second, time.Millisecond, "%s entries on %s to %s: %v", s.mode, s.name, peer.name, s.entriesTo(peer))
}

// routesTo lists the agent's routes on this node to the ranges of peer.
func (s *simNode) routesTo(peer *simNode) []string {
	rs, err := s.handle.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: agent.DefaultRouteProtocol}, netlink.RT_FILTER_PROTOCOL)
	require.NoError(s.t, err)
	var out []string
	for _, r := range rs {
		for _, c := range peer.podCIDRs {
			if r.Dst != nil && r.Dst.String() == c.String() {
				out = append(out, fmt.Sprintf("%s via %s", r.Dst, r.Gw))
			}
		}
	}
	return out
}

// reachable pings from one pod to another (v4 and v6), one try each.
func reachable(from, to *nettest.Pod) error {
	for _, fam := range []int{4, 6} {
		if _, err := nettest.Run(from.NS, "ping", "-n", "-q", "-c", "1", "-W", "1", to.IP(fam).String()); err != nil {
			return err
		}
	}
	return nil
}

// sourceSeen opens a TCP connection from `from` to a server in `to` and
// returns the client address the server saw.
func sourceSeen(t *testing.T, from, to *nettest.Pod, fam int) net.IP {
	t.Helper()
	var l net.Listener
	require.NoError(t, to.NS.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", net.JoinHostPort(to.IP(fam).String(), "0"))
		return err
	}))
	defer l.Close()
	seen := make(chan net.IP, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			seen <- nil
			return
		}
		seen <- c.RemoteAddr().(*net.TCPAddr).IP
		nettest.EchoConn(c)
	}()
	c, err := nettest.Dial(from.NS, l.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, nettest.Echo(c, "across nodes\n"))
	return <-seen
}

// TestAgentTwoNodes is the Must-hold of the deployment issue for direct
// mode: two simulated nodes on one L2 segment (agentTwoNodes says the
// rest).
func TestAgentTwoNodes(t *testing.T) {
	testutil.RequireRoot(t)
	seg, err := nettest.NewSegment()
	require.NoError(t, err)
	t.Cleanup(seg.Close)
	a, b := newSimNode(t, seg, "node-a", 1), newSimNode(t, seg, "node-b", 2)
	agentTwoNodes(t, a, b,
		[]string{"10.244.2.0/24 via 192.0.2.12", "fd00:10:244:2::/64 via 2001:db8:ffff::12"},
		[]string{"10.244.1.0/24 via 192.0.2.11", "fd00:10:244:1::/64 via 2001:db8:ffff::11"}, nil)
}

// agentTwoNodes: nodes a and b, the plugins configured by the production
// writer (masquerade on, clusterCIDRs, the node's mode), an agent in each
// fed by an API server. Pods on the two nodes do not reach each other
// until the Node objects exist, then a's entries to b are aToB (and b's to
// a bToA), and the pods reach each other both ways (IPv4 and IPv6, and
// then whatever also says) with their own addresses; with a's agent
// stopped its entries stay, ADD, CHECK, STATUS and DEL still succeed and
// pods keep talking; deleting b's Node object removes its entries from a
// and its pods become unreachable.
func agentTwoNodes(t *testing.T, a, b *simNode, aToB, bToA []string, also func(podA, podB *nettest.Pod)) {
	podA := testutil.AddPod(t, a.cni, a.list, "pod-a")
	podB := testutil.AddPod(t, b.cni, b.list, "pod-b")
	require.True(t, a.podCIDRs[0].Contains(netip.MustParseAddr(podA.IP(4).String())), "pod A got %s", podA.IP(4))
	require.Error(t, reachable(podA, podB), "pods of different nodes reach each other without the agent's entries")

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
	a.waitEntries(b, 2)
	t.Logf("%s's Node object to its entries on %s (%s): %v (BenchmarkNodeToRoute and BenchmarkNodeToTunnel measure it)", b.name, a.name, a.mode, time.Since(start))
	b.waitEntries(a, 2)
	require.ElementsMatch(t, aToB, a.entriesTo(b))
	require.ElementsMatch(t, bToA, b.entriesTo(a))
	require.Eventually(t, func() bool { return agentA.Status().Ready && agentB.Status().Ready }, 10*time.Second, 10*time.Millisecond,
		"a: %+v b: %+v", agentA.Status(), agentB.Status())
	require.Equal(t, string(a.mode), agentA.Status().Mode)

	require.NoError(t, reachable(podA, podB))
	require.NoError(t, reachable(podB, podA))
	for _, fam := range []int{4, 6} {
		require.True(t, podA.IP(fam).Equal(sourceSeen(t, podA, podB, fam)), "pod B sees pod A's own address (IPv%d)", fam)
		require.True(t, podB.IP(fam).Equal(sourceSeen(t, podB, podA, fam)), "pod A sees pod B's own address (IPv%d)", fam)
	}
	if also != nil {
		also(podA, podB)
	}

	// Agent of node A down: nothing of the pod path depends on it.
	a.stop()
	require.Len(t, a.entriesTo(b), 2, "stopping the agent removed its entries")
	require.NoError(t, reachable(podA, podB))
	podA2 := testutil.AddPod(t, a.cni, a.list, "pod-a2")
	require.NoError(t, a.cni.Check(a.list, podA2.RT))
	require.NoError(t, a.cni.Status(a.list))
	require.NoError(t, reachable(podA, podA2), "pods of one node talk with the agent down")
	require.NoError(t, reachable(podA2, podB))
	require.NoError(t, reachable(podB, podA2))
	require.NoError(t, a.cni.DelPod(a.list, podA2))
	require.NoError(t, reachable(podA, podB))

	// Back up, it finds its entries current; node B's Node goes: node A
	// withdraws the entries to it, and pod B is out of reach.
	agentA = a.startAgent(client)
	require.Eventually(t, func() bool { return agentA.Status().Ready }, 10*time.Second, 10*time.Millisecond, "%+v", agentA.Status())
	require.Equal(t, 2, agentA.Status().Routes, "the restarted agent knows its entries")
	require.True(t, api.Delete(b.name))
	a.waitEntries(b, 0)
	require.Error(t, reachable(podA, podB), "pod B reachable after its Node was deleted")
	require.Len(t, b.entriesTo(a), 2, "node A's Node is still there")
	// Node A's own routes were never the agent's to touch: its pods still
	// reach the node.
	_, err = nettest.Ping(a.node.NS, podA.IP(4), 1)
	require.NoError(t, err)
}

// lonelyNode is one simulated node alone on a segment, with a netlink
// handle in its network namespace (removed at cleanup).
func lonelyNode(tb testing.TB, ip4, ip6 string) (*nettest.Node, netlinksafe.Handle) {
	tb.Helper()
	testutil.RequireRoot(tb)
	seg, err := nettest.NewSegment()
	require.NoError(tb, err)
	tb.Cleanup(seg.Close)
	node, err := seg.AddNode(net.ParseIP(ip4), net.ParseIP(ip6))
	require.NoError(tb, err)
	h, err := netlinksafe.NewHandleAt(netns.NsHandle(int(node.NS.Fd())))
	require.NoError(tb, err)
	tb.Cleanup(h.Close)
	return node, h
}

// BenchmarkNodeToRoute measures the time from a Node object's creation on
// the API server to its routes in the node's table, and from its deletion
// to their removal (one op = both), with a real agent, client-go over HTTP
// and netlink.
func BenchmarkNodeToRoute(b *testing.B) {
	_, h := lonelyNode(b, "192.0.2.11", "2001:db8:ffff::11")
	d, err := agent.NewDirect(h, agent.DefaultRouteProtocol)
	require.NoError(b, err)
	benchNodeTo(b, d, "route", func() int {
		rs, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: agent.DefaultRouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		require.NoError(b, err)
		return len(rs)
	})
}

// benchNodeTo runs an agent with routes against a test API server and
// measures how long a peer's Node takes to show as two entries (count)
// and, deleted, to go; reported as µs-to-<what> and µs-to-removal.
func benchNodeTo(b *testing.B, routes agent.NodeRoutes, what string, count func() int) {
	api, err := kubetest.New()
	require.NoError(b, err)
	b.Cleanup(api.Close)
	client, err := kubernetes.NewForConfig(api.Config())
	require.NoError(b, err)
	ag, err := agent.New(client, routes, agent.Config{NodeName: "self", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = ag.Run(ctx); close(done) }()
	b.Cleanup(func() { cancel(); <-done })
	wait := func(n int) {
		for deadline := time.Now().Add(10 * time.Second); count() != n; time.Sleep(100 * time.Microsecond) {
			if time.Now().After(deadline) {
				b.Fatalf("%ss: %d, want %d", what, count(), n)
			}
		}
	}
	peer := &simNode{name: "peer", ip4: net.ParseIP("192.0.2.12"), ip6: net.ParseIP("2001:db8:ffff::12"),
		podCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("fd00:10:244:2::/64")}}
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
	b.ReportMetric(float64(add.Microseconds())/float64(b.N), "µs-to-"+what)
	b.ReportMetric(float64(del.Microseconds())/float64(b.N), "µs-to-removal")
}
