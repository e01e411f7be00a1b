package netpol_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
)

// ClusterNetworkPolicies (policy.networking.k8s.io/v1beta1) on the same
// model: the Admin tier before the NetworkPolicies, the Baseline tier
// after them, on the pods of the simulated node.

// cpol is a ClusterNetworkPolicy as the cases spell it.
type cpol struct{ cnpv1.ClusterNetworkPolicy }

func adminPolicy(name string, prio int32, subject cnpv1.ClusterNetworkPolicySubject) *cpol {
	p := &cpol{}
	p.Name, p.Spec.Tier, p.Spec.Priority, p.Spec.Subject = name, cnpv1.AdminTier, prio, subject
	return p
}

func baselinePolicy(name string, prio int32, subject cnpv1.ClusterNetworkPolicySubject) *cpol {
	p := adminPolicy(name, prio, subject)
	p.Spec.Tier = cnpv1.BaselineTier
	return p
}

// inNS and podsOf are subjects: the pods of the namespaces sel selects,
// the pods podSel selects in the namespaces nsSel selects.
func inNS(sel *metav1.LabelSelector) cnpv1.ClusterNetworkPolicySubject {
	return cnpv1.ClusterNetworkPolicySubject{Namespaces: sel}
}

func podsOf(nsSel, podSel *metav1.LabelSelector) cnpv1.ClusterNetworkPolicySubject {
	return cnpv1.ClusterNetworkPolicySubject{Pods: &cnpv1.NamespacedPod{NamespaceSelector: *nsSel, PodSelector: *podSel}}
}

// cpeer is a peer of either direction: namespaces, pods or (egress)
// networks.
type cpeer struct {
	nss  *metav1.LabelSelector
	pods *cnpv1.NamespacedPod
	nets []cnpv1.CIDR
}

func nsOf(sel *metav1.LabelSelector) cpeer { return cpeer{nss: sel} }
func podsIn(nsSel, podSel *metav1.LabelSelector) cpeer {
	return cpeer{pods: &cnpv1.NamespacedPod{NamespaceSelector: *nsSel, PodSelector: *podSel}}
}
func nets(cidrs ...string) cpeer {
	var p cpeer
	for _, c := range cidrs {
		p.nets = append(p.nets, cnpv1.CIDR(c))
	}
	return p
}

func cnpTCP(port int32) cnpv1.ClusterNetworkPolicyProtocol {
	return cnpv1.ClusterNetworkPolicyProtocol{TCP: &cnpv1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &cnpv1.Port{Number: port}}}
}

func cnpUDP(port int32) cnpv1.ClusterNetworkPolicyProtocol {
	return cnpv1.ClusterNetworkPolicyProtocol{UDP: &cnpv1.ClusterNetworkPolicyProtocolUDP{DestinationPort: &cnpv1.Port{Number: port}}}
}

// from and to add a rule (protocols nil: every protocol).
func (p *cpol) from(a cnpv1.ClusterNetworkPolicyRuleAction, protos []cnpv1.ClusterNetworkPolicyProtocol, peers ...cpeer) *cpol {
	r := cnpv1.ClusterNetworkPolicyIngressRule{Action: a, Protocols: protos}
	for _, x := range peers {
		r.From = append(r.From, cnpv1.ClusterNetworkPolicyIngressPeer{Namespaces: x.nss, Pods: x.pods})
	}
	p.Spec.Ingress = append(p.Spec.Ingress, r)
	return p
}

func (p *cpol) to(a cnpv1.ClusterNetworkPolicyRuleAction, protos []cnpv1.ClusterNetworkPolicyProtocol, peers ...cpeer) *cpol {
	r := cnpv1.ClusterNetworkPolicyEgressRule{Action: a, Protocols: protos}
	for _, x := range peers {
		r.To = append(r.To, cnpv1.ClusterNetworkPolicyEgressPeer{Namespaces: x.nss, Pods: x.pods, Networks: x.nets})
	}
	p.Spec.Egress = append(p.Spec.Egress, r)
	return p
}

func (p *cpol) obj() *cnpv1.ClusterNetworkPolicy { return p.DeepCopy() }

const (
	accept = cnpv1.ClusterNetworkPolicyRuleActionAccept
	deny   = cnpv1.ClusterNetworkPolicyRuleActionDeny
	pass   = cnpv1.ClusterNetworkPolicyRuleActionPass
)

// createCNP, updateCNP and removeCNP change the API's ClusterNetworkPolicies.
func (cl *cluster) createCNP(ps ...*cnpv1.ClusterNetworkPolicy) {
	cl.t.Helper()
	for _, p := range ps {
		_, err := cl.cnps.PolicyV1beta1().ClusterNetworkPolicies().Create(context.Background(), p, metav1.CreateOptions{})
		require.NoError(cl.t, err, "creating %s", p.Name)
	}
}

func (cl *cluster) updateCNP(p *cnpv1.ClusterNetworkPolicy) {
	cl.t.Helper()
	_, err := cl.cnps.PolicyV1beta1().ClusterNetworkPolicies().Update(context.Background(), p, metav1.UpdateOptions{})
	require.NoError(cl.t, err, "updating %s", p.Name)
}

func (cl *cluster) removeCNP(name string) {
	cl.t.Helper()
	require.NoError(cl.t, cl.cnps.PolicyV1beta1().ClusterNetworkPolicies().Delete(context.Background(), name, metav1.DeleteOptions{}))
}

// cnpCase is a case with ClusterNetworkPolicies, NetworkPolicies beside
// them.
type cnpCase struct {
	name   string
	cnps   func(cl *cluster) []*cpol
	nps    []*pol
	checks []check
}

var cnpCases = []cnpCase{
	{"ClusterNetworkPolicy admin Deny overrides a NetworkPolicy allow", func(*cluster) []*cpol {
		return []*cpol{adminPolicy("deny-y-to-x-80", 10, inNS(nsName("x"))).from(deny, []cnpv1.ClusterNetworkPolicyProtocol{cnpTCP(80)}, nsOf(nsName("y")))}
	}, []*pol{policyOf("x", "allow-all", labels()).ingress(from())}, []check{
		tcp(80, allowAll().deny("y/*", "x/*")),
		tcp(81, allowAll()),
		udp(80, allowAll()),
	}},
	{"ClusterNetworkPolicy admin Pass delegates to the NetworkPolicies", func(*cluster) []*cpol {
		return []*cpol{
			adminPolicy("pass-y", 1, inNS(nsName("x"))).from(pass, nil, nsOf(nsName("y"))),
			adminPolicy("deny-all-to-x", 2, inNS(nsName("x"))).from(deny, nil, nsOf(labels())),
		}
	}, []*pol{policyOf("x", "from-y-a", labels()).ingress(from(nsPodPeer(nsName("y"), labels("pod", "a"))))}, []check{
		tcp(80, allowAll().deny("*", "x/*").allow("y/a", "x/*")),
		udp(81, allowAll().deny("*", "x/*").allow("y/a", "x/*")),
	}},
	{"ClusterNetworkPolicy admin Pass where no NetworkPolicy selects goes to the Baseline tier", func(*cluster) []*cpol {
		return []*cpol{
			adminPolicy("pass-y", 1, inNS(nsName("x"))).from(pass, nil, nsOf(nsName("y"))),
			adminPolicy("deny-y", 2, inNS(nsName("x"))).from(deny, nil, nsOf(nsName("y"))),
			baselinePolicy("base-deny-y-b", 1, inNS(nsName("x"))).from(deny, nil, podsIn(nsName("y"), labels("pod", "b"))),
		}
	}, nil, []check{
		tcp(80, allowAll().deny("y/b", "x/*")),
	}},
	{"ClusterNetworkPolicy baseline Deny where no NetworkPolicy selects", func(*cluster) []*cpol {
		return []*cpol{baselinePolicy("base-deny-z", 5, inNS(labels())).from(deny, nil, nsOf(nsName("z")))}
	}, nil, []check{
		tcp(80, allowAll().deny("z/*", "*")),
		sctp(80, allowAll().deny("z/*", "*")),
	}},
	{"ClusterNetworkPolicy baseline overridden by a NetworkPolicy allow", func(*cluster) []*cpol {
		return []*cpol{baselinePolicy("base-deny-all", 5, inNS(labels())).from(deny, nil, nsOf(labels()))}
	}, []*pol{policyOf("x", "allow-all", labels()).ingress(from())}, []check{
		tcp(80, denyAll().allow("*", "x/*")),
	}},
	{"ClusterNetworkPolicy priority: the lower number decides", func(*cluster) []*cpol {
		return []*cpol{
			adminPolicy("deny-all-to-x", 20, inNS(nsName("x"))).from(deny, nil, nsOf(labels())),
			adminPolicy("accept-z", 10, inNS(nsName("x"))).from(accept, nil, nsOf(nsName("z"))),
		}
	}, nil, []check{
		tcp(80, allowAll().deny("*", "x/*").allow("z/*", "x/*")),
	}},
	{"ClusterNetworkPolicy egress networks with overlapping CIDRs", func(cl *cluster) []*cpol {
		ya := cl.pod("y/a")
		return []*cpol{
			adminPolicy("accept-y-a", 1, inNS(nsName("x"))).to(accept, nil, nets(host(ya.ip4), host(ya.ip6))),
			adminPolicy("deny-pods", 2, inNS(nsName("x"))).to(deny, nil, nets(podRange4, podRange6)),
		}
	}, nil, []check{
		tcp(80, allowAll().deny("x/*", "*").allow("x/*", "y/a")),
		udp(80, allowAll().deny("x/*", "*").allow("x/*", "y/a")),
	}},
	{"ClusterNetworkPolicy Deny of one protocol and port", func(*cluster) []*cpol {
		return []*cpol{adminPolicy("deny-udp-80", 1, inNS(nsName("y"))).from(deny, []cnpv1.ClusterNetworkPolicyProtocol{cnpUDP(80)}, nsOf(nsName("x")))}
	}, nil, []check{
		udp(80, allowAll().deny("x/*", "y/*")),
		udp(81, allowAll()),
		tcp(80, allowAll()),
	}},
	{"ClusterNetworkPolicy subject by pods", func(*cluster) []*cpol {
		return []*cpol{adminPolicy("deny-to-a", 1, podsOf(labels(), labels("pod", "a"))).from(deny, nil, nsOf(labels()))}
	}, nil, []check{
		tcp(80, allowAll().deny("*", "*/a")),
	}},
	{"ClusterNetworkPolicy egress Accept beside a NetworkPolicy that isolates egress", func(*cluster) []*cpol {
		return []*cpol{adminPolicy("accept-z", 1, inNS(nsName("x"))).to(accept, nil, nsOf(nsName("z")))}
	}, []*pol{policyOf("x", "deny-egress", labels()).egress()}, []check{
		tcp(80, allowAll().deny("x/*", "*").allow("x/*", "z/*")),
	}},
}

// TestClusterNetworkPolicyReachability runs each case on one cluster:
// its policies created, its matrices asserted, everything deleted before
// the next.
func TestClusterNetworkPolicyReachability(t *testing.T) {
	cl := newCluster(t)
	cl.startController(t)
	for _, c := range cnpCases {
		t.Run(c.name, func(t *testing.T) {
			cl := cl.in(t)
			t.Cleanup(cl.removeAll)
			cl.change(func() {
				for _, p := range c.nps {
					cl.create(p.obj())
				}
				for _, p := range c.cnps(cl) {
					cl.createCNP(p.obj())
				}
			})
			took := cl.expect(t, c.checks, settle)
			t.Logf("the matrix held %v after the maps were written", took.Round(time.Millisecond))
		})
	}
}

// TestClusterNetworkPolicyUpdates changes ClusterNetworkPolicies while
// probes run (expectChange: the changed cells within changeBound, the
// others never flipping meanwhile).
func TestClusterNetworkPolicyUpdates(t *testing.T) {
	acceptZ := adminPolicy("accept-z", 10, inNS(nsName("x"))).from(accept, nil, nsOf(nsName("z")))
	denyAllToX := adminPolicy("deny-all-to-x", 20, inNS(nsName("x"))).from(deny, nil, nsOf(labels()))
	cases := []updateCase{
		{"ClusterNetworkPolicy priorities reordered while traffic flows", []step{
			{"accept z (10) before deny all (20)", func(cl *cluster) { cl.createCNP(acceptZ.obj(), denyAllToX.obj()) },
				[]check{tcp(80, allowAll().deny("*", "x/*").allow("z/*", "x/*"))}},
			{"accept z moved to 30", func(cl *cluster) {
				p := acceptZ.obj()
				p.Spec.Priority = 30
				cl.updateCNP(p)
			}, []check{tcp(80, allowAll().deny("*", "x/*"))}},
		}},
		{"ClusterNetworkPolicy admin Deny added over a NetworkPolicy allow, then removed", []step{
			{"x allows everyone", func(cl *cluster) { cl.create(policyOf("x", "allow-all", labels()).ingress(from()).obj()) },
				[]check{tcp(80, allowAll())}},
			{"admin Deny y to x", func(cl *cluster) {
				cl.createCNP(adminPolicy("deny-y", 1, inNS(nsName("x"))).from(deny, nil, nsOf(nsName("y"))).obj())
			}, []check{tcp(80, allowAll().deny("y/*", "x/*"))}},
			{"removed", func(cl *cluster) { cl.removeCNP("deny-y") }, []check{tcp(80, allowAll())}},
		}},
		{"ClusterNetworkPolicy baseline Deny, then a NetworkPolicy selects the pods", []step{
			{"baseline deny z to y", func(cl *cluster) {
				cl.createCNP(baselinePolicy("base-deny-z", 1, inNS(nsName("y"))).from(deny, nil, nsOf(nsName("z"))).obj())
			}, []check{tcp(80, allowAll().deny("z/*", "y/*"))}},
			{"a NetworkPolicy of y admits z only", func(cl *cluster) {
				cl.create(policyOf("y", "from-z", labels()).ingress(from(nsPeer(nsName("z")))).obj())
			}, []check{tcp(80, allowAll().deny("*", "y/*").allow("z/*", "y/*"))}},
		}},
	}
	cl := newCluster(t)
	cl.startController(t)
	for _, uc := range cases {
		t.Run(uc.name, func(t *testing.T) {
			cl := cl.in(t)
			t.Cleanup(cl.removeAll)
			var prev []check
			for i, s := range uc.steps {
				if i == 0 {
					cl.change(func() { s.change(cl) })
					cl.expect(t, s.checks, settle)
				} else {
					cl.expectChange(t, s, prev[0])
				}
				prev = s.checks
				if t.Failed() {
					t.Fatalf("after step %q", s.name)
				}
			}
		})
	}
}

// TestClusterNetworkPolicyRevokesEstablished: a Deny cuts the established
// flows it covers at their next packet (TCP and UDP), through the
// generation of the direction it changes; a flow it does not cover goes
// on. The flows are opened while y is selected already (by an Accept of
// x): flows opened before a pod was isolated are remembered nowhere, and
// a TCP packet of theirs that is no SYN passes where the other way would
// be allowed (docs/networkpolicy.md, Flows opened before a pod was
// isolated).
func TestClusterNetworkPolicyRevokesEstablished(t *testing.T) {
	cl := newCluster(t)
	cl.startController(t)
	xa, ya, za := cl.pod("x/a"), cl.pod("y/a"), cl.pod("z/a")
	yPolicy := adminPolicy("y-from-x", 1, inNS(nsName("y"))).from(accept, nil, nsOf(nsName("x")))
	cl.change(func() { cl.createCNP(yPolicy.obj()) })
	l, err := nettest.ListenPort(ya.cni.NS, ya.ip4, 8080)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	addr := net.JoinHostPort(ya.ip4.String(), "8080")
	dial := func(from *pod) net.Conn {
		c, err := nettest.Dial(from.cni.NS, addr)
		require.NoError(t, err, "%s -> %s", from, addr)
		t.Cleanup(func() { c.Close() })
		require.NoError(t, c.SetDeadline(time.Now().Add(2*time.Second)))
		require.NoError(t, nettest.Echo(c, "before\n"))
		return c
	}
	cx, cz := dial(xa), dial(za)
	// A UDP flow: a connected socket to y/a's echo on 81.
	var ux net.Conn
	require.NoError(t, xa.cni.NS.Do(func(ns.NetNS) error {
		var err error
		ux, err = net.Dial("udp", net.JoinHostPort(ya.ip4.String(), strconv.Itoa(81)))
		return err
	}))
	t.Cleanup(func() { ux.Close() })
	require.NoError(t, ux.SetDeadline(time.Now().Add(2*time.Second)))
	require.NoError(t, nettest.Echo(ux, "udp before\n"))

	cl.change(func() {
		p := yPolicy.obj()
		p.Spec.Ingress[0].Action = deny
		cl.updateCNP(p)
	})
	require.NoError(t, cx.SetDeadline(time.Now().Add(time.Second)))
	require.Error(t, nettest.Echo(cx, "after\n"), "an established TCP flow the Deny covers kept passing")
	require.NoError(t, ux.SetDeadline(time.Now().Add(time.Second)))
	require.Error(t, nettest.Echo(ux, "udp after\n"), "an established UDP flow the Deny covers kept passing")
	require.NoError(t, cz.SetDeadline(time.Now().Add(2*time.Second)))
	require.NoError(t, nettest.Echo(cz, "after\n"), "a flow the Deny does not cover was cut")
	cl.removeAll()
}

// TestClusterNetworkPolicyAgentDown: with the controller stopped the
// maps keep enforcing what it wrote, a ClusterNetworkPolicy deleted
// meanwhile included; a new pod of a namespace a ClusterNetworkPolicy
// selects starts closed; the controller's start applies the deletion and
// opens the pod.
func TestClusterNetworkPolicyAgentDown(t *testing.T) {
	cl := newCluster(t)
	ctl := cl.startController(t)
	cl.change(func() {
		cl.createCNP(adminPolicy("deny-z-to-x", 1, inNS(nsName("x"))).from(deny, nil, nsOf(nsName("z"))).obj())
	})
	denied := []check{tcp(80, allowAll().deny("z/*", "x/*")), udp(81, allowAll().deny("z/*", "x/*"))}
	cl.expect(t, denied, settle)
	ctl.stop(t)
	cl.removeCNP("deny-z-to-x")
	cl.expect(t, denied, 0)

	d := cl.addPod("x", "d")
	ya := cl.pod("y/a")
	for _, fam := range families {
		if r := probe(ya, d, key{TCP, 80, fam}, retryTimeout); r.ok {
			t.Errorf("agent stopped: y/a -> x/d IPv%d reached: a new pod a ClusterNetworkPolicy may select must start closed", fam)
		}
	}

	cl.startController(t)
	cl.expect(t, []check{tcp(80, allowAll()), udp(81, allowAll())}, settle)
	deadline := time.Now().Add(settle)
	for _, fam := range families {
		for {
			if r := probe(ya, d, key{TCP, 80, fam}, probeTimeout); r.ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%v after the controller started, y/a -> x/d IPv%d is still closed", settle, fam)
			}
		}
	}
}
