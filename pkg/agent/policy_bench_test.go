package agent

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// scaleModel is make scale's cluster (test/scale/objects.go) as one of its
// agents sees it: namespaces ns-NNNN labelled team=t<n%50>, perNS pods in
// each (pod k: labels app=a<j%10>, role=r<j%5>, j = k%perNS, a named
// container port http/8080; on node k%nodes), polPerNS policies in each
// (np-PP: selects app=a<p%10>; p%3==0 admits role=r<p%5> of its
// namespace, p%3==1 role=r<p%5> of the namespaces team=t<(n+p)%50>,
// p%3==2 lets out to 192.0.2.0/24 except 192.0.2.128/25; np-00 admits
// access=granted on TCP 5000). This node is node 0: its endpoints are the
// pods 0, nodes, 2*nodes (all app=a0), which scope about 60 namespaces
// at the full size.
type scaleModel struct{ namespaces, perNS, polPerNS, nodes, local int }

func (m scaleModel) nsName(n int) string { return fmt.Sprintf("ns-%04d", n) }
func (m scaleModel) podName(k int) string {
	return fmt.Sprintf("pod-%05d", k)
}

func (m scaleModel) podIP(k int) netip.Addr {
	node, host := k%m.nodes, 10+k/m.nodes
	return netip.AddrFrom4([4]byte{10, byte(128 + node>>8), byte(node), byte(host)})
}

func (m scaleModel) pod(k int, extra map[string]string) *corev1.Pod {
	j := k % m.perNS
	lbl := map[string]string{"app": fmt.Sprintf("a%d", j%10), "role": fmt.Sprintf("r%d", j%5)}
	for key, v := range extra {
		lbl[key] = v
	}
	ns, name := m.nsName(k/m.perNS), m.podName(k)
	ip := m.podIP(k).String()
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbl, UID: types.UID(ns + "-" + name)},
		Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}}
}

// policy is np-p of namespace n; port, when non-zero, replaces its port.
func (m scaleModel) policy(n, p, port int) *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	portOf := func(def int) []networkingv1.NetworkPolicyPort {
		if port != 0 {
			def = port
		}
		v := intstr.FromInt32(int32(def))
		return []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &v}}
	}
	role := &metav1.LabelSelector{MatchLabels: map[string]string{"role": fmt.Sprintf("r%d", p%5)}}
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: m.nsName(n), Name: fmt.Sprintf("np-%02d", p)},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("a%d", p%10)}}}}
	ingress := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	switch {
	case p == 0:
		np.Spec.PolicyTypes = ingress
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"access": "granted"}}}}, Ports: portOf(5000)}}
	case p%3 == 0:
		np.Spec.PolicyTypes = ingress
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: role}}, Ports: portOf(1000 + p)}}
	case p%3 == 1:
		team := &metav1.LabelSelector{MatchLabels: map[string]string{"team": fmt.Sprintf("t%d", (n+p)%50)}}
		np.Spec.PolicyTypes = ingress
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: team, PodSelector: role}}, Ports: portOf(2000 + p)}}
	default:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "192.0.2.0/24", Except: []string{"192.0.2.128/25"}}}}, Ports: portOf(3000 + p)}}
	}
	return np
}

// objects is the whole cluster.
func (m scaleModel) objects() []runtime.Object {
	var objs []runtime.Object
	for n := range m.namespaces {
		objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: m.nsName(n), Labels: map[string]string{"team": fmt.Sprintf("t%d", n%50)}}})
		for j := range m.perNS {
			objs = append(objs, m.pod(n*m.perNS+j, nil))
		}
		for p := range m.polPerNS {
			objs = append(objs, m.policy(n, p, 0))
		}
	}
	return objs
}

// benchModel is the full size of make scale, or what
// EBPF_CNI_BENCH_NAMESPACES says (30 pods and 30 policies in each).
func benchModel(tb testing.TB) scaleModel {
	m := scaleModel{namespaces: 1000, perNS: 30, polPerNS: 30, nodes: 1000, local: 3}
	if v := os.Getenv("EBPF_CNI_BENCH_NAMESPACES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			tb.Fatalf("EBPF_CNI_BENCH_NAMESPACES=%q: want a number of namespaces", v)
		}
		m.namespaces, m.nodes = n, n
	}
	return m
}

// hasPort: endpoint ifindex's rule for peer (its longest prefix) allows
// TCP port.
func (n *policyNode) hasPort(ifindex uint32, d policy.Direction, peer netip.Prefix, port int) bool {
	k := policy.Key(ifindex, d, peer)
	var r policy.Rule
	if err := n.pm.RuleMap.Lookup(&k, &r); err != nil {
		return false
	}
	for _, p := range r.Ports[:r.N_ports] {
		if p.Proto == 6 && int(p.First) <= port && port <= int(p.Last) {
			return true
		}
	}
	return false
}

// waitPort polls the maps until hasPort says want (a bound for a broken
// controller: 30 s).
func (n *policyNode) waitPort(tb testing.TB, ifindex uint32, d policy.Direction, peer netip.Prefix, port int, want bool) {
	for end := time.Now().Add(30 * time.Second); n.hasPort(ifindex, d, peer, port) != want; {
		if time.Now().After(end) {
			tb.Fatalf("endpoint %d %s peer %s port %d: not %v after 30 s", ifindex, d, peer, port, want)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// BenchmarkPolicyScale is the agent's policy controller on node 0 of make
// scale's cluster (scaleModel: 30,000 pods and 30,000 policies in 1,000
// namespaces, a fake API server, real maps on a private bpffs; root), from
// an API write to the entry in policy_rules: apply (the port of a policy
// that selects an endpoint, as make scale's policy_apply) and peer_label
// (a pod labelled into np-00's peers and out again, as its peer_label).
// Reported: the p50 and p99 of the changes, and per change what the
// process allocated (the fake API server's share included: about 60 KB). Smaller:
// EBPF_CNI_BENCH_NAMESPACES=100.
func BenchmarkPolicyScale(b *testing.B) {
	testutil.RequireRoot(b)
	m := benchModel(b)
	// NewSimpleClientset: NewClientset's tracker of managed fields makes a
	// REST mapper at each write (2 MB): the fake's cost, not the agent's.
	n := policyNodeAt(b, testutil.BPFFS(b), fake.NewSimpleClientset(m.objects()...)) //nolint:staticcheck // see above
	for i := range m.local {
		k := i * m.nodes
		n.addEndpoint(uint32(100+i), m.nsName(k/m.perNS), m.podName(k), m.podIP(k).String())
	}
	t0 := time.Now()
	pc, _ := n.run()
	sc := pc.scope.Load()
	b.Logf("%d namespaces, %d pods, %d policies; %d namespaces in the scope; first sync %s", m.namespaces, m.namespaces*m.perNS, m.namespaces*m.polPerNS, len(sc.pods), time.Since(t0).Round(time.Millisecond))
	ctx := context.Background()
	b.Run("apply", func(b *testing.B) {
		var lats []time.Duration
		c := 0
		for b.Loop() {
			// Endpoint c%local, the pod k = i*nodes (app=a0): its
			// policies np-10, np-20 in turn (a namespace selector's
			// ingress, an ipBlock's egress).
			i := c % m.local
			k := i * m.nodes
			ns := k / m.perNS
			p := []int{10, 20}[(c/m.local)%2]
			port := 10000 + c%1000
			d, peer := policy.Egress, netip.MustParsePrefix("192.0.2.0/24")
			if p == 10 {
				d, peer = policy.Ingress, netip.PrefixFrom(m.podIP(((ns+p)%50)*m.perNS+p%5), 32)
			}
			t0 := time.Now()
			_, err := n.client.NetworkingV1().NetworkPolicies(m.nsName(ns)).Update(ctx, m.policy(ns, p, port), metav1.UpdateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			n.waitPort(b, uint32(100+i), d, peer, port, true)
			lats = append(lats, time.Since(t0))
			c++
		}
		reportLatencies(b, lats)
	})
	b.Run("peer_label", func(b *testing.B) {
		var lats []time.Duration
		c := 0
		for b.Loop() {
			// A pod of endpoint 0's namespace (not an endpoint) into
			// np-00's peers, then out.
			k := 1 + (c/2)%(m.perNS-1)
			in := c%2 == 0
			var extra map[string]string
			if in {
				extra = map[string]string{"access": "granted"}
			}
			t0 := time.Now()
			if _, err := n.client.CoreV1().Pods(m.nsName(0)).Update(ctx, m.pod(k, extra), metav1.UpdateOptions{}); err != nil {
				b.Fatal(err)
			}
			n.waitPort(b, 100, policy.Ingress, netip.PrefixFrom(m.podIP(k), 32), 5000, in)
			lats = append(lats, time.Since(t0))
			c++
		}
		reportLatencies(b, lats)
	})
}

// reportLatencies reports the p50 and p99 of lats, in ms.
func reportLatencies(b *testing.B, lats []time.Duration) {
	if len(lats) == 0 {
		return
	}
	slices.Sort(lats)
	at := func(q float64) float64 {
		return float64(lats[min(len(lats)-1, int(q*float64(len(lats))))].Microseconds()) / 1000
	}
	b.ReportMetric(at(0.5), "p50_ms")
	b.ReportMetric(at(0.99), "p99_ms")
	b.ReportAllocs()
}
