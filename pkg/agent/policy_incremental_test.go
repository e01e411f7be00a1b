package agent

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpfake "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned/fake"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy/compile"
)

// churn changes a policyNode's cluster at random: 8 namespaces
// (team=x|y|z), 16 pods (pod k in namespace n<k%8>, labels app=a|b|c, role=r0|r1,
// sometimes access=granted), NetworkPolicies of the shapes of make scale's
// (a pod selector, a namespace selector with a pod selector, an ipBlock,
// access=granted), ClusterNetworkPolicies, and the endpoints of this node.
type churn struct {
	n    *policyNode
	r    *rand.Rand
	cnps *cnpfake.Clientset // nil: NetworkPolicies only
	eps  map[uint32]compile.LocalEndpoint
}

// churnNS namespaces, churnPods pods: pod k in namespace n<k%churnNS>.
const (
	churnNS   = 8
	churnPods = 16
)

func (c *churn) pick(xs ...string) string { return xs[c.r.IntN(len(xs))] }

func (c *churn) podIP(k int) string { return fmt.Sprintf("10.0.%d.%d", k%churnNS, 10+k) }

func (c *churn) pod(k int) *corev1.Pod {
	lbl := map[string]string{"app": c.pick("a", "b", "c"), "role": c.pick("r0", "r1")}
	if c.r.IntN(3) == 0 {
		lbl["access"] = "granted"
	}
	p := testPod(fmt.Sprintf("n%d", k%churnNS), fmt.Sprintf("p%d", k), c.podIP(k), lbl)
	p.Spec.Containers = []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}
	if c.r.IntN(8) == 0 {
		p.Status.PodIPs = nil // not running yet
	}
	return p
}

func (c *churn) namespace(name string) *corev1.Namespace {
	ns := testNS(name)
	ns.Labels = map[string]string{"team": c.pick("x", "y", "z")}
	return ns
}

func (c *churn) policy(ns, name string) *networkingv1.NetworkPolicy {
	port := intstr.FromInt32(int32(1000 + c.r.IntN(4)))
	if c.r.IntN(5) == 0 {
		port = intstr.FromString("http")
	}
	ports := []networkingv1.NetworkPolicyPort{{Port: &port}}
	app := &metav1.LabelSelector{MatchLabels: map[string]string{"app": c.pick("a", "b", "c")}}
	role := &metav1.LabelSelector{MatchLabels: map[string]string{"role": c.pick("r0", "r1")}}
	p := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: networkingv1.NetworkPolicySpec{PodSelector: *app}}
	var peer networkingv1.NetworkPolicyPeer
	switch c.r.IntN(4) {
	case 0:
		peer.PodSelector = role
	case 1:
		peer.PodSelector, peer.NamespaceSelector = role, &metav1.LabelSelector{MatchLabels: map[string]string{"team": c.pick("x", "y", "z")}}
	case 2:
		peer.PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"access": "granted"}}
	default:
		p.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		p.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "192.0.2.0/24", Except: []string{"192.0.2.128/25"}}}}, Ports: ports}}
		return p
	}
	p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{peer}, Ports: ports}}
	return p
}

func (c *churn) clusterPolicy(name string) *cnpv1.ClusterNetworkPolicy {
	action := []cnpv1.ClusterNetworkPolicyRuleAction{cnpv1.ClusterNetworkPolicyRuleActionAccept, cnpv1.ClusterNetworkPolicyRuleActionDeny, cnpv1.ClusterNetworkPolicyRuleActionPass}[c.r.IntN(3)]
	team := metav1.LabelSelector{MatchLabels: map[string]string{"team": c.pick("x", "y")}}
	peer := cnpv1.ClusterNetworkPolicyIngressPeer{Pods: &cnpv1.NamespacedPod{NamespaceSelector: team,
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"access": "granted"}}}}
	if c.r.IntN(2) == 0 {
		peer = cnpv1.ClusterNetworkPolicyIngressPeer{Namespaces: &team}
	}
	return &cnpv1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: cnpv1.ClusterNetworkPolicySpec{
		Tier: []cnpv1.Tier{cnpv1.AdminTier, cnpv1.BaselineTier}[c.r.IntN(2)], Priority: int32(c.r.IntN(3)),
		Subject: cnpv1.ClusterNetworkPolicySubject{Pods: &cnpv1.NamespacedPod{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": c.pick("a", "b", "c")}}}},
		Ingress: []cnpv1.ClusterNetworkPolicyIngressRule{{Action: action, From: []cnpv1.ClusterNetworkPolicyIngressPeer{peer}}},
	}}
}

// endpoint makes pod k an endpoint of this node (ifindex 100+k).
func (c *churn) endpoint(k int) {
	ep := compile.LocalEndpoint{Ifindex: uint32(100 + k), Namespace: fmt.Sprintf("n%d", k%churnNS), Name: fmt.Sprintf("p%d", k)}
	ep.UID = ep.Namespace + "-" + ep.Name
	ep.IPs = []netip.Addr{netip.MustParseAddr(c.podIP(k))}
	c.n.addEndpoint(ep.Ifindex, ep.Namespace, ep.Name, c.podIP(k))
	c.eps[ep.Ifindex] = ep
}

// step makes one random change through the API (or the endpoint maps).
func (c *churn) step() string {
	ctx := context.Background()
	k := c.r.IntN(churnPods)
	ns := fmt.Sprintf("n%d", c.r.IntN(churnNS))
	switch n := c.r.IntN(100); {
	case n < 35:
		c.n.apply(c.pod(k))
		return "pod changed"
	case n < 42:
		err := c.n.client.CoreV1().Pods(fmt.Sprintf("n%d", k%churnNS)).Delete(ctx, fmt.Sprintf("p%d", k), metav1.DeleteOptions{})
		if err != nil {
			c.n.apply(c.pod(k)) // already gone: back
		}
		return "pod deleted or created"
	case n < 65:
		name := fmt.Sprintf("np%d", c.r.IntN(4))
		if c.r.IntN(4) == 0 {
			_ = c.n.client.NetworkingV1().NetworkPolicies(ns).Delete(ctx, name, metav1.DeleteOptions{})
			return "policy deleted"
		}
		c.n.apply(c.policy(ns, name))
		return "policy changed"
	case n < 75:
		c.n.apply(c.namespace(ns))
		return "namespace labelled"
	case n < 87:
		if _, ok := c.eps[uint32(100+k)]; ok || len(c.eps) > 4 {
			if !ok {
				return "nothing"
			}
			c.n.delEndpoint(uint32(100 + k))
			delete(c.eps, uint32(100+k))
			return "endpoint deleted"
		}
		c.endpoint(k)
		return "endpoint added"
	case c.cnps != nil:
		name := fmt.Sprintf("c%d", c.r.IntN(2))
		cl := c.cnps.PolicyV1beta1().ClusterNetworkPolicies()
		if c.r.IntN(4) == 0 {
			_ = cl.Delete(ctx, name, metav1.DeleteOptions{})
			return "cluster policy deleted"
		}
		p := c.clusterPolicy(name)
		if _, err := cl.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			_, err = cl.Create(ctx, p, metav1.CreateOptions{})
			require.NoError(c.n.t, err)
		}
		return "cluster policy changed"
	}
	c.n.apply(c.pod(k))
	return "pod changed"
}

// diff compares the maps with a compilation from scratch of what the API
// server holds (test/scale's check): every endpoint's states and rules,
// no rules of other ifindexes, the namespace facts.
func (c *churn) diff(t *assert.CollectT) {
	ctx := context.Background()
	var cl compile.Cluster
	pods, err := c.n.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	pols, err := c.n.client.NetworkingV1().NetworkPolicies("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	nss, err := c.n.client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	for i := range pods.Items {
		cl.Pods = append(cl.Pods, &pods.Items[i])
	}
	for i := range pols.Items {
		cl.Policies = append(cl.Policies, &pols.Items[i])
	}
	for i := range nss.Items {
		cl.Namespaces = append(cl.Namespaces, &nss.Items[i])
	}
	if c.cnps != nil {
		l, err := c.cnps.PolicyV1beta1().ClusterNetworkPolicies().List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		for i := range l.Items {
			cl.ClusterPolicies = append(cl.ClusterPolicies, &l.Items[i])
		}
	}
	var eps []compile.LocalEndpoint
	for _, k := range slices.Sorted(mapKeys(c.eps)) {
		eps = append(eps, c.eps[k])
	}
	res := compile.Compile(cl, eps)
	states, err := c.n.pm.EndpointStates()
	require.NoError(t, err)
	rules, err := c.n.pm.ReadRules()
	require.NoError(t, err)
	for _, ep := range eps {
		want, st := res.Endpoints[ep.Ifindex], states[ep.Ifindex]
		have := map[policy.Direction]policy.State{policy.Ingress: policy.State(st.Ingress), policy.Egress: policy.State(st.Egress)}
		for _, d := range []policy.Direction{policy.Ingress, policy.Egress} {
			w := want.Dir(d)
			if !assert.Equal(t, w.State, have[d], "%s/%s %s", ep.Namespace, ep.Name, d) {
				continue
			}
			var wantEntries []policy.Entry
			if w.State == policy.StateEnforce && len(w.Entries) > 0 {
				wantEntries = w.Entries
			}
			got := slices.Clone(rules[ep.Ifindex][d])
			compile.SortEntries(got)
			assert.Equal(t, wantEntries, got, "%s/%s %s", ep.Namespace, ep.Name, d)
		}
		delete(rules, ep.Ifindex)
	}
	for ifindex, byDir := range rules {
		for d, es := range byDir {
			assert.Empty(t, es, "rules of ifindex %d %s, no endpoint", ifindex, d)
		}
	}
	facts, err := c.n.pm.NamespaceFacts()
	require.NoError(t, err)
	for ns, f := range res.Namespaces {
		assert.Equal(t, f, facts[ns], "namespace %s", ns)
		delete(facts, ns)
	}
	for ns, f := range facts {
		assert.Zero(t, f, "namespace %s: a fact of no namespace", ns)
	}
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestPolicyControllerIncremental: after each change of a random
// sequence (pods labelled, moved into or out of peers, deleted; policies
// and ClusterNetworkPolicies changed, added, deleted; namespaces
// relabelled; endpoints added and deleted), the controller's maps come to
// equal a compilation from scratch of what the API server holds.
func TestPolicyControllerIncremental(t *testing.T) {
	for _, withCNP := range []bool{false, true} {
		name := "NetworkPolicy"
		if withCNP {
			name = "ClusterNetworkPolicy"
		}
		t.Run(name, func(t *testing.T) {
			c := &churn{n: newPolicyNode(t), r: rand.New(rand.NewPCG(55, 1)), eps: map[uint32]compile.LocalEndpoint{}}
			for i := range churnNS {
				c.n.apply(c.namespace(fmt.Sprintf("n%d", i)))
			}
			for k := range churnPods {
				c.n.apply(c.pod(k))
			}
			for i := range 8 {
				c.n.apply(c.policy(fmt.Sprintf("n%d", i%churnNS), fmt.Sprintf("np%d", i%4)))
			}
			// Two endpoints to start with: the scope (their namespaces,
			// those their policies' peers select) is some of the
			// namespaces, and changes.
			c.endpoint(0)
			c.endpoint(9)
			if withCNP {
				c.cnps = cnpfake.NewSimpleClientset(c.clusterPolicy("c0"))
				c.cnps.Resources = cnpServedList
				c.n.runCNP(c.cnps)
			} else {
				c.n.run()
			}
			c.n.eventually(c.diff)
			for i := range 120 {
				what := c.step()
				t.Logf("step %d: %s", i, what)
				c.n.eventually(c.diff)
			}
		})
	}
}
