package cluster

import (
	"errors"
	"fmt"
	"net"
	"sort"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// table is cluster_routes under the cluster lock: its entries carry the
// cluster's ranges (written by ADD) and other nodes' tunnel endpoints
// (written by the node agent or the CLI), possibly both on one prefix, so
// every write reads the entry first.
type table struct {
	m    *ebpf.Map
	lock *node.Lock
}

// clusterLock serialises every writer of cluster_routes, cluster_config and the
// overlay's device on the node. The node agent may come before any pod:
// the state directory may not exist yet (the lock file makes it).
func clusterLock(n *node.Node) (*node.Lock, error) { return n.Lock("cluster") }

// tableOf is the node's cluster_routes under the cluster lock.
func tableOf(nd *node.Node) (*table, error) {
	lock, err := clusterLock(nd)
	if err != nil {
		return nil, err
	}
	m, err := nd.Map(maps.CniMapClusterRoutes)
	if err != nil {
		lock.Unlock()
		return nil, fmt.Errorf("opening the cluster routes: %w", err)
	}
	return &table{m: m, lock: lock}, nil
}

func (t *table) Close() {
	t.lock.Unlock()
}

func routeKey(n *net.IPNet) maps.CniClusterKey {
	ones, _ := n.Mask.Size()
	return maps.CniClusterKey{Prefixlen: uint32(32 + ones), Family: maps.Family(n.IP), Addr: maps.Addr16(n.IP.Mask(n.Mask))}
}

func keyNet(k maps.CniClusterKey) *net.IPNet {
	bits := 32
	if k.Family == 6 {
		bits = 128
	}
	ip := net.IP(append([]byte(nil), k.Addr[:bits/8]...))
	return &net.IPNet{IP: ip, Mask: net.CIDRMask(int(k.Prefixlen)-32, bits)}
}

// lookup reads the entry of exactly k. The trie's lookup answers with the
// longest prefix that holds k's address, which may be a shorter one (the
// cluster's range around a node's pod range); writing the value back with
// BPF_EXIST tells whether k itself is there (every writer holds the lock,
// and the programs only read: the write changes nothing).
func (t *table) lookup(k maps.CniClusterKey) (maps.CniClusterRoute, bool, error) {
	var v maps.CniClusterRoute
	err := t.m.Lookup(&k, &v)
	if err == nil {
		err = t.m.Update(&k, &v, ebpf.UpdateExist)
	}
	switch {
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return maps.CniClusterRoute{}, false, nil
	case err != nil:
		return v, false, fmt.Errorf("reading %s[%s]: %w", maps.CniMapClusterRoutes, keyNet(k), err)
	}
	return v, true, nil
}

// set adds flags to the entry of n (with node for a tunnel), creating it.
func (t *table) set(n *net.IPNet, flags maps.CniClusterFlags, node net.IP) error {
	k := routeKey(n)
	v, _, err := t.lookup(k)
	if err != nil {
		return err
	}
	v.Flags |= flags
	if node != nil {
		v.NodeFamily = maps.Family(node)
		v.Node = maps.Addr16(node)
	}
	if err := t.m.Put(&k, &v); err != nil {
		return fmt.Errorf("writing %s[%s]: %w", maps.CniMapClusterRoutes, n, err)
	}
	return nil
}

// clear takes flags off the entry of k, deleting it when none remain.
func (t *table) clear(k maps.CniClusterKey, flags maps.CniClusterFlags) error {
	v, ok, err := t.lookup(k)
	if err != nil || !ok {
		return err
	}
	v.Flags &^= flags
	if flags&maps.CniClusterFlagsCLUSTER_F_TUNNEL != 0 {
		v.NodeFamily, v.Node = 0, [16]uint8{}
	}
	if v.Flags == 0 {
		err = t.m.Delete(&k)
	} else {
		err = t.m.Put(&k, &v)
	}
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("writing %s[%s]: %w", maps.CniMapClusterRoutes, keyNet(k), err)
	}
	return nil
}

func (t *table) entries() ([]maps.Entry[maps.CniClusterKey, maps.CniClusterRoute], error) {
	// LPM tries have no batch lookup: Entries falls back to iterating.
	return maps.Entries[maps.CniClusterKey, maps.CniClusterRoute](t.m)
}

// AddRanges marks the cluster's pod ranges (ADD of a network with
// clusterCIDRs); ranges of other networks stay.
func AddRanges(nd *node.Node, ranges []*net.IPNet) error {
	t, err := tableOf(nd)
	if err != nil {
		return err
	}
	defer t.Close()
	for _, n := range ranges {
		if err := t.set(n, maps.CniClusterFlagsCLUSTER_F_RANGE, nil); err != nil {
			return err
		}
	}
	return nil
}

// MissingRanges names the ranges that are not marked, for CHECK.
func MissingRanges(nd *node.Node, ranges []*net.IPNet) []string {
	m, err := nd.Map(maps.CniMapClusterRoutes)
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, n := range ranges {
		k := routeKey(n)
		var v maps.CniClusterRoute
		if err := m.Lookup(&k, &v); err != nil || v.Flags&maps.CniClusterFlagsCLUSTER_F_RANGE == 0 {
			out = append(out, fmt.Sprintf("cluster range %s is not in %s: it would be masqueraded and tracked as a Service", n, maps.CniMapClusterRoutes))
		}
	}
	return out
}

// clearRanges unmarks every cluster range; tunnel endpoints stay (they are
// the node agent's, and pods may come back).
func clearRanges(nd *node.Node) error {
	t, err := tableOf(nd)
	if err != nil {
		return err
	}
	defer t.Close()
	es, err := t.entries()
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range es {
		if e.Value.Flags&maps.CniClusterFlagsCLUSTER_F_RANGE != 0 {
			errs = append(errs, t.clear(e.Key, maps.CniClusterFlagsCLUSTER_F_RANGE))
		}
	}
	return errors.Join(errs...)
}

// Tunnel is another node's pod range and that node's underlay address.
type Tunnel struct {
	PodCIDR *net.IPNet
	Node    net.IP
}

func (t Tunnel) String() string { return t.PodCIDR.String() + " via " + t.Node.String() }

// Tunnels are the overlay's endpoints, for the node agent and the CLI.
// Writes hold the node's cluster lock until Close.
type Tunnels struct{ t *table }

// OpenTunnels opens the tunnel endpoints of the node (the node agent's
// handle, the operator CLI's: opened without the node lock, which the
// plugin's calls hold; the cluster lock is taken here).
func OpenTunnels(n *node.Node) (*Tunnels, error) {
	t, err := tableOf(n)
	if err != nil {
		return nil, err
	}
	return &Tunnels{t}, nil
}

// Close releases the lock (the node's handle keeps the map).
func (ts *Tunnels) Close() { ts.t.Close() }

// Add makes podCIDR reachable through the overlay at node (replacing the
// node of an existing endpoint).
func (ts *Tunnels) Add(podCIDR *net.IPNet, node net.IP) error {
	if podCIDR == nil || node == nil || node.IsUnspecified() || node.IsMulticast() {
		return fmt.Errorf("tunnel %v via %v: want a pod range and a unicast node address", podCIDR, node)
	}
	n := &net.IPNet{IP: podCIDR.IP.Mask(podCIDR.Mask), Mask: podCIDR.Mask}
	return ts.t.set(n, maps.CniClusterFlagsCLUSTER_F_TUNNEL, node)
}

// Del removes the endpoint of podCIDR; a missing one is fine.
func (ts *Tunnels) Del(podCIDR *net.IPNet) error {
	n := &net.IPNet{IP: podCIDR.IP.Mask(podCIDR.Mask), Mask: podCIDR.Mask}
	return ts.t.clear(routeKey(n), maps.CniClusterFlagsCLUSTER_F_TUNNEL)
}

// Get returns the node of podCIDR's endpoint, if it has one.
func (ts *Tunnels) Get(podCIDR *net.IPNet) (net.IP, bool, error) {
	v, ok, err := ts.t.lookup(routeKey(podCIDR))
	if err != nil || !ok || v.Flags&maps.CniClusterFlagsCLUSTER_F_TUNNEL == 0 {
		return nil, false, err
	}
	return nodeIP(v), true, nil
}

// List returns the endpoints, by pod range.
func (ts *Tunnels) List() ([]Tunnel, error) { return ListTunnels(ts.t.m) }

// ListTunnels reads the endpoints of a cluster_routes map (opened read-only
// by the CLI), by pod range.
func ListTunnels(m *ebpf.Map) ([]Tunnel, error) {
	es, err := maps.Entries[maps.CniClusterKey, maps.CniClusterRoute](m)
	if err != nil {
		return nil, err
	}
	var out []Tunnel
	for _, e := range es {
		if e.Value.Flags&maps.CniClusterFlagsCLUSTER_F_TUNNEL == 0 {
			continue
		}
		out = append(out, Tunnel{PodCIDR: keyNet(e.Key), Node: nodeIP(e.Value)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PodCIDR.String() < out[j].PodCIDR.String() })
	return out, nil
}

func nodeIP(v maps.CniClusterRoute) net.IP {
	node := net.IP(append([]byte(nil), v.Node[:]...))
	if v.NodeFamily == 4 {
		node = node[:4]
	}
	return node
}

// Sync makes the endpoints exactly want (the node agent's view of the
// other nodes): adds and changes first, then removals.
func (ts *Tunnels) Sync(want []Tunnel) error {
	keep := map[string]bool{}
	for _, w := range want {
		if err := ts.Add(w.PodCIDR, w.Node); err != nil {
			return err
		}
		keep[(&net.IPNet{IP: w.PodCIDR.IP.Mask(w.PodCIDR.Mask), Mask: w.PodCIDR.Mask}).String()] = true
	}
	have, err := ts.List()
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range have {
		if !keep[h.PodCIDR.String()] {
			errs = append(errs, ts.Del(h.PodCIDR))
		}
	}
	return errors.Join(errs...)
}
