package netpol_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ebpf-cni/ebpf-cni/internal/conflisttest"
)

const (
	TCP  = corev1.ProtocolTCP
	UDP  = corev1.ProtocolUDP
	SCTP = corev1.ProtocolSCTP

	nsLabel = "kubernetes.io/metadata.name"
)

// The pod ranges of the node (ebpf-ipam's, conflisttest's default).
var podRange4, podRange6 = conflisttest.DefaultSubnets[0], conflisttest.DefaultSubnets[1]

// settle is how long the matrix of a new case may take to hold: the agent
// sees the policies and writes the maps.
const settle = 5 * time.Second

// tcase is one case of the model: the policies it creates, and the matrices
// it expects on the ports and protocols it probes.
type tcase struct {
	name     string
	policies func(cl *cluster) []*pol
	checks   []check
}

// cases are the upstream model's cases (k8s.io/kubernetes
// test/e2e/network/netpol/network_policy.go) and more, each with its
// expected matrices written out.
var cases = []tcase{
	{"default deny ingress", func(*cluster) []*pol {
		return []*pol{policyOf("x", "deny-ingress", labels()).ingress()}
	}, []check{
		tcp(80, allowAll().deny("*", "x/*")),
		udp(80, allowAll().deny("*", "x/*")),
		sctp(80, allowAll().deny("*", "x/*")),
	}},
	{"default deny egress", func(*cluster) []*pol {
		return []*pol{policyOf("x", "deny-egress", labels()).egress()}
	}, []check{
		tcp(80, allowAll().deny("x/*", "*")),
		udp(80, allowAll().deny("x/*", "*")),
	}},
	{"default deny all", func(*cluster) []*pol {
		return []*pol{policyOf("x", "deny-all", labels()).ingress().egress()}
	}, []check{
		tcp(80, allowAll().deny("*", "x/*").deny("x/*", "*")),
		sctp(81, allowAll().deny("*", "x/*").deny("x/*", "*")),
	}},
	{"allow all ingress beside deny all ingress", func(*cluster) []*pol {
		return []*pol{policyOf("x", "deny-ingress", labels()).ingress(), policyOf("x", "allow-all", labels()).ingress(from())}
	}, []check{
		tcp(80, allowAll()),
		udp(81, allowAll()),
	}},
	{"allow all egress beside deny all egress", func(*cluster) []*pol {
		return []*pol{policyOf("x", "deny-egress", labels()).egress(), policyOf("x", "allow-all", labels()).egress(to())}
	}, []check{
		tcp(80, allowAll()),
	}},
	{"ingress from a pod of the namespace (podSelector)", func(*cluster) []*pol {
		return []*pol{policyOf("x", "x-a-from-x-b", labels("pod", "a")).ingress(from(podPeer(labels("pod", "b"))))}
	}, []check{
		tcp(80, allowAll().deny("*", "x/a").allow("x/b", "x/a")),
		udp(80, allowAll().deny("*", "x/a").allow("x/b", "x/a")),
	}},
	{"deny all ingress, allow all to one target", func(*cluster) []*pol {
		return []*pol{policyOf("x", "deny-ingress", labels()).ingress(),
			policyOf("x", "allow-all-to-a", labels("pod", "a")).ingress(from(nsPodPeer(labels(), labels())))}
	}, []check{
		tcp(80, allowAll().deny("*", "x/b").deny("*", "x/c")),
	}},
	{"ingress from every namespace", func(*cluster) []*pol {
		return []*pol{policyOf("x", "from-all-ns", labels("pod", "a")).ingress(from(nsPeer(labels())))}
	}, []check{
		tcp(80, allowAll()),
	}},
	{"ingress from the pods of the policy's namespace (empty podSelector)", func(*cluster) []*pol {
		return []*pol{policyOf("x", "from-x", labels("pod", "a")).ingress(from(podPeer(labels())))}
	}, []check{
		tcp(80, allowAll().deny("y/*", "x/a").deny("z/*", "x/a")),
	}},
	{"ingress from another namespace (namespaceSelector)", func(*cluster) []*pol {
		return []*pol{policyOf("x", "from-y", labels("pod", "a")).ingress(from(nsPeer(nsName("y"))))}
	}, []check{
		tcp(80, allowAll().deny("x/*", "x/a").deny("z/*", "x/a")),
		sctp(80, allowAll().deny("x/*", "x/a").deny("z/*", "x/a")),
	}},
	{"podSelector with matchExpressions", func(*cluster) []*pol {
		return []*pol{policyOf("x", "x-a-from-in-b", labels("pod", "a")).ingress(from(podPeer(exprs(req("pod", metav1.LabelSelectorOpIn, "b")))))}
	}, []check{
		tcp(80, allowAll().deny("*", "x/a").allow("x/b", "x/a")),
	}},
	{"namespaceSelector with matchExpressions", func(*cluster) []*pol {
		return []*pol{policyOf("x", "from-in-y", labels("pod", "a")).ingress(from(nsPeer(exprs(req(nsLabel, metav1.LabelSelectorOpIn, "y")))))}
	}, []check{
		tcp(80, allowAll().deny("x/*", "x/a").deny("z/*", "x/a")),
	}},
	{"namespaceSelector or podSelector: two peers", func(*cluster) []*pol {
		return []*pol{policyOf("x", "not-x-or-b", labels("pod", "a")).ingress(from(
			nsPeer(exprs(req(nsLabel, metav1.LabelSelectorOpNotIn, "x"))), podPeer(labels("pod", "b"))))}
	}, []check{
		tcp(80, allowAll().deny("x/c", "x/a")),
	}},
	{"namespaceSelector and podSelector: one peer", func(*cluster) []*pol {
		return []*pol{policyOf("x", "not-x-and-b", labels("pod", "a")).ingress(from(
			nsPodPeer(exprs(req(nsLabel, metav1.LabelSelectorOpNotIn, "x")), labels("pod", "b"))))}
	}, []check{
		tcp(80, allowAll().deny("*", "x/a").allow("y/b", "x/a").allow("z/b", "x/a")),
		udp(81, allowAll().deny("*", "x/a").allow("y/b", "x/a").allow("z/b", "x/a")),
	}},
	{"namespace and pod selectors with labels and expressions in one peer", func(*cluster) []*pol {
		return []*pol{policyOf("x", "y-b-or-c", labels("pod", "a")).ingress(from(
			nsPodPeer(labels("ns", "y"), exprs(req("pod", metav1.LabelSelectorOpIn, "b", "c")))))}
	}, []check{
		tcp(80, allowAll().deny("*", "x/a").allow("y/b", "x/a").allow("y/c", "x/a")),
	}},
	{"egress with Exists and NotIn", func(*cluster) []*pol {
		return []*pol{policyOf("x", "to-not-c", labels("pod", "a")).egress(to(
			nsPodPeer(exprs(req("ns", metav1.LabelSelectorOpExists)), exprs(req("pod", metav1.LabelSelectorOpNotIn, "c")))))}
	}, []check{
		tcp(80, allowAll().deny("x/a", "*/c")),
	}},
	{"several policies select a pod: their union", func(*cluster) []*pol {
		return []*pol{policyOf("x", "from-x-b", labels("pod", "a")).ingress(from(podPeer(labels("pod", "b")))),
			policyOf("x", "from-y", labels("pod", "a")).ingress(from(nsPeer(nsName("y"))))}
	}, []check{
		tcp(80, allowAll().deny("*", "x/a").allow("x/b", "x/a").allow("y/*", "x/a")),
	}},
	{"a policy applies in its own namespace only", func(*cluster) []*pol {
		// Selecting pod=a in y, with the pods of y as peers: x/a and z/a
		// are not selected, x's and z's pods are not peers.
		return []*pol{policyOf("y", "y-a-from-y", labels("pod", "a")).ingress(from(podPeer(labels())))}
	}, []check{
		tcp(80, allowAll().deny("x/*", "y/a").deny("z/*", "y/a")),
	}},
	{"ingress on a numeric port", func(*cluster) []*pol {
		return []*pol{policyOf("x", "x-a-tcp-81", labels("pod", "a")).ingress(fromOn(ports(port(TCP, 81))))}
	}, []check{
		tcp(80, allowAll().deny("*", "x/a")),
		tcp(81, allowAll()),
		udp(81, allowAll().deny("*", "x/a")),
	}},
	{"ingress on a named port", func(*cluster) []*pol {
		return []*pol{policyOf("x", "x-a-serve-81-tcp", labels("pod", "a")).ingress(fromOn(ports(namedPort("serve-81-tcp"))))}
	}, []check{
		tcp(80, allowAll().deny("*", "x/a")),
		tcp(81, allowAll()),
		udp(81, allowAll().deny("*", "x/a")),
	}},
	{"ingress on a named UDP port", func(*cluster) []*pol {
		return []*pol{policyOf("x", "x-a-serve-81-udp", labels("pod", "a")).ingress(fromOn(ports(namedPort("serve-81-udp", UDP))))}
	}, []check{
		udp(81, allowAll()),
		udp(80, allowAll().deny("*", "x/a")),
		tcp(81, allowAll().deny("*", "x/a")),
	}},
	{"ingress on a port range (endPort)", func(*cluster) []*pol {
		return []*pol{policyOf("x", "x-a-81-90", labels("pod", "a")).ingress(fromOn(ports(portRange(TCP, 81, 90))))}
	}, []check{
		tcp(80, allowAll().deny("*", "x/a")),
		tcp(81, allowAll()),
	}},
	{"ingress on a range of both ports, TCP only", func(*cluster) []*pol {
		return []*pol{policyOf("x", "x-a-80-81", labels("pod", "a")).ingress(fromOn(ports(portRange(TCP, 80, 81))))}
	}, []check{
		tcp(80, allowAll()),
		tcp(81, allowAll()),
		udp(80, allowAll().deny("*", "x/a")),
		sctp(81, allowAll().deny("*", "x/a")),
	}},
	{"ingress on UDP only", func(*cluster) []*pol {
		return []*pol{policyOf("x", "x-a-udp-80", labels("pod", "a")).ingress(fromOn(ports(port(UDP, 80))))}
	}, []check{
		udp(80, allowAll()),
		tcp(80, allowAll().deny("*", "x/a")),
		sctp(80, allowAll().deny("*", "x/a")),
	}},
	{"ingress on SCTP only", func(*cluster) []*pol {
		return []*pol{policyOf("x", "x-a-sctp-80", labels("pod", "a")).ingress(fromOn(ports(port(SCTP, 80))))}
	}, []check{
		sctp(80, allowAll()),
		sctp(81, allowAll().deny("*", "x/a")),
		tcp(80, allowAll().deny("*", "x/a")),
		udp(80, allowAll().deny("*", "x/a")),
	}},
	{"a port without protocol is TCP", func(*cluster) []*pol {
		return []*pol{policyOf("x", "x-a-80", labels("pod", "a")).ingress(fromOn(ports(defaultPort(80)), podPeer(labels("pod", "b"))))}
	}, []check{
		tcp(80, allowAll().deny("*", "x/a").allow("x/b", "x/a")),
		udp(80, allowAll().deny("*", "x/a")),
	}},
	{"ingress from ipBlocks with an except", func(cl *cluster) []*pol {
		ya := cl.pod("y/a")
		return []*pol{policyOf("x", "x-a-from-range", labels("pod", "a")).ingress(from(
			blockPeer(podRange4, host(ya.ip4)), blockPeer(podRange6, host(ya.ip6))))}
	}, []check{
		tcp(80, allowAll().deny("y/a", "x/a")),
		udp(80, allowAll().deny("y/a", "x/a")),
	}},
	{"ingress from an IPv4 ipBlock only", func(*cluster) []*pol {
		return []*pol{policyOf("x", "x-a-from-range4", labels("pod", "a")).ingress(from(blockPeer(podRange4)))}
	}, []check{
		tcp(80, allowAll()).dual(allowAll().deny("*", "x/a")),
	}},
	{"ipBlock excepts differ by family", func(cl *cluster) []*pol {
		return []*pol{policyOf("x", "x-a-excepts", labels("pod", "a")).ingress(from(
			blockPeer(podRange4, host(cl.pod("y/a").ip4), host(cl.pod("z/b").ip4)), blockPeer(podRange6, host(cl.pod("z/c").ip6))))}
	}, []check{
		tcp(80, allowAll().deny("y/a", "x/a").deny("z/b", "x/a")).dual(allowAll().deny("z/c", "x/a")),
	}},
	{"an except overlapped by another rule's block", func(cl *cluster) []*pol {
		// y/a is excepted from the range, but a rule of another policy
		// allows it on TCP 81: the except's entry has that rule's rights.
		ya := cl.pod("y/a")
		return []*pol{policyOf("x", "x-a-from-range", labels("pod", "a")).ingress(from(
			blockPeer(podRange4, host(ya.ip4)), blockPeer(podRange6, host(ya.ip6)))),
			policyOf("x", "x-a-y-a-81", labels("pod", "a")).ingress(fromOn(ports(port(TCP, 81)), blockPeer(host(ya.ip4)), blockPeer(host(ya.ip6))))}
	}, []check{
		tcp(80, allowAll().deny("y/a", "x/a")),
		tcp(81, allowAll()),
	}},
	{"egress to ipBlocks with an except", func(cl *cluster) []*pol {
		yb := cl.pod("y/b")
		return []*pol{policyOf("x", "x-a-to-range", labels("pod", "a")).egress(to(
			blockPeer(podRange4, host(yb.ip4)), blockPeer(podRange6, host(yb.ip6))))}
	}, []check{
		tcp(80, allowAll().deny("x/a", "y/b")),
	}},
	{"egress to a pod of another namespace, and DNS", func(*cluster) []*pol {
		return []*pol{policyOf("x", "x-a-to-y-b", labels("pod", "a")).egress(to(nsPodPeer(nsName("y"), labels("pod", "b"))), dns())}
	}, []check{
		tcp(80, allowAll().deny("x/a", "*").allow("x/a", "y/b")),
		udp(80, allowAll().deny("x/a", "*").allow("x/a", "y/b")),
		udp(53, allowAll()),
		tcp(53, allowAll()),
	}},
	{"egress on a named port of the pods of every namespace", func(*cluster) []*pol {
		return []*pol{policyOf("x", "x-a-to-pods-serve-80-tcp", labels("pod", "a")).egress(toOn(ports(namedPort("serve-80-tcp")), nsPeer(labels())))}
	}, []check{
		tcp(80, allowAll()),
		tcp(81, allowAll().deny("x/a", "*")),
	}},
	{"egress on a named port to every destination, and DNS", func(*cluster) []*pol {
		return []*pol{policyOf("x", "x-a-to-serve-80-tcp", labels("pod", "a")).egress(toOn(ports(namedPort("serve-80-tcp"))), dns())}
	}, []check{
		tcp(80, allowAll()),
		tcp(81, allowAll().deny("x/a", "*")),
		udp(53, allowAll()),
	}},
	{"egress within the namespace", func(*cluster) []*pol {
		return []*pol{policyOf("x", "to-x", labels()).egress(to(podPeer(labels())))}
	}, []check{
		tcp(80, allowAll().deny("x/*", "y/*").deny("x/*", "z/*")),
	}},
	{"ingress and egress in one policy", func(*cluster) []*pol {
		return []*pol{policyOf("x", "x-a-both", labels("pod", "a")).ingress(from(nsPeer(nsName("y")))).egress(to(nsPeer(nsName("z"))))}
	}, []check{
		tcp(80, allowAll().deny("*", "x/a").allow("y/*", "x/a").deny("x/a", "*").allow("x/a", "z/*")),
		sctp(81, allowAll().deny("*", "x/a").allow("y/*", "x/a").deny("x/a", "*").allow("x/a", "z/*")),
	}},
	{"the client's egress and the server's ingress both apply", func(*cluster) []*pol {
		return []*pol{policyOf("y", "y-to-x", labels()).egress(to(nsPeer(nsName("x")))),
			policyOf("x", "x-a-from-z", labels("pod", "a")).ingress(from(nsPeer(nsName("z"))))}
	}, []check{
		tcp(80, allowAll().deny("y/*", "*").allow("y/*", "x/*").deny("*", "x/a").allow("z/*", "x/a")),
	}},
	{"policyTypes left out: Ingress, and Egress for egress rules", func(*cluster) []*pol {
		return []*pol{policyOf("x", "untyped", labels("pod", "a")).egress(to(nsPeer(nsName("y")))).untyped()}
	}, []check{
		tcp(80, allowAll().deny("*", "x/a").deny("x/a", "*").allow("x/a", "y/*")),
	}},
}

// TestReachability runs every case on one cluster: its policies are
// created, its matrices asserted, and every policy deleted before the next
// (with the node back to no endpoint state and no namespace fact).
func TestReachability(t *testing.T) {
	cl := newCluster(t)
	cl.startController(t)
	if len(cases) < 30 {
		t.Fatalf("%d cases: the issue asks for at least 30", len(cases))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cl := cl.in(t)
			t.Cleanup(cl.removeAll)
			start := time.Now()
			cl.change(func() {
				for _, p := range c.policies(cl) {
					cl.create(p.obj())
				}
			})
			written := time.Since(start)
			took := cl.expect(t, c.checks, settle)
			t.Logf("the agent wrote the maps %v after the policies were created; the matrix held %v after", written.Round(time.Millisecond), took.Round(time.Millisecond))
		})
	}
}

// in is the cluster as seen by test t.
func (cl *cluster) in(t *testing.T) *cluster {
	c := *cl
	c.t = t
	return &c
}
