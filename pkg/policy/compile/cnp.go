package compile

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// This file compiles ClusterNetworkPolicies (policy.networking.k8s.io,
// sigs.k8s.io/network-policy-api) together with the NetworkPolicies into
// the same entries of policy_rules. A flow is decided, for each endpoint
// and direction, by the first of:
//   - the Admin tier: the ClusterNetworkPolicies of tier Admin that select
//     the pod, by priority (lower first; equal priorities by name), each
//     with its rules in order: the first rule that matches decides (Accept
//     or Deny), or Passes: the rest of the Admin tier is skipped;
//   - the NetworkPolicy tier: when NetworkPolicies isolate the pod in that
//     direction, they decide (what they allow, nothing else);
//   - the Baseline tier, as the Admin tier (Pass skips the rest of it);
//   - everything else is allowed.
// A rule matches a flow when one of its peers has the flow's peer address
// (pods, namespaces: the addresses of the pods they select; networks: the
// CIDRs) and its protocols the flow's protocol and destination port (no
// protocols: every protocol, ICMP too).
//
// The entries are cells: the prefixes of every peer that matters to the
// endpoint (CIDRs, pod addresses, the NetworkPolicies' entries, 0.0.0.0/0
// and ::/0) cut the address space into regions, each the addresses whose
// longest matching prefix it is, and every rule matches a region whole or
// not at all. In a region, the ports every rule names cut each protocol's
// ports into ranges that no rule tells apart; each range gets the action
// that wins it, and each entry holds what is allowed (or, when protocols
// without ports are allowed, what is denied: POLICY_F_EXCEPT_PORTS). So one
// lookup still decides a flow, however many policies of whatever tiers.
//
// What is not compiled: egress peers nodes and domainNames (experimental
// fields); a peer with none of the fields this build knows fails closed as
// the API says: an Accept rule's matches nothing, a Deny or Pass rule's
// denies everything.

// action is what a rule does to what it matches.
type action uint8

const (
	actAccept action = iota
	actDeny
	actPass
)

func (a action) String() string {
	return [...]string{"Accept", "Deny", "Pass"}[a]
}

// cnpRule is a ClusterNetworkPolicy rule.
type cnpRule struct {
	name   string
	action action
	peers  []compiledPeer
	ports  portSpec // named: destinationNamedPort, proto 0 (any protocol)
	// denyAll: a Deny or Pass rule with a peer this build cannot read: it
	// denies everything (fails closed).
	denyAll bool
}

// compiledCNP is a ClusterNetworkPolicy.
type compiledCNP struct {
	name     string
	id       uint32
	tier     policy.Tier
	priority int32
	nsSel    labels.Selector
	podSel   labels.Selector // nil: every pod of the namespaces
	in, out  []cnpRule
}

func (c *compiledCNP) source() policy.Source {
	return policy.Source{Tier: c.tier, Priority: uint16(min(max(c.priority, 0), 65535)), Name: c.name}
}

// selects: the policy applies to the pod p.
func (c *compiledCNP) selects(p *podInfo, nsLabels labels.Set) bool {
	if !c.nsSel.Matches(nsLabels) {
		return false
	}
	return c.podSel == nil || c.podSel.Matches(p.labels)
}

func compileCNP(p *cnpv1.ClusterNetworkPolicy) *compiledCNP {
	c := &compiledCNP{name: p.Name, id: policy.ID("", p.Name), priority: p.Spec.Priority, nsSel: nothing}
	switch p.Spec.Tier {
	case cnpv1.AdminTier:
		c.tier = policy.TierAdmin
	case cnpv1.BaselineTier:
		c.tier = policy.TierBaseline
	default:
		return nil // the API's validation allows no other
	}
	switch s := p.Spec.Subject; {
	case s.Namespaces != nil:
		c.nsSel = selector(s.Namespaces)
	case s.Pods != nil:
		c.nsSel = selector(&s.Pods.NamespaceSelector)
		c.podSel = selector(&s.Pods.PodSelector)
	}
	for _, r := range p.Spec.Ingress {
		var peers []compiledPeer
		unknown := false
		for _, pe := range r.From {
			x, ok := cnpPodPeer(pe.Namespaces, pe.Pods)
			if !ok {
				unknown = true
				continue
			}
			peers = append(peers, x)
		}
		c.in = append(c.in, newCNPRule(r.Name, r.Action, peers, unknown, r.Protocols))
	}
	for _, r := range p.Spec.Egress {
		var peers []compiledPeer
		unknown := false
		for _, pe := range r.To {
			if x, ok := cnpPodPeer(pe.Namespaces, pe.Pods); ok {
				peers = append(peers, x)
				continue
			}
			if len(pe.Networks) == 0 {
				unknown = true // nodes, domainNames, or a field this build does not know
				continue
			}
			for _, n := range pe.Networks {
				cidr, err := netip.ParsePrefix(string(n))
				if err != nil {
					continue // the API validates CIDRs
				}
				cidr = unmapPrefix(cidr).Masked()
				peers = append(peers, compiledPeer{key: "ip:" + cidr.String(), block: &ipBlock{cidr: cidr}})
			}
		}
		c.out = append(c.out, newCNPRule(r.Name, r.Action, peers, unknown, r.Protocols))
	}
	return c
}

// cnpPodPeer is a peer of namespaces or pods; ok false: neither.
func cnpPodPeer(nss *metav1.LabelSelector, pods *cnpv1.NamespacedPod) (compiledPeer, bool) {
	var c compiledPeer
	switch {
	case nss != nil:
		c.podSel, c.nsSel = labels.Everything(), selector(nss)
	case pods != nil:
		c.podSel, c.nsSel = selector(&pods.PodSelector), selector(&pods.NamespaceSelector)
	default:
		return c, false
	}
	c.key = "pods:" + c.podSel.String() + "|ns:" + c.nsSel.String()
	if c.podSel == nothing || c.nsSel == nothing {
		c.key = "nothing"
	}
	return c, true
}

func newCNPRule(name string, a cnpv1.ClusterNetworkPolicyRuleAction, peers []compiledPeer, unknown bool, protos []cnpv1.ClusterNetworkPolicyProtocol) cnpRule {
	r := cnpRule{name: name, peers: peers, ports: cnpPorts(protos)}
	switch a {
	case cnpv1.ClusterNetworkPolicyRuleActionAccept:
		r.action = actAccept
	case cnpv1.ClusterNetworkPolicyRuleActionDeny:
		r.action = actDeny
	case cnpv1.ClusterNetworkPolicyRuleActionPass:
		r.action = actPass
	default:
		// An action this build does not know: the rule cannot be
		// honoured; fail closed.
		r.action, r.denyAll = actDeny, true
	}
	if unknown && r.action != actAccept {
		r.action, r.denyAll = actDeny, true
	}
	if r.denyAll {
		r.peers, r.ports = everyone, portSpec{all: true}
	}
	return r
}

// cnpPorts are a rule's protocols: none, every protocol and port.
func cnpPorts(ps []cnpv1.ClusterNetworkPolicyProtocol) portSpec {
	if len(ps) == 0 {
		return portSpec{all: true}
	}
	var s portSpec
	add := func(proto uint8, dp *cnpv1.Port) {
		switch {
		case dp == nil:
			s.numeric = append(s.numeric, portRange{proto, 0, 65535})
		case dp.Range != nil:
			if dp.Range.Start < 0 || dp.Range.End > 65535 || dp.Range.Start > dp.Range.End {
				return
			}
			s.numeric = append(s.numeric, portRange{proto, uint16(dp.Range.Start), uint16(dp.Range.End)})
		case dp.Number > 0 && dp.Number <= 65535:
			s.numeric = append(s.numeric, portRange{proto, uint16(dp.Number), uint16(dp.Number)})
		}
	}
	for _, p := range ps {
		switch {
		case p.TCP != nil:
			add(6, p.TCP.DestinationPort)
		case p.UDP != nil:
			add(17, p.UDP.DestinationPort)
		case p.SCTP != nil:
			add(132, p.SCTP.DestinationPort)
		case p.DestinationNamedPort != "":
			s.named = append(s.named, namedPort{0, p.DestinationNamedPort})
		}
	}
	s.numeric = mergePorts(s.numeric)
	return s
}

// sortCNPs orders ClusterNetworkPolicies as they decide: by tier, priority,
// name.
func sortCNPs(ps []*compiledCNP) {
	slices.SortFunc(ps, func(a, b *compiledCNP) int {
		return cmp.Or(cmp.Compare(a.tier, b.tier), cmp.Compare(a.priority, b.priority), strings.Compare(a.name, b.name))
	})
}

// ruleRef is one rule of a tier, in the order the tier evaluates them.
type ruleRef struct {
	pol  *compiledCNP
	rule *cnpRule
}

// verdict is what decides a range: allowed or not, and by what policy (0:
// no policy, the default).
type verdict struct {
	allow bool
	src   uint32
}

// npTier is what the NetworkPolicy tier says of one direction of a pod.
type npTier struct {
	isolated bool
	entries  []policy.Entry // sorted by prefix
	isolator uint32         // a policy that isolates it: what denies what they do not allow
	// index (entries' masked prefix -> index) and lens (their lengths,
	// longest first), built by the first lookup.
	index map[netip.Prefix]int
	lens  []int
}

// lookup is the NetworkPolicy entry whose region holds p (the longest
// prefix of entries that contains p), nil: none. index makes it a few map
// lookups, one per prefix length the entries have, instead of a walk of
// every entry for every region.
func (t *npTier) lookup(p netip.Prefix) *policy.Rule {
	if t.index == nil {
		t.index = make(map[netip.Prefix]int, len(t.entries))
		lens := map[int]bool{}
		for i, e := range t.entries {
			t.index[e.Prefix.Masked()] = i
			lens[e.Prefix.Bits()] = true
		}
		for l := range lens {
			t.lens = append(t.lens, l)
		}
		slices.Sort(t.lens)
		slices.Reverse(t.lens)
	}
	for _, l := range t.lens {
		if l > p.Bits() {
			continue
		}
		if i, ok := t.index[netip.PrefixFrom(p.Addr(), l).Masked()]; ok {
			return &t.entries[i].Rule
		}
	}
	return nil
}

// tiered compiles one direction of the local pod self under the
// ClusterNetworkPolicies cnps (indexes into cp.cnps, ordered) and the
// NetworkPolicy tier np.
func (cp *compilation) tiered(d policy.Direction, self *podInfo, cnps []int, np npTier) ([]policy.Entry, error) {
	var admin, base []ruleRef
	for _, i := range cnps {
		c := cp.cnps[i]
		rules := c.in
		if d == policy.Egress {
			rules = c.out
		}
		for ri := range rules {
			ref := ruleRef{c, &rules[ri]}
			if c.tier == policy.TierAdmin {
				admin = append(admin, ref)
			} else {
				base = append(base, ref)
			}
		}
	}
	t := &tierEval{cp: cp, d: d, self: self, np: &np, addrs: map[string]map[netip.Addr]*podInfo{}}
	refs := append(admin[:len(admin):len(admin)], base...)
	cands, prefixes := t.candidates(refs, np.entries)
	if askEveryRule {
		every := make([]int, len(refs))
		for i := range every {
			every[i] = i
		}
		for p := range prefixes {
			cands[p] = every
		}
	}
	out := make([]policy.Entry, 0, len(prefixes))
	var errs []error
	var am, bm []ruleRef
	for p := range prefixes {
		am, bm = am[:0], bm[:0]
		for _, i := range cands[p] {
			if i < len(admin) {
				am = append(am, refs[i])
			} else {
				bm = append(bm, refs[i])
			}
		}
		r, err := t.entry(p, am, bm)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s peer %s: %w", d, p, err))
		}
		out = append(out, policy.Entry{Prefix: p, Rule: r})
	}
	return sortedEntries(out, errs)
}

// candidates cuts the address space by the peers of refs and the
// NetworkPolicy tier's entries nps: the prefixes of the regions (a pod
// address's own, a CIDR's, an entry's, and 0.0.0.0/0 and ::/0), and
// for each region the rules that may match it, as indexes into refs in
// their order. Each rule is asked only of the regions its peers name (a
// selector's pods' addresses, the regions a CIDR covers), so a region's
// rule is found without matching every rule against every region.
func (t *tierEval) candidates(refs []ruleRef, nps []policy.Entry) (map[netip.Prefix][]int, map[netip.Prefix]bool) {
	prefixes := map[netip.Prefix]bool{allV4: true, allV6: true}
	for _, e := range nps {
		prefixes[e.Prefix] = true
	}
	cands := map[netip.Prefix][]int{}
	var blocks []int // the rules with a CIDR peer
	for ri, ref := range refs {
		hasBlock := false
		for pi := range ref.rule.peers {
			peer := &ref.rule.peers[pi]
			if peer.block != nil {
				prefixes[peer.block.cidr] = true
				hasBlock = true
				continue
			}
			for a := range t.peerAddrs(peer) {
				p := netip.PrefixFrom(a, a.BitLen())
				prefixes[p] = true
				if c := cands[p]; len(c) == 0 || c[len(c)-1] != ri {
					cands[p] = append(c, ri)
				}
			}
		}
		if hasBlock {
			blocks = append(blocks, ri)
		}
	}
	if len(blocks) > 0 {
		for p := range prefixes {
			c := cands[p]
			n := len(c)
			for _, ri := range blocks {
				for pi := range refs[ri].rule.peers {
					if b := refs[ri].rule.peers[pi].block; b != nil && covers(b, p) {
						c = append(c, ri)
						break
					}
				}
			}
			if len(c) > n {
				slices.Sort(c)
				cands[p] = slices.Compact(c)
			}
		}
	}
	return cands, prefixes
}

// askEveryRule makes every region ask every rule, as tiered did before
// candidates: the reference its tests compare candidates with.
var askEveryRule = false

// tierEval is the evaluation of one direction of one pod.
type tierEval struct {
	cp    *compilation
	d     policy.Direction
	self  *podInfo
	np    *npTier
	addrs map[string]map[netip.Addr]*podInfo // peer key -> its pods by address
}

// peerAddrs are the addresses of the pods a selector peer selects.
func (t *tierEval) peerAddrs(p *compiledPeer) map[netip.Addr]*podInfo {
	if m, ok := t.addrs[p.key]; ok {
		return m
	}
	m := map[netip.Addr]*podInfo{}
	for _, pod := range t.cp.peers(p) {
		for _, a := range pod.addrs {
			m[a] = pod
		}
	}
	t.addrs[p.key] = m
	return m
}

// ruleMatch is how a rule matches a region: not at all, or on ports (the
// rule's, with its named ports resolved).
type ruleMatch struct {
	ok    bool
	all   bool
	ports []portRange
}

// match is how rule r matches the region of prefix p.
func (t *tierEval) match(r *cnpRule, p netip.Prefix) ruleMatch {
	var peerPod *podInfo
	hit := false
	for i := range r.peers {
		peer := &r.peers[i]
		if peer.block != nil {
			if covers(peer.block, p) {
				hit = true
			}
			continue
		}
		if p.Bits() != p.Addr().BitLen() {
			continue
		}
		if pod, ok := t.peerAddrs(peer)[p.Addr()]; ok {
			hit, peerPod = true, pod
		}
	}
	if !hit {
		return ruleMatch{}
	}
	if r.ports.all {
		return ruleMatch{ok: true, all: true}
	}
	ports := r.ports.numeric
	if len(r.ports.named) > 0 {
		// A named port is the listening pod's: the selected pod's for
		// ingress, the peer pod's for egress (an address of a network
		// has none).
		on := t.self
		if t.d == policy.Egress {
			on = peerPod
		}
		ports = on.resolve(r.ports.named, slices.Clone(ports))
	}
	if len(ports) == 0 {
		return ruleMatch{}
	}
	return ruleMatch{ok: true, ports: ports}
}

// otherProto stands for the protocols without ports (ICMP...) in a range.
const otherProto = 0

func (m *ruleMatch) has(proto uint8, port uint16) bool {
	if !m.ok {
		return false
	}
	if m.all {
		return true
	}
	for _, r := range m.ports {
		if r.proto == proto && port >= r.first && port <= r.last {
			return true
		}
	}
	return false
}

type matched struct {
	ref ruleRef
	m   ruleMatch
}

// entry is the rule of the region of prefix p; admin and base are the
// rules of each tier that may match it (candidates), in order.
func (t *tierEval) entry(p netip.Prefix, admin, base []ruleRef) (policy.Rule, error) {
	rm := t.regionMatches(p, admin, base)
	cells, other := rm.cells()
	return encodeRule(cells, other)
}

// regionMatch is what decides the flows of one region: the rules of each
// tier that match it, the NetworkPolicy tier's entry, and where the ports
// are cut (every bound of a rule that matches, and of the NetworkPolicy
// entry).
type regionMatch struct {
	t      *tierEval
	am, bm []matched
	npRule *policy.Rule
	cuts   map[uint8][]uint16
}

// regionMatches matches the region of prefix p with the rules of both
// tiers and the NetworkPolicy tier.
func (t *tierEval) regionMatches(p netip.Prefix, admin, base []ruleRef) *regionMatch {
	rm := &regionMatch{t: t, cuts: map[uint8][]uint16{6: {0}, 17: {0}, 132: {0}}}
	for _, x := range []struct {
		refs []ruleRef
		out  *[]matched
	}{{admin, &rm.am}, {base, &rm.bm}} {
		for _, ref := range x.refs {
			m := t.match(ref.rule, p)
			if !m.ok {
				continue
			}
			*x.out = append(*x.out, matched{ref, m})
			rm.addCuts(m.ports)
		}
	}
	if t.np.isolated {
		rm.npRule = t.np.lookup(p)
		if rm.npRule != nil && rm.npRule.Flags&uint8(maps.CniPolicyRuleFlagsPOLICY_F_ALL_PORTS) == 0 {
			for _, r := range rm.npRule.Ports[:rm.npRule.N_ports] {
				rm.addCuts([]portRange{{r.Proto, r.First, r.Last}})
			}
		}
	}
	return rm
}

func (rm *regionMatch) addCuts(ports []portRange) {
	for _, r := range ports {
		if r.proto != 6 && r.proto != 17 && r.proto != 132 {
			continue
		}
		rm.cuts[r.proto] = append(rm.cuts[r.proto], r.first)
		if r.last < 65535 {
			rm.cuts[r.proto] = append(rm.cuts[r.proto], r.last+1)
		}
	}
}

// decide is the verdict of proto/port (otherProto: the protocols without
// ports) in the region: the Admin tier, the NetworkPolicy tier, the
// Baseline tier, the default.
func (rm *regionMatch) decide(proto uint8, port uint16) verdict {
	if v, ok := tierDecides(rm.am, proto, port); ok {
		return v
	}
	if rm.t.np.isolated {
		if rm.npRule != nil && npAllows(rm.npRule, proto, port) {
			return verdict{true, rm.npRule.Sources[0]}
		}
		return verdict{false, rm.t.np.isolator}
	}
	if v, ok := tierDecides(rm.bm, proto, port); ok {
		return v
	}
	return verdict{allow: true}
}

// tierDecides is the verdict of the first rule of a tier that matches
// proto/port; ok false when none does or a Pass does first.
func tierDecides(ms []matched, proto uint8, port uint16) (verdict, bool) {
	for _, x := range ms {
		if !x.m.has(proto, port) {
			continue
		}
		if x.ref.rule.action == actPass {
			return verdict{}, false
		}
		return verdict{x.ref.rule.action == actAccept, x.ref.pol.id}, true
	}
	return verdict{}, false
}

// cell is a port range of one protocol and its verdict.
type cell struct {
	r portRange
	v verdict
}

// cells are the region's port ranges that no rule tells apart, each with
// its verdict (neighbours of one verdict merged), and the verdict of the
// protocols without ports.
func (rm *regionMatch) cells() ([]cell, verdict) {
	var cells []cell
	for _, proto := range []uint8{6, 17, 132} {
		cs := rm.cuts[proto]
		slices.Sort(cs)
		cs = slices.Compact(cs)
		for i, first := range cs {
			last := uint16(65535)
			if i+1 < len(cs) {
				last = cs[i+1] - 1
			}
			v := rm.decide(proto, first)
			if n := len(cells); n > 0 && cells[n-1].r.proto == proto && cells[n-1].v == v {
				cells[n-1].r.last = last
				continue
			}
			cells = append(cells, cell{portRange{proto, first, last}, v})
		}
	}
	return cells, rm.decide(otherProto, 0)
}

// ruleSources fills a rule's sources: the policies that decided, in the
// order they decide ranges; a range names its own while they fit.
type ruleSources struct{ r *policy.Rule }

// index is id's source index in the rule (1-based; 0: none, or no room).
func (s ruleSources) index(id uint32) uint8 {
	r := s.r
	if id == 0 {
		return 0
	}
	for i := 0; i < int(r.N_sources); i++ {
		if r.Sources[i] == id {
			return uint8(i + 1)
		}
	}
	if int(r.N_sources) == MaxSources {
		return 0
	}
	r.Sources[r.N_sources] = id
	r.N_sources++
	return r.N_sources
}

// encodeRule is the entry of a region's cells: what is allowed, or (the
// protocols without ports allowed) what is denied, each range with the
// policy that decided it; an error when the ranges do not fit.
func encodeRule(cells []cell, other verdict) (policy.Rule, error) {
	var r policy.Rule
	src := ruleSources{&r}
	r.Rest = src.index(other.src)
	allAllowed := other.allow
	for _, c := range cells {
		allAllowed = allAllowed && c.v.allow
	}
	if allAllowed {
		r.Flags = uint8(maps.CniPolicyRuleFlagsPOLICY_F_ALL_PORTS)
		for _, c := range cells {
			src.index(c.v.src)
		}
		return r, nil
	}
	// The ranges decided otherwise than the ports the entry does not list
	// (as the protocols without ports: by the same policy, the same way),
	// each with its verdict and source while they fit; else only those
	// whose verdict differs.
	if other.allow {
		r.Flags = uint8(maps.CniPolicyRuleFlagsPOLICY_F_EXCEPT_PORTS)
	}
	var listed []cell
	for _, c := range cells {
		if c.v != other {
			listed = append(listed, c)
		}
	}
	var err error
	if len(listed) > MaxPorts {
		listed = mergedCells(cells, func(c cell) bool { return c.v.allow != other.allow })
	}
	if len(listed) > MaxPorts {
		// Too many: allow only the first that fit, deny the rest (fail
		// closed: the protocols without ports are denied too).
		r.Flags = 0
		allowed := mergedCells(cells, func(c cell) bool { return c.v.allow })
		if len(allowed) > MaxPorts {
			err = fmt.Errorf("%d port ranges, at most %d fit: only the first %d are allowed", len(allowed), MaxPorts, MaxPorts)
		} else {
			err = fmt.Errorf("%d port ranges, at most %d fit: only the %d allowed are, the protocols without ports denied", len(listed), MaxPorts, len(allowed))
		}
		listed = allowed[:min(len(allowed), MaxPorts)]
	}
	for _, c := range listed {
		s := src.index(c.v.src) & uint8(maps.CniPolicyPortSrcPOLICY_PORT_SRC)
		if !c.v.allow {
			s |= uint8(maps.CniPolicyPortSrcPOLICY_PORT_DENIED)
		}
		r.Ports[r.N_ports] = maps.CniPolicyPort{First: c.r.first, Last: c.r.last, Proto: c.r.proto, Src: s}
		r.N_ports++
	}
	return r, err
}

// mergedCells are the cells keep keeps, without their sources where
// ranges of one protocol that touch are merged into one.
func mergedCells(cells []cell, keep func(cell) bool) []cell {
	var out []cell
	for _, c := range cells {
		if !keep(c) {
			continue
		}
		if n := len(out); n > 0 && out[n-1].r.proto == c.r.proto && uint32(out[n-1].r.last)+1 == uint32(c.r.first) {
			out[n-1].r.last = c.r.last
			out[n-1].v.src = 0
			continue
		}
		out = append(out, c)
	}
	return out
}

// npAllows: NetworkPolicy entry r allows proto/port (otherProto: a
// protocol without ports).
func npAllows(r *policy.Rule, proto uint8, port uint16) bool {
	if r.Flags&uint8(maps.CniPolicyRuleFlagsPOLICY_F_ALL_PORTS) != 0 {
		return true
	}
	for _, p := range r.Ports[:r.N_ports] {
		if p.Proto == proto && port >= p.First && port <= p.Last {
			return p.Src&uint8(maps.CniPolicyPortSrcPOLICY_PORT_DENIED) == 0
		}
	}
	return r.Flags&uint8(maps.CniPolicyRuleFlagsPOLICY_F_EXCEPT_PORTS) != 0
}
