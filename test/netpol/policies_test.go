package netpol_test

import (
	"net"

	corev1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Building NetworkPolicies as the cases spell them.

// pol is a policy of namespace ns selecting the pods of sel, with the
// policyTypes the API server defaults (Ingress; Egress too when it has
// egress rules) unless types are given.
type pol struct{ netv1.NetworkPolicy }

func policyOf(ns, name string, sel *metav1.LabelSelector) *pol {
	p := &pol{}
	p.Namespace, p.Name = ns, name
	if sel != nil {
		p.Spec.PodSelector = *sel
	}
	return p
}

// ingress adds ingress rules (none: the selected pods are isolated for
// ingress).
func (p *pol) ingress(rules ...netv1.NetworkPolicyIngressRule) *pol {
	p.Spec.Ingress = append(p.Spec.Ingress, rules...)
	return p.withType(netv1.PolicyTypeIngress)
}

// egress adds egress rules (none: isolated for egress).
func (p *pol) egress(rules ...netv1.NetworkPolicyEgressRule) *pol {
	p.Spec.Egress = append(p.Spec.Egress, rules...)
	return p.withType(netv1.PolicyTypeEgress)
}

func (p *pol) withType(t netv1.PolicyType) *pol {
	for _, x := range p.Spec.PolicyTypes {
		if x == t {
			return p
		}
	}
	p.Spec.PolicyTypes = append(p.Spec.PolicyTypes, t)
	return p
}

// untyped leaves policyTypes out, for the agent to default as the API
// server would.
func (p *pol) untyped() *pol { p.Spec.PolicyTypes = nil; return p }

func (p *pol) obj() *netv1.NetworkPolicy { return p.DeepCopy() }

// labels is a selector of matchLabels k1=v1, k2=v2...; no pairs: every
// object.
func labels(kv ...string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

// exprs is a selector of matchExpressions.
func exprs(reqs ...metav1.LabelSelectorRequirement) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: reqs}
}

func req(key string, op metav1.LabelSelectorOperator, values ...string) metav1.LabelSelectorRequirement {
	return metav1.LabelSelectorRequirement{Key: key, Operator: op, Values: values}
}

// nsName selects the namespace of that name by its automatic label.
func nsName(name string) *metav1.LabelSelector { return labels("kubernetes.io/metadata.name", name) }

// peers.
func podPeer(sel *metav1.LabelSelector) netv1.NetworkPolicyPeer {
	return netv1.NetworkPolicyPeer{PodSelector: sel}
}
func nsPeer(sel *metav1.LabelSelector) netv1.NetworkPolicyPeer {
	return netv1.NetworkPolicyPeer{NamespaceSelector: sel}
}
func nsPodPeer(nsSel, podSel *metav1.LabelSelector) netv1.NetworkPolicyPeer {
	return netv1.NetworkPolicyPeer{NamespaceSelector: nsSel, PodSelector: podSel}
}

func blockPeer(cidr string, except ...string) netv1.NetworkPolicyPeer {
	return netv1.NetworkPolicyPeer{IPBlock: &netv1.IPBlock{CIDR: cidr, Except: except}}
}

// host is the /32 or /128 of an address.
func host(ip net.IP) string {
	if ip.To4() != nil {
		return ip.String() + "/32"
	}
	return ip.String() + "/128"
}

// ports.
func port(proto corev1.Protocol, n int) netv1.NetworkPolicyPort {
	v := intstr.FromInt32(int32(n))
	return netv1.NetworkPolicyPort{Protocol: &proto, Port: &v}
}

// portRange is port..end (endPort).
func portRange(proto corev1.Protocol, n, end int) netv1.NetworkPolicyPort {
	p := port(proto, n)
	e := int32(end)
	p.EndPort = &e
	return p
}

// namedPort is a port by its container port name, protocol left out
// (TCP by default) unless given.
func namedPort(name string, proto ...corev1.Protocol) netv1.NetworkPolicyPort {
	v := intstr.FromString(name)
	p := netv1.NetworkPolicyPort{Port: &v}
	if len(proto) > 0 {
		p.Protocol = &proto[0]
	}
	return p
}

// defaultPort is a port number with the protocol left out (TCP).
func defaultPort(n int) netv1.NetworkPolicyPort {
	v := intstr.FromInt32(int32(n))
	return netv1.NetworkPolicyPort{Port: &v}
}

func from(peers ...netv1.NetworkPolicyPeer) netv1.NetworkPolicyIngressRule {
	return netv1.NetworkPolicyIngressRule{From: peers}
}

func to(peers ...netv1.NetworkPolicyPeer) netv1.NetworkPolicyEgressRule {
	return netv1.NetworkPolicyEgressRule{To: peers}
}

// fromOn is an ingress rule from peers (none: everyone) on ports.
func fromOn(ports []netv1.NetworkPolicyPort, peers ...netv1.NetworkPolicyPeer) netv1.NetworkPolicyIngressRule {
	return netv1.NetworkPolicyIngressRule{From: peers, Ports: ports}
}

func toOn(ports []netv1.NetworkPolicyPort, peers ...netv1.NetworkPolicyPeer) netv1.NetworkPolicyEgressRule {
	return netv1.NetworkPolicyEgressRule{To: peers, Ports: ports}
}

func ports(ps ...netv1.NetworkPolicyPort) []netv1.NetworkPolicyPort { return ps }

// dns is the egress rule of the upstream model's egress cases: UDP and
// TCP 53 to everyone.
func dns() netv1.NetworkPolicyEgressRule {
	return toOn(ports(port(corev1.ProtocolUDP, 53), port(corev1.ProtocolTCP, 53)))
}
