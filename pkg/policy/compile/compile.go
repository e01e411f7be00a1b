package compile

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// This file compiles the cluster's NetworkPolicies into the entries of
// policy_rules, with no map in sight: the node agent diffs what it returns
// against what the maps hold. The semantics are the API's
// (k8s.io/api/networking/v1):
//   - policyTypes: when empty, Ingress always, and Egress when the policy
//     has egress rules; rules of a type the policy does not list are ignored;
//   - a pod is isolated for a direction when some policy of its namespace
//     selects it (spec.podSelector) and has that type; what it may then
//     receive or send is the union of the rules of every such policy;
//   - a rule's peers: podSelector (pods of the policy's namespace),
//     namespaceSelector (every pod of the matching namespaces), both (the
//     matching pods of the matching namespaces), ipBlock (a CIDR less its
//     excepts); no peers: every address (0.0.0.0/0 and ::/0) and every
//     pod (for an egress rule's named ports);
//   - a rule's ports: TCP (the default), UDP or SCTP; a number, a range
//     (endPort) or a named port; no port number: every port of the
//     protocol; no ports: every port of every protocol (ICMP too). A named
//     port is resolved on the pod that listens: for ingress on the selected
//     (local) pod, for egress on each peer pod (every pod of the cluster
//     when the rule has no peers). A named port of an egress rule towards
//     an ipBlock matches nothing (an address has no container ports to
//     resolve the name against).
// Peer pods are the pods with addresses (status.podIPs, and for the pods of
// this node the addresses their endpoint has, so a new pod does not wait
// for the kubelet's status), not on the host network, not finished.
//
// The maps answer one longest-prefix lookup per flow, so each prefix's entry
// holds the union of every rule that covers the prefix's addresses: rule R
// covers prefix P when R's CIDR contains P and no except of R contains P.
// An except is an entry of its own (with what the other rules give it,
// possibly nothing: a deny).

// MaxPorts is how many port ranges one entry holds (POLICY_MAX_PORTS).
const MaxPorts = len(policy.Rule{}.Ports)

// MaxSources is how many policy ids one entry names (POLICY_MAX_SOURCES).
const MaxSources = len(policy.Rule{}.Sources)

// LocalEndpoint is a pod of this node as endpoint_pods and endpoint_devs
// hold it.
type LocalEndpoint struct {
	Ifindex   uint32
	Namespace string
	Name      string
	UID       string
	IPs       []netip.Addr
}

// Cluster is what the API server holds (the informers' caches).
type Cluster struct {
	Policies []*networkingv1.NetworkPolicy
	// ClusterPolicies: the ClusterNetworkPolicies (none where the API
	// server has no such resource).
	ClusterPolicies []*cnpv1.ClusterNetworkPolicy
	Pods            []*corev1.Pod
	Namespaces      []*corev1.Namespace
}

// DirRules is what an endpoint gets for one direction: its state, and in
// state enforce the entries of its rules, sorted by prefix.
type DirRules struct {
	State   policy.State
	Entries []policy.Entry
}

// EndpointRules is an endpoint's compiled policy.
type EndpointRules struct {
	Ingress, Egress DirRules
}

// Dir is the rules of direction d.
func (e *EndpointRules) Dir(d policy.Direction) *DirRules {
	if d == policy.Ingress {
		return &e.Ingress
	}
	return &e.Egress
}

// Result is a compilation.
type Result struct {
	// Endpoints: every local endpoint's rules, by host ifindex.
	Endpoints map[uint32]*EndpointRules
	// Namespaces: the fact of every namespace known (namespaces and
	// policies); a zero fact for those without policies. Read only, and
	// valid until the Compiler's next compilation: it keeps the map, and
	// changes it.
	Namespaces map[string]policy.NamespaceFact
	// Names: every policy, by policy.ID.
	Names map[uint32]policy.Source
	// Errors: what could not be compiled exactly, by endpoint (an entry
	// with more port ranges than fit: it got the first ones).
	Errors map[uint32]error
}

// Compile is a compilation without a cache.
func Compile(cl Cluster, eps []LocalEndpoint) *Result {
	var c Compiler
	return c.Compile(cl, eps)
}

type portRange struct {
	proto       uint8
	first, last uint16
}

type namedPort struct {
	proto uint8
	name  string
}

// portSpec is a rule's ports: all, or ranges and named ports.
type portSpec struct {
	all     bool
	numeric []portRange
	named   []namedPort
}

type ipBlock struct {
	cidr   netip.Prefix
	except []netip.Prefix
}

type compiledPeer struct {
	key    string // what peers with the same addresses share (the memo of their pods)
	block  *ipBlock
	podSel labels.Selector
	nsSel  labels.Selector // nil: the pods of namespace ns
	ns     string
	// everyone: a rule without peers (every address, every pod).
	everyone bool
}

type compiledRule struct {
	peers []compiledPeer
	ports portSpec
}

type compiledPolicy struct {
	ns, name        string
	id              uint32
	sel             labels.Selector
	ingress, egress bool
	in, out         []compiledRule
}

var (
	allV4 = netip.MustParsePrefix("0.0.0.0/0")
	allV6 = netip.MustParsePrefix("::/0")
	// everyone is the peers of a rule without any: every address, every
	// pod (an egress rule's named ports are resolved on each).
	everyone = []compiledPeer{
		{key: "every:" + allV4.String(), block: &ipBlock{cidr: allV4}, everyone: true},
		{key: "every:" + allV6.String(), block: &ipBlock{cidr: allV6}, everyone: true},
	}
	// everyPod selects every pod of every namespace.
	everyPod = compiledPeer{key: "every pod", podSel: labels.Everything(), nsSel: labels.Everything()}
)

// nothing is the selector of a selector that cannot be read.
var nothing = labels.Nothing()

func selector(ls *metav1.LabelSelector) labels.Selector {
	s, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		// The API server validates selectors; one it let through that we
		// cannot read selects nothing (fails closed).
		return nothing
	}
	return s
}

func protoOf(p *corev1.Protocol) (uint8, bool) {
	if p == nil {
		return 6, true
	}
	switch *p {
	case corev1.ProtocolTCP, "":
		return 6, true
	case corev1.ProtocolUDP:
		return 17, true
	case corev1.ProtocolSCTP:
		return 132, true
	}
	return 0, false
}

func compilePorts(ps []networkingv1.NetworkPolicyPort) portSpec {
	if len(ps) == 0 {
		return portSpec{all: true}
	}
	var s portSpec
	for _, p := range ps {
		proto, ok := protoOf(p.Protocol)
		if !ok {
			continue // a protocol the API does not define: matches nothing
		}
		switch {
		case p.Port == nil:
			s.numeric = append(s.numeric, portRange{proto, 0, 65535})
		case p.Port.Type == intstr.String:
			s.named = append(s.named, namedPort{proto, p.Port.StrVal})
		default:
			first := uint16(p.Port.IntVal)
			last := first
			if p.EndPort != nil && *p.EndPort >= p.Port.IntVal && *p.EndPort <= 65535 {
				last = uint16(*p.EndPort)
			}
			if p.Port.IntVal < 0 || p.Port.IntVal > 65535 {
				continue
			}
			s.numeric = append(s.numeric, portRange{proto, first, last})
		}
	}
	return s
}

func compilePeers(ns string, ps []networkingv1.NetworkPolicyPeer) []compiledPeer {
	if len(ps) == 0 {
		return everyone
	}
	var out []compiledPeer
	for _, p := range ps {
		switch {
		case p.IPBlock != nil:
			cidr, err := netip.ParsePrefix(p.IPBlock.CIDR)
			if err != nil {
				continue // validated by the API server
			}
			cidr = unmapPrefix(cidr).Masked()
			b := &ipBlock{cidr: cidr}
			keys := []string{cidr.String()}
			for _, e := range p.IPBlock.Except {
				ep, err := netip.ParsePrefix(e)
				if err != nil {
					continue
				}
				ep = unmapPrefix(ep).Masked()
				if ep.Addr().Is4() != cidr.Addr().Is4() || ep.Bits() < cidr.Bits() || !cidr.Contains(ep.Addr()) {
					continue // not inside the CIDR: nothing to take out
				}
				b.except = append(b.except, ep)
				keys = append(keys, ep.String())
			}
			out = append(out, compiledPeer{key: "ip:" + strings.Join(keys, ","), block: b})
		case p.PodSelector == nil && p.NamespaceSelector == nil:
			continue // an empty peer: the API rejects it
		default:
			c := compiledPeer{podSel: labels.Everything()}
			if p.PodSelector != nil {
				c.podSel = selector(p.PodSelector)
			}
			if p.NamespaceSelector != nil {
				c.nsSel = selector(p.NamespaceSelector)
				c.key = "pods:" + c.podSel.String() + "|ns:" + c.nsSel.String()
			} else {
				c.ns = ns
				c.key = "pods:" + c.podSel.String() + "|in:" + ns
			}
			if c.podSel == nothing || c.nsSel == nothing {
				c.key = "nothing" // its String() is Everything()'s, ""
			}
			out = append(out, c)
		}
	}
	return out
}

func unmapPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() {
		return netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
	}
	return p
}

// FactOf is what policy p isolates in its namespace: ingress, egress or
// both (its policyTypes, or when empty: ingress, and egress if it has
// egress rules). A namespace's fact is the union of its policies'.
func FactOf(p *networkingv1.NetworkPolicy) policy.NamespaceFact {
	var f policy.NamespaceFact
	if len(p.Spec.PolicyTypes) == 0 {
		f.Ingress = true
		f.Egress = len(p.Spec.Egress) > 0
	}
	for _, t := range p.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			f.Ingress = true
		case networkingv1.PolicyTypeEgress:
			f.Egress = true
		}
	}
	return f
}

func compilePolicy(p *networkingv1.NetworkPolicy) *compiledPolicy {
	c := &compiledPolicy{ns: p.Namespace, name: p.Name, id: policy.ID(p.Namespace, p.Name), sel: selector(&p.Spec.PodSelector)}
	f := FactOf(p)
	c.ingress, c.egress = f.Ingress, f.Egress
	if c.ingress {
		for _, r := range p.Spec.Ingress {
			c.in = append(c.in, compiledRule{peers: compilePeers(p.Namespace, r.From), ports: compilePorts(r.Ports)})
		}
	}
	if c.egress {
		for _, r := range p.Spec.Egress {
			c.out = append(c.out, compiledRule{peers: compilePeers(p.Namespace, r.To), ports: compilePorts(r.Ports)})
		}
	}
	return c
}

// podInfo is a pod as a peer or a selected pod.
type podInfo struct {
	live     bool // neither on the host network nor finished
	ns, name string
	labels   labels.Set
	addrs    []netip.Addr
	pod      *corev1.Pod
}

// resolve appends to ports the number of each of the named ports that the
// pod has (a name of protocol 0: the container port's protocol).
func (p *podInfo) resolve(named []namedPort, ports []portRange) []portRange {
	for _, n := range named {
		if pn, proto := p.containerPort(n); pn != 0 {
			ports = append(ports, portRange{proto, pn, pn})
		}
	}
	return ports
}

// containerPort resolves a named port on the pod: 0 when it has none.
func (p *podInfo) containerPort(n namedPort) (uint16, uint8) {
	if p == nil || p.pod == nil {
		return 0, 0
	}
	for _, cs := range [][]corev1.Container{p.pod.Spec.Containers, p.pod.Spec.InitContainers} {
		for _, c := range cs {
			for _, cp := range c.Ports {
				proto, ok := protoOf(&cp.Protocol)
				if ok && cp.Name == n.name && (n.proto == 0 || proto == n.proto) && cp.ContainerPort > 0 && cp.ContainerPort <= 65535 {
					return uint16(cp.ContainerPort), proto
				}
			}
		}
	}
	return 0, 0
}

func sameUID(a, b string) bool { return a == "" || b == "" || a == b }

func appendAddr(as []netip.Addr, a netip.Addr) []netip.Addr {
	if slices.Contains(as, a) {
		return as
	}
	return append(as, a)
}

// endpoint compiles one local endpoint; fact is its namespace's.
func (cp *compilation) endpoint(ep *LocalEndpoint, fact policy.NamespaceFact) (*EndpointRules, error) {
	er := &EndpointRules{}
	self := cp.podByKey[ep.Namespace+"/"+ep.Name]
	if self == nil || !sameUID(ep.UID, string(self.pod.UID)) {
		// Not in the API server's list (yet): its labels are unknown, so
		// whatever its namespace's policies may isolate stays closed.
		if fact.Ingress {
			er.Ingress.State = policy.StateClosed
		}
		if fact.Egress {
			er.Egress.State = policy.StateClosed
		}
		return er, nil
	}
	var in, out []int
	for _, i := range cp.byNS[ep.Namespace] {
		p := cp.policies[i]
		if !p.sel.Matches(self.labels) {
			continue
		}
		if p.ingress {
			in = append(in, i)
		}
		if p.egress {
			out = append(out, i)
		}
	}
	var cin, cout []int
	for i, x := range cp.cnps {
		if !x.selects(self, cp.nsLabels[ep.Namespace]) {
			continue
		}
		if len(x.in) > 0 {
			cin = append(cin, i)
		}
		if len(x.out) > 0 {
			cout = append(cout, i)
		}
	}
	var errs []error
	for _, x := range []struct {
		d    policy.Direction
		pols []int
		cnps []int
		dr   *DirRules
	}{{policy.Ingress, in, cin, &er.Ingress}, {policy.Egress, out, cout, &er.Egress}} {
		if len(x.pols) == 0 && len(x.cnps) == 0 {
			continue
		}
		x.dr.State = policy.StateEnforce
		var err error
		x.dr.Entries, err = cp.directionOnce(x.d, self, x.pols, x.cnps)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return er, joinErrs(errs)
}

type dirResult struct {
	entries []policy.Entry
	err     error
	deps    map[string]bool // the peer keys it read
}

// directionOnce is direction, once for all the pods it gives the same
// entries: the replicas of a workload (same policies, and for ingress the
// same container ports to resolve named ports on). Their entries are one
// slice: read only.
func (cp *compilation) directionOnce(d policy.Direction, self *podInfo, pols, cnps []int) ([]policy.Entry, error) {
	k := make([]byte, 0, 8*len(pols)+8*len(cnps)+16)
	k = append(k, byte(d))
	for _, i := range pols {
		k = strconv.AppendInt(append(k, ','), int64(i), 10)
	}
	k = append(k, '|')
	for _, i := range cnps {
		k = strconv.AppendInt(append(k, ','), int64(i), 10)
	}
	if d == policy.Ingress {
		for _, cs := range [][]corev1.Container{self.pod.Spec.Containers, self.pod.Spec.InitContainers} {
			for _, c := range cs {
				for _, p := range c.Ports {
					k = append(append(append(append(k, '|'), p.Name...), '/'), p.Protocol...)
					k = strconv.AppendInt(append(k, '/'), int64(p.ContainerPort), 10)
				}
			}
		}
	}
	if r, ok := cp.dirMemo[string(k)]; ok {
		addKeys(cp.deps, r.deps)
		return r.entries, r.err
	}
	// What this direction reads is the endpoint's, and the next one's that
	// finds it here.
	outer := cp.deps
	cp.deps = map[string]bool{}
	defer func() {
		addKeys(outer, cp.deps)
		cp.deps = outer
	}()
	var es []policy.Entry
	var err error
	if len(cnps) == 0 {
		es, err = cp.direction(d, self, pols)
	} else {
		np := npTier{isolated: len(pols) > 0}
		if np.isolated {
			np.isolator = cp.policies[pols[0]].id
			np.entries, err = cp.direction(d, self, pols)
		}
		var err2 error
		es, err2 = cp.tiered(d, self, cnps, np)
		err = joinErrs(slices.DeleteFunc([]error{err, err2}, func(e error) bool { return e == nil }))
	}
	cp.dirMemo[string(k)] = dirResult{es, err, cp.deps}
	return es, err
}

func joinErrs(errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return fmt.Errorf("%w; %w", errs[0], errs[1])
}

// group is what the rules of one direction give one peer (by key): their
// ports and the policies they come from.
type group struct {
	peer  *compiledPeer
	ports portSpec
	pols  []int
}

// builder accumulates an entry.
type builder struct {
	all   bool
	ports []portRange
	pols  []int
}

func (b *builder) add(all bool, ports []portRange, pols []int) {
	b.all = b.all || all
	if !b.all {
		b.ports = append(b.ports, ports...)
	}
	b.pols = append(b.pols, pols...)
}

// direction compiles the entries of one direction of the local pod self,
// from the policies pols (indexes) that select it for it.
func (cp *compilation) direction(d policy.Direction, self *podInfo, pols []int) ([]policy.Entry, error) {
	entries := entrySet{}
	var blocks []*group
	for _, g := range cp.groups(d, self, pols) {
		g.tidyPorts()
		if g.peer.block == nil {
			cp.addPods(d, g, entries)
			continue
		}
		if d == policy.Egress && g.peer.everyone && len(g.ports.named) > 0 && !g.ports.all {
			// No peers: every address, and so every pod, whose
			// container ports the named ports are resolved on.
			cp.addNamedEveryPod(g, entries)
		}
		if !g.ports.all && len(g.ports.numeric) == 0 {
			continue // only named ports: an address has none
		}
		blocks = append(blocks, g)
		entries.get(g.peer.block.cidr)
		for _, e := range g.peer.block.except {
			entries.get(e)
		}
	}
	// Every entry gets what the blocks that cover it give.
	for p, b := range entries {
		for _, g := range blocks {
			if covers(g.peer.block, p) {
				b.add(g.ports.all, g.ports.numeric, g.pols)
			}
		}
	}
	return cp.build(d, entries)
}

// groups gathers the rules of direction d of the policies pols by peer,
// in the order the peers first appear.
func (cp *compilation) groups(d policy.Direction, self *podInfo, pols []int) []*group {
	byKey := map[string]*group{}
	var out []*group
	for _, i := range pols {
		p := cp.policies[i]
		rules := p.in
		if d == policy.Egress {
			rules = p.out
		}
		for ri := range rules {
			r := &rules[ri]
			ports := r.ports
			if d == policy.Ingress && len(ports.named) > 0 {
				// Named ports of ingress rules are the selected pod's.
				ports.numeric = self.resolve(ports.named, slices.Clone(ports.numeric))
				ports.named = nil
			}
			for pi := range r.peers {
				peer := &r.peers[pi]
				g := byKey[peer.key]
				if g == nil {
					g = &group{peer: peer}
					byKey[peer.key] = g
					out = append(out, g)
				}
				g.ports.all = g.ports.all || ports.all
				g.ports.numeric = append(g.ports.numeric, ports.numeric...)
				g.ports.named = append(g.ports.named, ports.named...)
				if len(g.pols) == 0 || g.pols[len(g.pols)-1] != i {
					g.pols = append(g.pols, i)
				}
			}
		}
	}
	return out
}

// tidyPorts drops the ranges and named ports of a group that allows every
// port, merges its ranges, and sorts its named ports without repeats.
func (g *group) tidyPorts() {
	if g.ports.all {
		g.ports.numeric, g.ports.named = nil, nil
	}
	g.ports.numeric = mergePorts(g.ports.numeric)
	slices.SortFunc(g.ports.named, func(a, b namedPort) int {
		return cmp.Or(cmp.Compare(a.proto, b.proto), strings.Compare(a.name, b.name))
	})
	g.ports.named = slices.Compact(g.ports.named)
}

// entrySet is the entries of a direction being built, by prefix.
type entrySet map[netip.Prefix]*builder

// get is the builder of prefix p, made empty if it has none yet.
func (es entrySet) get(p netip.Prefix) *builder {
	b := es[p]
	if b == nil {
		b = &builder{}
		es[p] = b
	}
	return b
}

// addPods gives the addresses of each pod that g's peer selects g's ports
// (in egress with its named ports resolved on that pod); a pod left with
// no port gets no entry.
func (cp *compilation) addPods(d policy.Direction, g *group, es entrySet) {
	for _, pod := range cp.peers(g.peer) {
		ports := g.ports.numeric
		if d == policy.Egress && len(g.ports.named) > 0 && !g.ports.all {
			ports = pod.resolve(g.ports.named, slices.Clone(ports))
		}
		if !g.ports.all && len(ports) == 0 {
			continue
		}
		for _, a := range pod.addrs {
			es.get(netip.PrefixFrom(a, a.BitLen())).add(g.ports.all, ports, g.pols)
		}
	}
}

// addNamedEveryPod gives the addresses of every pod, of the family of g's
// block, g's named ports resolved on that pod.
func (cp *compilation) addNamedEveryPod(g *group, es entrySet) {
	for _, pod := range cp.peers(&everyPod) {
		ports := pod.resolve(g.ports.named, nil)
		if len(ports) == 0 {
			continue
		}
		for _, a := range pod.addrs {
			if a.Is4() == g.peer.block.cidr.Addr().Is4() {
				es.get(netip.PrefixFrom(a, a.BitLen())).add(false, ports, g.pols)
			}
		}
	}
}

// build makes the entries of direction d, sorted; an entry with more port
// ranges than fit is an error (the first one and how many more).
func (cp *compilation) build(d policy.Direction, es entrySet) ([]policy.Entry, error) {
	out := make([]policy.Entry, 0, len(es))
	var errs []error
	for p, b := range es {
		r, n := cp.rule(b)
		if n > MaxPorts {
			errs = append(errs, fmt.Errorf("%s peer %s: %d port ranges, at most %d fit: only the first %d are allowed", d, p, n, MaxPorts, MaxPorts))
		}
		out = append(out, policy.Entry{Prefix: p, Rule: r})
	}
	return sortedEntries(out, errs)
}

// covers: block b gives its rights to prefix p (of an entry).
func covers(b *ipBlock, p netip.Prefix) bool {
	if b.cidr.Addr().Is4() != p.Addr().Is4() || b.cidr.Bits() > p.Bits() || !b.cidr.Contains(p.Addr()) {
		return false
	}
	for _, e := range b.except {
		if e.Bits() <= p.Bits() && e.Contains(p.Addr()) {
			return false
		}
	}
	return true
}

// rule makes the entry of builder b; n is how many port ranges it needed.
func (cp *compilation) rule(b *builder) (r policy.Rule, n int) {
	slices.Sort(b.pols)
	b.pols = slices.Compact(b.pols)
	for i := 0; i < len(b.pols) && i < MaxSources; i++ {
		r.Sources[i] = cp.policies[b.pols[i]].id
		r.N_sources++
	}
	if b.all {
		r.Flags = uint8(maps.CniPolicyRuleFlagsPOLICY_F_ALL_PORTS)
		return r, 0
	}
	ports := mergePorts(b.ports)
	for i := 0; i < len(ports) && i < MaxPorts; i++ {
		r.Ports[i] = maps.CniPolicyPort{First: ports[i].first, Last: ports[i].last, Proto: ports[i].proto}
		r.N_ports++
	}
	return r, len(ports)
}

// mergePorts sorts ranges and merges those of a protocol that overlap or
// touch.
func mergePorts(ps []portRange) []portRange {
	slices.SortFunc(ps, func(a, b portRange) int {
		return cmp.Or(cmp.Compare(a.proto, b.proto), cmp.Compare(a.first, b.first), cmp.Compare(a.last, b.last))
	})
	var out []portRange
	for _, p := range ps {
		if n := len(out); n > 0 && out[n-1].proto == p.proto && uint32(p.first) <= uint32(out[n-1].last)+1 {
			out[n-1].last = max(out[n-1].last, p.last)
			continue
		}
		out = append(out, p)
	}
	return out
}

// SortEntries orders entries by family, address and prefix length (the
// order Compile returns them in).
func SortEntries(es []policy.Entry) {
	slices.SortFunc(es, func(a, b policy.Entry) int {
		return cmp.Or(a.Prefix.Addr().Compare(b.Prefix.Addr()), cmp.Compare(a.Prefix.Bits(), b.Prefix.Bits()))
	})
}

// peers are the pods a selector peer selects (memoized by its key).
// The key is one of what the endpoint being compiled depends on
// (compilation.deps): a change of a pod it may select recompiles it.
func (cp *compilation) peers(p *compiledPeer) []*podInfo {
	if cp.deps != nil {
		cp.deps[p.key] = true
	}
	if m, ok := cp.memo[p.key]; ok {
		return m.pods
	}
	var out []*podInfo
	match := func(ns string) {
		for _, pod := range cp.pods[ns] {
			if p.podSel.Matches(pod.labels) {
				out = append(out, pod)
			}
		}
	}
	if p.nsSel == nil {
		match(p.ns)
	} else {
		for _, ns := range cp.namespaces(p.nsSel) {
			match(ns)
		}
	}
	cp.memo[p.key] = memoEntry{peer: peerSelectors{podSel: p.podSel, nsSel: p.nsSel, ns: p.ns}, pods: out}
	return out
}

// namespaces are the namespaces sel matches, sorted.
func (cp *compilation) namespaces(sel labels.Selector) []string {
	k := sel.String()
	if ns, ok := cp.nsMemo[k]; ok {
		return ns
	}
	var out []string
	for _, ns := range cp.nsNames {
		if sel.Matches(cp.nsLabels[ns]) {
			out = append(out, ns)
		}
	}
	cp.nsMemo[k] = out
	return out
}

// PeerNamespaces are the namespaces whose pods the peers of the policies
// that select one of the local pods can select (their selector peers' own
// namespace or the namespaces their namespace selectors match among nss);
// all: every namespace's pods matter (an egress rule without peers but
// with named ports: every pod of the cluster is a peer, its ports resolved
// on it). locals are the pods of the local endpoints, as the API server
// has them. Compile, given the pods of these namespaces and the local
// pods, gives the local endpoints what it gives them with every pod of the
// cluster: the node agent reads no more than that.
func PeerNamespaces(pols []*networkingv1.NetworkPolicy, nss []*corev1.Namespace, locals []*corev1.Pod) (out map[string]bool, all bool) {
	var c Compiler
	return c.PeerNamespaces(pols, nss, locals)
}

// peerNamespaces is PeerNamespaces of the parsed policies pols; match is
// the namespaces a namespace selector matches.
func peerNamespaces(pols []*compiledPolicy, locals []*corev1.Pod, match func(labels.Selector) []string) (out map[string]bool, all bool) {
	out = map[string]bool{}
	for _, cp := range pols {
		if !slices.ContainsFunc(locals, func(l *corev1.Pod) bool { return l.Namespace == cp.ns && cp.sel.Matches(labels.Set(l.Labels)) }) {
			continue // it selects no pod of this node: its peers get no entry here
		}
		for i, rules := range [][]compiledRule{cp.in, cp.out} {
			for _, r := range rules {
				for _, peer := range r.peers {
					switch {
					case peer.everyone:
						// An egress rule's named ports are resolved on
						// every pod (addNamedEveryPod); an ingress
						// rule's on the local pod.
						all = all || (i == 1 && len(r.ports.named) > 0 && !r.ports.all)
					case peer.block != nil || peer.key == "nothing":
					case peer.nsSel == nil:
						out[peer.ns] = true
					default:
						for _, ns := range match(peer.nsSel) {
							out[ns] = true
						}
					}
				}
			}
		}
	}
	return out, all
}

// sortedEntries is out sorted, with errs (the entries with too many port
// ranges) sorted and, beyond two, summed up in a second error.
func sortedEntries(out []policy.Entry, errs []error) ([]policy.Entry, error) {
	SortEntries(out)
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	if len(errs) > 2 {
		errs = append(errs[:1], fmt.Errorf("and %d more entries with too many port ranges", len(errs)-1))
	}
	return out, joinErrs(errs)
}
