package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/pkg/conflist"
)

// memRoutes is a NodeRoutes in memory: the reconciler's decisions without
// a kernel (the direct backend is tested on real routes in test/deploy).
type memRoutes struct {
	mu       sync.Mutex
	entries  map[netip.Prefix]netip.Addr
	failNext int // Ensure calls that fail before the next succeeds
	ensures  int
}

func newMem() *memRoutes { return &memRoutes{entries: map[netip.Prefix]netip.Addr{}} }

func (m *memRoutes) Mode() conflist.Mode          { return conflist.ModeDirect }
func (m *memRoutes) Plan(p Peer) ([]Route, error) { return PlanSameFamily(p) }

func (m *memRoutes) Ensure(r Route) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ensures++
	if m.failNext > 0 {
		m.failNext--
		return errors.New("netlink: injected failure")
	}
	m.entries[r.Dst] = r.Via
	return nil
}

func (m *memRoutes) Remove(r Route) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.entries[r.Dst] == r.Via {
		delete(m.entries, r.Dst)
	}
	return nil
}

func (m *memRoutes) List() ([]Route, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Route
	for d, v := range m.entries {
		out = append(out, Route{d, v})
	}
	return out, nil
}

// snapshot is the entries as "dst via addr" lines, sorted.
func (m *memRoutes) snapshot() []string {
	rs, _ := m.List()
	out := []string{}
	for _, r := range rs {
		out = append(out, r.String())
	}
	sort.Strings(out)
	return out
}

func node(name string, ips []string, cidrs ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDRs: cidrs}}
	if len(cidrs) > 0 {
		n.Spec.PodCIDR = cidrs[0]
	}
	for _, ip := range ips {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: name})
	return n
}

type harness struct {
	t      *testing.T
	client *fake.Clientset
	routes *memRoutes
	agent  *Agent
	stop   func()
}

// start runs an agent for node "self" against a fake clientset holding
// objs, until the test ends.
func start(t *testing.T, routes *memRoutes, client *fake.Clientset) *harness {
	t.Helper()
	a, err := New(client, routes, Config{NodeName: "self", Resync: 200 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = a.Run(ctx); close(done) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return &harness{t: t, client: client, routes: routes, agent: a, stop: stop}
}

// eventually waits for the entries to be want (a bound for a broken agent,
// not a speed assertion).
func (h *harness) eventually(want ...string) {
	h.t.Helper()
	if want == nil {
		want = []string{}
	}
	sort.Strings(want)
	require.EventuallyWithT(h.t, func(c *assert.CollectT) {
		assert.Equal(c, want, h.routes.snapshot())
	}, 10*time.Second, 10*time.Millisecond)
}

func (h *harness) ready() Status {
	h.t.Helper()
	var s Status
	require.Eventually(h.t, func() bool { s = h.agent.Status(); return s.Ready }, 10*time.Second, 10*time.Millisecond, "not ready: %+v", s)
	return s
}

func (h *harness) create(n *corev1.Node) {
	h.t.Helper()
	_, err := h.client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{})
	require.NoError(h.t, err)
}

func (h *harness) update(n *corev1.Node) {
	h.t.Helper()
	_, err := h.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
	require.NoError(h.t, err)
}

func (h *harness) delete(name string) {
	h.t.Helper()
	require.NoError(h.t, h.client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}))
}

// TestReconcileLifecycle: a node's ranges are routed via its InternalIP
// when its Node appears, follow a changed address and changed ranges, and
// go with the Node; this node's own ranges are never routed.
func TestReconcileLifecycle(t *testing.T) {
	self := node("self", []string{"192.0.2.10", "2001:db8::10"}, "10.244.0.0/24", "fd00:10:244::/64")
	h := start(t, newMem(), fake.NewClientset(self))
	s := h.ready()
	require.Equal(t, 0, s.Routes)

	h.create(node("b", []string{"192.0.2.11", "2001:db8::11"}, "10.244.1.0/24", "fd00:10:244:1::/64"))
	h.eventually("10.244.1.0/24 via 192.0.2.11", "fd00:10:244:1::/64 via 2001:db8::11")

	// Changed InternalIP.
	h.update(node("b", []string{"192.0.2.21", "2001:db8::11"}, "10.244.1.0/24", "fd00:10:244:1::/64"))
	h.eventually("10.244.1.0/24 via 192.0.2.21", "fd00:10:244:1::/64 via 2001:db8::11")

	// Changed pod ranges (a Node recreated with another allocation): the
	// old range goes, the new one comes.
	h.update(node("b", []string{"192.0.2.21"}, "10.244.7.0/24"))
	h.eventually("10.244.7.0/24 via 192.0.2.21")

	h.create(node("c", []string{"192.0.2.12"}, "10.244.2.0/24"))
	h.eventually("10.244.7.0/24 via 192.0.2.21", "10.244.2.0/24 via 192.0.2.12")
	s = h.ready()
	require.Equal(t, 2, s.Peers)
	require.Equal(t, 2, s.Routes)

	h.delete("b")
	h.eventually("10.244.2.0/24 via 192.0.2.12")
	h.delete("c")
	h.eventually()
}

// TestReconcileProblems: what a Node object gets wrong is reported (not
// ready, named in the problems) and leaves the rest routed; fixing the Node
// clears it.
func TestReconcileProblems(t *testing.T) {
	self := node("self", []string{"192.0.2.10"}, "10.244.0.0/24")
	h := start(t, newMem(), fake.NewClientset(self,
		node("v6only", []string{"2001:db8::12"}, "10.244.2.0/24", "fd00:10:244:2::/64"),
		node("thief", []string{"192.0.2.13"}, "10.244.0.0/16"),
		node("typo", []string{"192.0.2.14"}, "10.244.4.0/33"),
	))
	h.eventually("fd00:10:244:2::/64 via 2001:db8::12")
	var s Status
	require.Eventually(t, func() bool { s = h.agent.Status(); return len(s.Problems) == 3 }, 10*time.Second, 10*time.Millisecond)
	require.False(t, s.Ready)
	require.Contains(t, s.Problems[0], "node thief claims 10.244.0.0/16, which overlaps this node's pod range 10.244.0.0/24")
	require.Contains(t, s.Problems[1], `node typo: pod range "10.244.4.0/33" is not a CIDR`)
	require.Contains(t, s.Problems[2], "node v6only has no InternalIP of the family of its pod range 10.244.2.0/24")

	h.update(node("v6only", []string{"192.0.2.12", "2001:db8::12"}, "10.244.2.0/24", "fd00:10:244:2::/64"))
	h.update(node("thief", []string{"192.0.2.13"}, "10.244.3.0/24"))
	h.update(node("typo", []string{"192.0.2.14"}, "10.244.4.0/24"))
	h.eventually("fd00:10:244:2::/64 via 2001:db8::12", "10.244.2.0/24 via 192.0.2.12", "10.244.3.0/24 via 192.0.2.13", "10.244.4.0/24 via 192.0.2.14")
	h.ready()
}

// TestReconcileSelfWithoutPodRange: the agent is not ready while its own
// Node has no spec.podCIDRs (nor while it has no Node), and says why.
func TestReconcileSelfWithoutPodRange(t *testing.T) {
	h := start(t, newMem(), fake.NewClientset(node("b", []string{"192.0.2.11"}, "10.244.1.0/24")))
	h.eventually("10.244.1.0/24 via 192.0.2.11")
	var s Status
	require.Eventually(t, func() bool { s = h.agent.Status(); return len(s.Problems) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Contains(t, s.Problems[0], "this node (self) has no Node object")
	h.create(node("self", []string{"192.0.2.10"}))
	require.Eventually(t, func() bool {
		s = h.agent.Status()
		return len(s.Problems) == 1 && s.Problems[0] != "" && !s.Ready && containsAll(s.Problems[0], "has no spec.podCIDRs", "--allocate-node-cidrs")
	}, 10*time.Second, 10*time.Millisecond, "%+v", s)
	h.update(node("self", []string{"192.0.2.10"}, "10.244.0.0/24"))
	h.ready()
}

func containsAll(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

// TestReconcileAPIErrors: while the API server refuses to list nodes, the
// agent is not ready and keeps what it had installed; when it answers
// again, the agent catches up. A failing Ensure is retried until it holds.
func TestReconcileAPIErrors(t *testing.T) {
	routes := newMem()
	// Left by an earlier run of the agent: a node that still exists and one
	// that went while the agent was down.
	routes.entries[netip.MustParsePrefix("10.244.1.0/24")] = netip.MustParseAddr("192.0.2.11")
	routes.entries[netip.MustParsePrefix("10.244.9.0/24")] = netip.MustParseAddr("192.0.2.19")
	client := fake.NewClientset(node("self", []string{"192.0.2.10"}, "10.244.0.0/24"), node("b", []string{"192.0.2.11"}, "10.244.1.0/24"))
	var mu sync.Mutex
	refuse := true
	client.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if refuse {
			return true, nil, fmt.Errorf("the server is currently unable to handle the request")
		}
		return false, nil, nil
	})
	h := start(t, routes, client)
	// Wait for the agent to have tried (and failed) to list.
	require.Eventually(t, func() bool {
		for _, a := range client.Actions() {
			if a.GetVerb() == "list" {
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond)
	s := h.agent.Status()
	require.False(t, s.Ready)
	require.Equal(t, "waiting for the node list from the API server", s.Reason)
	require.Equal(t, []string{"10.244.1.0/24 via 192.0.2.11", "10.244.9.0/24 via 192.0.2.19"}, routes.snapshot(), "nothing removed without a node list")

	routes.mu.Lock()
	routes.failNext = 3
	routes.mu.Unlock()
	mu.Lock()
	refuse = false
	mu.Unlock()
	h.eventually("10.244.1.0/24 via 192.0.2.11")
	h.create(node("c", []string{"192.0.2.12"}, "10.244.2.0/24"))
	h.eventually("10.244.1.0/24 via 192.0.2.11", "10.244.2.0/24 via 192.0.2.12")
	h.ready()
}

// TestReconcileWatchBroken: the watch breaks (the API server restarts)
// while a node is deleted and another added; the informer lists again and
// the agent removes the one and routes the other. Then routes removed
// behind the agent's back come back at the next full sync.
func TestReconcileWatchBroken(t *testing.T) {
	client := fake.NewClientset(node("self", []string{"192.0.2.10"}, "10.244.0.0/24"), node("b", []string{"192.0.2.11"}, "10.244.1.0/24"))
	var mu sync.Mutex
	var watchers []*watch.FakeWatcher
	client.PrependWatchReactor("nodes", func(k8stesting.Action) (bool, watch.Interface, error) {
		mu.Lock()
		defer mu.Unlock()
		w := watch.NewFake()
		watchers = append(watchers, w)
		return true, w, nil
	})
	h := start(t, newMem(), client)
	h.eventually("10.244.1.0/24 via 192.0.2.11")
	h.ready()

	// Changes the agent's watch never delivers: the tracker has them, the
	// FakeWatcher the agent holds does not.
	h.delete("b")
	h.create(node("c", []string{"192.0.2.12"}, "10.244.2.0/24"))
	time.Sleep(300 * time.Millisecond) // more than a resync: nothing may happen without the events
	require.Equal(t, []string{"10.244.1.0/24 via 192.0.2.11"}, h.routes.snapshot())

	mu.Lock()
	watchers[len(watchers)-1].Stop() // the connection drops
	mu.Unlock()
	h.eventually("10.244.2.0/24 via 192.0.2.12")

	// Someone deletes the agent's route: the next full sync restores it.
	h.routes.mu.Lock()
	delete(h.routes.entries, netip.MustParsePrefix("10.244.2.0/24"))
	h.routes.mu.Unlock()
	h.eventually("10.244.2.0/24 via 192.0.2.12")
}

// TestHealthEndpoints: /readyz is 503 with the reason until ready, then
// 200; /healthz is 200 while the worker is not wedged. Both carry JSON.
func TestHealthEndpoints(t *testing.T) {
	client := fake.NewClientset(node("b", []string{"192.0.2.11"}, "10.244.1.0/24"))
	h := start(t, newMem(), client)
	srv := httptest.NewServer(h.agent.Handler())
	t.Cleanup(srv.Close)
	get := func(path string) (int, Status) {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		var s Status
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&s))
		return resp.StatusCode, s
	}
	h.eventually("10.244.1.0/24 via 192.0.2.11")
	require.Eventually(t, func() bool { code, _ := get("/readyz"); return code == http.StatusServiceUnavailable }, 10*time.Second, 10*time.Millisecond)
	code, s := get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "self", s.Node)
	require.Equal(t, "direct", s.Mode)
	require.NotEmpty(t, s.Reason)
	code, _ = get("/healthz")
	require.Equal(t, http.StatusOK, code)

	h.create(node("self", []string{"192.0.2.10"}, "10.244.0.0/24"))
	require.Eventually(t, func() bool { code, _ := get("/readyz"); return code == http.StatusOK }, 10*time.Second, 10*time.Millisecond)
	_, s = get("/readyz")
	require.True(t, s.Ready)
	require.Equal(t, 1, s.Routes)

	// A wedged worker fails liveness.
	h.agent.setBusy(time.Now().Add(-stuckAfter - time.Second))
	code, s = get("/healthz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.False(t, s.Ready)
	require.Contains(t, s.Reason, "stuck")
}

func TestNewRefusesNoNodeName(t *testing.T) {
	_, err := New(fake.NewClientset(), newMem(), Config{})
	require.ErrorContains(t, err, "NODE_NAME")
	_, err = NewVXLAN(nodetest.Handle(t, t.TempDir(), t.TempDir()), 5)
	require.ErrorContains(t, err, "underlay family 5: want 4 or 6")
	// Not on a bpffs: no error (it may be mounted later), each call says so.
	v, err := NewVXLAN(nodetest.Handle(t, t.TempDir(), t.TempDir()), 4)
	require.NoError(t, err)
	_, err = v.List()
	require.ErrorContains(t, err, "not on a bpf filesystem")
}

func TestPeerOf(t *testing.T) {
	n := node("x", []string{"192.0.2.1", "bogus", "::ffff:192.0.2.9"}, "10.1.0.0/24")
	n.Spec.PodCIDRs = nil // a cluster that sets only spec.podCIDR
	p, err := PeerOf(n)
	require.ErrorContains(t, err, `InternalIP "bogus" is not an address`)
	require.Equal(t, []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.9")}, p.InternalIPs)
	require.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24")}, p.PodCIDRs)
}
