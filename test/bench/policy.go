package main

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// The policy path: pod-to-pod RR and CRR of EBPF between two pods that
// 1,000 NetworkPolicies select (`_1000`), between two pods that 1,000
// ClusterNetworkPolicies select (`_cnp1000`), beside two pods of a
// namespace without any (`_none`), in an order that rotates from run to
// run; the programs' run time per packet for all three; the node agent's
// time from a policy change to the maps being written; and, for each kind,
// the time from an API write to the first connection that sees it
// (policy_latency.go). The API holds 1,000 pods and both sets of policies.
const policyPath = "policy"

// policyCount and policyPods are the cluster the agent compiles.
const (
	policyCount = 1000
	policyPods  = 1000
)

var policyStates = []string{"none", "1000", "cnp1000"}

var policyMetrics = []metricDecl{
	{"rr_tps", "tx/s", "higher"}, {"rr_p50_us", "µs", "lower"}, {"crr_cps", "conn/s", "higher"}, {"crr_p99_us", "µs", "lower"},
}

// The bench's pods: a client and a server in each of three namespaces.
// bench-policy's pair is what the NetworkPolicies select, bench-cnp's what
// the ClusterNetworkPolicies select.
var policyPodNS = map[string]string{
	"open-client": "bench-open", "open-server": "bench-open",
	"pol-client": "bench-policy", "pol-server": "bench-policy",
	"cnp-client": "bench-cnp", "cnp-server": "bench-cnp",
}

// policyObjects is the fake API's content: the namespaces, the bench's
// six pods (pair: yes for the two policied pairs), policyPods-6 peers that
// exist only in the API, policyCount NetworkPolicies of bench-policy, each
// selecting its pair and admitting one peer on a port of its own, both
// ways (policy 0 also admits the pair to each other on echoPort), and the
// probe's NetworkPolicy (policy_latency.go), closed to begin with.
func policyObjects(pods map[string]*pod) []any {
	var objs []any
	for _, ns := range []string{"bench-open", "bench-policy", "bench-cnp", "bench-peers"} {
		objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"kubernetes.io/metadata.name": ns}}})
	}
	for name, p := range pods {
		ns, labels := policyPodNS[name], map[string]string{"app": name}
		if ns != "bench-open" {
			labels["pair"] = "yes"
		}
		objs = append(objs, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, UID: types.UID("uid-" + name)},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: p.ip.String(), PodIPs: []corev1.PodIP{{IP: p.ip.String()}}}})
	}
	for i := range policyPeers {
		ip := netip.AddrFrom4([4]byte{10, 99, byte(i >> 8), byte(i)}).String()
		objs = append(objs, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "bench-peers", Name: fmt.Sprintf("peer-%d", i),
			Labels: map[string]string{"peer": fmt.Sprint(i)}, UID: types.UID(fmt.Sprintf("uid-peer-%d", i))},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}})
	}
	for i := range policyCount {
		objs = append(objs, benchPolicy(i, 1000+i))
	}
	return append(objs, probeNP(false))
}

// policyPeers is how many pods of the API are peers only: with the bench's
// six, policyPods.
const policyPeers = policyPods - 6

// benchPolicy is policy i, admitting its peer on port.
func benchPolicy(i, port int) *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	pair := &metav1.LabelSelector{MatchLabels: map[string]string{"pair": "yes"}}
	peer := networkingv1.NetworkPolicyPeer{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "bench-peers"}},
		PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"peer": fmt.Sprint(i % policyPeers)}},
	}
	p := intstr.FromInt32(int32(port))
	ports := []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p}}
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "bench-policy", Name: fmt.Sprintf("p-%d", i)},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *pair, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{peer}, Ports: ports}},
			Egress:  []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{peer}, Ports: ports}}}}
	if i == 0 {
		e := intstr.FromInt32(echoPort)
		own := []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &e}}
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{PodSelector: pair}}, Ports: own})
		np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: []networkingv1.NetworkPolicyPeer{{PodSelector: pair}}, Ports: own})
	}
	return np
}

func (b *bench) policy() error {
	b.declareStates(policyPath, policyStates, policyMetrics, "not applicable: REF (bridge + iptables) enforces no NetworkPolicy", "not applicable: no NetworkPolicy")
	for _, m := range []string{"agent_sync_p50_ms", "agent_sync_p99_ms"} {
		b.res.declare(policyPath, m, "ms", "lower")
		b.res.skip(policyPath, m, "ms", "lower", REF, "not applicable: REF enforces no NetworkPolicy")
		b.res.skip(policyPath, m, "ms", "lower", RAW, "not applicable: no NetworkPolicy")
	}
	s := b.setups[EBPF]
	b.logf("policy: %d NetworkPolicies, %d ClusterNetworkPolicies and %d pods in the API; %d runs of %s (RR and CRR, then again with BPF run-time statistics), without and with each kind", policyCount, policyCount, policyPods, b.cfg.runs, b.cfg.dur)
	pods, err := b.policyPods(s)
	if err != nil {
		return err
	}
	client, err := fakeAPI(policyObjects(pods))
	if err != nil {
		return err
	}
	cnps, err := fakeCNPAPI()
	if err != nil {
		return err
	}
	nd, err := node.Open(node.Options{BPFRoot: s.bpfRoot, StateDir: s.stateDir, Lock: node.Unlocked})
	if err != nil {
		return err
	}
	defer nd.Close()
	ctl := agent.NewPolicyController(client, agent.PolicyConfig{Node: nd, ClusterPolicies: cnps})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ctl.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	pm, err := policy.Open(nd)
	if err != nil {
		return err
	}
	if err := waitEnforced(pm, ctl, 4, 60*time.Second); err != nil {
		return err
	}

	targets := map[string][2]*pod{"none": {pods["open-client"], pods["open-server"]}, "1000": {pods["pol-client"], pods["pol-server"]},
		"cnp1000": {pods["cnp-client"], pods["cnp-server"]}}
	syncs := len(ctl.Latencies())
	for run := range b.cfg.runs {
		for _, st := range inRunOrder(policyStates, run) {
			c, sv := targets[st][0], targets[st][1]
			if err := b.stateLoad(policyPath, st, run, c.ns, addr(sv.ip, echoPort)); err != nil {
				return err
			}
		}
		b.logf("  policy run %d/%d done (the agent wrote %d changes meanwhile)", run+1, b.cfg.runs, len(ctl.Latencies())-syncs)
	}
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return fmt.Errorf("enabling BPF run-time statistics: %w", err)
	}
	for run := range b.cfg.runs {
		for _, st := range inRunOrder(policyStates, run) {
			c, sv := targets[st][0], targets[st][1]
			if err := b.stateBPFStats(policyPath, policyStates, st, run, s.bpfRoot, c.ns, addr(sv.ip, echoPort)); err != nil {
				stats.Close()
				return err
			}
		}
	}
	stats.Close()
	if err := b.agentLatency(client, ctl); err != nil {
		return err
	}
	return b.policyLatency(latencyProbes(pods, client, cnps), 20*b.cfg.runs)
}

// policyPods attaches the bench's six pods (policyPodNS) and starts the
// servers.
func (b *bench) policyPods(s *setup) (map[string]*pod, error) {
	pods := map[string]*pod{}
	for _, name := range []string{"open-client", "open-server", "pol-client", "pol-server", "cnp-client", "cnp-server"} {
		p, _, err := b.addPodArgs(s, nil, [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", policyPodNS[name]}, {"K8S_POD_NAME", name}, {"K8S_POD_UID", "uid-" + name}})
		if err != nil {
			return nil, err
		}
		pods[name] = p
	}
	for _, name := range []string{"open-server", "pol-server", "cnp-server"} {
		if err := b.startServer(pods[name].ns, addr(pods[name].ip, echoPort)); err != nil {
			return nil, err
		}
	}
	return pods, nil
}

// fakeAPI is a fake API server holding objs (namespaces, pods and
// NetworkPolicies).
func fakeAPI(objs []any) (*fake.Clientset, error) {
	client := fake.NewClientset()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.Namespace:
			_, err = client.CoreV1().Namespaces().Create(context.Background(), o, metav1.CreateOptions{})
		case *corev1.Pod:
			_, err = client.CoreV1().Pods(o.Namespace).Create(context.Background(), o, metav1.CreateOptions{})
		case *networkingv1.NetworkPolicy:
			_, err = client.NetworkingV1().NetworkPolicies(o.Namespace).Create(context.Background(), o, metav1.CreateOptions{})
		}
		if err != nil {
			return nil, fmt.Errorf("the fake API: %w", err)
		}
	}
	return client, nil
}

// agentLatency measures the agent's latency: one policy changed at a time
// (its port), each change waited for before the next.
func (b *bench) agentLatency(client *fake.Clientset, ctl *agent.PolicyController) error {
	changes := 20 * b.cfg.runs
	seen := len(ctl.Latencies())
	for k := range changes {
		np := benchPolicy(k%policyCount, 3000+k)
		if _, err := client.NetworkingV1().NetworkPolicies("bench-policy").Update(context.Background(), np, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("updating policy %s: %w", np.Name, err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for len(ctl.Latencies()) <= seen {
			if time.Now().After(deadline) {
				return fmt.Errorf("the agent did not write policy change %d within 10 s", k)
			}
			time.Sleep(time.Millisecond)
		}
		seen = len(ctl.Latencies())
	}
	var ms []float64
	for _, d := range ctl.Latencies() {
		ms = append(ms, float64(d.Microseconds())/1000)
	}
	ms = ms[len(ms)-changes:]
	b.res.add(policyPath, "agent_sync_p50_ms", "ms", "lower", EBPF, percentile(ms, 0.5))
	b.res.add(policyPath, "agent_sync_p99_ms", "ms", "lower", EBPF, percentile(ms, 0.99))
	b.logf("  policy: agent sync p50 %.1f ms, p99 %.1f ms over %d changes", percentile(ms, 0.5), percentile(ms, 0.99), changes)
	return nil
}

// waitEnforced waits until the controller has synced and written the
// states of the want policied pods.
func waitEnforced(pm *policy.Maps, ctl *agent.PolicyController, want int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if ctl.Synced() {
			st, err := pm.EndpointStates()
			if err != nil {
				return err
			}
			n := 0
			for _, v := range st {
				if policy.State(v.Ingress) == policy.StateEnforce && policy.State(v.Egress) == policy.StateEnforce {
					n++
				}
			}
			if n == want {
				return nil
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("the policy controller did not enforce the %d policied pods' policies within %s", want, limit)
}
