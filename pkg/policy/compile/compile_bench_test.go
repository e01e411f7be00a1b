package compile

import (
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// benchCluster is the bench's shape: pods pods in 10 namespaces (labels
// app=server|client, shard=i%50), policies policies in the namespace of
// the servers, each selecting the servers, letting in the clients of one
// shard (and of every namespace with team=x) on its own port and letting
// them reach DNS; local of the pods are this node's endpoints.
func benchCluster(pods, policies, local int) (Cluster, []LocalEndpoint) {
	var cl Cluster
	for i := range 10 {
		lbl := map[string]string{}
		if i%2 == 0 {
			lbl["team"] = "x"
		}
		cl.Namespaces = append(cl.Namespaces, ns(fmt.Sprintf("ns%d", i), lbl))
	}
	var eps []LocalEndpoint
	for i := range pods {
		app := "client"
		if i%2 == 0 {
			app = "server"
		}
		ip := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		p := pod(fmt.Sprintf("ns%d", i%10), fmt.Sprintf("pod%d", i), map[string]string{"app": app, "shard": fmt.Sprint(i % 50)}, []string{ip.String()},
			ports(corev1.ContainerPort{Name: "http", ContainerPort: 8080}))
		cl.Pods = append(cl.Pods, p)
		if i < local {
			eps = append(eps, LocalEndpoint{Ifindex: uint32(100 + i), Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), IPs: []netip.Addr{ip}})
		}
	}
	for i := range policies {
		cl.Policies = append(cl.Policies, np(fmt.Sprintf("ns%d", i%10), fmt.Sprintf("pol%d", i), sel("app", "server"), both,
			[]networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(sel("shard", fmt.Sprint(i%50)), sel("team", "x"))), port("", 1000+i%16), port("", "http"))},
			[]networkingv1.NetworkPolicyEgressRule{out(peers(blockPeer("10.96.0.10/32")), port(corev1.ProtocolUDP, 53))}))
	}
	return cl, eps
}

// BenchmarkCompile: a recompile of 1,000 pods and 1,000 policies for a
// node of 2 or 110 pods, as the agent does on a change: warm (a policy
// changed: the parsed policies and matched peers of the last compile
// kept), or cold (nothing kept: a pod changed, or the agent's first).
func BenchmarkCompile(b *testing.B) {
	for _, local := range []int{2, 110} {
		for _, warm := range []bool{true, false} {
			b.Run(fmt.Sprintf("local=%d/warm=%v", local, warm), func(b *testing.B) {
				cl, eps := benchCluster(1000, 1000, local)
				var c Compiler
				c.Compile(cl, eps)
				b.ResetTimer()
				for b.Loop() {
					if !warm {
						c = Compiler{}
					}
					c.Compile(cl, eps)
				}
			})
		}
	}
}
