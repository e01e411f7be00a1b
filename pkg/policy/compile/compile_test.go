package compile

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// Fixtures: the local pod under test is ns a/"server" (ifindex 10).

type podOpt func(*corev1.Pod)

func pod(ns, name string, lbl map[string]string, ips []string, opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbl, UID: types.UID(ns + "-" + name)}}
	p.Status.Phase = corev1.PodRunning
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func ports(cps ...corev1.ContainerPort) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "c", Ports: cps})
	}
}

func ns(name string, lbl map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbl}}
}

func sel(kv ...string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

func np(ns, name string, podSel *metav1.LabelSelector, types []networkingv1.PolicyType, in []networkingv1.NetworkPolicyIngressRule, out []networkingv1.NetworkPolicyEgressRule) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *podSel, PolicyTypes: types, Ingress: in, Egress: out}}
}

func port(proto corev1.Protocol, p any, end ...int32) networkingv1.NetworkPolicyPort {
	var r networkingv1.NetworkPolicyPort
	if proto != "" {
		r.Protocol = &proto
	}
	switch v := p.(type) {
	case int:
		x := intstr.FromInt32(int32(v))
		r.Port = &x
	case string:
		x := intstr.FromString(v)
		r.Port = &x
	}
	if len(end) > 0 {
		r.EndPort = &end[0]
	}
	return r
}

func podPeer(podSel, nsSel *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: podSel, NamespaceSelector: nsSel}
}

func blockPeer(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

func in(peers []networkingv1.NetworkPolicyPeer, ps ...networkingv1.NetworkPolicyPort) networkingv1.NetworkPolicyIngressRule {
	return networkingv1.NetworkPolicyIngressRule{From: peers, Ports: ps}
}

func out(peers []networkingv1.NetworkPolicyPeer, ps ...networkingv1.NetworkPolicyPort) networkingv1.NetworkPolicyEgressRule {
	return networkingv1.NetworkPolicyEgressRule{To: peers, Ports: ps}
}

func peers(p ...networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyPeer { return p }

var (
	ingressOnly = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egressOnly  = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	both        = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
)

// describe is a direction in one line per entry: "prefix ports [sources]".
func describe(r *Result, d *DirRules) []string {
	out := []string{d.State.String()}
	for _, e := range d.Entries {
		var ps []string
		if e.Rule.Flags&uint8(1) != 0 {
			ps = append(ps, "all")
		}
		for _, p := range e.Rule.Ports[:e.Rule.N_ports] {
			name := map[uint8]string{6: "tcp", 17: "udp", 132: "sctp"}[p.Proto]
			if p.First == p.Last {
				ps = append(ps, fmt.Sprintf("%s:%d", name, p.First))
			} else {
				ps = append(ps, fmt.Sprintf("%s:%d-%d", name, p.First, p.Last))
			}
		}
		if len(ps) == 0 {
			ps = append(ps, "none")
		}
		var srcs []string
		for _, id := range e.Rule.Sources[:e.Rule.N_sources] {
			srcs = append(srcs, r.Names[id].Name)
		}
		out = append(out, fmt.Sprintf("%s %s [%s]", e.Prefix, strings.Join(ps, ","), strings.Join(srcs, ",")))
	}
	return out
}

// The cluster of every case: namespaces a (team=x), b (team=x), c; pods
// with addresses in 10.0.<ns>.<n> and fd00::<ns>:<n>.
func cluster() ([]*corev1.Namespace, []*corev1.Pod) {
	nss := []*corev1.Namespace{ns("a", map[string]string{"team": "x"}), ns("b", map[string]string{"team": "x"}), ns("c", nil)}
	pods := []*corev1.Pod{
		pod("a", "server", map[string]string{"app": "server"}, []string{"10.0.1.1", "fd00::1:1"},
			ports(corev1.ContainerPort{Name: "http", ContainerPort: 8080}, corev1.ContainerPort{Name: "dns", ContainerPort: 5353, Protocol: corev1.ProtocolUDP})),
		pod("a", "client", map[string]string{"app": "client"}, []string{"10.0.1.2"},
			ports(corev1.ContainerPort{Name: "http", ContainerPort: 9090})),
		pod("b", "client", map[string]string{"app": "client"}, []string{"10.0.2.2"},
			ports(corev1.ContainerPort{Name: "http", ContainerPort: 7070})),
		pod("b", "other", map[string]string{"app": "other"}, []string{"10.0.2.3"}),
		pod("c", "client", map[string]string{"app": "client"}, []string{"10.0.3.2", "fd00::3:2"}),
		pod("c", "host", map[string]string{"app": "client"}, []string{"10.9.9.9"}, func(p *corev1.Pod) { p.Spec.HostNetwork = true }),
		pod("c", "done", map[string]string{"app": "client"}, []string{"10.0.3.9"}, func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
		pod("c", "pending", map[string]string{"app": "client"}, nil),
	}
	return nss, pods
}

var server = LocalEndpoint{Ifindex: 10, Namespace: "a", Name: "server", UID: "a-server", IPs: []netip.Addr{netip.MustParseAddr("10.0.1.1")}}

func TestCompile(t *testing.T) {
	all := sel()
	srv := sel("app", "server")
	cli := sel("app", "client")
	for _, tc := range []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		extra    []*corev1.Pod
		eps      []LocalEndpoint // default: server
		ingress  []string        // state, then entries
		egress   []string
		err      string
	}{
		{name: "no policy", ingress: []string{"open"}, egress: []string{"open"}},
		{name: "default deny ingress", policies: []*networkingv1.NetworkPolicy{np("a", "deny", all, ingressOnly, nil, nil)},
			ingress: []string{"enforced"}, egress: []string{"open"}},
		{name: "policyTypes empty: ingress only without egress rules",
			policies: []*networkingv1.NetworkPolicy{np("a", "p", all, nil, []networkingv1.NetworkPolicyIngressRule{in(nil)}, nil)},
			ingress:  []string{"enforced", "0.0.0.0/0 all [p]", "::/0 all [p]"}, egress: []string{"open"}},
		{name: "policyTypes empty: egress when egress rules",
			policies: []*networkingv1.NetworkPolicy{np("a", "p", all, nil, nil, []networkingv1.NetworkPolicyEgressRule{out(peers(podPeer(cli, nil)), port("", 53))})},
			ingress:  []string{"enforced"}, egress: []string{"enforced", "10.0.1.2/32 tcp:53 [p]"}},
		{name: "ingress rules of an egress-only policy are ignored",
			policies: []*networkingv1.NetworkPolicy{np("a", "p", all, egressOnly, []networkingv1.NetworkPolicyIngressRule{in(nil)}, nil)},
			ingress:  []string{"open"}, egress: []string{"enforced"}},
		{name: "a policy selecting other pods", policies: []*networkingv1.NetworkPolicy{np("a", "p", cli, both, nil, nil)},
			ingress: []string{"open"}, egress: []string{"open"}},
		{name: "a policy of another namespace", policies: []*networkingv1.NetworkPolicy{np("b", "p", all, both, nil, nil)},
			ingress: []string{"open"}, egress: []string{"open"}},
		{name: "pod selector: pods of the policy's namespace, TCP by default",
			policies: []*networkingv1.NetworkPolicy{np("a", "p", srv, ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(cli, nil)), port("", 80))}, nil)},
			ingress:  []string{"enforced", "10.0.1.2/32 tcp:80 [p]"}, egress: []string{"open"}},
		{name: "namespace selector: every pod of the matching namespaces; finished, host-network and address-less pods are no peers",
			policies: []*networkingv1.NetworkPolicy{np("a", "p", srv, ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(nil, sel("kubernetes.io/metadata.name", "c"))), port(corev1.ProtocolUDP, 53))}, nil)},
			ingress:  []string{"enforced", "10.0.3.2/32 udp:53 [p]", "fd00::3:2/128 udp:53 [p]"}, egress: []string{"open"}},
		{name: "namespace selector by label",
			policies: []*networkingv1.NetworkPolicy{np("a", "p", srv, ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(nil, sel("team", "x"))), port(corev1.ProtocolSCTP, 9))}, nil)},
			ingress: []string{"enforced", "10.0.1.1/32 sctp:9 [p]", "10.0.1.2/32 sctp:9 [p]", "10.0.2.2/32 sctp:9 [p]", "10.0.2.3/32 sctp:9 [p]",
				"fd00::1:1/128 sctp:9 [p]"}, egress: []string{"open"}},
		{name: "pod and namespace selectors combined",
			policies: []*networkingv1.NetworkPolicy{np("a", "p", srv, ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(cli, sel("team", "x"))))}, nil)},
			ingress:  []string{"enforced", "10.0.1.2/32 all [p]", "10.0.2.2/32 all [p]"}, egress: []string{"open"}},
		{name: "empty namespace selector: every namespace",
			policies: []*networkingv1.NetworkPolicy{np("a", "p", srv, ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(cli, all)))}, nil)},
			ingress:  []string{"enforced", "10.0.1.2/32 all [p]", "10.0.2.2/32 all [p]", "10.0.3.2/32 all [p]", "fd00::3:2/128 all [p]"}, egress: []string{"open"}},
		{name: "a selector that cannot be read selects nothing (not everything)",
			policies: []*networkingv1.NetworkPolicy{np("a", "p", srv, ingressOnly, []networkingv1.NetworkPolicyIngressRule{
				in(peers(podPeer(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Bogus"}}}, nil)), port("", 1)),
				in(peers(podPeer(all, nil)), port("", 2))}, nil)},
			ingress: []string{"enforced", "10.0.1.1/32 tcp:2 [p]", "10.0.1.2/32 tcp:2 [p]", "fd00::1:1/128 tcp:2 [p]"}, egress: []string{"open"}},
		{name: "ipBlock with except; a pod inside the except gets only its own rights, one outside the union",
			policies: []*networkingv1.NetworkPolicy{
				np("a", "block", srv, ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(blockPeer("10.0.0.0/16", "10.0.2.0/24", "10.1.0.0/24")), port("", 443))}, nil),
				np("a", "pods", srv, ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(cli, all)), port("", 80))}, nil),
			},
			ingress: []string{"enforced", "10.0.0.0/16 tcp:443 [block]", "10.0.1.2/32 tcp:80,tcp:443 [block,pods]", "10.0.2.0/24 none []",
				"10.0.2.2/32 tcp:80 [pods]", "10.0.3.2/32 tcp:80,tcp:443 [block,pods]", "fd00::3:2/128 tcp:80 [pods]"}, egress: []string{"open"}},
		{name: "an except's own entry has what a wider block gives it",
			policies: []*networkingv1.NetworkPolicy{
				np("a", "narrow", srv, ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(blockPeer("192.168.0.0/16", "192.168.1.0/24")), port("", 1))}, nil),
				np("a", "wide", srv, ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(blockPeer("192.0.0.0/8")), port("", 2))}, nil),
			},
			ingress: []string{"enforced", "192.0.0.0/8 tcp:2 [wide]", "192.168.0.0/16 tcp:1-2 [narrow,wide]", "192.168.1.0/24 tcp:2 [wide]"}, egress: []string{"open"}},
		{name: "named port of ingress: resolved on the selected pod, with its protocol",
			policies: []*networkingv1.NetworkPolicy{np("a", "p", srv, ingressOnly, []networkingv1.NetworkPolicyIngressRule{
				in(peers(podPeer(cli, nil)), port("", "http"), port(corev1.ProtocolUDP, "dns"), port("", "dns"), port("", "missing"))}, nil)},
			ingress: []string{"enforced", "10.0.1.2/32 tcp:8080,udp:5353 [p]"}, egress: []string{"open"}},
		{name: "named port of egress: resolved on each peer; an ipBlock matches no named port",
			policies: []*networkingv1.NetworkPolicy{np("a", "p", srv, egressOnly, nil, []networkingv1.NetworkPolicyEgressRule{
				out(peers(podPeer(cli, all), blockPeer("172.16.0.0/12")), port("", "http"))})},
			ingress: []string{"open"}, egress: []string{"enforced", "10.0.1.2/32 tcp:9090 [p]", "10.0.2.2/32 tcp:7070 [p]"}},
		{name: "endPort, a protocol without port, SCTP",
			policies: []*networkingv1.NetworkPolicy{np("a", "p", srv, egressOnly, nil, []networkingv1.NetworkPolicyEgressRule{
				out(peers(blockPeer("10.0.0.0/8")), port("", 1000, 2000), port(corev1.ProtocolUDP, nil), port(corev1.ProtocolSCTP, 7, 9))})},
			ingress: []string{"open"}, egress: []string{"enforced", "10.0.0.0/8 tcp:1000-2000,udp:0-65535,sctp:7-9 [p]"}},
		{name: "no peers: every address of both families; no ports: every port",
			policies: []*networkingv1.NetworkPolicy{np("a", "p", srv, egressOnly, nil, []networkingv1.NetworkPolicyEgressRule{out(nil, port("", 53), port(corev1.ProtocolUDP, 53)), out(peers(podPeer(cli, nil)))})},
			ingress:  []string{"open"}, egress: []string{"enforced", "0.0.0.0/0 tcp:53,udp:53 [p]", "10.0.1.2/32 all [p]", "::/0 tcp:53,udp:53 [p]"}},
		{name: "no peers and a named port: every address for the numbers, every pod of every namespace for the name",
			policies: []*networkingv1.NetworkPolicy{np("a", "p", srv, egressOnly, nil, []networkingv1.NetworkPolicyEgressRule{out(nil, port("", "http"), port("", 53))})},
			ingress:  []string{"open"}, egress: []string{"enforced", "0.0.0.0/0 tcp:53 [p]", "10.0.1.1/32 tcp:53,tcp:8080 [p]",
				"10.0.1.2/32 tcp:53,tcp:9090 [p]", "10.0.2.2/32 tcp:53,tcp:7070 [p]", "::/0 tcp:53 [p]", "fd00::1:1/128 tcp:53,tcp:8080 [p]"}},
		{name: "rules are unions: ports merged and deduplicated, overlapping ranges of a protocol merged, sources of both",
			policies: []*networkingv1.NetworkPolicy{
				np("a", "p1", srv, ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(cli, nil)), port("", 80), port("", 100, 200), port(corev1.ProtocolUDP, 150))}, nil),
				np("a", "p2", all, ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(cli, nil)), port("", 80), port("", 150, 300), port("", 301))}, nil),
			},
			ingress: []string{"enforced", "10.0.1.2/32 tcp:80,tcp:100-301,udp:150 [p1,p2]"}, egress: []string{"open"}},
		{name: "at most 4 sources: the first ones by namespace/name",
			policies: []*networkingv1.NetworkPolicy{
				np("a", "p5", srv, ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(cli, nil)), port("", 5))}, nil),
				np("a", "p4", srv, ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(cli, nil)), port("", 4))}, nil),
				np("a", "p3", srv, ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(cli, nil)), port("", 3))}, nil),
				np("a", "p2", srv, ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(cli, nil)), port("", 2))}, nil),
				np("a", "p1", srv, ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(cli, nil)), port("", 1))}, nil),
			},
			ingress: []string{"enforced", "10.0.1.2/32 tcp:1-5 [p1,p2,p3,p4]"}, egress: []string{"open"}},
		{name: "more port ranges than fit: the first 16 and an error",
			policies: []*networkingv1.NetworkPolicy{np("a", "p", srv, ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(cli, nil)),
				port("", 1), port("", 3), port("", 5), port("", 7), port("", 9), port("", 11), port("", 13), port("", 15), port("", 17),
				port("", 19), port("", 21), port("", 23), port("", 25), port("", 27), port("", 29), port("", 31), port("", 33))}, nil)},
			ingress: []string{"enforced", "10.0.1.2/32 tcp:1,tcp:3,tcp:5,tcp:7,tcp:9,tcp:11,tcp:13,tcp:15,tcp:17,tcp:19,tcp:21,tcp:23,tcp:25,tcp:27,tcp:29,tcp:31 [p]"},
			egress:  []string{"open"}, err: "endpoint a/server (ifindex 10): ingress peer 10.0.1.2/32: 17 port ranges, at most 16 fit"},
		{name: "a local pod without status addresses is a peer by its endpoint's",
			extra:    []*corev1.Pod{pod("a", "new", map[string]string{"app": "client"}, nil)},
			eps:      []LocalEndpoint{server, {Ifindex: 11, Namespace: "a", Name: "new", IPs: []netip.Addr{netip.MustParseAddr("10.0.1.7"), netip.MustParseAddr("fd00::1:7")}}},
			policies: []*networkingv1.NetworkPolicy{np("a", "p", srv, ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(cli, nil)))}, nil)},
			ingress:  []string{"enforced", "10.0.1.2/32 all [p]", "10.0.1.7/32 all [p]", "fd00::1:7/128 all [p]"}, egress: []string{"open"}},
		{name: "a local pod the API server has not listed: closed where its namespace's policies isolate",
			eps:      []LocalEndpoint{{Ifindex: 10, Namespace: "a", Name: "unknown"}},
			policies: []*networkingv1.NetworkPolicy{np("a", "p", cli, egressOnly, nil, nil)},
			ingress:  []string{"open"}, egress: []string{"closed"}},
		{name: "a local pod whose object is another pod of the same name (another uid): closed",
			eps:      []LocalEndpoint{{Ifindex: 10, Namespace: "a", Name: "server", UID: "recreated"}},
			policies: []*networkingv1.NetworkPolicy{np("a", "p", all, nil, nil, nil)},
			ingress:  []string{"closed"}, egress: []string{"open"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nss, pods := cluster()
			eps := tc.eps
			if eps == nil {
				eps = []LocalEndpoint{server}
			}
			cl := Cluster{Policies: tc.policies, Pods: append(pods, tc.extra...), Namespaces: nss}
			r := Compile(cl, eps)
			require.Equal(t, r.Endpoints, Compile(scoped(cl, eps), eps).Endpoints, "compiled from what the node agent watches")
			er := r.Endpoints[10]
			require.NotNil(t, er)
			require.Equal(t, tc.ingress, describe(r, &er.Ingress), "ingress")
			require.Equal(t, tc.egress, describe(r, &er.Egress), "egress")
			if tc.err == "" {
				require.Empty(t, r.Errors)
			} else {
				require.ErrorContains(t, r.Errors[10], tc.err)
			}
		})
	}
}

// scoped is what the node agent compiles for eps: the policies of their
// namespaces, and the pods of those and of the namespaces the policies'
// peers can select.
func scoped(cl Cluster, eps []LocalEndpoint) Cluster {
	local := map[string]bool{}
	for _, ep := range eps {
		local[ep.Namespace] = true
	}
	out := Cluster{Namespaces: cl.Namespaces}
	for _, p := range cl.Policies {
		if local[p.Namespace] {
			out.Policies = append(out.Policies, p)
		}
	}
	var locals []*corev1.Pod
	for _, p := range cl.Pods {
		for _, ep := range eps {
			if p.Namespace == ep.Namespace && p.Name == ep.Name && sameUID(ep.UID, string(p.UID)) {
				locals = append(locals, p)
			}
		}
	}
	peers, all := PeerNamespaces(out.Policies, cl.Namespaces, locals)
	for _, p := range cl.Pods {
		if all || local[p.Namespace] || peers[p.Namespace] {
			out.Pods = append(out.Pods, p)
		}
	}
	return out
}

// TestPeerNamespaces: the namespaces whose pods a policy's selector peers
// can select, when it selects a local pod; ipBlocks none; an egress rule
// without peers but with a named port every namespace.
func TestPeerNamespaces(t *testing.T) {
	nss, pods := cluster()
	for _, tc := range []struct {
		name string
		p    *networkingv1.NetworkPolicy
		want []string
		all  bool
	}{
		{"selecting no local pod: none", np("a", "p", sel("app", "client"), ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(nil, sel())))}, nil), nil, false},
		{"pod selector: its namespace", np("a", "p", sel(), ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(sel("app", "x"), nil)))}, nil), []string{"a"}, false},
		{"namespace selector", np("a", "p", sel(), egressOnly, nil, []networkingv1.NetworkPolicyEgressRule{out(peers(podPeer(nil, sel("team", "x"))))}), []string{"a", "b"}, false},
		{"by name", np("a", "p", sel(), ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(nil, sel("kubernetes.io/metadata.name", "b"))))}, nil), []string{"b"}, false},
		{"ipBlock and no peers", np("a", "p", sel(), nil, []networkingv1.NetworkPolicyIngressRule{in(nil, port("", "http"))},
			[]networkingv1.NetworkPolicyEgressRule{out(peers(blockPeer("10.0.0.0/8")), port("", "http")), out(nil, port("", 53))}), nil, false},
		{"no peers and a named port of egress", np("a", "p", sel(), egressOnly, nil, []networkingv1.NetworkPolicyEgressRule{out(nil, port("", "http"))}), nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, all := PeerNamespaces([]*networkingv1.NetworkPolicy{tc.p}, nss, pods[:1]) // a/server
			var names []string
			for ns := range got {
				names = append(names, ns)
			}
			slices.Sort(names)
			require.Equal(t, tc.want, names)
			require.Equal(t, tc.all, all)
		})
	}
}

// TestCompileNamespaces: a namespace's fact says which types its policies
// have; every namespace has one (zero without policies), and every policy
// a name.
func TestCompileNamespaces(t *testing.T) {
	nss, pods := cluster()
	r := Compile(Cluster{Namespaces: nss, Pods: pods, Policies: []*networkingv1.NetworkPolicy{
		np("a", "in", sel(), nil, nil, nil),
		np("b", "out", sel(), egressOnly, nil, nil),
		np("b", "out2", sel("x", "y"), egressOnly, nil, nil),
		np("d", "both", sel(), both, nil, nil), // a namespace the list does not have (yet)
	}}, nil)
	require.Equal(t, map[string]policy.NamespaceFact{"a": {Ingress: true}, "b": {Egress: true}, "c": {}, "d": {Ingress: true, Egress: true}}, r.Namespaces)
	require.Equal(t, map[uint32]policy.Source{policy.ID("a", "in"): {Namespace: "a", Name: "in"}, policy.ID("b", "out"): {Namespace: "b", Name: "out"}, policy.ID("b", "out2"): {Namespace: "b", Name: "out2"}, policy.ID("d", "both"): {Namespace: "d", Name: "both"}}, r.Names)
	require.Empty(t, r.Endpoints)
}

// TestCompileCache: a recompile with the same objects gives the same
// result, and a changed policy object is compiled again.
func TestCompileCache(t *testing.T) {
	nss, pods := cluster()
	p := np("a", "p", sel("app", "server"), ingressOnly, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(sel("app", "client"), nil)), port("", 80))}, nil)
	var c Compiler
	cl := Cluster{Namespaces: nss, Pods: pods, Policies: []*networkingv1.NetworkPolicy{p}}
	r1 := c.Compile(cl, []LocalEndpoint{server})
	r2 := c.Compile(cl, []LocalEndpoint{server})
	require.Equal(t, r1, r2)
	p2 := p.DeepCopy()
	p2.Spec.Ingress[0].Ports[0] = port("", 81)
	cl.Policies = []*networkingv1.NetworkPolicy{p2}
	r3 := c.Compile(cl, []LocalEndpoint{server})
	require.Equal(t, []string{"enforced", "10.0.1.2/32 tcp:81 [p]"}, describe(r3, &r3.Endpoints[10].Ingress))
	require.Len(t, c.cache, 1)

	// The pods' state is kept while the pods, namespaces and endpoints are
	// the same objects (in any order), and changed where one changes.
	ps := c.pods
	slices.Reverse(cl.Pods)
	c.Compile(cl, []LocalEndpoint{server})
	require.Same(t, ps, c.pods)
	cl.Pods = slices.Clone(cl.Pods)
	for i, p := range cl.Pods {
		if p.Name == "client" && p.Namespace == "a" {
			q := p.DeepCopy()
			q.Status.PodIPs = []corev1.PodIP{{IP: "10.0.1.99"}}
			cl.Pods[i] = q
		}
	}
	r4 := c.Compile(cl, []LocalEndpoint{server})
	require.Equal(t, []string{"enforced", "10.0.1.99/32 tcp:81 [p]"}, describe(r4, &r4.Endpoints[10].Ingress))
	newClient := LocalEndpoint{Ifindex: 11, Namespace: "a", Name: "client", UID: "a-client", IPs: []netip.Addr{netip.MustParseAddr("10.0.1.100")}}
	r5 := c.Compile(cl, []LocalEndpoint{server, newClient})
	require.Equal(t, []string{"enforced", "10.0.1.99/32 tcp:81 [p]", "10.0.1.100/32 tcp:81 [p]"}, describe(r5, &r5.Endpoints[10].Ingress))
}

func TestMergePorts(t *testing.T) {
	for _, tc := range []struct{ in, want []portRange }{
		{nil, nil},
		{[]portRange{{6, 80, 80}, {6, 80, 80}}, []portRange{{6, 80, 80}}},
		{[]portRange{{6, 10, 20}, {6, 21, 30}, {17, 5, 5}, {6, 1, 2}}, []portRange{{6, 1, 2}, {6, 10, 30}, {17, 5, 5}}},
		{[]portRange{{6, 0, 65535}, {6, 65535, 65535}}, []portRange{{6, 0, 65535}}},
		{[]portRange{{6, 10, 100}, {6, 20, 30}, {132, 20, 30}}, []portRange{{6, 10, 100}, {132, 20, 30}}},
	} {
		require.Equal(t, tc.want, mergePorts(tc.in), "%v", tc.in)
	}
}

// TestCompileReplicas: pods a policy selects alike share their compiled
// entries, unless their named ports differ.
func TestCompileReplicas(t *testing.T) {
	nss, pods := cluster()
	mk := func(name string, http int32) *corev1.Pod {
		return pod("a", name, map[string]string{"app": "server"}, []string{"10.0.1.1" + name[len(name)-1:]}, ports(corev1.ContainerPort{Name: "http", ContainerPort: http}))
	}
	pods = append(pods, mk("r1", 80), mk("r2", 80), mk("r3", 81))
	var eps []LocalEndpoint
	for i, n := range []string{"r1", "r2", "r3"} {
		eps = append(eps, LocalEndpoint{Ifindex: uint32(21 + i), Namespace: "a", Name: n})
	}
	r := Compile(Cluster{Namespaces: nss, Pods: pods, Policies: []*networkingv1.NetworkPolicy{
		np("a", "p", sel("app", "server"), both, []networkingv1.NetworkPolicyIngressRule{in(peers(podPeer(sel("app", "client"), nil)), port("", "http"))},
			[]networkingv1.NetworkPolicyEgressRule{out(peers(blockPeer("10.96.0.10/32")), port(corev1.ProtocolUDP, 53))}),
	}}, eps)
	require.Equal(t, []string{"enforced", "10.0.1.2/32 tcp:80 [p]"}, describe(r, &r.Endpoints[21].Ingress))
	require.Equal(t, []string{"enforced", "10.0.1.2/32 tcp:80 [p]"}, describe(r, &r.Endpoints[22].Ingress))
	require.Equal(t, []string{"enforced", "10.0.1.2/32 tcp:81 [p]"}, describe(r, &r.Endpoints[23].Ingress))
	for i := uint32(21); i <= 23; i++ {
		require.Equal(t, []string{"enforced", "10.96.0.10/32 udp:53 [p]"}, describe(r, &r.Endpoints[i].Egress))
	}
}
