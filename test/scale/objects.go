package main

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The cluster the harness writes, all of it a function of its size:
//
//   - node i: node-NNNN, pod range 10.128.0.0/13's i-th /24, InternalIP
//     2001:db8:1::i+1 (the agents' nodes: their segment addresses);
//   - namespace n: ns-NNNN, labelled team=t<n%50>;
//   - pod k: in namespace k/perNS (j = k%perNS its index there), on node
//     k%nodes, address .10+k/nodes of that node's range, labels
//     app=a<j%10>, role=r<j%5>;
//   - policy p of namespace n (np-PP): selects app=a<p%10>; p%3==0 admits
//     role=r<p%5> of its namespace on TCP 1000+p, p%3==1 role=r<p%5> of the
//     namespaces team=t<(n+p)%50> on TCP 2000+p, p%3==2 lets out to
//     192.0.2.0/24 except 192.0.2.128/25 on TCP 3000+p; policy 0 admits
//     the pods labelled access=granted on TCP 5000 (the peer-label changes).
type model struct {
	nodes, pods, namespaces, policies int
}

const (
	grantPort  = 5000
	grantLabel = "access"
	grantValue = "granted"
)

var (
	podBase     = netip.MustParseAddr("10.128.0.0")
	clusterCIDR = netip.MustParsePrefix("10.128.0.0/13")
)

func (m model) perNS() int    { return max(m.pods/m.namespaces, 1) }
func (m model) polPerNS() int { return max(m.policies/m.namespaces, 0) }

func nodeName(i int) string { return fmt.Sprintf("node-%04d", i) }
func nsName(n int) string   { return fmt.Sprintf("ns-%04d", n) }
func podName(k int) string  { return fmt.Sprintf("pod-%05d", k) }
func polName(p int) string  { return fmt.Sprintf("np-%02d", p) }

// podCIDR is node i's range: the i-th /24 of 10.128.0.0/13 (2,048 of them;
// nodes added take the ranges after the model's, re-registered ones the
// last quarter).
func podCIDR(i int) netip.Prefix {
	b := podBase.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 + uint32(i)<<8
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), 0}), 24)
}

func nodeIP6(i int) netip.Addr {
	return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 1, 14: byte((i + 1) >> 8), 15: byte(i + 1)})
}

func (m model) podNS(k int) int   { return k / m.perNS() }
func (m model) podJ(k int) int    { return k % m.perNS() }
func (m model) podNode(k int) int { return k % m.nodes }
func (m model) podIP(k int) netip.Addr {
	b := podCIDR(m.podNode(k)).Addr().As4()
	b[3] = byte(10 + k/m.nodes)
	return netip.AddrFrom4(b)
}

func podLabels(j int) map[string]string {
	return map[string]string{"app": fmt.Sprintf("a%d", j%10), "role": fmt.Sprintf("r%d", j%5)}
}

func (m model) namespace(n int) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsName(n), Labels: map[string]string{"team": fmt.Sprintf("t%d", n%50)}}}
}

// node is node i as a kubelet would have registered it (without the images
// and the volumes a real one lists).
func (m model) node(i int, v4 netip.Addr, v6 netip.Addr) *corev1.Node {
	cidr := podCIDR(i).String()
	addrs := []corev1.NodeAddress{}
	if v4.IsValid() {
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: v4.String()})
	}
	addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: v6.String()}, corev1.NodeAddress{Type: corev1.NodeHostName, Address: nodeName(i)})
	res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi"), corev1.ResourcePods: resource.MustParse("110")}
	now := metav1.Now()
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName(i), Labels: map[string]string{"kubernetes.io/hostname": nodeName(i), "kubernetes.io/os": "linux"}},
		Spec:       corev1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}},
		Status: corev1.NodeStatus{Addresses: addrs, Capacity: res, Allocatable: res,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}},
			NodeInfo:   corev1.NodeSystemInfo{KubeletVersion: "v1.34.3", OperatingSystem: "linux", Architecture: "amd64", ContainerRuntimeVersion: "containerd://2.2.9"}},
	}
}

// pod is pod k without its status (the API server drops a created pod's).
func (m model) pod(k int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: nsName(m.podNS(k)), Name: podName(k), Labels: podLabels(m.podJ(k))},
		Spec: corev1.PodSpec{NodeName: nodeName(m.podNode(k)), Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}}},
	}
}

// podStatus is a running pod's status at ip, as a kubelet writes it.
func podStatus(ip netip.Addr) corev1.PodStatus {
	now := metav1.Now()
	return corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip.String(), PodIPs: []corev1.PodIP{{IP: ip.String()}}, HostIP: "192.0.2.1",
		StartTime: &now, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}}
}

// policy is policy p of namespace n; port, when non-zero, replaces its
// port (the changes the apply latency is measured on).
func (m model) policy(n, p, port int) *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	sel := metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("a%d", p%10)}}
	role := &metav1.LabelSelector{MatchLabels: map[string]string{"role": fmt.Sprintf("r%d", p%5)}}
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: nsName(n), Name: polName(p)}, Spec: networkingv1.NetworkPolicySpec{PodSelector: sel}}
	portOf := func(def int) []networkingv1.NetworkPolicyPort {
		if port != 0 {
			def = port
		}
		v := intstr.FromInt32(int32(def))
		return []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &v}}
	}
	switch {
	case p == 0:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{grantLabel: grantValue}}}}, Ports: portOf(grantPort)}}
	case p%3 == 0:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: role}}, Ports: portOf(1000 + p)}}
	case p%3 == 1:
		team := &metav1.LabelSelector{MatchLabels: map[string]string{"team": fmt.Sprintf("t%d", (n+p)%50)}}
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: team, PodSelector: role}}, Ports: portOf(2000 + p)}}
	default:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "192.0.2.0/24", Except: []string{"192.0.2.128/25"}}}}, Ports: portOf(3000 + p)}}
	}
	return np
}

// parallel runs f(0..n-1) on w workers, stopping at the first error.
func parallel(ctx context.Context, n, w int, f func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { first = err })
					next.Store(int64(n))
					return
				}
			}
		}()
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}
