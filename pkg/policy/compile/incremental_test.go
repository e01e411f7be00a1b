package compile

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// world is a small cluster changed at random: 5 namespaces, 14 pods,
// up to 8 NetworkPolicies and (cnps) up to 3 ClusterNetworkPolicies, some
// pods local endpoints.
type world struct {
	r    *rand.Rand
	cnps bool
	nss  map[string]*corev1.Namespace
	pods map[string]*corev1.Pod // by namespace/name
	pols map[string]*networkingv1.NetworkPolicy
	cps  map[string]*cnpv1.ClusterNetworkPolicy
	eps  map[uint32]LocalEndpoint
	// changed: the pods changed since the last compilation.
	changed map[string]*corev1.Pod
}

const worldPods = 14

func (w *world) pick(xs ...string) string { return xs[w.r.IntN(len(xs))] }

func (w *world) nsName() string { return fmt.Sprintf("n%d", w.r.IntN(5)) }

func (w *world) randSel(keys ...string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for _, k := range keys {
		switch w.r.IntN(3) {
		case 0:
			s.MatchLabels[k] = w.pick(w.values(k)...)
		case 1:
			s.MatchExpressions = append(s.MatchExpressions, metav1.LabelSelectorRequirement{Key: k, Operator: metav1.LabelSelectorOpIn, Values: []string{w.pick(w.values(k)...), w.pick(w.values(k)...)}})
		}
	}
	return s
}

func (w *world) values(k string) []string {
	switch k {
	case "app":
		return []string{"a", "b", "c"}
	case "role":
		return []string{"r0", "r1"}
	case "access":
		return []string{"granted"}
	case "team":
		return []string{"x", "y"}
	}
	return []string{"n0", "n1", "n2", "n3", "n4"} // kubernetes.io/metadata.name
}

func (w *world) namespace(name string) *corev1.Namespace {
	return ns(name, map[string]string{"team": w.pick("x", "y")})
}

// pod k: in namespace n<k%5>, random labels, address (or none), phase,
// container ports.
func (w *world) pod(k int) *corev1.Pod {
	lbl := map[string]string{"app": w.pick("a", "b", "c"), "role": w.pick("r0", "r1")}
	if w.r.IntN(3) == 0 {
		lbl["access"] = "granted"
	}
	var ips []string
	if w.r.IntN(6) != 0 {
		ips = append(ips, fmt.Sprintf("10.0.%d.%d", k%5, 1+w.r.IntN(3)*20+k))
	}
	p := pod(fmt.Sprintf("n%d", k%5), fmt.Sprintf("p%d", k), lbl, ips,
		ports(corev1.ContainerPort{Name: "http", ContainerPort: int32(w.pick("8080", "9090")[0]-'0') * 1000}))
	switch w.r.IntN(12) {
	case 0:
		p.Status.Phase = corev1.PodSucceeded
	case 1:
		p.Spec.HostNetwork = true
	}
	return p
}

func (w *world) npPorts() []networkingv1.NetworkPolicyPort {
	switch w.r.IntN(4) {
	case 0:
		return nil
	case 1:
		return []networkingv1.NetworkPolicyPort{port("", "http")}
	case 2:
		return []networkingv1.NetworkPolicyPort{port("", 80+w.r.IntN(3)), port(corev1.ProtocolUDP, 53)}
	}
	return []networkingv1.NetworkPolicyPort{port("", 1000+w.r.IntN(5))}
}

func (w *world) npPeers() []networkingv1.NetworkPolicyPeer {
	var out []networkingv1.NetworkPolicyPeer
	for range w.r.IntN(3) {
		switch w.r.IntN(4) {
		case 0:
			out = append(out, podPeer(w.randSel("app", "access"), nil))
		case 1:
			out = append(out, podPeer(nil, w.randSel("team")))
		case 2:
			out = append(out, podPeer(w.randSel("role"), w.randSel("team", corev1.LabelMetadataName)))
		default:
			out = append(out, blockPeer("10.0.0.0/16", fmt.Sprintf("10.0.%d.0/24", w.r.IntN(5))))
		}
	}
	return out
}

func (w *world) policy(name string) *networkingv1.NetworkPolicy {
	types := [][]networkingv1.PolicyType{nil, ingressOnly, egressOnly, both}[w.r.IntN(4)]
	var ins []networkingv1.NetworkPolicyIngressRule
	var outs []networkingv1.NetworkPolicyEgressRule
	for range w.r.IntN(3) {
		ins = append(ins, in(w.npPeers(), w.npPorts()...))
	}
	for range w.r.IntN(3) {
		outs = append(outs, out(w.npPeers(), w.npPorts()...))
	}
	return np(w.nsName(), name, w.randSel("app"), types, ins, outs)
}

func (w *world) cnpPeers() []cnpPeer {
	var out []cnpPeer
	for range 1 + w.r.IntN(2) {
		switch w.r.IntN(3) {
		case 0:
			out = append(out, peerNS(w.randSel("team")))
		case 1:
			out = append(out, peerPods(w.randSel("team"), w.randSel("app", "access")))
		default:
			out = append(out, peerNets(fmt.Sprintf("10.0.%d.0/24", w.r.IntN(5))))
		}
	}
	return out
}

func (w *world) cnpProtos() []cnpv1.ClusterNetworkPolicyProtocol {
	switch w.r.IntN(3) {
	case 0:
		return nil
	case 1:
		return []cnpv1.ClusterNetworkPolicyProtocol{namedPortP("http")}
	}
	return []cnpv1.ClusterNetworkPolicyProtocol{tcp(int32(80 + w.r.IntN(3)))}
}

func (w *world) clusterPolicy(name string) *cnpv1.ClusterNetworkPolicy {
	subj := subjNS(w.randSel("team"))
	if w.r.IntN(2) == 0 {
		subj = subjPods(w.randSel("team"), w.randSel("app"))
	}
	action := []cnpv1.ClusterNetworkPolicyRuleAction{accept, deny, pass}
	var in []cnpv1.ClusterNetworkPolicyIngressRule
	var out []cnpv1.ClusterNetworkPolicyEgressRule
	for range w.r.IntN(3) {
		in = append(in, cin(action[w.r.IntN(3)], w.cnpPeers(), w.cnpProtos()...))
	}
	for range w.r.IntN(2) {
		out = append(out, cout(action[w.r.IntN(3)], w.cnpPeers(), w.cnpProtos()...))
	}
	if w.r.IntN(2) == 0 {
		return admin(name, int32(w.r.IntN(5)), subj, in, out)
	}
	return baseline(name, int32(w.r.IntN(5)), subj, in, out)
}

// endpoint makes pod k a local endpoint (its address its own, or one the
// API server does not know yet; its uid the pod's, or another one's).
func (w *world) endpoint(k int) {
	ep := LocalEndpoint{Ifindex: uint32(100 + k), Namespace: fmt.Sprintf("n%d", k%5), Name: fmt.Sprintf("p%d", k)}
	ep.UID = ep.Namespace + "-" + ep.Name
	if w.r.IntN(8) == 0 {
		ep.UID = "another"
	}
	ep.IPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 0, byte(k % 5), byte(1 + w.r.IntN(3)*20 + k)})}
	w.eps[ep.Ifindex] = ep
}

func newWorld(seed uint64, cnps bool) *world {
	w := &world{r: rand.New(rand.NewPCG(seed, 55)), cnps: cnps, nss: map[string]*corev1.Namespace{}, pods: map[string]*corev1.Pod{},
		pols: map[string]*networkingv1.NetworkPolicy{}, cps: map[string]*cnpv1.ClusterNetworkPolicy{}, eps: map[uint32]LocalEndpoint{}, changed: map[string]*corev1.Pod{}}
	for i := range 5 {
		name := fmt.Sprintf("n%d", i)
		w.nss[name] = w.namespace(name)
	}
	for k := range worldPods {
		w.setPod(k, w.pod(k))
	}
	for i := range 4 {
		w.pols[fmt.Sprintf("np%d", i)] = w.policy(fmt.Sprintf("np%d", i))
	}
	if cnps {
		w.cps["c0"] = w.clusterPolicy("c0")
	}
	for k := range 4 {
		w.endpoint(k * 3)
	}
	return w
}

func (w *world) setPod(k int, p *corev1.Pod) {
	key := fmt.Sprintf("n%d/p%d", k%5, k)
	if p == nil {
		delete(w.pods, key)
	} else {
		w.pods[key] = p
	}
	w.changed[key] = p
}

// step makes one random change; what says which.
func (w *world) step() (what string) {
	k := w.r.IntN(worldPods)
	switch n := w.r.IntN(100); {
	case n < 25: // a pod's labels, address, phase or ports
		w.setPod(k, w.pod(k))
		return "pod changed"
	case n < 35: // a pod's labels only (into or out of peers)
		key := fmt.Sprintf("n%d/p%d", k%5, k)
		if p := w.pods[key]; p != nil {
			q := p.DeepCopy()
			if q.Labels["access"] == "" {
				q.Labels["access"] = "granted"
			} else {
				delete(q.Labels, "access")
			}
			w.setPod(k, q)
		}
		return "pod labelled"
	case n < 40:
		w.setPod(k, nil)
		return "pod deleted"
	case n < 60:
		name := fmt.Sprintf("np%d", w.r.IntN(8))
		if w.r.IntN(4) == 0 {
			delete(w.pols, name)
			return "policy deleted"
		}
		w.pols[name] = w.policy(name)
		return "policy changed"
	case n < 68:
		name := w.nsName()
		if w.r.IntN(5) == 0 {
			delete(w.nss, name) // its pods stay (a fake API server's)
			return "namespace deleted"
		}
		w.nss[name] = w.namespace(name)
		return "namespace labelled"
	case n < 80:
		if w.r.IntN(3) == 0 {
			delete(w.eps, uint32(100+k))
			return "endpoint deleted"
		}
		w.endpoint(k)
		return "endpoint changed"
	case n < 90 && w.cnps:
		name := fmt.Sprintf("c%d", w.r.IntN(3))
		if w.r.IntN(4) == 0 {
			delete(w.cps, name)
			return "cluster policy deleted"
		}
		w.cps[name] = w.clusterPolicy(name)
		return "cluster policy changed"
	}
	// A pod's copy with nothing changed but its object (a status
	// condition): nothing to compile.
	key := fmt.Sprintf("n%d/p%d", k%5, k)
	if p := w.pods[key]; p != nil {
		w.setPod(k, p.DeepCopy())
	}
	return "pod copied"
}

func (w *world) cluster() (Cluster, []LocalEndpoint) {
	var cl Cluster
	for _, k := range slices.Sorted(mapKeys(w.nss)) {
		cl.Namespaces = append(cl.Namespaces, w.nss[k])
	}
	for _, k := range slices.Sorted(mapKeys(w.pods)) {
		cl.Pods = append(cl.Pods, w.pods[k])
	}
	for _, k := range slices.Sorted(mapKeys(w.pols)) {
		cl.Policies = append(cl.Policies, w.pols[k])
	}
	for _, k := range slices.Sorted(mapKeys(w.cps)) {
		cl.ClusterPolicies = append(cl.ClusterPolicies, w.cps[k])
	}
	var eps []LocalEndpoint
	for _, k := range slices.Sorted(mapKeys(w.eps)) {
		eps = append(eps, w.eps[k])
	}
	return cl, eps
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

// requireSameResult: a and b are the same compilation (errors by their
// text).
func requireSameResult(t *testing.T, want, got *Result, msg string) {
	t.Helper()
	require.Equal(t, want.Endpoints, got.Endpoints, msg)
	require.Equal(t, want.Namespaces, got.Namespaces, msg)
	require.Equal(t, want.Names, got.Names, msg)
	errs := func(r *Result) map[uint32]string {
		m := map[uint32]string{}
		for k, e := range r.Errors {
			m[k] = e.Error()
		}
		return m
	}
	require.Equal(t, errs(want), errs(got), msg)
}

// TestCompileIncremental: after every change of a random sequence (pods
// labelled, moved, finished or deleted; policies, namespaces, endpoints
// and ClusterNetworkPolicies changed, added or deleted), a compiler told
// only the pods that changed (Update), and one that finds them (Compile),
// give what a compilation from scratch gives; and an endpoint nothing
// touched keeps its result (the same object).
func TestCompileIncremental(t *testing.T) {
	for _, cnps := range []bool{false, true} {
		name := "NetworkPolicy"
		if cnps {
			name = "ClusterNetworkPolicy"
		}
		t.Run(name, func(t *testing.T) {
			for seed := range uint64(20) {
				w := newWorld(seed, cnps)
				var byUpdate, byCompile Compiler
				for i := range 150 {
					what := "start"
					if i > 0 {
						what = w.step()
					}
					cl, eps := w.cluster()
					want := Compile(cl, eps)
					pods := w.changed
					w.changed = map[string]*corev1.Pod{}
					msg := fmt.Sprintf("seed %d step %d (%s)", seed, i, what)
					requireSameResult(t, want, byUpdate.Update(Cluster{Namespaces: cl.Namespaces, Policies: cl.Policies, ClusterPolicies: cl.ClusterPolicies}, pods, eps), msg)
					requireSameResult(t, want, byCompile.Compile(cl, eps), msg)
				}
			}
		})
	}
}

// TestCompileIncrementalKeeps: a policy's change compiles again the
// endpoints it selects, before or after, and no other; a pod labelled
// into a policy's peers, the endpoints that policy selects.
func TestCompileIncrementalKeeps(t *testing.T) {
	nss, pods := cluster()
	client := pods[slices.IndexFunc(pods, func(p *corev1.Pod) bool { return p.Namespace == "a" && p.Name == "client" })]
	server2 := pod("b", "server2", map[string]string{"app": "server"}, []string{"10.0.2.9"})
	pods = append(pods, server2)
	ep2 := LocalEndpoint{Ifindex: 11, Namespace: "b", Name: "server2", UID: "b-server2"}
	webA := np("a", "web", sel("app", "server"), ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(sel("app", "client"), nil)), port("", 80))}, nil)
	webB := np("b", "web", sel("app", "server"), ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(sel("access", "granted"), nil)), port("", 80))}, nil)
	cl := Cluster{Namespaces: nss, Policies: []*networkingv1.NetworkPolicy{webA, webB}}
	eps := []LocalEndpoint{server, ep2}
	all := map[string]*corev1.Pod{}
	for _, p := range pods {
		all[p.Namespace+"/"+p.Name] = p
	}
	var c Compiler
	r1 := c.Update(cl, all, eps)

	webA2 := webA.DeepCopy()
	webA2.Spec.Ingress[0].Ports[0] = port("", 81)
	cl.Policies = []*networkingv1.NetworkPolicy{webA2, webB}
	r2 := c.Update(cl, nil, eps)
	require.NotSame(t, r1.Endpoints[10], r2.Endpoints[10], "the policy selects it")
	require.Same(t, r1.Endpoints[11], r2.Endpoints[11], "another namespace's")

	// a/client is no peer of b's policy (another namespace): labelled,
	// nothing is compiled again; b's own pod labelled, b's endpoint only.
	c2 := client.DeepCopy()
	c2.Labels["access"] = "granted"
	r3 := c.Update(cl, map[string]*corev1.Pod{"a/client": c2}, eps)
	require.NotSame(t, r2.Endpoints[10], r3.Endpoints[10], "a peer of a's policy")
	require.Same(t, r2.Endpoints[11], r3.Endpoints[11])
	peer := pod("b", "peer", map[string]string{"access": "granted"}, []string{"10.0.2.7"})
	r4 := c.Update(cl, map[string]*corev1.Pod{"b/peer": peer}, eps)
	require.Same(t, r3.Endpoints[10], r4.Endpoints[10])
	require.NotSame(t, r3.Endpoints[11], r4.Endpoints[11])
	require.Equal(t, []string{"enforced", "10.0.2.7/32 tcp:80 [web]"}, describe(r4, &r4.Endpoints[11].Ingress))

	// A ClusterNetworkPolicy whose subject is namespace b: b's endpoint
	// is compiled again when it comes, changes or goes; a's is not.
	denyB := admin("deny-b", 1, subjNS(sel("kubernetes.io/metadata.name", "b")), ins(cin(deny, cpeers(peerNS(sel())), tcp(22))), nil)
	cl.ClusterPolicies = []*cnpv1.ClusterNetworkPolicy{denyB}
	r5 := c.Update(cl, nil, eps)
	require.Same(t, r4.Endpoints[10], r5.Endpoints[10], "not a subject")
	require.NotSame(t, r4.Endpoints[11], r5.Endpoints[11], "a subject")
	denyB2 := denyB.DeepCopy()
	denyB2.Spec.Ingress[0].Action = accept
	cl.ClusterPolicies = []*cnpv1.ClusterNetworkPolicy{denyB2}
	r6 := c.Update(cl, nil, eps)
	require.Same(t, r5.Endpoints[10], r6.Endpoints[10])
	require.NotSame(t, r5.Endpoints[11], r6.Endpoints[11])
	cl.ClusterPolicies = nil
	r7 := c.Update(cl, nil, eps)
	require.Same(t, r6.Endpoints[10], r7.Endpoints[10])
	now := append(slices.Clone(pods), peer)
	now[slices.Index(now, client)] = c2
	require.Equal(t, Compile(Cluster{Namespaces: nss, Policies: cl.Policies, Pods: now}, eps).Endpoints[11], r7.Endpoints[11], "as from scratch")
}

// TestCompileIncrementalImplicitNamespace: a namespace known only by its
// pods (no object) is known while it has a running pod, as from scratch.
func TestCompileIncrementalImplicitNamespace(t *testing.T) {
	deny := admin("deny", 1, subjNS(sel()), ins(cin(deny, cpeers(peerNS(sel())))), nil)
	cl := Cluster{ClusterPolicies: []*cnpv1.ClusterNetworkPolicy{deny}}
	z := pod("z", "p", nil, []string{"10.0.9.1"})
	var c Compiler
	r := c.Update(cl, map[string]*corev1.Pod{"z/p": z}, nil)
	require.Contains(t, r.Namespaces, "z")
	done := z.DeepCopy()
	done.Status.Phase = corev1.PodSucceeded
	r = c.Update(cl, map[string]*corev1.Pod{"z/p": done}, nil)
	require.NotContains(t, r.Namespaces, "z")
	require.Equal(t, Compile(Cluster{ClusterPolicies: cl.ClusterPolicies, Pods: []*corev1.Pod{done}}, nil).Namespaces, r.Namespaces)
}
