// Package conntrack is the node's connection-tracking/NAT table (nat,
// bpf/lib/conntrack.h): a building block that masquerade (pkg/nat: the OUT and
// IN entries of the flows pods open) and hostPort (pkg/portmap: the DNAT
// entries of the flows to published ports) write through the programs and
// read, flush and collect here, each its own kind of flow. Neither feature
// owns the table: each flushes its own flows of a pod in its Del, and
// collects its own in its GC.
package conntrack

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/podflush"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

// enum nat_dir, nat_state and nat_flags (generated from bpf/include/types.h)
// as the one-byte fields of nat_key and nat_entry hold them.
const (
	dirOut  = uint8(maps.CniNatDirNAT_DIR_OUT)
	dirIn   = uint8(maps.CniNatDirNAT_DIR_IN)
	dirDNAT = uint8(maps.CniNatDirNAT_DIR_DNAT) // hostPort replies, keyed by the pod's tuple

	StateSynSent     = uint8(maps.CniNatStateNAT_STATE_SYN_SENT)
	StateEstablished = uint8(maps.CniNatStateNAT_STATE_ESTABLISHED)
	StateClosing     = uint8(maps.CniNatStateNAT_STATE_CLOSING)
	StateOpen        = uint8(maps.CniNatStateNAT_STATE_OPEN)

	flagKept    = uint8(maps.CniNatFlagsNAT_F_KEPT)
	flagReplied = uint8(maps.CniNatFlagsNAT_F_REPLIED)
	flagBypass  = uint8(maps.CniNatFlagsNAT_F_BYPASS)
)

// StateNames names the states for people.
var StateNames = map[uint8]string{StateSynSent: "syn-sent", StateEstablished: "established", StateClosing: "closing", StateOpen: "open"}

// Flow is one translated flow: the pod's side, the remote, and what the
// remote sees.
type Flow struct {
	Proto      uint8
	Pod        net.IP
	PodPort    uint16 // ICMP echo: the identifier
	Remote     net.IP
	RemotePort uint16
	NAT        net.IP
	NATPort    uint16
	State      uint8
	Kept       bool // the pod's own port
	Replied    bool
	Bypass     bool // TCP, set up in BPF at its SYN: fast for its life, its verdict here instead of in flows
	Age, Idle  time.Duration
	Expired    bool // still in the table, but the programs ignore it
}

// lifetime mirrors nat_lifetime of bpf/lib/conntrack.h.
func lifetime(t *maps.CniNatLifetimes, proto, state uint8) time.Duration {
	s := uint32(0)
	switch proto {
	case unix.IPPROTO_TCP:
		switch state {
		case StateEstablished:
			s = t.TcpEstablished
		case StateClosing:
			s = t.TcpClosing
		default:
			s = t.TcpSyn
		}
	case unix.IPPROTO_SCTP:
		s = t.TcpEstablished
	case unix.IPPROTO_UDP:
		s = t.Udp
	default:
		s = t.Icmp
	}
	return time.Duration(s) * time.Second
}

// DefaultTimeouts are the programs' own lifetimes (enum
// nat_default_lifetime), used while nat_timeouts holds none.
var DefaultTimeouts = maps.CniNatLifetimes{
	TcpSyn:         uint32(maps.CniNatDefaultLifetimeNAT_DEFAULT_TCP_SYN),
	TcpEstablished: uint32(maps.CniNatDefaultLifetimeNAT_DEFAULT_TCP_ESTABLISHED),
	TcpClosing:     uint32(maps.CniNatDefaultLifetimeNAT_DEFAULT_TCP_CLOSING),
	Udp:            uint32(maps.CniNatDefaultLifetimeNAT_DEFAULT_UDP),
	Icmp:           uint32(maps.CniNatDefaultLifetimeNAT_DEFAULT_ICMP),
}

// Kind is whose flows an entry belongs to.
type Kind int

const (
	// Masquerade: the flows pods open, translated to the node's address
	// (the OUT entry and its IN entry).
	Masquerade Kind = iota
	// HostPort: the flows to a published port, translated to the pod
	// (DNAT entries).
	HostPort
)

// tables are the directions of kind k's entries, as a flush names them.
func (k Kind) tables() maps.CniFlushTables {
	if k == HostPort {
		return maps.CniFlushTablesFLUSH_NAT_DNAT
	}
	return maps.CniFlushTablesFLUSH_NAT_OUT | maps.CniFlushTablesFLUSH_NAT_IN
}

// owns reports whether an entry of direction dir is of kind k.
func (k Kind) owns(dir uint8) bool { return dir < 32 && k.tables()&(1<<dir) != 0 }

// Table is the pinned conntrack/NAT table and its lifetimes.
type Table struct {
	nat      *ebpf.Map
	timeouts maps.CniNatLifetimes
}

// Open is the call's node's table, created on first use (the node closes
// it).
func Open(n *node.Node) (*Table, error) {
	m, err := n.Map(maps.CniMapNat)
	if err != nil {
		return nil, fmt.Errorf("opening the NAT table: %w", err)
	}
	timeouts, err := n.Map(maps.CniMapNatTimeouts)
	if err != nil {
		return nil, fmt.Errorf("opening the NAT table: %w", err)
	}
	return NewTable(m, timeouts), nil
}

// Pinned is the call's node's table, nil when it is not pinned (no flow
// was ever made); the node closes it.
func Pinned(n *node.Node) (*Table, error) {
	m, err := n.PinnedMap(maps.CniMapNat)
	if err != nil || m == nil {
		return nil, err
	}
	timeouts, err := n.PinnedMap(maps.CniMapNatTimeouts)
	if err != nil {
		return nil, err
	}
	return NewTable(m, timeouts), nil
}

// NewTable reads flows from natMap with the lifetimes in timeouts (nil:
// the defaults); the Table owns neither (the operator CLI's read-only
// maps).
func NewTable(natMap, timeouts *ebpf.Map) *Table {
	t := &Table{nat: natMap, timeouts: DefaultTimeouts}
	var cur maps.CniNatLifetimes
	if timeouts != nil && timeouts.Lookup(uint32(0), &cur) == nil && cur.TcpSyn != 0 {
		t.timeouts = cur
	}
	return t
}

type entry = maps.Entry[maps.CniNatKey, maps.CniNatEntry]

func (t *Table) entries() ([]entry, error) {
	es, err := maps.Entries[maps.CniNatKey, maps.CniNatEntry](t.nat)
	if err != nil {
		return nil, fmt.Errorf("reading the NAT table: %w", err)
	}
	return es, nil
}

// Flows lists the flows (their OUT entries).
func (t *Table) Flows() ([]Flow, error) {
	es, err := t.entries()
	if err != nil {
		return nil, err
	}
	now := maps.Monotonic()
	var out []Flow
	for _, e := range es {
		if e.Key.Dir != dirOut {
			continue
		}
		f := Flow{
			Proto: e.Key.Proto, Pod: maps.IP(e.Key.Family, e.Key.Saddr), PodPort: maps.Port(e.Key.Sport),
			Remote: maps.IP(e.Key.Family, e.Key.Daddr), RemotePort: maps.Port(e.Key.Dport),
			NAT: maps.IP(e.Key.Family, e.Value.Addr), NATPort: maps.Port(e.Value.Port),
			State: e.Value.State, Kept: e.Value.Flags&flagKept != 0, Replied: e.Value.Flags&flagReplied != 0,
			Bypass: e.Value.Flags&flagBypass != 0,
		}
		if now > e.Value.Created {
			f.Age = time.Duration(now - e.Value.Created)
		}
		if now > e.Value.LastSeen {
			f.Idle = time.Duration(now - e.Value.LastSeen)
		}
		f.Expired = f.Idle > lifetime(&t.timeouts, f.Proto, f.State)
		out = append(out, f)
	}
	return out, nil
}

// podAddr is the pod's address of an entry: the IN entry's value, or the
// source of the other keys (the pod's tuple).
func podAddr(e *entry) net.IP {
	if e.Key.Dir == dirIn {
		return maps.IP(e.Key.Family, e.Value.Addr)
	}
	return maps.IP(e.Key.Family, e.Key.Saddr)
}

// delete removes the entries for which drop says so; it returns how many.
func (t *Table) delete(drop func(e *entry) bool) (int, error) {
	var e entry // one for the walk: drop must not keep it
	n, err := maps.DeleteMatching(t.nat, func(k *maps.CniNatKey, v *maps.CniNatEntry) bool {
		e.Key, e.Value = *k, *v
		return drop(&e)
	})
	if err != nil {
		return n, fmt.Errorf("walking the NAT table: %w", err)
	}
	return n, nil
}

// flushes are the per-pod flushes features asked for in one call: one
// walk of the table does them all (FlushPodLater).
type flushes struct {
	ips [HostPort + 1][]net.IP // by kind
}

type flushesKey struct{}

// FlushPodLater queues the removal of every entry of kind k of the pod's
// addresses, done when the call's node settles (node.Settle: DEL's
// teardown, once every feature's Del and the endpoint's removal are done,
// so no new flow of the pod can appear after it). Masquerade and hostPort
// each queue their own kind; the table, which a read walks whole (tens of
// milliseconds at its size), is walked once for both.
func FlushPodLater(n *node.Node, k Kind, ips []net.IP) {
	if len(ips) == 0 {
		return
	}
	f := n.Batch(flushesKey{}, func() (any, func() error) {
		f := &flushes{}
		return f, func() error { return f.run(n) }
	}).(*flushes)
	f.ips[k] = append(f.ips[k], ips...)
}

func (f *flushes) run(n *node.Node) error {
	if n.CheckBPFFS() != nil {
		return nil // nothing pinned, nothing to flush
	}
	t, err := Pinned(n)
	if err != nil || t == nil {
		return err
	}
	var pods []podflush.Pod
	for k, ips := range f.ips {
		for _, ip := range ips {
			pods = append(pods, podflush.Pod{IP: ip, Tables: Kind(k).tables()})
		}
	}
	_, err = podflush.Flush(n, podflush.NAT, pods, func() (int, error) {
		return t.delete(func(e *entry) bool {
			for k, ips := range f.ips {
				if len(ips) > 0 && Kind(k).owns(e.Key.Dir) && hasIP(ips, podAddr(e)) {
					return true
				}
			}
			return false
		})
	})
	return err
}

func hasIP(ips []net.IP, a net.IP) bool {
	for _, ip := range ips {
		if a.Equal(ip) {
			return true
		}
	}
	return false
}

// GC finds the entries of kind k of pods that are not live and the
// expired ones and, unless dryRun, removes them. It returns one line per flow (the two
// entries of a masqueraded flow are one; a reply entry whose flow is
// already gone is one of its own): what a dry run would remove is what a
// real run removes.
func (t *Table) GC(k Kind, live func(ip net.IP) bool, dryRun bool) ([]string, error) {
	now := maps.Monotonic()
	es, err := t.entries()
	if err != nil {
		return nil, err
	}
	// An IN entry lives as long as its OUT entry: find the OUT entries' fate
	// first.
	why := map[maps.CniNatKey]string{}
	present := map[maps.CniNatKey]bool{}
	for _, e := range es {
		if e.Key.Dir == dirIn || !k.owns(e.Key.Dir) {
			continue
		}
		present[e.Key] = true
		switch {
		case !live(podAddr(&e)):
			why[e.Key] = "pod gone"
		case now > e.Value.LastSeen && time.Duration(now-e.Value.LastSeen) > lifetime(&t.timeouts, e.Key.Proto, e.Value.State):
			why[e.Key] = "expired"
		}
	}
	sw := &feature.Sweep{DryRun: dryRun}
	var errs []error
	for i := range es {
		e := &es[i]
		key := e.Key
		if !k.owns(key.Dir) {
			continue
		}
		del := func() error {
			if err := t.nat.Delete(&key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("deleting a NAT entry: %w", err)
			}
			return nil
		}
		if key.Dir != dirIn {
			if w := why[key]; w != "" {
				sw.Remove(describe(e, w), del)
			}
			continue
		}
		out := outKeyOf(e)
		switch {
		case !present[out]:
			sw.Remove(describe(e, "its flow is gone"), del)
		case !live(podAddr(e)) || why[out] != "":
			// Goes with its flow's OUT entry, which has the line.
			if !dryRun {
				errs = append(errs, del())
			}
		}
	}
	found, err := sw.Result()
	return found, errors.Join(append(errs, err)...)
}

// outKeyOf is the OUT entry's key of the flow an IN entry belongs to.
func outKeyOf(e *entry) maps.CniNatKey {
	out := maps.CniNatKey{Family: e.Key.Family, Proto: e.Key.Proto, Dir: dirOut, Sport: e.Value.Port, Saddr: e.Value.Addr, Daddr: e.Key.Saddr}
	if e.Key.Proto == unix.IPPROTO_TCP || e.Key.Proto == unix.IPPROTO_UDP {
		out.Dport = e.Key.Sport
	}
	return out
}

// describe is GC's line for an entry.
func describe(e *entry, why string) string {
	proto := view.ProtoName(e.Key.Proto)
	ap := func(addr [16]uint8, port uint16) string {
		return view.AddrPort(maps.IP(e.Key.Family, addr), maps.Port(port))
	}
	switch e.Key.Dir {
	case dirOut:
		return fmt.Sprintf("%s flow %s %s -> %s as %s (%s)", maps.CniMapNat, proto, ap(e.Key.Saddr, e.Key.Sport), ap(e.Key.Daddr, e.Key.Dport), ap(e.Value.Addr, e.Value.Port), why)
	case dirDNAT:
		return fmt.Sprintf("%s hostPort flow %s %s -> %s -> pod %s (%s)", maps.CniMapNat, proto, ap(e.Key.Daddr, e.Key.Dport), ap(e.Value.Addr, e.Value.Port), ap(e.Key.Saddr, e.Key.Sport), why)
	}
	return fmt.Sprintf("%s reply entry %s %s -> %s for pod %s (%s)", maps.CniMapNat, proto, ap(e.Key.Saddr, e.Key.Sport), ap(e.Key.Daddr, e.Key.Dport), ap(e.Value.Addr, e.Value.Port), why)
}

// DirDNAT is the direction of hostPort entries (enum nat_dir).
const DirDNAT = dirDNAT

// Count counts the entries for which f holds, given their direction and
// the pod they belong to.
func (t *Table) Count(f func(dir uint8, pod net.IP) bool) (int, error) {
	es, err := t.entries()
	if err != nil {
		return 0, err
	}
	n := 0
	for i := range es {
		if f(es[i].Key.Dir, podAddr(&es[i])) {
			n++
		}
	}
	return n, nil
}

// LiveDNAT counts the live hostPort flows per pod address and port
// ("ip:port", as net.JoinHostPort writes it).
func (t *Table) LiveDNAT() (map[string]int, error) {
	es, err := t.entries()
	if err != nil {
		return nil, err
	}
	now := maps.Monotonic()
	out := map[string]int{}
	for _, e := range es {
		if e.Key.Dir != dirDNAT || (now > e.Value.LastSeen && time.Duration(now-e.Value.LastSeen) > lifetime(&t.timeouts, e.Key.Proto, e.Value.State)) {
			continue
		}
		out[net.JoinHostPort(maps.IP(e.Key.Family, e.Key.Saddr).String(), fmt.Sprint(maps.Port(e.Key.Sport)))]++
	}
	return out, nil
}
