package flows

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// Set is the destinations the node's netfilter may translate (kube-proxy's
// Service ranges, ClusterIPs, externalIPs, load-balancer IPs, the nodes'
// addresses), each with what kube-proxy has there.
type Set map[netip.Prefix]maps.CniXlatKind

// Add puts p (its address masked, an IPv4-mapped IPv6 one as IPv4) in the
// set as kind, besides what it already is.
func (s Set) Add(p netip.Prefix, kind maps.CniXlatKind) {
	if !p.IsValid() {
		return
	}
	a, bits := p.Addr(), p.Bits()
	if a.Is4In6() {
		a, bits = a.Unmap(), max(bits-96, 0)
	}
	q, err := a.Prefix(bits)
	if err != nil {
		return
	}
	s[q] |= kind
}

// AddAddr puts one address in the set.
func (s Set) AddAddr(a netip.Addr, kind maps.CniXlatKind) {
	if a.IsValid() {
		a = a.Unmap()
		s.Add(netip.PrefixFrom(a, a.BitLen()), kind)
	}
}

// String lists the set, one prefix a line, for people and tests.
func (s Set) String() string {
	lines := make([]string, 0, len(s))
	for p, k := range s {
		lines = append(lines, p.String()+" "+KindString(k))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// KindString names the kinds of a destination, e.g. "clusterIP,externalIP".
func KindString(k maps.CniXlatKind) string {
	var out []string
	for _, n := range []struct {
		k    maps.CniXlatKind
		name string
	}{{maps.CniXlatKindXLAT_SERVICE_RANGE, "serviceRange"}, {maps.CniXlatKindXLAT_CLUSTER_IP, "clusterIP"},
		{maps.CniXlatKindXLAT_EXTERNAL_IP, "externalIP"}, {maps.CniXlatKindXLAT_LOAD_BALANCER, "loadBalancer"},
		{maps.CniXlatKindXLAT_NODE, "node"}} {
		if k&n.k != 0 {
			out = append(out, n.name)
		}
	}
	return strings.Join(out, ",")
}

// Lease is the node agent's promise on the set (xlat_lease).
type Lease struct {
	// Left is how long the promise still holds; 0 or less: it does not
	// (expired, or never given), and every new flow meets netfilter.
	Left       time.Duration
	Renewed    time.Duration // ago
	Generation uint64
	Entries    uint32
}

// Valid says whether the programs trust the set now.
func (l Lease) Valid() bool { return l.Left > 0 }

// Translated is the node's pinned set of destinations netfilter may
// translate (xlat_dsts) and the lease on it (xlat_lease): the node agent
// writes them (bpf/lib/xlat.h), the programs read them. While the lease
// runs, a pod's new flow to a destination outside the set is set up in BPF
// without meeting netfilter; otherwise, and for destinations in the set,
// its first packet goes through the stack.
type Translated struct{ dsts, lease *ebpf.Map }

// OpenTranslated is the node's set and lease, created on first use (the
// node closes them).
func OpenTranslated(n *node.Node) (*Translated, error) {
	dsts, err := n.Map(maps.CniMapXlatDsts)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", maps.CniMapXlatDsts, err)
	}
	lease, err := n.Map(maps.CniMapXlatLease)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", maps.CniMapXlatLease, err)
	}
	return &Translated{dsts: dsts, lease: lease}, nil
}

func xlatKey(p netip.Prefix) maps.CniXlatKey {
	a := p.Addr()
	k := maps.CniXlatKey{Prefixlen: uint32(32 + p.Bits()), Family: 6}
	if a.Is4() {
		k.Family = 4
	}
	copy(k.Addr[:], a.AsSlice())
	return k
}

func keyPrefix(k maps.CniXlatKey) netip.Prefix {
	bits := 128
	if k.Family == 4 {
		bits = 32
	}
	a, _ := netip.AddrFromSlice(k.Addr[:bits/8])
	return netip.PrefixFrom(a, int(k.Prefixlen)-32)
}

// List reads the set as the programs see it.
func (t *Translated) List() (Set, error) { return ListTranslated(t.dsts) }

// ListTranslated reads the set of an xlat_dsts map (opened read-only by
// the CLI).
func ListTranslated(m *ebpf.Map) (Set, error) {
	es, err := maps.Entries[maps.CniXlatKey, maps.CniXlatDst](m)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", maps.CniMapXlatDsts, err)
	}
	s := Set{}
	for _, e := range es {
		s[keyPrefix(e.Key)] = e.Value.Kinds
	}
	return s, nil
}

// Write makes the pinned set exactly want: additions and changes first,
// removals after (a destination that stays is never missing in between),
// and counts the write in the lease without extending it. One writer at a
// time (the node agent).
func (t *Translated) Write(want Set) error {
	have, err := t.List()
	if err != nil {
		return err
	}
	for p, k := range want {
		if have[p] == k {
			continue
		}
		key := xlatKey(p)
		if err := t.dsts.Put(&key, &maps.CniXlatDst{Kinds: k}); err != nil {
			return fmt.Errorf("writing %s[%s]: %w", maps.CniMapXlatDsts, p, err)
		}
	}
	var errs []error
	for p := range have {
		if _, ok := want[p]; ok {
			continue
		}
		key := xlatKey(p)
		if err := t.dsts.Delete(&key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("deleting %s[%s]: %w", maps.CniMapXlatDsts, p, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return t.update(func(v *maps.CniXlatTerm) {
		v.Generation++
		v.Entries = uint32(len(want))
	})
}

// Renew extends the lease to ttl from now: the set is trusted until then.
// Only after a successful Write of what the API says now.
func (t *Translated) Renew(ttl time.Duration) error {
	return t.update(func(v *maps.CniXlatTerm) {
		now := maps.Monotonic()
		v.Renewed = now
		v.Expires = now + uint64(ttl)
	})
}

// Expire ends the lease now: every new flow meets netfilter again.
func (t *Translated) Expire() error {
	return t.update(func(v *maps.CniXlatTerm) { v.Expires = 0 })
}

func (t *Translated) update(change func(*maps.CniXlatTerm)) error {
	var zero uint32
	var v maps.CniXlatTerm
	if err := t.lease.Lookup(&zero, &v); err != nil {
		return fmt.Errorf("reading %s: %w", maps.CniMapXlatLease, err)
	}
	change(&v)
	if err := t.lease.Put(&zero, &v); err != nil {
		return fmt.Errorf("writing %s: %w", maps.CniMapXlatLease, err)
	}
	return nil
}

// Lease reads the lease as the programs see it now.
func (t *Translated) Lease() (Lease, error) { return ReadLease(t.lease) }

// ReadLease reads an xlat_lease map.
func ReadLease(m *ebpf.Map) (Lease, error) {
	var zero uint32
	var v maps.CniXlatTerm
	if err := m.Lookup(&zero, &v); err != nil {
		return Lease{}, fmt.Errorf("reading %s: %w", maps.CniMapXlatLease, err)
	}
	now := maps.Monotonic()
	l := Lease{Generation: v.Generation, Entries: v.Entries}
	if v.Expires > now {
		l.Left = time.Duration(v.Expires - now)
	}
	if v.Renewed != 0 && now > v.Renewed {
		l.Renewed = time.Duration(now - v.Renewed)
	}
	return l, nil
}

// Contains says whether ip is in the set (longest prefix, as the programs
// look it up).
func (s Set) Contains(ip net.IP) bool {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return false
	}
	a = a.Unmap()
	for p := range s {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
