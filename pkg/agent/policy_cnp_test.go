package agent

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpfake "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned/fake"

	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// cnpServedList is what discovery answers for ClusterNetworkPolicies once
// their CRD is installed.
var cnpServedList = []*metav1.APIResourceList{{GroupVersion: cnpv1.GroupVersion.String(),
	APIResources: []metav1.APIResource{{Name: "clusternetworkpolicies", Kind: "ClusterNetworkPolicy"}}}}

// runCNP starts a controller that watches ClusterNetworkPolicies through
// client (asking every 20 ms whether they are served).
func (n *policyNode) runCNP(client *cnpfake.Clientset) (pc *PolicyController, stop func()) {
	n.t.Helper()
	pc = NewPolicyController(n.client, PolicyConfig{Node: nodetest.Handle(n.t, n.bpfRoot, n.t.TempDir()), Poll: 20 * time.Millisecond,
		ClusterPolicies: client, ClusterPoliciesCheck: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
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

// denyClientCNP: an Admin ClusterNetworkPolicy of the given priority
// that denies (or accepts) ingress from the pods labelled app=client to
// namespace a.
func denyClientCNP(name string, prio int32, a cnpv1.ClusterNetworkPolicyRuleAction) *cnpv1.ClusterNetworkPolicy {
	return &cnpv1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: cnpv1.ClusterNetworkPolicySpec{
		Tier: cnpv1.AdminTier, Priority: prio,
		Subject: cnpv1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "a"}}},
		Ingress: []cnpv1.ClusterNetworkPolicyIngressRule{{Action: a, From: []cnpv1.ClusterNetworkPolicyIngressPeer{{
			Pods: &cnpv1.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}}}}},
	}}
}

// TestPolicyControllerClusterNetworkPolicyCRDAbsent: without the CRD the
// controller enforces NetworkPolicies as before and says it does not
// watch ClusterNetworkPolicies; once the CRD is served it restarts, with
// no generation bumped, and compiles them; when it goes, it stops
// compiling them.
func TestPolicyControllerClusterNetworkPolicyCRDAbsent(t *testing.T) {
	n := serverClient(t)
	cnps := cnpfake.NewSimpleClientset()
	_, err := cnps.PolicyV1beta1().ClusterNetworkPolicies().Create(context.Background(), denyClientCNP("deny-client", 10, cnpv1.ClusterNetworkPolicyRuleActionDeny), metav1.CreateOptions{})
	require.NoError(t, err)
	pc, _ := n.runCNP(cnps)
	require.False(t, pc.Status().ClusterNetworkPolicies)
	require.True(t, pc.Status().Running)
	states := n.states()
	require.Equal(t, map[uint32]policy.EndpointState{ifServer: {Ingress: uint8(policy.StateEnforce), IngressGen: 1}}, states, "NetworkPolicies only")

	cnps.Resources = cnpServedList
	n.eventually(func(c *assert.CollectT) {
		assert.True(c, pc.Status().ClusterNetworkPolicies)
		st := n.states()
		assert.Equal(c, uint8(policy.StateEnforce), st[ifClient].Ingress, "the client is a subject now")
		rs := n.rules()[ifServer][policy.Ingress]
		if assert.Len(c, rs, 3) { // 0/0, ::/0, the client
			assert.Equal(c, "10.0.1.2/32", rs[1].Prefix.String())
			assert.Equal(c, uint8(0), rs[1].Rule.Flags&uint8(maps.CniPolicyRuleFlagsPOLICY_F_ALL_PORTS))
			assert.Equal(c, uint8(0), rs[1].Rule.N_ports, "the client denied every port: nothing listed, nothing else allowed")
		}
	})
	s, ok := n.pm.SourceOf(policy.ID("", "deny-client"))
	require.True(t, ok)
	require.Equal(t, policy.Source{Tier: policy.TierAdmin, Priority: 10, Name: "deny-client"}, s)

	cnps.Resources = nil
	n.eventually(func(c *assert.CollectT) {
		assert.False(c, pc.Status().ClusterNetworkPolicies)
		assert.Equal(c, map[uint32]policy.EndpointState{ifServer: {Ingress: uint8(policy.StateEnforce), IngressGen: 3}}, n.states())
		_, ok := n.pm.SourceOf(policy.ID("", "deny-client"))
		assert.False(c, ok)
	})
	require.Zero(t, pc.Status().Retries, "a CRD that comes and goes is no failure")
}

// TestPolicyControllerClusterNetworkPolicyChanges: a new, a changed
// (priority) and a deleted ClusterNetworkPolicy each reach the maps with
// a new generation of the directions they change, and only those; a
// restart with the same policies writes nothing.
func TestPolicyControllerClusterNetworkPolicyChanges(t *testing.T) {
	n := serverClient(t)
	cnps := cnpfake.NewSimpleClientset()
	cnps.Resources = cnpServedList
	_, stop := n.runCNP(cnps)
	ctx := context.Background()
	api := cnps.PolicyV1beta1().ClusterNetworkPolicies()

	deny := denyClientCNP("deny-client", 20, cnpv1.ClusterNetworkPolicyRuleActionDeny)
	_, err := api.Create(ctx, deny, metav1.CreateOptions{})
	require.NoError(t, err)
	n.eventually(func(c *assert.CollectT) {
		st := n.states()[ifServer]
		assert.Equal(c, uint32(2), st.IngressGen)
		assert.Zero(c, st.EgressGen, "egress untouched")
	})
	// An Accept of a lower number: it decides first.
	_, err = api.Create(ctx, denyClientCNP("accept-client", 10, cnpv1.ClusterNetworkPolicyRuleActionAccept), metav1.CreateOptions{})
	require.NoError(t, err)
	clientRule := func() policy.Rule {
		for _, e := range n.rules()[ifServer][policy.Ingress] {
			if e.Prefix.String() == "10.0.1.2/32" {
				return e.Rule
			}
		}
		return policy.Rule{}
	}
	n.eventually(func(c *assert.CollectT) {
		assert.NotZero(c, clientRule().Flags&uint8(maps.CniPolicyRuleFlagsPOLICY_F_ALL_PORTS), "accepted")
		assert.Equal(c, uint32(3), n.states()[ifServer].IngressGen)
	})
	// The Deny's priority moved before the Accept.
	deny.Spec.Priority = 5
	_, err = api.Update(ctx, deny, metav1.UpdateOptions{})
	require.NoError(t, err)
	n.eventually(func(c *assert.CollectT) {
		r := clientRule()
		assert.Zero(c, r.Flags&uint8(maps.CniPolicyRuleFlagsPOLICY_F_ALL_PORTS), "denied again")
		s, _ := n.pm.SourceOf(policy.ID("", "deny-client"))
		assert.Equal(c, uint16(5), s.Priority, "the source's priority rewritten")
		assert.Equal(c, uint32(4), n.states()[ifServer].IngressGen)
	})
	states, rules := n.states(), n.rules()
	stop()
	_, stop = n.runCNP(cnps)
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, states, n.states(), "a restart bumped a generation")
	require.Equal(t, rules, n.rules())

	require.NoError(t, api.Delete(ctx, "deny-client", metav1.DeleteOptions{}))
	require.NoError(t, api.Delete(ctx, "accept-client", metav1.DeleteOptions{}))
	n.eventually(func(c *assert.CollectT) {
		assert.Equal(c, map[uint32]policy.EndpointState{ifServer: {Ingress: uint8(policy.StateEnforce), IngressGen: 5}}, n.states())
	})
	stop()
}
