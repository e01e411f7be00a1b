package netpol_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes/fake"
	cnpfake "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned/fake"

	"github.com/ebpf-cni/ebpf-cni/internal/conflisttest"
	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// The model: namespaces x, y, z, each with pods a, b, c; the matrix's rows
// and columns in this order.
var (
	namespaces = []string{"x", "y", "z"}
	podNames   = []string{"a", "b", "c"}
)

// servedPorts are what every pod serves on TCP, UDP and SCTP: the model's
// 80 and 81, and 53 for the cases that allow DNS.
var servedPorts = []int{80, 81, 53}

var protocols = []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}

const nodeName = "node-1"

// cluster is one simulated node with the model's pods on it and a fake API
// holding their objects.
type cluster struct {
	t      *testing.T
	node   *testutil.Node
	list   *libcni.NetworkConfigList
	client *fake.Clientset
	cnps   *cnpfake.Clientset // ClusterNetworkPolicies: the API serves them
	pods   []*pod             // the model's 9, in matrix order
	maps   *policy.Maps
	ctl    *controller // the policy controller last started
}

// pod is a pod of the model: its netns, addresses and servers.
type pod struct {
	ns, name string
	cni      *nettest.Pod
	ip4, ip6 net.IP
}

func (p *pod) String() string { return p.ns + "/" + p.name }

// ip is the pod's address of family fam (4 or 6).
func (p *pod) ip(fam int) net.IP {
	if fam == 4 {
		return p.ip4
	}
	return p.ip6
}

// newCluster builds the node, the namespaces and the 9 pods, each serving
// its ports; everything goes at cleanup.
func newCluster(t *testing.T) *cluster {
	t.Helper()
	n := testutil.NewNode(t, false)
	cl := &cluster{t: t, node: n, list: n.List(t, conflisttest.Options{}), client: fake.NewClientset(), cnps: cnpfake.NewSimpleClientset()}
	cl.cnps.Resources = []*metav1.APIResourceList{{GroupVersion: "policy.networking.k8s.io/v1beta1",
		APIResources: []metav1.APIResource{{Name: "clusternetworkpolicies", Kind: "ClusterNetworkPolicy"}}}}
	for _, ns := range namespaces {
		_, err := cl.client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: ns, Labels: map[string]string{"ns": ns, "kubernetes.io/metadata.name": ns}}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	for _, ns := range namespaces {
		for _, name := range podNames {
			cl.pods = append(cl.pods, cl.addPod(ns, name))
		}
	}
	m, err := policy.Open(nodetest.Handle(t, n.BPFRoot, n.StateDir))
	require.NoError(t, err)
	t.Cleanup(m.Close)
	cl.maps = m
	return cl
}

// addPod attaches pod ns/name as a kubelet would (CNI_ARGS K8S_POD_*),
// starts its servers and records it, with the addresses ADD gave, in the
// API.
func (cl *cluster) addPod(ns, name string) *pod {
	cl.t.Helper()
	uid := uuid.NewUUID()
	p := &pod{ns: ns, name: name}
	p.cni = testutil.AddPodArgs(cl.t, cl.node.CNI, cl.list, ns+"-"+name, nil, testutil.K8sArgs(ns, name, string(uid)))
	p.ip4, p.ip6 = p.cni.IP(4), p.cni.IP(6)
	require.NotNil(cl.t, p.ip4, "%s has no IPv4 address", p)
	require.NotNil(cl.t, p.ip6, "%s has no IPv6 address", p)
	serve(cl.t, p)

	var ports []corev1.ContainerPort
	for _, port := range servedPorts {
		for _, proto := range protocols {
			ports = append(ports, corev1.ContainerPort{Name: portName(port, proto), ContainerPort: int32(port), Protocol: proto})
		}
	}
	obj := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid, Labels: map[string]string{"pod": name}},
		Spec:       corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "server", Image: "agnhost", Ports: ports}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, HostIP: nettest.NodeIP4.String(), PodIP: p.ip4.String(),
			PodIPs: []corev1.PodIP{{IP: p.ip4.String()}, {IP: p.ip6.String()}}},
	}
	_, err := cl.client.CoreV1().Pods(ns).Create(context.Background(), obj, metav1.CreateOptions{})
	require.NoError(cl.t, err)
	return p
}

// portName is the name upstream's model gives a container port:
// serve-80-tcp, serve-81-udp...
func portName(port int, proto corev1.Protocol) string {
	return fmt.Sprintf("serve-%d-%s", port, strings.ToLower(string(proto)))
}

// pod finds a pod of the model by "ns/name".
func (cl *cluster) pod(s string) *pod {
	for _, p := range cl.pods {
		if p.String() == s {
			return p
		}
	}
	cl.t.Fatalf("no pod %s", s)
	return nil
}

// create, update and remove change the API's NetworkPolicies.
func (cl *cluster) create(ps ...*netv1.NetworkPolicy) {
	cl.t.Helper()
	for _, p := range ps {
		_, err := cl.client.NetworkingV1().NetworkPolicies(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
		require.NoError(cl.t, err, "creating %s/%s", p.Namespace, p.Name)
	}
}

func (cl *cluster) update(ps ...*netv1.NetworkPolicy) {
	cl.t.Helper()
	for _, p := range ps {
		_, err := cl.client.NetworkingV1().NetworkPolicies(p.Namespace).Update(context.Background(), p, metav1.UpdateOptions{})
		require.NoError(cl.t, err, "updating %s/%s", p.Namespace, p.Name)
	}
}

func (cl *cluster) remove(ps ...*netv1.NetworkPolicy) {
	cl.t.Helper()
	for _, p := range ps {
		err := cl.client.NetworkingV1().NetworkPolicies(p.Namespace).Delete(context.Background(), p.Name, metav1.DeleteOptions{})
		require.NoError(cl.t, err, "deleting %s/%s", p.Namespace, p.Name)
	}
}

// removeAll deletes every NetworkPolicy and ClusterNetworkPolicy and waits
// until the agent has opened every endpoint again and dropped every
// namespace fact: the next case starts from a node without policies.
func (cl *cluster) removeAll() {
	cl.t.Helper()
	cnps, err := cl.cnps.PolicyV1beta1().ClusterNetworkPolicies().List(context.Background(), metav1.ListOptions{})
	require.NoError(cl.t, err)
	for i := range cnps.Items {
		require.NoError(cl.t, cl.cnps.PolicyV1beta1().ClusterNetworkPolicies().Delete(context.Background(), cnps.Items[i].Name, metav1.DeleteOptions{}))
	}
	for _, ns := range namespaces {
		l, err := cl.client.NetworkingV1().NetworkPolicies(ns).List(context.Background(), metav1.ListOptions{})
		require.NoError(cl.t, err)
		for i := range l.Items {
			cl.remove(&l.Items[i])
		}
	}
	var states map[uint32]policy.EndpointState
	var facts map[string]policy.NamespaceFact
	deadline := time.Now().Add(5 * time.Second)
	for {
		var err error
		states, err = cl.maps.EndpointStates()
		require.NoError(cl.t, err)
		facts, err = cl.maps.NamespaceFacts()
		require.NoError(cl.t, err)
		if len(states) == 0 && len(facts) == 0 {
			return
		}
		if time.Now().After(deadline) {
			cl.t.Fatalf("5 s after every policy was deleted, endpoint states %v and namespace facts %v are left", states, facts)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// setNamespaceLabels and setPodLabels replace the labels of a namespace or a
// pod in the API.
func (cl *cluster) setNamespaceLabels(ns string, labels map[string]string) {
	cl.t.Helper()
	c := cl.client.CoreV1().Namespaces()
	obj, err := c.Get(context.Background(), ns, metav1.GetOptions{})
	require.NoError(cl.t, err)
	obj.Labels = labels
	_, err = c.Update(context.Background(), obj, metav1.UpdateOptions{})
	require.NoError(cl.t, err)
}

func (cl *cluster) setPodLabels(p *pod, labels map[string]string) {
	cl.t.Helper()
	c := cl.client.CoreV1().Pods(p.ns)
	obj, err := c.Get(context.Background(), p.name, metav1.GetOptions{})
	require.NoError(cl.t, err)
	obj.Labels = labels
	_, err = c.Update(context.Background(), obj, metav1.UpdateOptions{})
	require.NoError(cl.t, err)
}
