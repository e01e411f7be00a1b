package agent

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy/compile"
)

// policyNode is a node's maps in a private bpffs, its endpoints written as
// ADD writes them, and a fake API server.
type policyNode struct {
	t       testing.TB
	bpfRoot string
	client  *fake.Clientset
	pm      *policy.Maps
	devs    *ebpf.Map
	pods    *ebpf.Map
}

func newPolicyNode(t testing.TB, objs ...any) *policyNode {
	n := policyNodeAt(t, testutil.BPFFS(t), fake.NewClientset())
	for _, o := range objs {
		n.apply(o)
	}
	return n
}

// policyNodeAt is the node of the maps under bpfRoot (on a bpffs) and the
// API of client.
func policyNodeAt(t testing.TB, bpfRoot string, client *fake.Clientset) *policyNode {
	pm, err := policy.Open(nodetest.Handle(t, bpfRoot, t.TempDir()))
	require.NoError(t, err)
	t.Cleanup(pm.Close)
	ms, err := maps.OpenPinned(bpfRoot, maps.CniMapEndpointDevs, maps.CniMapEndpointPods)
	require.NoError(t, err)
	t.Cleanup(func() { ms[maps.CniMapEndpointDevs].Close(); ms[maps.CniMapEndpointPods].Close() })
	return &policyNode{t: t, bpfRoot: bpfRoot, client: client, pm: pm, devs: ms[maps.CniMapEndpointDevs], pods: ms[maps.CniMapEndpointPods]}
}

func (n *policyNode) apply(o any) {
	n.t.Helper()
	ctx := context.Background()
	var err error
	switch o := o.(type) {
	case *corev1.Namespace:
		if _, err = n.client.CoreV1().Namespaces().Update(ctx, o, metav1.UpdateOptions{}); err != nil {
			_, err = n.client.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{})
		}
	case *corev1.Pod:
		if _, err = n.client.CoreV1().Pods(o.Namespace).Update(ctx, o, metav1.UpdateOptions{}); err != nil {
			_, err = n.client.CoreV1().Pods(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		}
	case *networkingv1.NetworkPolicy:
		if _, err = n.client.NetworkingV1().NetworkPolicies(o.Namespace).Update(ctx, o, metav1.UpdateOptions{}); err != nil {
			_, err = n.client.NetworkingV1().NetworkPolicies(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		}
	}
	require.NoError(n.t, err)
}

func (n *policyNode) deletePolicy(ns, name string) {
	n.t.Helper()
	require.NoError(n.t, n.client.NetworkingV1().NetworkPolicies(ns).Delete(context.Background(), name, metav1.DeleteOptions{}))
}

// addEndpoint writes endpoint_devs and endpoint_pods as ADD does (its
// policy state aside).
func (n *policyNode) addEndpoint(ifindex uint32, ns, name string, ip string) {
	n.t.Helper()
	var d maps.CniEndpointDev
	a := netip.MustParseAddr(ip).As4()
	d.Ip4[0] = binary.NativeEndian.Uint32(a[:])
	d.N_ip4 = 1
	require.NoError(n.t, n.devs.Put(ifindex, &d))
	var p maps.CniEndpointPod
	maps.CString(p.Namespace[:], ns)
	maps.CString(p.Name[:], name)
	maps.CString(p.Uid[:], ns+"-"+name)
	require.NoError(n.t, n.pods.Put(ifindex, &p))
}

func (n *policyNode) delEndpoint(ifindex uint32) {
	n.t.Helper()
	require.NoError(n.t, n.devs.Delete(ifindex))
	require.NoError(n.t, n.pods.Delete(ifindex))
	require.NoError(n.t, n.pm.DeleteEndpoint(ifindex))
}

// run starts a controller until stop (or the test's end).
func (n *policyNode) run() (pc *PolicyController, stop func()) {
	n.t.Helper()
	pc = NewPolicyController(n.client, PolicyConfig{Node: nodetest.Handle(n.t, n.bpfRoot, n.t.TempDir()), Poll: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = pc.Run(ctx); close(done) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	n.t.Cleanup(stop)
	require.Eventually(n.t, pc.Synced, 10*time.Second, 10*time.Millisecond)
	return pc, stop
}

func (n *policyNode) states() map[uint32]policy.EndpointState {
	n.t.Helper()
	s, err := n.pm.EndpointStates()
	require.NoError(n.t, err)
	return s
}

func (n *policyNode) rules() policy.RuleSet {
	n.t.Helper()
	rs, err := n.pm.ReadRules()
	require.NoError(n.t, err)
	for _, byDir := range rs {
		for _, es := range byDir {
			compile.SortEntries(es)
		}
	}
	return rs
}

// eventually waits (a bound for a broken controller, not a speed
// assertion) until cond holds on the maps.
func (n *policyNode) eventually(cond func(c *assert.CollectT)) {
	n.t.Helper()
	require.EventuallyWithT(n.t, cond, 10*time.Second, 10*time.Millisecond)
}

func testPod(ns, name, ip string, lbl map[string]string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbl, UID: types.UID(ns + "-" + name)}}
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	return p
}

func testNS(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// allowFrom lets pods labelled app=from reach the pods labelled app=to on
// TCP port (ingress).
func allowFrom(ns, name, to, from string, port int32) *networkingv1.NetworkPolicy {
	p := intstr.FromInt32(port)
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": to}},
		Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": from}}}},
			Ports: []networkingv1.NetworkPolicyPort{{Port: &p}},
		}},
	}}
}

// denyEgress isolates the egress of the pods labelled app=to, but for
// TCP port to pods labelled app=peer.
func denyEgress(ns, name, to, peer string, port int32) *networkingv1.NetworkPolicy {
	p := intstr.FromInt32(port)
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": to}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
		Egress: []networkingv1.NetworkPolicyEgressRule{{
			To:    []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": peer}}}},
			Ports: []networkingv1.NetworkPolicyPort{{Port: &p}},
		}},
	}}
}

func tcp(port uint16) policy.Rule {
	r := policy.Rule{N_ports: 1}
	r.Ports[0] = maps.CniPolicyPort{First: port, Last: port, Proto: 6}
	return r
}

func withSources(r policy.Rule, ids ...uint32) policy.Rule {
	for i, id := range ids {
		r.Sources[i] = id
	}
	r.N_sources = uint8(len(ids))
	return r
}

func entry(prefix string, r policy.Rule) policy.Entry {
	return policy.Entry{Prefix: netip.MustParsePrefix(prefix), Rule: r}
}

const (
	ifServer = 10
	ifClient = 11
)

// serverClient: namespace a holds server (10.0.1.1, ifindex 10) and client
// (10.0.1.2, ifindex 11), both of this node; b has no policy.
func serverClient(t *testing.T) *policyNode {
	n := newPolicyNode(t, testNS("a"), testNS("b"),
		testPod("a", "server", "10.0.1.1", map[string]string{"app": "server"}),
		testPod("a", "client", "10.0.1.2", map[string]string{"app": "client"}),
		allowFrom("a", "web", "server", "client", 80))
	n.addEndpoint(ifServer, "a", "server", "10.0.1.1")
	n.addEndpoint(ifClient, "a", "client", "10.0.1.2")
	return n
}

// TestPolicyControllerRestart: the controller writes the server's ingress
// rules and state, the namespace's fact and the policy's name; a new
// controller with the same policies changes nothing, generations included.
func TestPolicyControllerRestart(t *testing.T) {
	n := serverClient(t)
	pc, stop := n.run()
	states := n.states()
	require.Equal(t, map[uint32]policy.EndpointState{ifServer: {Ingress: uint8(policy.StateEnforce), IngressGen: 1}}, states)
	rules := n.rules()
	require.Equal(t, policy.RuleSet{ifServer: {policy.Ingress: {entry("10.0.1.2/32", withSources(tcp(80), policy.ID("a", "web")))}}}, rules)
	fact, err := n.pm.Namespace("a")
	require.NoError(t, err)
	require.Equal(t, policy.NamespaceFact{Ingress: true}, fact)
	facts, err := n.pm.NamespaceFacts()
	require.NoError(t, err)
	require.Len(t, facts, 1, "namespaces without policies have no fact")
	require.Equal(t, "a/web", n.pm.NameOf(policy.ID("a", "web")))
	require.NotEmpty(t, pc.Latencies())
	stop()

	_, stop = n.run()
	time.Sleep(100 * time.Millisecond) // a few polls
	require.Equal(t, states, n.states(), "a restart bumped a generation")
	require.Equal(t, rules, n.rules())
	stop()

	// The same after the policy maps' state is changed behind the
	// controller's back: it follows the maps, not its memory.
	require.NoError(t, n.pm.SetEndpoint(ifServer, policy.EndpointState{Ingress: uint8(policy.StateClosed), Egress: uint8(policy.StateClosed)}))
	n.run()
	require.Equal(t, map[uint32]policy.EndpointState{ifServer: {Ingress: uint8(policy.StateEnforce), IngressGen: 1, Egress: uint8(policy.StateOpen), EgressGen: 1}}, n.states())
}

// TestPolicyControllerChanges: a change bumps the generation of the
// direction whose rules or state it changes, and only that one; a new
// local peer is found by the poll before the API server has its address;
// an endpoint that goes loses its rules.
func TestPolicyControllerChanges(t *testing.T) {
	n := serverClient(t)
	_, _ = n.run()
	web := policy.ID("a", "web")

	// Egress of the server: a new direction, its own generation.
	n.apply(denyEgress("a", "out", "server", "client", 53))
	n.eventually(func(c *assert.CollectT) {
		assert.Equal(c, map[uint32]policy.EndpointState{ifServer: {Ingress: uint8(policy.StateEnforce), IngressGen: 1, Egress: uint8(policy.StateEnforce), EgressGen: 1}}, n.states())
	})
	require.Equal(t, policy.RuleSet{ifServer: {
		policy.Ingress: {entry("10.0.1.2/32", withSources(tcp(80), web))},
		policy.Egress:  {entry("10.0.1.2/32", withSources(tcp(53), policy.ID("a", "out")))},
	}}, n.rules())

	// The ingress port changes: the ingress generation only.
	n.apply(allowFrom("a", "web", "server", "client", 8080))
	n.eventually(func(c *assert.CollectT) {
		assert.Equal(c, map[uint32]policy.EndpointState{ifServer: {Ingress: uint8(policy.StateEnforce), IngressGen: 2, Egress: uint8(policy.StateEnforce), EgressGen: 1}}, n.states())
	})
	require.Equal(t, []policy.Entry{entry("10.0.1.2/32", withSources(tcp(8080), web))}, n.rules()[ifServer][policy.Ingress])

	// A pod update that changes nothing the policies read: no change.
	p := testPod("a", "client", "10.0.1.2", map[string]string{"app": "client"})
	p.Annotations = map[string]string{"x": "y"}
	n.apply(p)

	// A new client of this node, not in the API server's status yet: a
	// peer by its endpoint's address.
	n.apply(testPod("a", "client2", "", map[string]string{"app": "client"}))
	n.addEndpoint(12, "a", "client2", "10.0.1.3")
	n.eventually(func(c *assert.CollectT) {
		assert.Equal(c, []policy.Entry{entry("10.0.1.2/32", withSources(tcp(8080), web)), entry("10.0.1.3/32", withSources(tcp(8080), web))}, n.rules()[ifServer][policy.Ingress])
	})
	require.Equal(t, map[uint32]policy.EndpointState{ifServer: {Ingress: uint8(policy.StateEnforce), IngressGen: 3, Egress: uint8(policy.StateEnforce), EgressGen: 2}}, n.states(),
		"a new peer bumps both directions: it is an ingress and an egress peer")

	// The server goes: its rules go; a client in its place (the same
	// ifindex) is open.
	n.delEndpoint(ifServer)
	n.eventually(func(c *assert.CollectT) { assert.Empty(c, n.rules()) })
	require.Empty(t, n.states())

	// Policies removed: the namespace's fact and the names go.
	n.addEndpoint(ifServer, "a", "server", "10.0.1.1")
	n.eventually(func(c *assert.CollectT) { assert.Len(c, n.rules()[ifServer], 2) })
	require.Equal(t, map[uint32]policy.EndpointState{ifServer: {Ingress: uint8(policy.StateEnforce), IngressGen: 4, Egress: uint8(policy.StateEnforce), EgressGen: 3}}, n.states(),
		"an ifindex that comes back continues its generations")
	n.deletePolicy("a", "web")
	n.deletePolicy("a", "out")
	n.eventually(func(c *assert.CollectT) {
		assert.Empty(c, n.states())
		assert.Empty(c, n.rules())
		facts, err := n.pm.NamespaceFacts()
		assert.NoError(c, err)
		assert.Empty(c, facts)
	})
	require.Equal(t, fmt.Sprintf("policy %#x", web), n.pm.NameOf(web), "the name is gone")
}

// TestPolicyControllerScope: the controller reads the pods of the
// namespaces its endpoints' policies can select, and follows what changes
// that set: a namespace labelled into a namespace selector brings its pods
// in, and their changes from then on; a policy that selects another
// namespace's pods brings those in; a policy of a namespace without local
// pods changes that namespace's fact only.
func TestPolicyControllerScope(t *testing.T) {
	team := func(ns string, labels map[string]string) *corev1.Namespace {
		n := testNS(ns)
		n.Labels = labels
		return n
	}
	port := intstr.FromInt32(80)
	fromTeam := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "team"}, Spec: networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
		Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "x"}}}},
			Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
		}},
	}}
	n := newPolicyNode(t, testNS("a"), testNS("b"), testNS("c"),
		testPod("a", "server", "10.0.1.1", map[string]string{"app": "server"}),
		testPod("b", "client", "10.0.2.1", map[string]string{"app": "client"}),
		testPod("c", "client", "10.0.3.1", map[string]string{"app": "client"}),
		fromTeam)
	n.addEndpoint(ifServer, "a", "server", "10.0.1.1")
	n.run()
	id := policy.ID("a", "team")
	require.Equal(t, map[uint32]policy.EndpointState{ifServer: {Ingress: uint8(policy.StateEnforce), IngressGen: 1}}, n.states())
	require.Empty(t, n.rules(), "no namespace has team=x")

	n.apply(team("b", map[string]string{"team": "x"}))
	n.eventually(func(c *assert.CollectT) {
		assert.Equal(c, policy.RuleSet{ifServer: {policy.Ingress: {entry("10.0.2.1/32", withSources(tcp(80), id))}}}, n.rules())
	})
	n.apply(testPod("b", "client", "10.0.2.9", map[string]string{"app": "client"}))
	n.eventually(func(c *assert.CollectT) {
		assert.Equal(c, policy.RuleSet{ifServer: {policy.Ingress: {entry("10.0.2.9/32", withSources(tcp(80), id))}}}, n.rules())
	})

	// c's pods come in with a policy whose peers select them.
	n.apply(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "c"}, Spec: networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
		Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "c"}}}}}},
	}})
	all := policy.Rule{Flags: uint8(maps.CniPolicyRuleFlagsPOLICY_F_ALL_PORTS)}
	n.eventually(func(c *assert.CollectT) {
		assert.Equal(c, policy.RuleSet{ifServer: {policy.Ingress: {entry("10.0.2.9/32", withSources(tcp(80), id)),
			entry("10.0.3.1/32", withSources(all, policy.ID("a", "c")))}}}, n.rules())
	})

	// A policy of c, where this node has no pod: c's fact, no rule.
	n.apply(denyEgress("c", "out", "client", "x", 1))
	n.eventually(func(c *assert.CollectT) {
		f, err := n.pm.Namespace("c")
		assert.NoError(c, err)
		assert.Equal(c, policy.NamespaceFact{Egress: true}, f)
	})
	require.Len(t, n.rules()[ifServer][policy.Ingress], 2)
}

// TestPolicyControllerNamespaces: every namespace's fact follows its
// policies' types; a pod of this node the API server does not know yet
// stays closed where its namespace's policies isolate, and is opened or
// enforced once it is known.
func TestPolicyControllerNamespaces(t *testing.T) {
	n := newPolicyNode(t, testNS("a"), testNS("b"), allowFrom("a", "web", "server", "client", 80))
	n.run()
	facts := func() map[string]policy.NamespaceFact {
		f, err := n.pm.NamespaceFacts()
		require.NoError(t, err)
		return f
	}
	require.Equal(t, map[string]policy.NamespaceFact{"a": {Ingress: true}}, facts())

	n.apply(denyEgress("b", "out", "x", "y", 1))
	n.eventually(func(c *assert.CollectT) {
		assert.Equal(c, map[string]policy.NamespaceFact{"a": {Ingress: true}, "b": {Egress: true}}, facts())
	})
	n.apply(denyEgress("a", "out", "x", "y", 1))
	n.eventually(func(c *assert.CollectT) {
		assert.Equal(c, map[string]policy.NamespaceFact{"a": {Ingress: true, Egress: true}, "b": {Egress: true}}, facts())
	})

	// ADD of a pod of a: closed both ways (its namespace's fact).
	st, err := n.pm.StartState("a")
	require.NoError(t, err)
	require.NoError(t, n.pm.SetEndpoint(20, st))
	n.addEndpoint(20, "a", "server", "10.0.1.1")
	time.Sleep(100 * time.Millisecond) // a few polls: the pod is not known
	require.Equal(t, map[uint32]policy.EndpointState{20: {Ingress: uint8(policy.StateClosed), Egress: uint8(policy.StateClosed)}}, n.states())
	n.apply(testPod("a", "server", "10.0.1.1", map[string]string{"app": "server"}))
	n.eventually(func(c *assert.CollectT) {
		assert.Equal(c, map[uint32]policy.EndpointState{20: {Ingress: uint8(policy.StateEnforce), IngressGen: 1, Egress: uint8(policy.StateOpen), EgressGen: 1}}, n.states())
	})

	n.deletePolicy("b", "out")
	n.eventually(func(c *assert.CollectT) {
		assert.Equal(c, map[string]policy.NamespaceFact{"a": {Ingress: true, Egress: true}}, facts())
	})
}

// TestPolicyControllerMapFull: an endpoint whose rules do not fit keeps the
// direction closed (fails closed) and the error is counted.
func TestPolicyControllerMapFull(t *testing.T) {
	bpfRoot := testutil.BPFFS(t)
	spec, err := maps.LoadCni()
	require.NoError(t, err)
	small := spec.Maps[maps.CniMapPolicyRules].Copy()
	small.MaxEntries = 1
	small.Pinning = ebpf.PinNone
	m, err := ebpf.NewMap(small)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(maps.Dir(bpfRoot), 0o700))
	require.NoError(t, m.Pin(filepath.Join(maps.Dir(bpfRoot), maps.CniMapPolicyRules)))
	m.Close()

	pm, err := policy.Open(nodetest.Handle(t, bpfRoot, t.TempDir()))
	require.NoError(t, err)
	t.Cleanup(pm.Close)
	ms, err := maps.OpenPinned(bpfRoot, maps.CniMapEndpointDevs, maps.CniMapEndpointPods)
	require.NoError(t, err)
	n := &policyNode{t: t, bpfRoot: bpfRoot, client: fake.NewClientset(), pm: pm, devs: ms[maps.CniMapEndpointDevs], pods: ms[maps.CniMapEndpointPods]}
	t.Cleanup(func() { n.devs.Close(); n.pods.Close() })
	n.apply(testNS("a"))
	n.apply(testPod("a", "server", "10.0.1.1", map[string]string{"app": "server"}))
	n.apply(testPod("a", "c1", "10.0.1.2", map[string]string{"app": "client"}))
	n.apply(testPod("a", "c2", "10.0.1.3", map[string]string{"app": "client"}))
	n.apply(allowFrom("a", "web", "server", "client", 80))
	n.addEndpoint(ifServer, "a", "server", "10.0.1.1")
	pc, _ := n.run()
	require.Equal(t, map[uint32]policy.EndpointState{ifServer: {Ingress: uint8(policy.StateClosed), IngressGen: 1}}, n.states())
	mt := NewMetrics(nodetest.Handle(t, bpfRoot, t.TempDir()), nil, nil)
	mt.AddPolicy(pc)
	reg := mt.Registry()
	errs, _ := gauge(t, reg, "ebpf_cni_policy_errors_total")
	require.Positive(t, errs)
	enforced, ok := gauge(t, reg, "ebpf_cni_policy_endpoints_enforced")
	require.True(t, ok)
	require.Zero(t, enforced, "compiled as enforced but written closed")
	synced, _ := gauge(t, reg, "ebpf_cni_policy_synced")
	require.Equal(t, 1.0, synced)

	// The rules fit again (a peer is gone): written and enforced (the
	// retry, or the pod's deletion).
	require.NoError(t, n.client.CoreV1().Pods("a").Delete(context.Background(), "c2", metav1.DeleteOptions{}))
	n.eventually(func(c *assert.CollectT) {
		assert.Equal(c, map[uint32]policy.EndpointState{ifServer: {Ingress: uint8(policy.StateEnforce), IngressGen: 2}}, n.states())
	})
	require.Equal(t, policy.RuleSet{ifServer: {policy.Ingress: {entry("10.0.1.2/32", withSources(tcp(80), policy.ID("a", "web")))}}}, n.rules())
}

// TestPolicyControllerWaitsForBPFFS: on a bpfRoot that is no bpffs yet,
// the controller reports why and retries, and the agent it runs beside
// routes all the same but is not ready, saying why; once a bpffs is mounted
// there, the controller starts and writes the policies, and the agent is
// ready.
func TestPolicyControllerWaitsForBPFFS(t *testing.T) {
	testutil.RequireRoot(t)
	mnt := filepath.Join(t.TempDir(), "bpffs")
	require.NoError(t, os.Mkdir(mnt, 0o700))
	bpfRoot := filepath.Join(mnt, "ebpf-cni")
	client := fake.NewClientset(node("self", []string{"192.0.2.10"}, "10.244.0.0/24"), node("b", []string{"192.0.2.11"}, "10.244.1.0/24"),
		testNS("a"), testPod("a", "server", "10.0.1.1", map[string]string{"app": "server"}), allowFrom("a", "web", "server", "client", 80))
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	pc := NewPolicyController(client, PolicyConfig{Node: nodetest.Handle(t, bpfRoot, t.TempDir()), Poll: 20 * time.Millisecond, Logger: discard})
	routes := newMem()
	a, err := New(client, routes, Config{NodeName: "self", Policy: pc, Logger: discard})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = pc.Run(ctx); done <- struct{}{} }()
	go func() { _ = a.Run(ctx); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); <-done; <-done })
	reg := NewMetrics(nodetest.Handle(t, bpfRoot, t.TempDir()), a, discard)
	reg.AddPolicy(pc)

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, []string{"10.244.1.0/24 via 192.0.2.11"}, routes.snapshot())
		s := a.Status()
		assert.False(c, s.Ready)
		assert.Contains(c, s.Reason, "network policies not enforced, retrying: opening the plugin's policy maps")
		require.NotNil(c, s.Policy)
		assert.Contains(c, s.Policy.Problem, "not on a bpf filesystem")
		assert.Positive(c, s.Policy.Retries)
		up, ok := gauge(c, reg.Registry(), "ebpf_cni_policy_up")
		assert.True(c, ok)
		assert.Zero(c, up)
	}, 10*time.Second, 10*time.Millisecond)

	testutil.MountBPFFS(t, mnt)
	n := policyNodeAt(t, bpfRoot, client)
	n.addEndpoint(ifServer, "a", "server", "10.0.1.1")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		st, ok, err := n.pm.Endpoint(ifServer)
		require.NoError(c, err)
		assert.True(c, ok)
		assert.Equal(c, policy.StateEnforce, policy.State(st.Ingress))
		s := a.Status()
		assert.True(c, s.Ready, "%+v", s)
		up, _ := gauge(c, reg.Registry(), "ebpf_cni_policy_up")
		assert.Equal(c, 1.0, up)
	}, 60*time.Second, 10*time.Millisecond, "the policies once the bpffs is there (retried every 1 s, then 2, 4...)")
	require.Equal(t, PolicyStatus{Running: true, Synced: true}, *a.Status().Policy)
}

// TestPolicyMetrics: the latency histogram counts every write since a
// change, the enforced endpoints their states.
func TestPolicyMetrics(t *testing.T) {
	n := serverClient(t)
	pc, _ := n.run()
	mt := NewMetrics(nodetest.Handle(t, n.bpfRoot, t.TempDir()), nil, nil)
	mt.AddPolicy(pc)
	reg := mt.Registry()
	enforced, _ := gauge(t, reg, "ebpf_cni_policy_endpoints_enforced")
	require.Equal(t, 1.0, enforced)
	n.apply(denyEgress("a", "out", "client", "server", 80))
	n.eventually(func(c *assert.CollectT) {
		enforced, _ := gauge(c, reg, "ebpf_cni_policy_endpoints_enforced")
		assert.Equal(c, 2.0, enforced)
	})
	fams, err := reg.Gather()
	require.NoError(t, err)
	var h *dto.Histogram
	for _, f := range fams {
		if f.GetName() == "ebpf_cni_policy_sync_duration_seconds" {
			h = f.Metric[0].Histogram
		}
	}
	require.NotNil(t, h)
	require.Equal(t, uint64(len(pc.Latencies())), h.GetSampleCount())
	require.GreaterOrEqual(t, h.GetSampleCount(), uint64(2))
	require.Equal(t, h.GetSampleCount(), h.Bucket[len(h.Bucket)-1].GetCumulativeCount(), "every write under 10 s")
}

// BenchmarkPolicyChange: from a policy's update to the maps written, with
// 1,000 pods, 1,000 policies that all select this node's 110 pods, through
// a fake API server (client-go's watch, no HTTP): the controller's
// recompile and write. Reports the p50 and p99 of Latencies.
func BenchmarkPolicyChange(b *testing.B) {
	bpfRoot := testutil.BPFFS(b)
	pm, err := policy.Open(nodetest.Handle(b, bpfRoot, b.TempDir()))
	require.NoError(b, err)
	defer pm.Close()
	ms, err := maps.OpenPinned(bpfRoot, maps.CniMapEndpointDevs, maps.CniMapEndpointPods)
	require.NoError(b, err)
	defer ms[maps.CniMapEndpointDevs].Close()
	defer ms[maps.CniMapEndpointPods].Close()
	var objs []runtime.Object
	for i := range 10 {
		objs = append(objs, testNS(fmt.Sprintf("ns%d", i)))
	}
	n := &policyNode{bpfRoot: bpfRoot, pm: pm, devs: ms[maps.CniMapEndpointDevs], pods: ms[maps.CniMapEndpointPods]}
	for i := range 1000 {
		ip := fmt.Sprintf("10.1.%d.%d", i>>8, i&255)
		ns, name := fmt.Sprintf("ns%d", i%10), fmt.Sprintf("pod%d", i)
		objs = append(objs, testPod(ns, name, ip, map[string]string{"app": "server", "shard": fmt.Sprint(i % 50)}))
		if i < 110 {
			var d maps.CniEndpointDev
			a := netip.MustParseAddr(ip).As4()
			d.Ip4[0] = binary.NativeEndian.Uint32(a[:])
			d.N_ip4 = 1
			require.NoError(b, n.devs.Put(uint32(100+i), &d))
			var p maps.CniEndpointPod
			maps.CString(p.Namespace[:], ns)
			maps.CString(p.Name[:], name)
			maps.CString(p.Uid[:], ns+"-"+name)
			require.NoError(b, n.pods.Put(uint32(100+i), &p))
		}
	}
	pol := func(i int, port int32) *networkingv1.NetworkPolicy {
		p := allowFrom(fmt.Sprintf("ns%d", i%10), fmt.Sprintf("pol%d", i), "server", "server", port)
		p.Spec.Ingress[0].From[0].PodSelector.MatchLabels = map[string]string{"shard": fmt.Sprint(i % 50)}
		p.Spec.Ingress[0].From[0].NamespaceSelector = &metav1.LabelSelector{}
		return p
	}
	for i := range 1000 {
		objs = append(objs, pol(i, int32(1000+i%16)))
	}
	client := fake.NewClientset(objs...)
	pc := NewPolicyController(client, PolicyConfig{Node: nodetest.Handle(b, bpfRoot, b.TempDir()), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = pc.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	require.Eventually(b, pc.Synced, time.Minute, 10*time.Millisecond)
	before := len(pc.Latencies())
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		_, err := client.NetworkingV1().NetworkPolicies(fmt.Sprintf("ns%d", i%10)).Update(ctx, pol(i%1000, int32(2000+i%7)), metav1.UpdateOptions{})
		require.NoError(b, err)
		require.Eventually(b, func() bool { return len(pc.Latencies()) > before }, 10*time.Second, 100*time.Microsecond)
		before = len(pc.Latencies())
	}
	b.StopTimer()
	lats := pc.Latencies()[1:] // the first full write aside
	slices.Sort(lats)
	if len(lats) > 0 {
		b.ReportMetric(float64(lats[len(lats)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lats[len(lats)*99/100].Microseconds())/1000, "p99-ms")
	}
}

// TestPodRecord: the informer keeps of a pod its record: what the
// compiler reads and nothing else; an update of anything else is no
// change. Of a policy, its fact and its spec.
func TestPodRecord(t *testing.T) {
	p := testPod("a", "server", "10.0.1.1", map[string]string{"app": "server", "tier": "web"})
	p.Annotations = map[string]string{"big": "value"}
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	p.Spec.HostNetwork = true
	p.Spec.Containers = []corev1.Container{{Name: "c", Image: "x", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80}}}, {Name: "d", Image: "y"}}
	p.Spec.InitContainers = []corev1.Container{{Name: "sidecar", Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolUDP}}}}
	p.Spec.Volumes = []corev1.Volume{{Name: "v"}}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady}}
	p.Status.PodIP = "10.0.1.1"
	s, err := slim(p)
	require.NoError(t, err)
	r := s.(*podRecord)
	key, err := cache.MetaNamespaceKeyFunc(r)
	require.NoError(t, err)
	require.Equal(t, "a/server", key)
	back := r.pod()
	require.Equal(t, metav1.ObjectMeta{Namespace: "a", Name: "server", UID: p.UID, Labels: p.Labels}, back.ObjectMeta)
	require.True(t, back.Spec.HostNetwork)
	require.Equal(t, corev1.PodRunning, back.Status.Phase)
	require.Equal(t, p.Status.PodIPs, back.Status.PodIPs)
	require.Equal(t, []corev1.Container{{Name: "ports", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80}, {Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolUDP}}}}, back.Spec.Containers)
	require.Nil(t, back.Spec.InitContainers)
	require.Nil(t, back.Status.Conditions)

	p2 := p.DeepCopy()
	p2.ResourceVersion, p2.Annotations = "2", map[string]string{"other": "x"}
	p2.Status.Conditions = nil
	require.False(t, podChanged(r, recordOf(p2)), "an annotation and a condition")
	p2.Labels = map[string]string{"app": "server", "tier": "db"}
	require.True(t, podChanged(r, recordOf(p2)), "a label")

	np := denyEgress("a", "out", "server", "client", 53)
	np.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{}"}
	s, err = slim(np)
	require.NoError(t, err)
	pr := s.(*policyRecord)
	require.Equal(t, policy.NamespaceFact{Egress: true}, pr.fact)
	decoded, err := pr.policy()
	require.NoError(t, err)
	require.Equal(t, np.Spec, decoded.Spec)
	require.Equal(t, "out", decoded.Name)
	np2 := np.DeepCopy()
	np2.ResourceVersion = "9"
	r2, err := policyRecordOf(np2)
	require.NoError(t, err)
	require.False(t, specChanged(pr, r2), "the same spec")
	np2.Spec.Egress[0].Ports = nil
	r2, err = policyRecordOf(np2)
	require.NoError(t, err)
	require.True(t, specChanged(pr, r2), "a port less")

	ns := testNS("a")
	ns.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "x"}}
	ns.Annotations = map[string]string{"x": "y"}
	s, err = slim(ns)
	require.NoError(t, err)
	require.Nil(t, s.(*corev1.Namespace).ManagedFields)
	require.Nil(t, s.(*corev1.Namespace).Annotations)
}

// TestClearPolicies: an agent without network policies removes what an
// earlier one wrote: new pods start open, isolated ones are opened.
func TestClearPolicies(t *testing.T) {
	require.NoError(t, ClearPolicies(nodetest.Handle(t, t.TempDir(), t.TempDir())), "no maps: nothing to do")
	n := serverClient(t)
	_, stop := n.run()
	stop()
	require.NotEmpty(t, n.states())
	require.NotEmpty(t, n.rules())
	require.NoError(t, ClearPolicies(nodetest.Handle(t, n.bpfRoot, t.TempDir())))
	require.Empty(t, n.states())
	require.Empty(t, n.rules())
	facts, err := n.pm.NamespaceFacts()
	require.NoError(t, err)
	require.Empty(t, facts)
	require.Equal(t, fmt.Sprintf("policy %#x", policy.ID("a", "web")), n.pm.NameOf(policy.ID("a", "web")))
	active, err := n.pm.Active()
	require.NoError(t, err)
	require.False(t, active)
}
