// Package policy is the NetworkPolicy feature of ebpf-cni: the maps of a
// node (bpf/lib/policy.h) that say what each endpoint may receive and send,
// as the node agent compiles them (pkg/policy/compile) and the programs
// enforce them, the per-namespace facts ADD reads, and the feature that
// gives a pod its first state (feature.go) and shows them (view.go).
//
// The agent is the only writer of rules, names and namespace facts; ADD
// writes the first state of a pod it starts in a namespace that has
// policies (closed); DEL and GC remove an endpoint's state and drop
// counters, and GC the rules the agent left of endpoints that are gone.
package policy

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// Direction of a rule, as enum pkt_dir.
type Direction uint8

const (
	Egress  = Direction(maps.CniPktDirPKT_DIR_EGRESS)
	Ingress = Direction(maps.CniPktDirPKT_DIR_INGRESS)
)

func (d Direction) String() string {
	if d == Ingress {
		return "ingress"
	}
	return "egress"
}

// State of a direction of an endpoint (enum policy_state).
type State uint8

const (
	StateOpen    = State(maps.CniPolicyStatePOLICY_OPEN)
	StateClosed  = State(maps.CniPolicyStatePOLICY_CLOSED)
	StateEnforce = State(maps.CniPolicyStatePOLICY_ENFORCE)
)

func (s State) String() string {
	switch s {
	case StateOpen:
		return "open"
	case StateClosed:
		return "closed"
	case StateEnforce:
		return "enforced"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Names of the maps, in the order Open opens them.
var Names = []string{
	maps.CniMapPolicyConfig, maps.CniMapPolicyEndpoints, maps.CniMapPolicyRules, maps.CniMapPolicyFlows,
	maps.CniMapPolicyDrops, maps.CniMapPolicyNamespaces, maps.CniMapPolicySources,
}

// Maps are the pinned policy maps of a node.
type Maps struct {
	ConfigMap    *ebpf.Map // [0] -> policy_settings
	EndpointMap  *ebpf.Map // host ifindex -> policy_endpoint
	RuleMap      *ebpf.Map // LPM policy_key -> policy_rule
	FlowMap      *ebpf.Map // policy_flow_key -> policy_flow (LRU)
	DropMap      *ebpf.Map // policy_drop_key -> per-CPU u64
	NamespaceMap *ebpf.Map // policy_ns_key -> policy_ns
	NameMap      *ebpf.Map // policy_sources: policy id -> policy_source
	own          bool
}

// Open opens (creating and pinning when missing) the policy maps of the
// node through its handle, which keeps and closes them.
func Open(n *node.Node) (*Maps, error) {
	ms := make(map[string]*ebpf.Map, len(Names))
	for _, name := range Names {
		m, err := n.Map(name)
		if err != nil {
			return nil, err
		}
		ms[name] = m
	}
	return FromMaps(ms, false), nil
}

// FromMaps wraps maps opened by name; own: Close closes them.
func FromMaps(ms map[string]*ebpf.Map, own bool) *Maps {
	return &Maps{
		ConfigMap: ms[maps.CniMapPolicyConfig], EndpointMap: ms[maps.CniMapPolicyEndpoints], RuleMap: ms[maps.CniMapPolicyRules],
		FlowMap: ms[maps.CniMapPolicyFlows], DropMap: ms[maps.CniMapPolicyDrops], NamespaceMap: ms[maps.CniMapPolicyNamespaces],
		NameMap: ms[maps.CniMapPolicySources], own: own,
	}
}

// ownMaps are the maps an endpoint's life touches: its first state
// (policy_endpoints, policy_config, read from policy_namespaces) and its
// drop counters; the rules, flows and names are the agent's and the
// programs'.
var ownMaps = []string{maps.CniMapPolicyEndpoints, maps.CniMapPolicyConfig, maps.CniMapPolicyNamespaces, maps.CniMapPolicyDrops}

// MapsOf are the maps of the call's node that an endpoint's life touches,
// created when missing (ADD); the node opens each once per call and closes
// them.
func MapsOf(n *node.Node) (*Maps, error) {
	ms := map[string]*ebpf.Map{}
	for _, name := range ownMaps {
		m, err := n.Map(name)
		if err != nil {
			return nil, fmt.Errorf("opening the policy maps: %w", err)
		}
		ms[name] = m
	}
	return FromMaps(ms, false), nil
}

// pinnedOf are the node's policy maps of names that are pinned, nil where
// one is not (a node no ADD of a build with NetworkPolicy ran on): DEL and
// GC create none.
func pinnedOf(n *node.Node, names ...string) (*Maps, error) {
	ms := map[string]*ebpf.Map{}
	for _, name := range names {
		m, err := n.PinnedMap(name)
		if err != nil {
			return nil, fmt.Errorf("opening the policy maps: %w", err)
		}
		ms[name] = m
	}
	return FromMaps(ms, false), nil
}

// Close closes the maps Open opened.
func (m *Maps) Close() {
	if m == nil || !m.own {
		return
	}
	for _, x := range []*ebpf.Map{m.ConfigMap, m.EndpointMap, m.RuleMap, m.FlowMap, m.DropMap, m.NamespaceMap, m.NameMap} {
		if x != nil {
			x.Close()
		}
	}
}

// Active says whether the programs look policies up at all.
func (m *Maps) Active() (bool, error) {
	var v maps.CniPolicySettings
	if err := m.ConfigMap.Lookup(uint32(0), &v); err != nil {
		return false, fmt.Errorf("reading %s: %w", maps.CniMapPolicyConfig, err)
	}
	return v.Active != 0, nil
}

// SetActive turns the programs' lookups on or off. Off only when no endpoint
// has a state: turning it off checks again after, so that a state ADD wrote
// meanwhile turns it back on (ADD writes its state first, then on).
func (m *Maps) SetActive(on bool) error {
	v := maps.CniPolicySettings{}
	if on {
		v.Active = 1
	}
	if err := m.ConfigMap.Put(uint32(0), &v); err != nil {
		return fmt.Errorf("writing %s: %w", maps.CniMapPolicyConfig, err)
	}
	if on {
		return nil
	}
	var k uint32
	if err := m.EndpointMap.NextKey(nil, &k); err == nil {
		return m.SetActive(true)
	} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("reading %s: %w", maps.CniMapPolicyEndpoints, err)
	}
	return nil
}

// EndpointState is an endpoint's policy_endpoints entry.
type EndpointState = maps.CniPolicyEndpoint

// Endpoint reads the state of the endpoint behind host ifindex; ok false:
// none (open both ways).
func (m *Maps) Endpoint(ifindex uint32) (st EndpointState, ok bool, err error) {
	err = m.EndpointMap.Lookup(ifindex, &st)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return st, false, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("reading %s[%d]: %w", maps.CniMapPolicyEndpoints, ifindex, err)
	}
	return st, true, nil
}

// EndpointStates reads every endpoint state.
func (m *Maps) EndpointStates() (map[uint32]EndpointState, error) {
	out := map[uint32]EndpointState{}
	var k uint32
	var v EndpointState
	it := m.EndpointMap.Iterate()
	for it.Next(&k, &v) {
		out[k] = v
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterating %s: %w", maps.CniMapPolicyEndpoints, err)
	}
	return out, nil
}

// SetEndpoint writes the state of an endpoint and turns the lookups on. A
// state open both ways is deleted instead: such an endpoint costs its
// packets nothing.
func (m *Maps) SetEndpoint(ifindex uint32, st EndpointState) error {
	if State(st.Ingress) == StateOpen && State(st.Egress) == StateOpen {
		return m.DeleteEndpoint(ifindex)
	}
	if err := m.EndpointMap.Put(ifindex, &st); err != nil {
		if errors.Is(err, errE2BIG) {
			return fmt.Errorf("%s is full (%d endpoints): %w", maps.CniMapPolicyEndpoints, m.EndpointMap.MaxEntries(), err)
		}
		return fmt.Errorf("writing %s[%d]: %w", maps.CniMapPolicyEndpoints, ifindex, err)
	}
	return m.SetActive(true)
}

// DeleteEndpoint removes the state and drop counters of an endpoint (DEL,
// GC, or both directions open); a missing entry, or map (not pinned), is
// fine.
func (m *Maps) DeleteEndpoint(ifindex uint32) error {
	if m.EndpointMap != nil {
		if err := m.EndpointMap.Delete(ifindex); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting %s[%d]: %w", maps.CniMapPolicyEndpoints, ifindex, err)
		}
	}
	if m.DropMap == nil {
		return nil
	}
	for _, d := range []Direction{Ingress, Egress} {
		k := maps.CniPolicyDropKey{Ifindex: ifindex, Dir: uint32(d)}
		if err := m.DropMap.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting %s[%d/%s]: %w", maps.CniMapPolicyDrops, ifindex, d, err)
		}
	}
	return nil
}

// Drops is the number of packets denied to/by the endpoint in direction d.
func (m *Maps) Drops(ifindex uint32, d Direction) (uint64, error) {
	var per []uint64
	k := maps.CniPolicyDropKey{Ifindex: ifindex, Dir: uint32(d)}
	if err := m.DropMap.Lookup(&k, &per); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return 0, nil
		}
		return 0, fmt.Errorf("reading %s: %w", maps.CniMapPolicyDrops, err)
	}
	var n uint64
	for _, c := range per {
		n += c
	}
	return n, nil
}

// DropEndpoints are the host ifindexes policy_drops counts packets of.
func (m *Maps) DropEndpoints() (map[uint32]bool, error) {
	out := map[uint32]bool{}
	var k maps.CniPolicyDropKey
	var per []uint64
	it := m.DropMap.Iterate()
	for it.Next(&k, &per) {
		out[k.Ifindex] = true
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterating %s: %w", maps.CniMapPolicyDrops, err)
	}
	return out, nil
}

// NamespaceFact is what a namespace's policies isolate.
type NamespaceFact struct{ Ingress, Egress bool }

func nsKey(ns string) maps.CniPolicyNsKey {
	var k maps.CniPolicyNsKey
	maps.CString(k.Namespace[:], ns)
	return k
}

// Namespace reads the fact of namespace ns (zero: no policies).
func (m *Maps) Namespace(ns string) (NamespaceFact, error) {
	var v maps.CniPolicyNs
	k := nsKey(ns)
	if err := m.NamespaceMap.Lookup(&k, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return NamespaceFact{}, nil
		}
		return NamespaceFact{}, fmt.Errorf("reading %s[%s]: %w", maps.CniMapPolicyNamespaces, ns, err)
	}
	return NamespaceFact{Ingress: v.Ingress != 0, Egress: v.Egress != 0}, nil
}

// SetNamespace writes the fact of namespace ns; a zero fact deletes it.
func (m *Maps) SetNamespace(ns string, f NamespaceFact) error {
	k := nsKey(ns)
	if !f.Ingress && !f.Egress {
		if err := m.NamespaceMap.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting %s[%s]: %w", maps.CniMapPolicyNamespaces, ns, err)
		}
		return nil
	}
	v := maps.CniPolicyNs{}
	if f.Ingress {
		v.Ingress = 1
	}
	if f.Egress {
		v.Egress = 1
	}
	if err := m.NamespaceMap.Put(&k, &v); err != nil {
		return fmt.Errorf("writing %s[%s]: %w", maps.CniMapPolicyNamespaces, ns, err)
	}
	return nil
}

// NamespaceFacts reads every namespace fact.
func (m *Maps) NamespaceFacts() (map[string]NamespaceFact, error) {
	out := map[string]NamespaceFact{}
	var k maps.CniPolicyNsKey
	var v maps.CniPolicyNs
	it := m.NamespaceMap.Iterate()
	for it.Next(&k, &v) {
		out[maps.GoString(k.Namespace[:])] = NamespaceFact{Ingress: v.Ingress != 0, Egress: v.Egress != 0}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterating %s: %w", maps.CniMapPolicyNamespaces, err)
	}
	return out, nil
}

// StartState is the state ADD gives a new pod of namespace ns: the
// directions its namespace's policies isolate start closed, until the agent
// writes the pod's rules. Without a namespace (not a Kubernetes pod) or
// policies: open, nothing to write.
func (m *Maps) StartState(ns string) (EndpointState, error) {
	var st EndpointState
	if ns == "" {
		return st, nil
	}
	f, err := m.Namespace(ns)
	if err != nil {
		return st, err
	}
	if f.Ingress {
		st.Ingress = uint8(StateClosed)
	}
	if f.Egress {
		st.Egress = uint8(StateClosed)
	}
	return st, nil
}

// ID is a policy's key in policy_sources (and in a rule's sources): FNV-1a
// of "namespace/name" ("/name" for a ClusterNetworkPolicy: no namespace is
// empty).
func ID(namespace, name string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(namespace + "/" + name))
	return h.Sum32()
}

// Tier is the tier of a policy (enum policy_tier): ClusterNetworkPolicies
// of tier Admin decide a flow first, then NetworkPolicies, then those of
// tier Baseline.
type Tier uint8

const (
	TierNetworkPolicy = Tier(maps.CniPolicyTierPOLICY_TIER_NETWORK_POLICY)
	TierAdmin         = Tier(maps.CniPolicyTierPOLICY_TIER_ADMIN)
	TierBaseline      = Tier(maps.CniPolicyTierPOLICY_TIER_BASELINE)
)

func (t Tier) String() string {
	switch t {
	case TierNetworkPolicy:
		return "NetworkPolicy"
	case TierAdmin:
		return "Admin"
	case TierBaseline:
		return "Baseline"
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}

// Source is a policy as policy_sources holds it: its tier, its priority
// (a ClusterNetworkPolicy's), namespace (none for a ClusterNetworkPolicy)
// and name.
type Source struct {
	Tier      Tier
	Priority  uint16
	Namespace string
	Name      string
}

// ID is the source's key in policy_sources.
func (s Source) ID() uint32 { return ID(s.Namespace, s.Name) }

// String is "namespace/name" of a NetworkPolicy, "Admin:10/name" of a
// ClusterNetworkPolicy of tier Admin and priority 10.
func (s Source) String() string {
	if s.Tier == TierNetworkPolicy {
		return s.Namespace + "/" + s.Name
	}
	return fmt.Sprintf("%s:%d/%s", s.Tier, s.Priority, s.Name)
}

// SetSource records policy s under its id (s.ID()).
func (m *Maps) SetSource(s Source) (uint32, error) {
	id := s.ID()
	v := maps.CniPolicySource{Tier: uint8(s.Tier), Priority: s.Priority}
	maps.CString(v.Namespace[:], s.Namespace)
	maps.CString(v.Name[:], s.Name)
	if err := m.NameMap.Put(id, &v); err != nil {
		return 0, fmt.Errorf("writing %s[%s]: %w", maps.CniMapPolicySources, s, err)
	}
	return id, nil
}

// SetName records the NetworkPolicy namespace/name.
func (m *Maps) SetName(namespace, name string) (uint32, error) {
	return m.SetSource(Source{Namespace: namespace, Name: name})
}

// DeleteName removes policy id from policy_sources.
func (m *Maps) DeleteName(id uint32) error {
	if err := m.NameMap.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("deleting %s[%#x]: %w", maps.CniMapPolicySources, id, err)
	}
	return nil
}

// SourceOf reads policy id; ok false when policy_sources has none.
func (m *Maps) SourceOf(id uint32) (s Source, ok bool) {
	var v maps.CniPolicySource
	if err := m.NameMap.Lookup(id, &v); err != nil {
		return s, false
	}
	return sourceOf(&v), true
}

func sourceOf(v *maps.CniPolicySource) Source {
	return Source{Tier: Tier(v.Tier), Priority: v.Priority, Namespace: maps.GoString(v.Namespace[:]), Name: maps.GoString(v.Name[:])}
}

// Sources reads every policy of policy_sources, by id.
func (m *Maps) Sources() (map[uint32]Source, error) {
	out := map[uint32]Source{}
	var id uint32
	var v maps.CniPolicySource
	it := m.NameMap.Iterate()
	for it.Next(&id, &v) {
		out[id] = sourceOf(&v)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterating %s: %w", maps.CniMapPolicySources, err)
	}
	return out, nil
}

// NameOf is policy id as Source.String says it, or its id in hex when
// unknown.
func (m *Maps) NameOf(id uint32) string {
	s, ok := m.SourceOf(id)
	if !ok {
		return fmt.Sprintf("policy %#x", id)
	}
	return s.String()
}

// Key is the policy_rules key of an endpoint's rule for prefix p.
func Key(ifindex uint32, d Direction, p netip.Prefix) maps.CniPolicyKey {
	p = p.Masked()
	k := maps.CniPolicyKey{Ifindex: ifindex, Dir: uint8(d), Prefixlen: 64 + uint32(p.Bits())}
	a := p.Addr()
	if a.Is4() || a.Is4In6() {
		a = a.Unmap()
		k.Family = uint8(maps.CniAddrFamilyADDR_FAMILY_V4)
		b := a.As4()
		copy(k.Addr[:], b[:])
	} else {
		k.Family = uint8(maps.CniAddrFamilyADDR_FAMILY_V6)
		b := a.As16()
		copy(k.Addr[:], b[:])
	}
	return k
}

// PrefixOf is the peer prefix of key k.
func PrefixOf(k *maps.CniPolicyKey) netip.Prefix {
	bits := int(k.Prefixlen) - 64
	if k.Family == uint8(maps.CniAddrFamilyADDR_FAMILY_V4) {
		var b [4]byte
		copy(b[:], k.Addr[:4])
		return netip.PrefixFrom(netip.AddrFrom4(b), bits)
	}
	return netip.PrefixFrom(netip.AddrFrom16(k.Addr), bits)
}

// Rule is one policy_rules entry as Go sees it.
type Rule = maps.CniPolicyRule

// Entry is one entry of an endpoint's rules: a peer prefix and what its
// peers may use.
type Entry struct {
	Prefix netip.Prefix
	Rule   Rule
}

// PutRules writes the entries of endpoint ifindex for direction d.
func (m *Maps) PutRules(ifindex uint32, d Direction, entries []Entry) error {
	for i := range entries {
		k := Key(ifindex, d, entries[i].Prefix)
		if err := m.RuleMap.Put(&k, &entries[i].Rule); err != nil {
			if errors.Is(err, errE2BIG) {
				return fmt.Errorf("%s is full (%d entries): %w", maps.CniMapPolicyRules, m.RuleMap.MaxEntries(), err)
			}
			return fmt.Errorf("writing %s[%d %s %s]: %w", maps.CniMapPolicyRules, ifindex, d, entries[i].Prefix, err)
		}
	}
	return nil
}

// DeleteRules removes the entries of endpoint ifindex for d and prefixes;
// missing ones are fine.
func (m *Maps) DeleteRules(ifindex uint32, d Direction, prefixes []netip.Prefix) error {
	for _, p := range prefixes {
		k := Key(ifindex, d, p)
		if err := m.RuleMap.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting %s[%d %s %s]: %w", maps.CniMapPolicyRules, ifindex, d, p, err)
		}
	}
	return nil
}

// RuleSet is every rule of the node: endpoint -> direction -> entries.
type RuleSet map[uint32]map[Direction][]Entry

// ReadRules walks policy_rules (the agent at start, the CLI, GC).
func (m *Maps) ReadRules() (RuleSet, error) {
	out := RuleSet{}
	var k maps.CniPolicyKey
	var v Rule
	it := m.RuleMap.Iterate()
	for it.Next(&k, &v) {
		byDir := out[k.Ifindex]
		if byDir == nil {
			byDir = map[Direction][]Entry{}
			out[k.Ifindex] = byDir
		}
		d := Direction(k.Dir)
		byDir[d] = append(byDir[d], Entry{Prefix: PrefixOf(&k), Rule: v})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterating %s: %w", maps.CniMapPolicyRules, err)
	}
	return out, nil
}

// errE2BIG is what a full hash or LPM map answers an insert with.
var errE2BIG = unix.E2BIG
