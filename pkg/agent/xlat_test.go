package agent

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/flows"
	nodestate "github.com/ebpf-cni/ebpf-cni/pkg/node"
)

func service(name string, clusterIPs []string, external []string, lb ...string) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.ServiceSpec{ClusterIPs: clusterIPs, ExternalIPs: external}}
	if len(clusterIPs) > 0 {
		s.Spec.ClusterIP = clusterIPs[0]
	}
	for _, ip := range lb {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip, Hostname: "lb.example"})
	}
	return s
}

// TestXlatSet: the destinations kube-proxy translates, from Services and
// Nodes: the Service ranges, ClusterIPs of both families, externalIPs,
// load-balancer IPs, every Node's InternalIPs and ExternalIPs; headless
// Services, ExternalName ones, host names and hostname-only load balancers
// add nothing; an address that is several things is one entry.
func TestXlatSet(t *testing.T) {
	ext := node("b", []string{"192.0.2.11", "2001:db8::11"})
	ext.Status.Addresses = append(ext.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "198.51.100.11"},
		corev1.NodeAddress{Type: corev1.NodeInternalDNS, Address: "b.internal"})
	headless := service("headless", []string{"None"}, nil)
	byName := service("external-name", nil, nil)
	byName.Spec.Type, byName.Spec.ExternalName = corev1.ServiceTypeExternalName, "example.com"
	got := XlatSet([]*corev1.Service{
		service("web", []string{"10.96.0.10", "fd00:96::10"}, []string{"198.51.100.200", "192.0.2.11"}, "203.0.113.7"),
		service("legacy", nil, nil), headless, byName,
	}, []*corev1.Node{node("a", []string{"192.0.2.10"}), ext},
		[]netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/112")})
	got2 := XlatSet([]*corev1.Service{{Spec: corev1.ServiceSpec{ClusterIP: "10.96.5.5"}}}, nil, nil)
	require.Equal(t, `10.96.0.0/16 serviceRange
10.96.0.10/32 clusterIP
192.0.2.10/32 node
192.0.2.11/32 externalIP,node
198.51.100.11/32 node
198.51.100.200/32 externalIP
2001:db8::11/128 node
203.0.113.7/32 loadBalancer
fd00:96::/112 serviceRange
fd00:96::10/128 clusterIP`, got.String())
	require.Equal(t, "10.96.5.5/32 clusterIP", got2.String(), "spec.clusterIP alone (an API server before dual-stack)")
}

// TestXlatSlim: the watches keep only the addresses.
func TestXlatSlim(t *testing.T) {
	s := service("web", []string{"10.96.0.10"}, []string{"198.51.100.200"}, "203.0.113.7")
	s.Labels = map[string]string{"app": "web"}
	s.Spec.Selector = map[string]string{"app": "web"}
	s.Spec.Ports = []corev1.ServicePort{{Port: 80}}
	out, err := slimXlat(s)
	require.NoError(t, err)
	slim := out.(*corev1.Service)
	require.Nil(t, slim.Labels)
	require.Nil(t, slim.Spec.Selector)
	require.Nil(t, slim.Spec.Ports)
	require.Equal(t, XlatSet([]*corev1.Service{s}, nil, nil), XlatSet([]*corev1.Service{slim}, nil, nil))
	n := node("a", []string{"192.0.2.10"}, "10.244.0.0/24")
	n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "198.51.100.10"})
	out, err = slimXlat(n)
	require.NoError(t, err)
	require.Equal(t, []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.10"}, {Type: corev1.NodeExternalIP, Address: "198.51.100.10"}},
		out.(*corev1.Node).Status.Addresses, "the host name goes")
}

// TestSlimNodeKeepsWhatBothRead: the agent's one Node watch feeds the
// routes and the translated destinations; its transform keeps what each
// reads of a kubelet's Node (pod ranges and InternalIPs; InternalIPs and
// ExternalIPs) and drops the rest.
func TestSlimNodeKeepsWhatBothRead(t *testing.T) {
	n := node("b", []string{"192.0.2.11", "2001:db8::11"}, "10.244.1.0/24", "fd00:244:1::/64")
	n.Labels = map[string]string{"kubernetes.io/hostname": "b"}
	n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "198.51.100.11"},
		corev1.NodeAddress{Type: corev1.NodeExternalDNS, Address: "b.example"})
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"registry.k8s.io/pause:3.10"}, SizeBytes: 320000}}
	out, err := slimNode(n)
	require.NoError(t, err)
	slim := out.(*corev1.Node)
	require.Nil(t, slim.Labels)
	require.Nil(t, slim.Status.Conditions)
	require.Nil(t, slim.Status.Images)
	peer, err := PeerOf(n)
	require.NoError(t, err)
	slimPeer, err := PeerOf(slim)
	require.NoError(t, err)
	require.True(t, peer.Equal(slimPeer), "the routes read the same: %+v", slimPeer)
	require.Equal(t, XlatSet(nil, []*corev1.Node{n}, nil), XlatSet(nil, []*corev1.Node{slim}, nil))
	require.Equal(t, "192.0.2.11/32 node\n198.51.100.11/32 node\n2001:db8::11/128 node", XlatSet(nil, []*corev1.Node{slim}, nil).String())
}

// TestXlatController runs the controller against a fake API server and a
// private bpffs: it writes the set and leases it, follows the Services
// and Nodes, and when it stops leaves the set and lets the lease run out.
func TestXlatController(t *testing.T) {
	bpfRoot := testutil.BPFFS(t)
	nd := nodetest.Handle(t, bpfRoot, t.TempDir())
	client := fake.NewClientset(service("web", []string{"10.96.0.10"}, nil), node("a", []string{"192.0.2.10"}))
	xc := NewXlatController(client, XlatConfig{Node: nd, ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")},
		Lease: time.Second, Renew: 200 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- xc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	tr, err := flows.OpenTranslated(nd)
	require.NoError(t, err)
	set := func() string {
		s, err := tr.List()
		require.NoError(t, err)
		return s.String()
	}
	leased := func() bool {
		l, err := tr.Lease()
		require.NoError(t, err)
		return l.Valid()
	}

	want := "10.96.0.0/16 serviceRange\n10.96.0.10/32 clusterIP\n192.0.2.10/32 node"
	require.Eventually(t, func() bool { return set() == want && leased() }, 10*time.Second, 20*time.Millisecond, "the set: %s", set())
	l, err := tr.Lease()
	require.NoError(t, err)
	require.Equal(t, uint32(3), l.Entries)
	require.LessOrEqual(t, l.Left, time.Second, "leased for the configured time")

	// An externalIP appears, a node goes: followed.
	_, err = client.CoreV1().Services("default").Create(ctx, service("ext", []string{"10.96.0.11"}, []string{"198.51.100.200"}), metav1.CreateOptions{})
	require.NoError(t, err)
	require.NoError(t, client.CoreV1().Nodes().Delete(ctx, "a", metav1.DeleteOptions{}))
	want = "10.96.0.0/16 serviceRange\n10.96.0.10/32 clusterIP\n10.96.0.11/32 clusterIP\n198.51.100.200/32 externalIP"
	require.Eventually(t, func() bool { return set() == want }, 10*time.Second, 20*time.Millisecond, "the set: %s", set())
	require.NoError(t, xc.Status().Err)

	// Renewed while it runs: valid past the first lease's end.
	time.Sleep(1500 * time.Millisecond)
	require.True(t, leased(), "renewed")

	// Stopped: the set stays, the lease runs out.
	cancel()
	require.NoError(t, <-done)
	done <- nil
	require.Eventually(t, func() bool { return !leased() }, 10*time.Second, 50*time.Millisecond)
	require.Equal(t, want, set(), "a stopped agent leaves the set")
}

// TestXlatControllerNoBPFFS: a bpfRoot that is no bpffs is reported, and
// nothing is leased.
func TestXlatControllerNoBPFFS(t *testing.T) {
	xc := NewXlatController(fake.NewClientset(), XlatConfig{Node: nodetest.Handle(t, t.TempDir(), t.TempDir())})
	require.Error(t, xc.Sync(flows.Set{}))
	require.Error(t, xc.Status().Err)
	require.True(t, xc.Status().Renewed.IsZero())
}

// TestXlatSame: only an update that changes what XlatSet reads wakes the
// controller (a heartbeat of a slimmed Node does not).
func TestXlatSame(t *testing.T) {
	node := func(rv, ip string) any {
		n, _ := slimXlat(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: rv},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}},
				Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Reason: rv}}}})
		return n
	}
	svc := func(rv string, ext ...string) any {
		s, _ := slimXlat(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s", ResourceVersion: rv, Labels: map[string]string{"rv": rv}},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}, ExternalIPs: ext}})
		return s
	}
	withExternal := func(rv, ip, ext string) any {
		n, _ := slimXlat(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: rv},
			Spec:   corev1.NodeSpec{PodCIDRs: []string{"10.244." + rv + ".0/24"}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeExternalIP, Address: ext}}}})
		return n
	}
	require.True(t, xlatSame(node("1", "192.0.2.1"), node("2", "192.0.2.1")), "a heartbeat")
	require.False(t, xlatSame(node("1", "192.0.2.1"), node("2", "192.0.2.2")), "a new address")
	require.True(t, xlatSame(withExternal("1", "192.0.2.1", "198.51.100.1"), withExternal("2", "192.0.2.1", "198.51.100.1")),
		"new pod ranges (kept of a Node for the routes, not read by the set)")
	require.False(t, xlatSame(withExternal("1", "192.0.2.1", "198.51.100.1"), withExternal("1", "192.0.2.1", "198.51.100.2")), "a new ExternalIP")
	require.True(t, xlatSame(svc("1"), svc("2")), "a label")
	require.False(t, xlatSame(svc("1"), svc("2", "192.0.2.9")), "a new externalIP")
	require.False(t, xlatSame(svc("1"), node("1", "192.0.2.1")))
}

// runAgentWithXlat runs an agent for node "self" and beside it, as
// ebpf-cni-agent run does (runSideBySide), the translated destinations on
// nd: reading the agent's Node informer when shared, watching Nodes itself
// if not. watches counts the watches the client opened, by resource.
func runAgentWithXlat(t *testing.T, client *fake.Clientset, nd *nodestate.Node, shared bool) (h *harness, xc *XlatController, watches func(resource string) int) {
	t.Helper()
	var mu sync.Mutex
	opened := map[string]int{}
	client.PrependWatchReactor("*", func(action k8stesting.Action) (bool, watch.Interface, error) {
		mu.Lock()
		opened[action.GetResource().Resource]++
		mu.Unlock()
		return false, nil, nil // the tracker's watch
	})
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	routes := newMem()
	a, err := New(client, routes, Config{NodeName: "self", Resync: time.Hour, Logger: discard})
	require.NoError(t, err)
	cfg := XlatConfig{Node: nd, Lease: time.Second, Renew: 200 * time.Millisecond, Logger: discard}
	if shared {
		cfg.Nodes = a.Nodes()
	}
	xc = NewXlatController(client, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = runSideBySide(ctx, a, nil, xc); close(done) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return &harness{t: t, client: client, routes: routes, agent: a, stop: stop}, xc, func(resource string) int {
		mu.Lock()
		defer mu.Unlock()
		return opened[resource]
	}
}

// TestAgentOneNodeWatch: the agent opens one Node watch, which the routes
// and the translated destinations share (XlatConfig.Nodes); a controller
// given no informer watches Nodes itself, a second watch.
func TestAgentOneNodeWatch(t *testing.T) {
	for _, tc := range []struct {
		name        string
		shared      bool
		nodeWatches int
	}{{"shared", true, 1}, {"own", false, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(node("self", []string{"192.0.2.10"}, "10.244.0.0/24"), node("b", []string{"192.0.2.11"}, "10.244.1.0/24"),
				service("web", []string{"10.96.0.10"}, nil))
			// No bpffs: the controller's writes fail, after its caches synced.
			h, xc, watches := runAgentWithXlat(t, client, nodetest.Handle(t, t.TempDir(), t.TempDir()), tc.shared)
			h.eventually("10.244.1.0/24 via 192.0.2.11")
			require.Eventually(t, func() bool {
				return xc.Status().Err != nil && watches("services") == 1 && watches("nodes") == tc.nodeWatches
			}, 10*time.Second, 10*time.Millisecond, "services %d, nodes %d", watches("services"), watches("nodes"))
			h.create(node("c", []string{"192.0.2.12"}, "10.244.2.0/24"))
			h.eventually("10.244.1.0/24 via 192.0.2.11", "10.244.2.0/24 via 192.0.2.12")
			require.Equal(t, tc.nodeWatches, watches("nodes"))
			require.Equal(t, 1, watches("services"))
		})
	}
}

// TestXlatControllerSharedNodes: reading the agent's Node informer, the
// set has every node's InternalIPs and ExternalIPs (the agent's transform
// keeps both) and follows a changed ExternalIP, while the routes follow the
// Nodes as before.
func TestXlatControllerSharedNodes(t *testing.T) {
	nd := nodetest.Handle(t, testutil.BPFFS(t), t.TempDir())
	b := node("b", []string{"192.0.2.11", "2001:db8::11"}, "10.244.1.0/24")
	b.Status.Addresses = append(b.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "198.51.100.11"})
	client := fake.NewClientset(node("self", []string{"192.0.2.10"}, "10.244.0.0/24"), b, service("web", []string{"10.96.0.10"}, nil))
	h, _, watches := runAgentWithXlat(t, client, nd, true)
	tr, err := flows.OpenTranslated(nd)
	require.NoError(t, err)
	set := func() string {
		s, err := tr.List()
		require.NoError(t, err)
		return s.String()
	}

	want := "10.96.0.10/32 clusterIP\n192.0.2.10/32 node\n192.0.2.11/32 node\n198.51.100.11/32 node\n2001:db8::11/128 node"
	require.Eventually(t, func() bool { return set() == want }, 10*time.Second, 20*time.Millisecond, "the set: %s", set())
	h.eventually("10.244.1.0/24 via 192.0.2.11")

	// A new ExternalIP: the set follows; the routes (InternalIPs) stay.
	b.Status.Addresses[len(b.Status.Addresses)-1].Address = "198.51.100.12"
	h.update(b)
	want = "10.96.0.10/32 clusterIP\n192.0.2.10/32 node\n192.0.2.11/32 node\n198.51.100.12/32 node\n2001:db8::11/128 node"
	require.Eventually(t, func() bool { return set() == want }, 10*time.Second, 20*time.Millisecond, "the set: %s", set())
	h.eventually("10.244.1.0/24 via 192.0.2.11")
	require.Equal(t, 1, watches("nodes"))
}
