package compile

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// Fixtures of ClusterNetworkPolicies, in the shape of the API's YAML.

func cnp(name string, tier cnpv1.Tier, prio int32, subj cnpv1.ClusterNetworkPolicySubject, in []cnpv1.ClusterNetworkPolicyIngressRule, out []cnpv1.ClusterNetworkPolicyEgressRule) *cnpv1.ClusterNetworkPolicy {
	return &cnpv1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: cnpv1.ClusterNetworkPolicySpec{Tier: tier, Priority: prio, Subject: subj, Ingress: in, Egress: out}}
}

func admin(name string, prio int32, subj cnpv1.ClusterNetworkPolicySubject, in []cnpv1.ClusterNetworkPolicyIngressRule, out []cnpv1.ClusterNetworkPolicyEgressRule) *cnpv1.ClusterNetworkPolicy {
	return cnp(name, cnpv1.AdminTier, prio, subj, in, out)
}

func baseline(name string, prio int32, subj cnpv1.ClusterNetworkPolicySubject, in []cnpv1.ClusterNetworkPolicyIngressRule, out []cnpv1.ClusterNetworkPolicyEgressRule) *cnpv1.ClusterNetworkPolicy {
	return cnp(name, cnpv1.BaselineTier, prio, subj, in, out)
}

func subjNS(s *metav1.LabelSelector) cnpv1.ClusterNetworkPolicySubject {
	return cnpv1.ClusterNetworkPolicySubject{Namespaces: s}
}

func subjPods(nsSel, podSel *metav1.LabelSelector) cnpv1.ClusterNetworkPolicySubject {
	return cnpv1.ClusterNetworkPolicySubject{Pods: &cnpv1.NamespacedPod{NamespaceSelector: *nsSel, PodSelector: *podSel}}
}

type cnpPeer struct {
	nss   *metav1.LabelSelector
	pods  *cnpv1.NamespacedPod
	nets  []cnpv1.CIDR
	nodes *metav1.LabelSelector
}

func peerNS(s *metav1.LabelSelector) cnpPeer { return cnpPeer{nss: s} }
func peerPods(nsSel, podSel *metav1.LabelSelector) cnpPeer {
	return cnpPeer{pods: &cnpv1.NamespacedPod{NamespaceSelector: *nsSel, PodSelector: *podSel}}
}
func peerNets(cidrs ...string) cnpPeer {
	p := cnpPeer{}
	for _, c := range cidrs {
		p.nets = append(p.nets, cnpv1.CIDR(c))
	}
	return p
}

func tcp(n int32) cnpv1.ClusterNetworkPolicyProtocol {
	return cnpv1.ClusterNetworkPolicyProtocol{TCP: &cnpv1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &cnpv1.Port{Number: n}}}
}
func tcpRange(a, b int32) cnpv1.ClusterNetworkPolicyProtocol {
	return cnpv1.ClusterNetworkPolicyProtocol{TCP: &cnpv1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &cnpv1.Port{Range: &cnpv1.PortRange{Start: a, End: b}}}}
}
func udp(n int32) cnpv1.ClusterNetworkPolicyProtocol {
	return cnpv1.ClusterNetworkPolicyProtocol{UDP: &cnpv1.ClusterNetworkPolicyProtocolUDP{DestinationPort: &cnpv1.Port{Number: n}}}
}
func sctp(n int32) cnpv1.ClusterNetworkPolicyProtocol {
	return cnpv1.ClusterNetworkPolicyProtocol{SCTP: &cnpv1.ClusterNetworkPolicyProtocolSCTP{DestinationPort: &cnpv1.Port{Number: n}}}
}
func namedPortP(n string) cnpv1.ClusterNetworkPolicyProtocol {
	return cnpv1.ClusterNetworkPolicyProtocol{DestinationNamedPort: n}
}

var (
	accept = cnpv1.ClusterNetworkPolicyRuleActionAccept
	deny   = cnpv1.ClusterNetworkPolicyRuleActionDeny
	pass   = cnpv1.ClusterNetworkPolicyRuleActionPass
)

func cin(a cnpv1.ClusterNetworkPolicyRuleAction, from []cnpPeer, protos ...cnpv1.ClusterNetworkPolicyProtocol) cnpv1.ClusterNetworkPolicyIngressRule {
	r := cnpv1.ClusterNetworkPolicyIngressRule{Action: a, Protocols: protos}
	for _, p := range from {
		r.From = append(r.From, cnpv1.ClusterNetworkPolicyIngressPeer{Namespaces: p.nss, Pods: p.pods})
	}
	return r
}

func cout(a cnpv1.ClusterNetworkPolicyRuleAction, to []cnpPeer, protos ...cnpv1.ClusterNetworkPolicyProtocol) cnpv1.ClusterNetworkPolicyEgressRule {
	r := cnpv1.ClusterNetworkPolicyEgressRule{Action: a, Protocols: protos}
	for _, p := range to {
		r.To = append(r.To, cnpv1.ClusterNetworkPolicyEgressPeer{Namespaces: p.nss, Pods: p.pods, Networks: p.nets, Nodes: p.nodes})
	}
	return r
}

func ins(r ...cnpv1.ClusterNetworkPolicyIngressRule) []cnpv1.ClusterNetworkPolicyIngressRule {
	return r
}
func outs(r ...cnpv1.ClusterNetworkPolicyEgressRule) []cnpv1.ClusterNetworkPolicyEgressRule { return r }
func cpeers(p ...cnpPeer) []cnpPeer                                                         { return p }

// probe is one flow of the local pod: its direction, its peer, protocol
// (tcp, udp, sctp, icmp) and destination port, and what must decide it:
// "allow" or "deny", optionally with the policy that won ("deny by x").
type probe struct {
	dir   policy.Direction
	peer  string
	proto string
	port  uint16
	want  string
}

func pin(peer, proto string, port uint16, want string) probe {
	return probe{policy.Ingress, peer, proto, port, want}
}
func pout(peer, proto string, port uint16, want string) probe {
	return probe{policy.Egress, peer, proto, port, want}
}

var protoNums = map[string]uint8{"tcp": 6, "udp": 17, "sctp": 132, "icmp": 1}

// decide is what the programs decide for p with the entries of dr
// (lib/policy.h policy_rule_allows), and the source the entry names for
// it ("" when it names none).
func decide(r *Result, dr *DirRules, p probe) (bool, string) {
	switch dr.State {
	case policy.StateOpen:
		return true, ""
	case policy.StateClosed:
		return false, ""
	}
	a := netip.MustParseAddr(p.peer)
	var best *policy.Entry
	for i := range dr.Entries {
		e := &dr.Entries[i]
		if e.Prefix.Contains(a) && (best == nil || e.Prefix.Bits() > best.Prefix.Bits()) {
			best = e
		}
	}
	if best == nil {
		return false, ""
	}
	rule := &best.Rule
	name := func(src uint8) string {
		if src == 0 || int(src) > int(rule.N_sources) {
			return ""
		}
		return r.Names[rule.Sources[src-1]].Name
	}
	if rule.Flags&uint8(maps.CniPolicyRuleFlagsPOLICY_F_ALL_PORTS) != 0 {
		if rule.N_sources == 1 {
			return true, name(1)
		}
		return true, name(rule.Rest)
	}
	except := rule.Flags&uint8(maps.CniPolicyRuleFlagsPOLICY_F_EXCEPT_PORTS) != 0
	proto := protoNums[p.proto]
	if proto != 6 && proto != 17 && proto != 132 {
		return except, name(rule.Rest)
	}
	for _, pr := range rule.Ports[:rule.N_ports] {
		if pr.Proto == proto && p.port >= pr.First && p.port <= pr.Last {
			return pr.Src&uint8(maps.CniPolicyPortSrcPOLICY_PORT_DENIED) == 0, name(pr.Src & uint8(maps.CniPolicyPortSrcPOLICY_PORT_SRC))
		}
	}
	return except, name(rule.Rest)
}

func TestCompileClusterNetworkPolicy(t *testing.T) {
	all := sel()
	nsB := sel("kubernetes.io/metadata.name", "b")
	nsC := sel("kubernetes.io/metadata.name", "c")
	nsA := sel("kubernetes.io/metadata.name", "a")
	srv := sel("app", "server")
	// Peers: 10.0.2.2 (b/client), 10.0.2.3 (b/other), 10.0.3.2 and
	// fd00::3:2 (c/client), 10.0.1.2 (a/client); 192.0.2.1 a network.
	for _, tc := range []struct {
		name   string
		cnps   []*cnpv1.ClusterNetworkPolicy
		nps    []*networkingv1.NetworkPolicy
		state  [2]string // ingress, egress: "" for enforced
		probes []probe
	}{
		{name: "admin Deny from a namespace, the rest allowed by default",
			cnps:  []*cnpv1.ClusterNetworkPolicy{admin("deny-b", 10, subjNS(nsA), ins(cin(deny, cpeers(peerNS(nsB)))), nil)},
			state: [2]string{"", "open"},
			probes: []probe{pin("10.0.2.2", "tcp", 80, "deny by deny-b"), pin("10.0.2.3", "udp", 53, "deny by deny-b"),
				pin("10.0.2.2", "icmp", 0, "deny by deny-b"), pin("10.0.3.2", "tcp", 80, "allow"), pin("fd00::3:2", "tcp", 80, "allow"),
				pin("192.0.2.1", "tcp", 80, "allow")}},
		{name: "admin Deny overrides a NetworkPolicy allow",
			cnps: []*cnpv1.ClusterNetworkPolicy{admin("deny-b-80", 10, subjNS(nsA), ins(cin(deny, cpeers(peerNS(nsB)), tcp(80))), nil)},
			nps:  []*networkingv1.NetworkPolicy{np("a", "allow-80", all, ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(nil, port("", 80))}, nil)},
			probes: []probe{pin("10.0.2.2", "tcp", 80, "deny by deny-b-80"), pin("10.0.3.2", "tcp", 80, "allow by allow-80"),
				pin("10.0.3.2", "tcp", 81, "deny by allow-80"), pin("10.0.2.2", "tcp", 81, "deny by allow-80"), pin("192.0.2.1", "tcp", 80, "allow by allow-80")}},
		{name: "admin Accept overrides a NetworkPolicy deny",
			cnps: []*cnpv1.ClusterNetworkPolicy{admin("accept-c", 10, subjNS(all), ins(cin(accept, cpeers(peerNS(nsC)), tcp(80))), nil)},
			nps:  []*networkingv1.NetworkPolicy{np("a", "deny", all, ingressOnly, nil, nil)},
			probes: []probe{pin("10.0.3.2", "tcp", 80, "allow by accept-c"), pin("fd00::3:2", "tcp", 80, "allow by accept-c"),
				pin("10.0.3.2", "tcp", 81, "deny by deny"), pin("10.0.2.2", "tcp", 80, "deny by deny")}},
		{name: "admin Pass goes to the NetworkPolicy tier, skipping the rest of the Admin tier",
			cnps: []*cnpv1.ClusterNetworkPolicy{
				admin("pass-b", 10, subjNS(nsA), ins(cin(pass, cpeers(peerNS(nsB)))), nil),
				admin("deny-all", 20, subjNS(nsA), ins(cin(deny, cpeers(peerNS(all)))), nil)},
			nps: []*networkingv1.NetworkPolicy{np("a", "allow-b-80", all, ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(nil, nsB)), port("", 80))}, nil)},
			probes: []probe{pin("10.0.2.2", "tcp", 80, "allow by allow-b-80"), pin("10.0.2.2", "tcp", 81, "deny by allow-b-80"),
				pin("10.0.3.2", "tcp", 80, "deny by deny-all"), pin("192.0.2.1", "tcp", 80, "deny by allow-b-80")}},
		{name: "admin Pass where no NetworkPolicy selects goes on to the Baseline tier",
			cnps: []*cnpv1.ClusterNetworkPolicy{
				admin("pass-b", 10, subjNS(nsA), ins(cin(pass, cpeers(peerNS(nsB)))), nil),
				admin("deny-b", 20, subjNS(nsA), ins(cin(deny, cpeers(peerNS(nsB)))), nil),
				baseline("base-deny-b81", 0, subjNS(nsA), ins(cin(deny, cpeers(peerNS(nsB)), tcp(81))), nil)},
			probes: []probe{pin("10.0.2.2", "tcp", 80, "allow"), pin("10.0.2.2", "tcp", 81, "deny by base-deny-b81"), pin("10.0.3.2", "tcp", 81, "allow")}},
		{name: "baseline Deny where no NetworkPolicy selects",
			cnps:  []*cnpv1.ClusterNetworkPolicy{baseline("default-deny", 0, subjNS(all), ins(cin(deny, cpeers(peerNS(all)))), nil)},
			state: [2]string{"", "open"},
			probes: []probe{pin("10.0.2.2", "tcp", 80, "deny by default-deny"), pin("fd00::3:2", "udp", 53, "deny by default-deny"),
				pin("192.0.2.1", "tcp", 80, "allow")}},
		{name: "baseline overridden by a NetworkPolicy allow, and by its isolation",
			cnps: []*cnpv1.ClusterNetworkPolicy{
				baseline("base-deny", 0, subjNS(all), ins(cin(deny, cpeers(peerNS(nsB)))), nil),
				baseline("base-accept-c", 1, subjNS(all), ins(cin(accept, cpeers(peerNS(nsC)))), nil)},
			nps: []*networkingv1.NetworkPolicy{np("a", "allow-b", all, ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(nil, nsB)), port("", 80))}, nil)},
			probes: []probe{pin("10.0.2.2", "tcp", 80, "allow by allow-b"), pin("10.0.3.2", "tcp", 80, "deny by allow-b"),
				pin("10.0.2.2", "tcp", 81, "deny by allow-b")}},
		{name: "rules of a policy in order: the first that matches decides",
			cnps: []*cnpv1.ClusterNetworkPolicy{baseline("ordered", 0, subjNS(nsA), ins(
				cin(accept, cpeers(peerPods(nsB, sel("app", "client")))),
				cin(deny, cpeers(peerNS(all)))), nil)},
			probes: []probe{pin("10.0.2.2", "tcp", 80, "allow by ordered"), pin("10.0.2.3", "tcp", 80, "deny by ordered"), pin("10.0.1.2", "udp", 9, "deny by ordered")}},
		{name: "priority: the lower number decides",
			cnps: []*cnpv1.ClusterNetworkPolicy{
				admin("z-first", 5, subjNS(nsA), ins(cin(accept, cpeers(peerNS(nsB)))), nil),
				admin("a-second", 50, subjNS(nsA), ins(cin(deny, cpeers(peerNS(nsB)))), nil)},
			probes: []probe{pin("10.0.2.2", "tcp", 80, "allow by z-first")}},
		{name: "priority reordered: the same policies, the other wins",
			cnps: []*cnpv1.ClusterNetworkPolicy{
				admin("z-first", 500, subjNS(nsA), ins(cin(accept, cpeers(peerNS(nsB)))), nil),
				admin("a-second", 50, subjNS(nsA), ins(cin(deny, cpeers(peerNS(nsB)))), nil)},
			probes: []probe{pin("10.0.2.2", "tcp", 80, "deny by a-second")}},
		{name: "equal priorities: by name, the same on every node",
			cnps: []*cnpv1.ClusterNetworkPolicy{
				admin("b-deny", 7, subjNS(nsA), ins(cin(deny, cpeers(peerNS(nsB)))), nil),
				admin("a-accept", 7, subjNS(nsA), ins(cin(accept, cpeers(peerNS(nsB)))), nil)},
			probes: []probe{pin("10.0.2.2", "tcp", 80, "allow by a-accept")}},
		{name: "any Admin policy before any Baseline policy, whatever their priorities",
			cnps: []*cnpv1.ClusterNetworkPolicy{
				baseline("base-accept", 0, subjNS(nsA), ins(cin(accept, cpeers(peerNS(nsB)))), nil),
				admin("admin-deny", 1000, subjNS(nsA), ins(cin(deny, cpeers(peerNS(nsB)))), nil)},
			probes: []probe{pin("10.0.2.2", "tcp", 80, "deny by admin-deny")}},
		{name: "baseline Pass: the rest of the Baseline tier skipped, allowed by default",
			cnps: []*cnpv1.ClusterNetworkPolicy{
				baseline("base-pass", 1, subjNS(nsA), ins(cin(pass, cpeers(peerNS(nsB)))), nil),
				baseline("base-deny", 2, subjNS(nsA), ins(cin(deny, cpeers(peerNS(all)))), nil)},
			probes: []probe{pin("10.0.2.2", "tcp", 80, "allow"), pin("10.0.3.2", "tcp", 80, "deny by base-deny")}},
		{name: "egress networks with overlapping CIDRs: the more precise Accept first, then the Deny of the wider",
			cnps: []*cnpv1.ClusterNetworkPolicy{
				admin("accept-b-net", 1, subjNS(nsA), nil, outs(cout(accept, cpeers(peerNets("10.0.2.0/24"))))),
				admin("deny-10", 2, subjNS(nsA), nil, outs(cout(deny, cpeers(peerNets("10.0.0.0/8", "fd00::/16")))))},
			state: [2]string{"open", ""},
			probes: []probe{pout("10.0.2.2", "tcp", 80, "allow by accept-b-net"), pout("10.0.2.200", "udp", 1, "allow by accept-b-net"),
				pout("10.0.3.2", "tcp", 80, "deny by deny-10"), pout("10.200.0.1", "icmp", 0, "deny by deny-10"), pout("fd00::3:2", "tcp", 80, "deny by deny-10"),
				pout("192.0.2.1", "tcp", 80, "allow"), pout("2001:db8::1", "tcp", 80, "allow")}},
		{name: "egress networks overlapping, the wider first: it decides the narrower too",
			cnps: []*cnpv1.ClusterNetworkPolicy{
				admin("deny-10", 1, subjNS(nsA), nil, outs(cout(deny, cpeers(peerNets("10.0.0.0/8"))))),
				admin("accept-b-net", 2, subjNS(nsA), nil, outs(cout(accept, cpeers(peerNets("10.0.2.0/24")))))},
			probes: []probe{pout("10.0.2.2", "tcp", 80, "deny by deny-10"), pout("10.0.3.2", "tcp", 80, "deny by deny-10")}},
		{name: "networks and pods in one policy: a pod in a denied network accepted by an earlier rule",
			cnps: []*cnpv1.ClusterNetworkPolicy{admin("mixed", 1, subjNS(nsA), nil, outs(
				cout(accept, cpeers(peerPods(nsC, all)), udp(53)),
				cout(deny, cpeers(peerNets("10.0.0.0/8")))))},
			probes: []probe{pout("10.0.3.2", "udp", 53, "allow by mixed"), pout("10.0.3.2", "tcp", 53, "deny by mixed"),
				pout("10.0.3.3", "udp", 53, "deny by mixed"), pout("fd00::3:2", "tcp", 53, "allow")}},
		{name: "a port range: denied inside, allowed around it, other protocols untouched",
			cnps: []*cnpv1.ClusterNetworkPolicy{admin("deny-range", 1, subjNS(nsA), ins(cin(deny, cpeers(peerNS(all)), tcpRange(8000, 9000))), nil)},
			probes: []probe{pin("10.0.2.2", "tcp", 8000, "deny by deny-range"), pin("10.0.2.2", "tcp", 9000, "deny by deny-range"),
				pin("10.0.2.2", "tcp", 7999, "allow"), pin("10.0.2.2", "tcp", 9001, "allow"), pin("10.0.2.2", "udp", 8500, "allow"),
				pin("10.0.2.2", "icmp", 0, "allow"), pin("10.0.2.2", "sctp", 8500, "allow")}},
		{name: "protocols: each its own ports",
			cnps: []*cnpv1.ClusterNetworkPolicy{admin("deny-dns", 1, subjNS(nsA), nil, outs(cout(deny, cpeers(peerNets("0.0.0.0/0")), udp(53), sctp(53))))},
			probes: []probe{pout("10.0.2.2", "udp", 53, "deny by deny-dns"), pout("10.0.2.2", "sctp", 53, "deny by deny-dns"),
				pout("10.0.2.2", "tcp", 53, "allow"), pout("10.0.2.2", "udp", 54, "allow"), pout("fd00::3:2", "udp", 53, "allow")}},
		{name: "ICMP: matched by a rule without protocols only",
			cnps: []*cnpv1.ClusterNetworkPolicy{
				admin("accept-tcp", 1, subjNS(nsA), nil, outs(cout(accept, cpeers(peerNets("192.0.2.0/24")), tcp(443)))),
				admin("deny-rest", 2, subjNS(nsA), nil, outs(cout(deny, cpeers(peerNets("192.0.2.0/24")))))},
			probes: []probe{pout("192.0.2.1", "tcp", 443, "allow by accept-tcp"), pout("192.0.2.1", "icmp", 0, "deny by deny-rest"),
				pout("192.0.2.1", "tcp", 80, "deny by deny-rest"), pout("198.51.100.1", "icmp", 0, "allow")}},
		{name: "a subject by pods selects only the matching pods of the matching namespaces",
			cnps:  []*cnpv1.ClusterNetworkPolicy{admin("clients", 1, subjPods(nsA, sel("app", "client")), ins(cin(deny, cpeers(peerNS(all)))), nil)},
			state: [2]string{"open", "open"}},
		{name: "a subject by pods that selects the pod",
			cnps:   []*cnpv1.ClusterNetworkPolicy{admin("servers", 1, subjPods(all, srv), ins(cin(deny, cpeers(peerNS(nsC)))), nil)},
			state:  [2]string{"", "open"},
			probes: []probe{pin("10.0.3.2", "tcp", 1, "deny by servers"), pin("10.0.2.2", "tcp", 1, "allow")}},
		{name: "a subject of other namespaces leaves the pod open",
			cnps:  []*cnpv1.ClusterNetworkPolicy{admin("other", 1, subjNS(nsB), ins(cin(deny, cpeers(peerNS(all)))), outs(cout(deny, cpeers(peerNS(all)))))},
			state: [2]string{"open", "open"}},
		{name: "a policy without egress rules leaves egress alone",
			cnps:   []*cnpv1.ClusterNetworkPolicy{admin("in-only", 1, subjNS(all), ins(cin(accept, cpeers(peerNS(nsB)))), nil)},
			state:  [2]string{"", "open"},
			probes: []probe{pin("10.0.2.2", "tcp", 1, "allow by in-only"), pin("10.0.3.2", "tcp", 1, "allow")}},
		{name: "a named port of ingress is the selected pod's",
			cnps:   []*cnpv1.ClusterNetworkPolicy{admin("deny-http", 1, subjNS(nsA), ins(cin(deny, cpeers(peerNS(all)), namedPortP("http"))), nil)},
			probes: []probe{pin("10.0.2.2", "tcp", 8080, "deny by deny-http"), pin("10.0.2.2", "tcp", 9090, "allow"), pin("10.0.2.2", "udp", 8080, "allow")}},
		{name: "a named port of egress is each peer pod's",
			cnps: []*cnpv1.ClusterNetworkPolicy{admin("deny-http", 1, subjNS(nsA), nil, outs(cout(deny, cpeers(peerNS(all)), namedPortP("http"))))},
			probes: []probe{pout("10.0.1.2", "tcp", 9090, "deny by deny-http"), pout("10.0.2.2", "tcp", 7070, "deny by deny-http"),
				pout("10.0.2.2", "tcp", 9090, "allow"), pout("10.0.3.2", "tcp", 9090, "allow")}},
		{name: "egress Accept is final for the Admin tier and the NetworkPolicy tier",
			cnps: []*cnpv1.ClusterNetworkPolicy{admin("dns", 1, subjNS(all), nil, outs(cout(accept, cpeers(peerPods(nsC, all)), udp(53))))},
			nps:  []*networkingv1.NetworkPolicy{np("a", "deny-out", all, egressOnly, nil, nil)},
			probes: []probe{pout("10.0.3.2", "udp", 53, "allow by dns"), pout("fd00::3:2", "udp", 53, "allow by dns"),
				pout("10.0.3.2", "tcp", 53, "deny by deny-out"), pout("192.0.2.1", "udp", 53, "deny by deny-out")}},
		{name: "a peer this build cannot read: a Deny rule denies everything",
			cnps:   []*cnpv1.ClusterNetworkPolicy{admin("nodes", 1, subjNS(nsA), nil, outs(cout(deny, cpeers(cnpPeer{nodes: all}), tcp(22))))},
			probes: []probe{pout("10.0.2.2", "tcp", 80, "deny by nodes"), pout("192.0.2.1", "icmp", 0, "deny by nodes")}},
		{name: "a peer this build cannot read: an Accept rule matches nothing",
			cnps: []*cnpv1.ClusterNetworkPolicy{
				admin("nodes", 1, subjNS(nsA), nil, outs(cout(accept, cpeers(cnpPeer{nodes: all})))),
				baseline("deny", 1, subjNS(nsA), nil, outs(cout(deny, cpeers(peerNets("192.0.2.0/24")))))},
			probes: []probe{pout("192.0.2.1", "tcp", 80, "deny by deny"), pout("10.0.2.2", "tcp", 80, "allow")}},
		{name: "isolated by NetworkPolicy, egress peers in an except of its ipBlock",
			cnps: []*cnpv1.ClusterNetworkPolicy{admin("deny-443", 1, subjNS(nsA), nil, outs(cout(deny, cpeers(peerNets("10.0.0.0/8")), tcp(443))))},
			nps:  []*networkingv1.NetworkPolicy{np("a", "to-10", all, egressOnly, nil, []networkingv1.NetworkPolicyEgressRule{out(peers(blockPeer("10.0.0.0/8", "10.0.3.0/24")))})},
			probes: []probe{pout("10.0.2.2", "tcp", 443, "deny by deny-443"), pout("10.0.2.2", "tcp", 80, "allow by to-10"),
				pout("10.0.3.2", "tcp", 80, "deny by to-10"), pout("10.0.3.2", "tcp", 443, "deny by deny-443"), pout("192.0.2.1", "tcp", 80, "deny by to-10")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nss, pods := cluster()
			r := Compile(Cluster{Policies: tc.nps, ClusterPolicies: tc.cnps, Pods: pods, Namespaces: nss}, []LocalEndpoint{server})
			require.Empty(t, r.Errors)
			er := r.Endpoints[server.Ifindex]
			for i, d := range []policy.Direction{policy.Ingress, policy.Egress} {
				want := tc.state[i]
				if want == "" {
					want = "enforced"
				}
				if tc.state == [2]string{} {
					// Directions the probes leave out: open unless a policy has rules for them.
					want = ""
				}
				if want != "" {
					require.Equal(t, want, er.Dir(d).State.String(), "%s", d)
				}
			}
			for _, p := range tc.probes {
				ok, by := decide(r, er.Dir(p.dir), p)
				got := map[bool]string{true: "allow", false: "deny"}[ok]
				wantVerdict, wantBy, hasBy := strings.Cut(p.want, " by ")
				require.Equal(t, wantVerdict, got, "%s %s %s/%d\n%s", p.dir, p.peer, p.proto, p.port, strings.Join(describeTiered(r, er.Dir(p.dir)), "\n"))
				if hasBy {
					require.Equal(t, wantBy, by, "%s %s %s/%d: the policy that decided\n%s", p.dir, p.peer, p.proto, p.port, strings.Join(describeTiered(r, er.Dir(p.dir)), "\n"))
				}
			}
		})
	}
}

// describeTiered is describe with the flags and each range's source.
func describeTiered(r *Result, d *DirRules) []string {
	out := []string{d.State.String()}
	for _, e := range d.Entries {
		s := fmt.Sprintf("%s flags=%d rest=%d", e.Prefix, e.Rule.Flags, e.Rule.Rest)
		for _, p := range e.Rule.Ports[:e.Rule.N_ports] {
			s += fmt.Sprintf(" %d:%d-%d(%#x)", p.Proto, p.First, p.Last, p.Src)
		}
		var srcs []string
		for _, id := range e.Rule.Sources[:e.Rule.N_sources] {
			srcs = append(srcs, r.Names[id].String())
		}
		out = append(out, s+" ["+strings.Join(srcs, ",")+"]")
	}
	return out
}

func TestCompileClusterNetworkPolicyNamesAndNamespaces(t *testing.T) {
	nss, pods := cluster()
	r := Compile(Cluster{Pods: pods, Namespaces: nss, ClusterPolicies: []*cnpv1.ClusterNetworkPolicy{
		admin("team-x", 10, subjNS(sel("team", "x")), ins(cin(deny, cpeers(peerNS(sel("team", "y"))))), nil),
		baseline("egress-c", 3, subjNS(sel("kubernetes.io/metadata.name", "c")), nil, outs(cout(deny, cpeers(peerNets("0.0.0.0/0"))))),
	}}, nil)
	require.Equal(t, map[string]policy.NamespaceFact{"a": {Ingress: true}, "b": {Ingress: true}, "c": {Egress: true}}, r.Namespaces,
		"a new pod of a namespace a ClusterNetworkPolicy selects starts closed where it has rules")
	require.Equal(t, map[uint32]policy.Source{
		policy.ID("", "team-x"):   {Tier: policy.TierAdmin, Priority: 10, Name: "team-x"},
		policy.ID("", "egress-c"): {Tier: policy.TierBaseline, Priority: 3, Name: "egress-c"},
	}, r.Names)
	require.Equal(t, "Admin:10/team-x", r.Names[policy.ID("", "team-x")].String())
}

func TestCompileClusterNetworkPolicyUnlistedPodClosed(t *testing.T) {
	nss, pods := cluster()
	newPod := LocalEndpoint{Ifindex: 11, Namespace: "b", Name: "new", UID: "b-new", IPs: []netip.Addr{netip.MustParseAddr("10.0.2.9")}}
	r := Compile(Cluster{Pods: pods, Namespaces: nss, ClusterPolicies: []*cnpv1.ClusterNetworkPolicy{
		admin("x", 1, subjNS(sel("team", "x")), nil, outs(cout(deny, cpeers(peerNets("192.0.2.0/24"))))),
	}}, []LocalEndpoint{newPod})
	require.Equal(t, policy.StateOpen, r.Endpoints[11].Ingress.State)
	require.Equal(t, policy.StateClosed, r.Endpoints[11].Egress.State, "its labels unknown: closed where a ClusterNetworkPolicy may select it")
}

func TestCompileClusterNetworkPolicyTooManyRangesFailsClosed(t *testing.T) {
	nss, pods := cluster()
	var protos []cnpv1.ClusterNetworkPolicyProtocol
	for i := range int32(20) {
		protos = append(protos, tcp(1000+2*i))
	}
	r := Compile(Cluster{Pods: pods, Namespaces: nss, ClusterPolicies: []*cnpv1.ClusterNetworkPolicy{
		admin("many", 1, subjNS(sel()), ins(cin(deny, cpeers(peerNS(sel())), protos...)), nil),
	}}, []LocalEndpoint{server})
	require.ErrorContains(t, r.Errors[server.Ifindex], "port ranges, at most 16 fit")
	er := r.Endpoints[server.Ifindex]
	for port := uint16(1000); port < 1040; port += 2 {
		ok, _ := decide(r, &er.Ingress, pin("10.0.2.2", "tcp", port, ""))
		require.False(t, ok, "tcp/%d: a denied port never allowed", port)
	}
	ok, _ := decide(r, &er.Ingress, pin("10.0.2.2", "icmp", 0, ""))
	require.False(t, ok, "what does not fit fails closed")
}

func TestCompileClusterNetworkPolicyCache(t *testing.T) {
	nss, pods := cluster()
	p := admin("x", 1, subjNS(sel()), ins(cin(deny, cpeers(peerNS(sel("kubernetes.io/metadata.name", "b"))))), nil)
	var c Compiler
	cl := Cluster{Pods: pods, Namespaces: nss, ClusterPolicies: []*cnpv1.ClusterNetworkPolicy{p}}
	r1 := c.Compile(cl, []LocalEndpoint{server})
	require.Same(t, c.cnpCache[p], c.cnpCache[p])
	r2 := c.Compile(cl, []LocalEndpoint{server})
	require.Equal(t, r1.Endpoints, r2.Endpoints)
	// A new object (an update): compiled again.
	q := p.DeepCopy()
	q.Spec.Ingress[0].Action = accept
	cl.ClusterPolicies = []*cnpv1.ClusterNetworkPolicy{q}
	r3 := c.Compile(cl, []LocalEndpoint{server})
	ok, _ := decide(r3, &r3.Endpoints[server.Ifindex].Ingress, pin("10.0.2.2", "tcp", 80, ""))
	require.True(t, ok)
	require.NotContains(t, c.cnpCache, p)
}

var _ = corev1.ProtocolTCP

// TestCompileClusterNetworkPolicyCandidatesAskEveryRule: random clusters
// of pods, NetworkPolicies and ClusterNetworkPolicies of both tiers, with
// every action, pod, namespace and (overlapping) network peers, ports,
// ranges and named ports: asking each region only the rules its peers
// name (candidates) compiles exactly what asking every rule everywhere
// does.
func TestCompileClusterNetworkPolicyCandidatesAskEveryRule(t *testing.T) {
	rng := rand.New(rand.NewPCG(57, 1))
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	nets := []string{"10.0.0.0/8", "10.0.2.0/24", "10.0.2.2/32", "10.0.3.0/25", "192.0.2.0/24", "192.0.2.128/25", "0.0.0.0/0", "fd00::/64", "fd00::3:0/112", "::/0"}
	actions := []cnpv1.ClusterNetworkPolicyRuleAction{accept, deny, pass}
	protos := func() []cnpv1.ClusterNetworkPolicyProtocol {
		var ps []cnpv1.ClusterNetworkPolicyProtocol
		for range rng.IntN(3) {
			switch rng.IntN(5) {
			case 0:
				ps = append(ps, tcp(int32(80+rng.IntN(3))))
			case 1:
				a := int32(75 + rng.IntN(10))
				ps = append(ps, tcpRange(a, a+int32(rng.IntN(10))))
			case 2:
				ps = append(ps, udp(int32(53+rng.IntN(2))))
			case 3:
				ps = append(ps, sctp(80))
			default:
				ps = append(ps, namedPortP(pick("http", "dns", "none")))
			}
		}
		return ps
	}
	peer := func(egress bool) cnpPeer {
		switch rng.IntN(4) {
		case 0:
			return peerNS(sel("kubernetes.io/metadata.name", pick("a", "b", "c")))
		case 1:
			return peerPods(sel("kubernetes.io/metadata.name", pick("a", "b", "c")), sel("app", pick("client", "server", "other")))
		case 2:
			if egress {
				return peerNets(pick(nets...), pick(nets...))
			}
			return peerNS(sel())
		default:
			return peerPods(sel(), sel("app", pick("client", "server")))
		}
	}
	for iter := range 200 {
		nss := []*corev1.Namespace{ns("a", nil), ns("b", nil), ns("c", nil)}
		var pods []*corev1.Pod
		var eps []LocalEndpoint
		for i := range 12 {
			nsName, app := pick("a", "b", "c"), pick("client", "server", "other")
			ip4 := netip.AddrFrom4([4]byte{10, 0, byte(2 + i%3), byte(2 + i)})
			ip6 := netip.MustParseAddr(fmt.Sprintf("fd00::3:%x", 2+i))
			p := pod(nsName, fmt.Sprintf("p%d", i), map[string]string{"app": app}, []string{ip4.String(), ip6.String()},
				ports(corev1.ContainerPort{Name: "http", ContainerPort: int32(80 + rng.IntN(2))}, corev1.ContainerPort{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}))
			pods = append(pods, p)
			if i < 3 {
				eps = append(eps, LocalEndpoint{Ifindex: uint32(100 + i), Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), IPs: []netip.Addr{ip4, ip6}})
			}
		}
		var cnps []*cnpv1.ClusterNetworkPolicy
		for j := range 1 + rng.IntN(6) {
			var in []cnpv1.ClusterNetworkPolicyIngressRule
			var out []cnpv1.ClusterNetworkPolicyEgressRule
			for range rng.IntN(3) {
				in = append(in, cin(actions[rng.IntN(3)], cpeers(peer(false), peer(false)), protos()...))
			}
			for range rng.IntN(3) {
				out = append(out, cout(actions[rng.IntN(3)], cpeers(peer(true)), protos()...))
			}
			tier := cnpv1.AdminTier
			if rng.IntN(2) == 0 {
				tier = cnpv1.BaselineTier
			}
			cnps = append(cnps, cnp(fmt.Sprintf("c%d", j), tier, int32(rng.IntN(4)), subjNS(sel()), in, out))
		}
		var nps []*networkingv1.NetworkPolicy
		if rng.IntN(2) == 0 {
			nps = append(nps, np(pick("a", "b", "c"), "np", sel(), both,
				[]networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(sel("app", "client"), nil)), port("", 80))},
				[]networkingv1.NetworkPolicyEgressRule{out(peers(blockPeer("10.0.0.0/8")), port(corev1.ProtocolUDP, 53))}))
		}
		cl := Cluster{Pods: pods, Namespaces: nss, Policies: nps, ClusterPolicies: cnps}
		var fast, every Compiler
		got := fast.Compile(cl, eps)
		askEveryRule = true
		want := every.Compile(cl, eps)
		askEveryRule = false
		require.Equal(t, want.Endpoints, got.Endpoints, "cluster %d", iter)
		require.Equal(t, fmt.Sprint(want.Errors), fmt.Sprint(got.Errors), "cluster %d", iter)
	}
}
