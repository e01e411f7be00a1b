package compile

import (
	"cmp"
	"fmt"
	stdmaps "maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"

	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
)

// This file makes a compilation after a change cost what the change
// touches. A Compiler keeps from one compilation to the next:
//   - the parsed policies, by object (an informer hands out the same object
//     until it changes);
//   - its pods and namespaces (podState), changed pod by pod: a pod's
//     change updates its namespace's list, and forgets the peers matched
//     before (memo) only of the selectors that select the pod before or
//     after;
//   - each endpoint's result and what it read: the peer selectors whose
//     pods it matched, its namespace's fact. An endpoint is compiled again
//     only when one of those changed, its own pod or endpoint changed, or a
//     policy of its namespace that selects it (before or after) came, went
//     or changed; everything is compiled again when a namespace's labels or
//     a ClusterNetworkPolicy changed (both rare, and either can change any
//     endpoint's subjects and peers).
//
// Compile from scratch and a chain of Updates give the same result: the
// tests compare them after random sequences of changes.

// Compiler compiles; it keeps what it parsed, matched and compiled (see
// above), so a compilation after a change redoes only what the change
// touches. Not safe for concurrent use.
type Compiler struct {
	cache    map[*networkingv1.NetworkPolicy]*compiledPolicy
	fresh    map[*networkingv1.NetworkPolicy]*compiledPolicy // parsed by PeerNamespaces, for the next compilation
	cnpCache map[*cnpv1.ClusterNetworkPolicy]*compiledCNP
	pods     *podState
	eps      map[uint32]*epResult // by ifindex
	peerNS   peerNSCache
	// facts is the last result's Namespaces, kept (and handed out again)
	// while the namespaces and ClusterNetworkPolicies are the same.
	facts map[string]policy.NamespaceFact
}

// epResult is an endpoint's last compilation and what it read.
type epResult struct {
	ep    LocalEndpoint
	rules *EndpointRules
	err   error
	fact  policy.NamespaceFact // its namespace's
	deps  map[string]bool      // the peer keys it matched pods of
}

// Compile compiles the policies for the local endpoints eps: what changed
// since the last compilation is found by comparing cl's objects with the
// last ones (cl.Pods by namespace/name and object).
func (c *Compiler) Compile(cl Cluster, eps []LocalEndpoint) *Result {
	changes := map[string]*corev1.Pod{}
	seen := make(map[string]bool, len(cl.Pods))
	for _, p := range cl.Pods {
		key := p.Namespace + "/" + p.Name
		seen[key] = true
		if c.pods == nil {
			changes[key] = p
		} else if old := c.pods.podByKey[key]; old == nil || old.pod != p {
			changes[key] = p
		}
	}
	if c.pods != nil {
		for key := range c.pods.podByKey {
			if !seen[key] {
				changes[key] = nil
			}
		}
	}
	return c.Update(cl, changes, eps)
}

// Update compiles after a change: pods are the pods that changed since the
// last compilation (by namespace/name; nil: gone), cl.Pods is not read;
// cl's policies and namespaces are all of them, compared by object.
func (c *Compiler) Update(cl Cluster, pods map[string]*corev1.Pod, eps []LocalEndpoint) *Result {
	res := &Result{Endpoints: map[uint32]*EndpointRules{}, Namespaces: map[string]policy.NamespaceFact{}, Names: map[uint32]policy.Source{}, Errors: map[uint32]error{}}
	cp := &compilation{byNS: map[string][]int{}, dirMemo: map[string]dirResult{}}
	changedPols := c.policies(cl.Policies, cp, res)
	changedCNPs := c.clusterPolicies(cl.ClusterPolicies, cp, res)
	all := false
	if c.pods == nil {
		c.pods = newPodState()
		all = true
	}
	ps := c.pods
	cp.podState = ps
	pods = stdmaps.Clone(pods) // the endpoints' pods are added to it
	if pods == nil {
		pods = map[string]*corev1.Pod{}
	}
	nsChanged := ps.setNamespaces(cl.Namespaces)
	changedEPs := c.localChanges(eps, pods)
	ps.setLocal(eps)
	var moved []podChange
	for key, p := range pods {
		old, cur, nsc := ps.setPod(key, p)
		nsChanged = nsChanged || nsc
		moved = append(moved, podChange{old, cur})
	}
	if nsChanged {
		ps.rebuildNamespaces()
		all = true
	}
	invalid := ps.invalidate(moved)
	switch {
	case all || c.facts == nil || len(changedCNPs) > 0 || len(cp.cnps) > 0 && len(changedPols) > 0:
		c.namespaceFacts(cl.Namespaces, cp, res)
		c.facts = res.Namespaces
	case len(changedPols) > 0:
		c.changeFacts(changedPols, cp)
	}
	res.Namespaces = c.facts

	next := make(map[uint32]*epResult, len(eps))
	for i := range eps {
		ep := &eps[i]
		fact := res.Namespaces[ep.Namespace]
		key := ep.Namespace + "/" + ep.Name
		r := c.eps[ep.Ifindex]
		_, self := pods[key]
		if all || r == nil || self || changedEPs[ep.Ifindex] || r.fact != fact || r.dependsOn(invalid) ||
			selectedBy(changedPols, ep.Namespace, ps.podByKey[key]) || subjectOf(changedCNPs, ps.podByKey[key], ps.nsLabels[ep.Namespace]) {
			r = cp.compileEndpoint(ep, fact)
		}
		next[ep.Ifindex] = r
		res.Endpoints[ep.Ifindex] = r.rules
		if r.err != nil {
			res.Errors[ep.Ifindex] = r.err
		}
	}
	c.eps = next
	return res
}

// compileEndpoint compiles ep and keeps what it read.
func (cp *compilation) compileEndpoint(ep *LocalEndpoint, fact policy.NamespaceFact) *epResult {
	cp.deps = map[string]bool{}
	er, err := cp.endpoint(ep, fact)
	r := &epResult{ep: *ep, rules: er, fact: fact, deps: cp.deps}
	r.ep.IPs = slices.Clone(ep.IPs)
	cp.deps = nil
	if err != nil {
		r.err = fmt.Errorf("endpoint %s/%s (ifindex %d): %w", ep.Namespace, ep.Name, ep.Ifindex, err)
	}
	return r
}

func (r *epResult) dependsOn(keys map[string]bool) bool {
	for k := range keys {
		if r.deps[k] {
			return true
		}
	}
	return false
}

// selectedBy: one of pols (policies that came, went or changed) is of
// namespace ns and selects self (unknown: may select it).
func selectedBy(pols []*compiledPolicy, ns string, self *podInfo) bool {
	for _, x := range pols {
		if x.ns == ns && (self == nil || x.sel.Matches(self.labels)) {
			return true
		}
	}
	return false
}

// subjectOf: one of cnps (ClusterNetworkPolicies that came, went or
// changed) selects self (unknown: may select it). An endpoint's entries
// read only the ClusterNetworkPolicies that select it: the others' change
// leaves them as they are.
func subjectOf(cnps []*compiledCNP, self *podInfo, nsLabels labels.Set) bool {
	for _, x := range cnps {
		if self == nil || x.selects(self, nsLabels) {
			return true
		}
	}
	return false
}

// policies parses what it has not yet of pols into cp (sorted by
// namespace/name), their names and facts into res, and returns those that
// came or went since the last compilation (a changed one is a new object:
// both).
func (c *Compiler) policies(pols []*networkingv1.NetworkPolicy, cp *compilation, res *Result) []*compiledPolicy {
	var changed []*compiledPolicy
	cache := make(map[*networkingv1.NetworkPolicy]*compiledPolicy, len(pols))
	pols = slices.Clone(pols)
	slices.SortFunc(pols, func(a, b *networkingv1.NetworkPolicy) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	for _, p := range pols {
		x := c.cache[p]
		if x == nil {
			if x = c.fresh[p]; x == nil {
				x = compilePolicy(p)
			}
			changed = append(changed, x)
		}
		cache[p] = x
		cp.byNS[x.ns] = append(cp.byNS[x.ns], len(cp.policies))
		cp.policies = append(cp.policies, x)
		res.Names[x.id] = policy.Source{Namespace: x.ns, Name: x.name}
		f := res.Namespaces[x.ns]
		f.Ingress = f.Ingress || x.ingress
		f.Egress = f.Egress || x.egress
		res.Namespaces[x.ns] = f
	}
	for p, x := range c.cache {
		if _, ok := cache[p]; !ok {
			changed = append(changed, x)
		}
	}
	c.cache, c.fresh = cache, nil
	return changed
}

// clusterPolicies parses what it has not yet of pols into cp, their names
// into res, and returns those that came or went since the last
// compilation (a changed one is a new object: both).
func (c *Compiler) clusterPolicies(pols []*cnpv1.ClusterNetworkPolicy, cp *compilation, res *Result) (changed []*compiledCNP) {
	cache := make(map[*cnpv1.ClusterNetworkPolicy]*compiledCNP, len(pols))
	for _, p := range pols {
		x, ok := c.cnpCache[p]
		if !ok {
			x = compileCNP(p)
			if x != nil {
				changed = append(changed, x)
			}
		}
		cache[p] = x
		if x != nil {
			cp.cnps = append(cp.cnps, x)
			res.Names[x.id] = x.source()
		}
	}
	for p, x := range c.cnpCache {
		if _, ok := cache[p]; !ok && x != nil {
			changed = append(changed, x)
		}
	}
	c.cnpCache = cache
	sortCNPs(cp.cnps)
	return changed
}

// namespaceFacts completes res.Namespaces: the namespaces some
// ClusterNetworkPolicy's subject may select (their new pods start closed
// in the directions it has rules for), a zero fact for the others.
func (c *Compiler) namespaceFacts(nss []*corev1.Namespace, cp *compilation, res *Result) {
	for _, x := range cp.cnps {
		for _, ns := range cp.namespaces(x.nsSel) {
			f := res.Namespaces[ns]
			f.Ingress = f.Ingress || len(x.in) > 0
			f.Egress = f.Egress || len(x.out) > 0
			res.Namespaces[ns] = f
		}
	}
	for _, ns := range nss {
		if _, ok := res.Namespaces[ns.Name]; !ok {
			res.Namespaces[ns.Name] = policy.NamespaceFact{}
		}
	}
}

// changeFacts brings c.facts to the policies cp has, where pols (those
// that came or went) are: without ClusterNetworkPolicies, a namespace's
// fact is its policies'.
func (c *Compiler) changeFacts(pols []*compiledPolicy, cp *compilation) {
	for _, x := range pols {
		var f policy.NamespaceFact
		for _, i := range cp.byNS[x.ns] {
			f.Ingress = f.Ingress || cp.policies[i].ingress
			f.Egress = f.Egress || cp.policies[i].egress
		}
		if len(cp.byNS[x.ns]) > 0 || cp.nsObjs[x.ns] != nil {
			c.facts[x.ns] = f
		} else {
			delete(c.facts, x.ns)
		}
	}
}

// localChanges compares eps with the endpoints of the last compilation:
// the ifindexes whose endpoint came or changed; the pods of the endpoints
// that came, went or changed are added to pods (unchanged objects: their
// addresses are their endpoint's too).
func (c *Compiler) localChanges(eps []LocalEndpoint, pods map[string]*corev1.Pod) map[uint32]bool {
	changed := map[uint32]bool{}
	touch := func(ep *LocalEndpoint) {
		key := ep.Namespace + "/" + ep.Name
		if _, ok := pods[key]; ok || c.pods == nil {
			return
		}
		if pi := c.pods.podByKey[key]; pi != nil {
			pods[key] = pi.pod
		}
	}
	cur := make(map[uint32]bool, len(eps))
	for i := range eps {
		ep := &eps[i]
		cur[ep.Ifindex] = true
		r := c.eps[ep.Ifindex]
		if r != nil && sameEndpoint(&r.ep, ep) {
			continue
		}
		changed[ep.Ifindex] = true
		touch(ep)
		if r != nil {
			touch(&r.ep)
		}
	}
	for ifindex, r := range c.eps {
		if !cur[ifindex] {
			touch(&r.ep)
		}
	}
	return changed
}

func sameEndpoint(a, b *LocalEndpoint) bool {
	return a.Ifindex == b.Ifindex && a.Namespace == b.Namespace && a.Name == b.Name && a.UID == b.UID && slices.Equal(a.IPs, b.IPs)
}

// podState is what the compiler knows of pods and namespaces, and the
// peers it matched among them, kept from one compilation to the next and
// changed pod by pod.
type podState struct {
	pods     map[string][]*podInfo        // namespace -> peer pods, sorted by name
	podByKey map[string]*podInfo          // namespace/name -> pod (peer or not)
	nsObjs   map[string]*corev1.Namespace // the namespaces, by name
	// live counts the pods of a namespace neither on the host network nor
	// finished: a namespace without object is known while it has one (a
	// fake clientset's pods may have none).
	live     map[string]int
	nsLabels map[string]labels.Set // namespace -> labels (with kubernetes.io/metadata.name)
	nsNames  []string              // sorted
	memo     map[string]memoEntry  // peer key -> its pods
	nsMemo   map[string][]string   // namespace selector -> matching namespaces
	local    map[string]*LocalEndpoint
}

// memoEntry is a selector peer's pods, and its selectors: a pod they
// select before or after its change makes the entry stale.
type memoEntry struct {
	peer peerSelectors
	pods []*podInfo
}

type peerSelectors struct {
	podSel, nsSel labels.Selector // nsSel nil: the pods of namespace ns
	ns            string
}

// podChange is a pod before and after a change (nil: none).
type podChange struct{ old, cur *podInfo }

func newPodState() *podState {
	return &podState{pods: map[string][]*podInfo{}, podByKey: map[string]*podInfo{}, nsObjs: map[string]*corev1.Namespace{},
		live: map[string]int{}, nsLabels: map[string]labels.Set{}, memo: map[string]memoEntry{}, nsMemo: map[string][]string{}}
}

// setNamespaces takes the namespaces nss, and says whether their names or
// labels changed.
func (ps *podState) setNamespaces(nss []*corev1.Namespace) bool {
	if len(nss) == len(ps.nsObjs) && !slices.ContainsFunc(nss, func(ns *corev1.Namespace) bool { return ps.nsObjs[ns.Name] != ns }) {
		return false // the same objects
	}
	same := len(nss) == len(ps.nsObjs)
	for _, ns := range nss {
		if !same {
			break
		}
		old := ps.nsObjs[ns.Name]
		same = old != nil && (old == ns || stdmaps.Equal(old.Labels, ns.Labels))
	}
	objs := make(map[string]*corev1.Namespace, len(nss))
	for _, ns := range nss {
		objs[ns.Name] = ns
	}
	ps.nsObjs = objs
	return !same
}

// rebuildNamespaces makes the namespaces' labels and names anew, and
// forgets every match.
func (ps *podState) rebuildNamespaces() {
	ps.nsLabels = make(map[string]labels.Set, len(ps.nsObjs))
	for name, ns := range ps.nsObjs {
		l := make(labels.Set, len(ns.Labels)+1)
		for k, v := range ns.Labels {
			l[k] = v
		}
		// The API server sets it on every namespace; a fake clientset's
		// namespaces lack it.
		l[corev1.LabelMetadataName] = name
		ps.nsLabels[name] = l
	}
	for ns := range ps.live {
		if _, ok := ps.nsLabels[ns]; !ok {
			ps.nsLabels[ns] = labels.Set{corev1.LabelMetadataName: ns}
		}
	}
	ps.nsNames = slices.Sorted(stdmaps.Keys(ps.nsLabels))
	ps.memo, ps.nsMemo = map[string]memoEntry{}, map[string][]string{}
}

// setLocal takes the local endpoints (their addresses are their pods').
func (ps *podState) setLocal(eps []LocalEndpoint) {
	ps.local = make(map[string]*LocalEndpoint, len(eps))
	for i := range eps {
		ps.local[eps[i].Namespace+"/"+eps[i].Name] = &eps[i]
	}
}

// setPod replaces the pod of key with p (nil: none); nsChanged: a
// namespace without object came or went with it.
func (ps *podState) setPod(key string, p *corev1.Pod) (old, cur *podInfo, nsChanged bool) {
	if old = ps.podByKey[key]; old != nil {
		delete(ps.podByKey, key)
		if len(old.addrs) > 0 {
			l := slices.DeleteFunc(ps.pods[old.ns], func(x *podInfo) bool { return x == old })
			if len(l) == 0 {
				delete(ps.pods, old.ns)
			} else {
				ps.pods[old.ns] = l
			}
		}
		if old.live {
			if ps.live[old.ns]--; ps.live[old.ns] == 0 {
				delete(ps.live, old.ns)
				nsChanged = ps.nsObjs[old.ns] == nil
			}
		}
	}
	if p == nil {
		return old, nil, nsChanged
	}
	cur = ps.podInfoOf(p)
	ps.podByKey[key] = cur
	if cur.live {
		if ps.live[cur.ns] == 0 && ps.nsObjs[cur.ns] == nil {
			nsChanged = true
		}
		ps.live[cur.ns]++
	}
	if len(cur.addrs) > 0 {
		l := ps.pods[cur.ns]
		i, _ := slices.BinarySearchFunc(l, cur.name, func(x *podInfo, name string) int { return strings.Compare(x.name, name) })
		ps.pods[cur.ns] = slices.Insert(l, i, cur)
	}
	return old, cur, nsChanged
}

// podInfoOf is pod p as a peer: its addresses, and for a pod of a local
// endpoint the endpoint's; none for a pod on the host network or
// finished.
func (ps *podState) podInfoOf(p *corev1.Pod) *podInfo {
	pi := &podInfo{ns: p.Namespace, name: p.Name, labels: labels.Set(p.Labels), pod: p}
	if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return pi
	}
	pi.live = true
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			pi.addrs = appendAddr(pi.addrs, a.Unmap())
		}
	}
	if len(p.Status.PodIPs) == 0 && p.Status.PodIP != "" {
		if a, err := netip.ParseAddr(p.Status.PodIP); err == nil {
			pi.addrs = appendAddr(pi.addrs, a.Unmap())
		}
	}
	if ep := ps.local[p.Namespace+"/"+p.Name]; ep != nil && sameUID(ep.UID, string(p.UID)) {
		for _, a := range ep.IPs {
			pi.addrs = appendAddr(pi.addrs, a.Unmap())
		}
	}
	return pi
}

// invalidate forgets the pods matched by the selectors that select a
// changed pod before or after its change, and returns their keys.
func (ps *podState) invalidate(changes []podChange) map[string]bool {
	out := map[string]bool{}
	for k, m := range ps.memo {
		for _, ch := range changes {
			if m.peer.selects(ch.old, ps.nsLabels) || m.peer.selects(ch.cur, ps.nsLabels) {
				out[k] = true
				delete(ps.memo, k)
				break
			}
		}
	}
	return out
}

func (s peerSelectors) selects(p *podInfo, nsLabels map[string]labels.Set) bool {
	if p == nil {
		return false
	}
	if s.nsSel == nil {
		if p.ns != s.ns {
			return false
		}
	} else if !s.nsSel.Matches(nsLabels[p.ns]) {
		return false
	}
	return s.podSel.Matches(p.labels)
}

// addKeys adds src's keys to dst (nil: nothing).
func addKeys(dst, src map[string]bool) {
	if dst == nil {
		return
	}
	for k := range src {
		dst[k] = true
	}
}

// compilation is the state of one compilation.
type compilation struct {
	*podState
	policies []*compiledPolicy    // sorted by namespace/name: their index orders sources
	byNS     map[string][]int     // namespace -> indexes of its policies
	cnps     []*compiledCNP       // in the order they decide (sortCNPs)
	dirMemo  map[string]dirResult // see directionOnce
	deps     map[string]bool      // the peer keys the endpoint being compiled read
}

// peerNSCache is what PeerNamespaces keeps: the namespaces' labels, by
// object, and the namespaces each namespace selector matches among them.
type peerNSCache struct {
	labels  map[*corev1.Namespace]labels.Set
	matches map[string][]string
}

// PeerNamespaces is the package's PeerNamespaces, with the policies parsed
// once (kept for the next compilation) and the namespace selectors
// matched once while the namespaces stay the same objects.
func (c *Compiler) PeerNamespaces(pols []*networkingv1.NetworkPolicy, nss []*corev1.Namespace, locals []*corev1.Pod) (out map[string]bool, all bool) {
	pc := &c.peerNS
	same := len(nss) == len(pc.labels)
	for _, ns := range nss {
		if same = same && pc.labels[ns] != nil; !same {
			break
		}
	}
	if !same {
		next := make(map[*corev1.Namespace]labels.Set, len(nss))
		for _, ns := range nss {
			l := pc.labels[ns]
			if l == nil {
				l = make(labels.Set, len(ns.Labels)+1)
				for k, v := range ns.Labels {
					l[k] = v
				}
				l[corev1.LabelMetadataName] = ns.Name
			}
			next[ns] = l
		}
		pc.labels, pc.matches = next, map[string][]string{}
	}
	match := func(sel labels.Selector) []string {
		k := sel.String()
		m, ok := pc.matches[k]
		if !ok {
			for ns, l := range pc.labels {
				if sel.Matches(l) {
					m = append(m, ns.Name)
				}
			}
			pc.matches[k] = m
		}
		return m
	}
	if c.fresh == nil {
		c.fresh = map[*networkingv1.NetworkPolicy]*compiledPolicy{}
	}
	parsed := make([]*compiledPolicy, 0, len(pols))
	for _, p := range pols {
		x := c.cache[p]
		if x == nil {
			if x = c.fresh[p]; x == nil {
				x = compilePolicy(p)
				c.fresh[p] = x
			}
		}
		parsed = append(parsed, x)
	}
	return peerNamespaces(parsed, locals, match)
}
