package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/ebpf-cni/ebpf-cni/pkg/cluster"
	"github.com/ebpf-cni/ebpf-cni/pkg/conflist"
	cnimaps "github.com/ebpf-cni/ebpf-cni/pkg/maps"
	nodestate "github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// VXLAN keeps the tunnel endpoints of the plugin's VXLAN overlay: for each
// other node's pod range, that node's address, in the plugin's pinned
// cluster_routes map (pkg/cluster), which from_container reads to
// encapsulate. Every call opens the map under the node's cluster lock and
// releases both before it returns: a pod's ADD waits for one entry at most.
//
// Only its own entries: the map also holds what `ebpf-cni tunnels --add`
// wrote by hand, so the agent records the entries it wrote (range and
// node) in <stateDir>/agent/tunnels.json, under the same lock. An entry is
// the agent's while the map and the record agree on it; one the record does
// not hold, or that someone has pointed elsewhere since, is left alone.
// Like the reconciler, it is called from one goroutine at a time.
type VXLAN struct {
	n        *nodestate.Node // the agent's handle on the plugin's node
	record   string          // the agent's record of its entries
	underlay int
	// cache is the record as last read or written, and the file it came
	// from: only the agent writes it, so an unchanged file need not be
	// read again (a full sync ensures every entry of the cluster).
	cache     owned
	cacheFile os.FileInfo
}

// NewVXLAN keeps the tunnel endpoints of the plugin's node n (the agent's
// handle, reopened for each piece of work). underlay (4 or 6) is the family of node addresses it
// prefers: the one whose encapsulation overhead the plugin took off the
// pods' MTU (cluster.Overhead), so that every range, IPv4 or IPv6, is
// carried within the pods' MTU. It opens the map once, creating it when no
// pod ran yet, so that missing privileges fail here. A bpfRoot not on a
// bpffs is no error: a mount can appear later (a capability cannot come
// back to a running process), and until then every call fails, saying so,
// for the reconciler to retry.
func NewVXLAN(n *nodestate.Node, underlay int) (*VXLAN, error) {
	if underlay != 4 && underlay != 6 {
		return nil, fmt.Errorf("underlay family %d: want 4 or 6", underlay)
	}
	v := &VXLAN{n: n, record: n.StatePath("agent", "tunnels.json"), underlay: underlay}
	err := v.locked(func(*cluster.Tunnels, owned) (bool, error) { return false, nil })
	if err != nil && !errors.Is(err, cnimaps.ErrNotBPFFS) {
		return nil, fmt.Errorf("the plugin's tunnel endpoints (bpfRoot %s, stateDir %s): %w", n.BPFRoot(), n.StateDir(), err)
	}
	return v, nil
}

// UnderlayFamily is the family NewVXLAN should prefer on this node (run in
// its network namespace): the plugin's own choice for the pods' MTU.
func UnderlayFamily() int {
	if cluster.Overhead() == cluster.OverheadIPv4 {
		return 4
	}
	return 6
}

// Mode is vxlan.
func (v *VXLAN) Mode() conflist.Mode { return conflist.ModeVXLAN }

// Plan sends each of p's ranges, IPv4 and IPv6 alike, to its InternalIP of
// the underlay family, or to its other one when it has none of that family
// (then an IPv4 node's pods may send IPv6 packets 20 bytes too big for the
// overlay: set the plugin's mtu to the uplink's less 70 on such clusters).
func (v *VXLAN) Plan(p Peer) ([]Route, error) {
	if len(p.InternalIPs) == 0 {
		if len(p.PodCIDRs) == 0 {
			return nil, nil
		}
		return nil, fmt.Errorf("node %s has no InternalIP: the overlay needs an address of the node to tunnel its pod ranges to", p.Name)
	}
	via := p.InternalIPs[0]
	for _, a := range p.InternalIPs {
		if a.Is4() == (v.underlay == 4) {
			via = a
			break
		}
	}
	var out []Route
	for _, c := range p.PodCIDRs {
		out = append(out, Route{Dst: c, Via: via})
	}
	return out, nil
}

// Ensure points r.Dst at r.Via, replacing the agent's own endpoint of r.Dst.
// An endpoint it did not write (by hand, or its own re-pointed by hand) is
// left alone and reported.
func (v *VXLAN) Ensure(r Route) error {
	return v.locked(func(ts *cluster.Tunnels, own owned) (bool, error) {
		dst := ipNet(r.Dst)
		node, ok, err := ts.Get(dst)
		if err != nil {
			return false, err
		}
		var have netip.Addr
		if ok {
			have = addrOf(node)
			if own[r.Dst] != have {
				return false, fmt.Errorf("tunnel endpoint of %s: one the agent did not write is there (via %s): left alone; remove it (ebpf-cni tunnels --del %s) to let the agent tunnel the range to %s", r.Dst, have, r.Dst, r.Via)
			}
			if have == r.Via {
				return false, nil
			}
		}
		if err := ts.Add(dst, r.Via.AsSlice()); err != nil {
			return false, fmt.Errorf("tunnelling %s: %w", r, err)
		}
		prev, had := own[r.Dst]
		own[r.Dst] = r.Via
		if err := own.save(v.record); err != nil {
			// Unrecorded, the entry would look like someone else's from
			// now on: take it back.
			if had && ok {
				own[r.Dst] = prev
				_ = ts.Add(dst, prev.AsSlice())
			} else {
				delete(own, r.Dst)
				_ = ts.Del(dst)
			}
			return false, fmt.Errorf("tunnelling %s: %w", r, err)
		}
		return false, nil
	})
}

// Remove deletes the endpoint of r.Dst if it is the agent's and still
// points at r.Via: a range another node (or someone by hand) has taken over
// since keeps its endpoint.
func (v *VXLAN) Remove(r Route) error {
	return v.locked(func(ts *cluster.Tunnels, own owned) (bool, error) {
		if own[r.Dst] != r.Via {
			return false, nil
		}
		node, ok, err := ts.Get(ipNet(r.Dst))
		if err != nil {
			return false, err
		}
		if ok && addrOf(node) == r.Via {
			if err := ts.Del(ipNet(r.Dst)); err != nil {
				return false, fmt.Errorf("removing the tunnel %s: %w", r, err)
			}
		}
		delete(own, r.Dst)
		return true, nil
	})
}

// List returns the agent's endpoints: those of the map its record holds as
// they are. Record entries the map no longer agrees with are forgotten.
func (v *VXLAN) List() ([]Route, error) {
	var out []Route
	err := v.locked(func(ts *cluster.Tunnels, own owned) (bool, error) {
		list, err := ts.List()
		if err != nil {
			return false, err
		}
		inMap := map[netip.Prefix]netip.Addr{}
		for _, t := range list {
			dst, ok := prefixOf(t.PodCIDR)
			if !ok {
				continue
			}
			inMap[dst] = addrOf(t.Node)
			if own[dst] == inMap[dst] {
				out = append(out, Route{Dst: dst, Via: inMap[dst]})
			}
		}
		changed := false
		for dst, via := range own {
			if inMap[dst] != via {
				delete(own, dst)
				changed = true
			}
		}
		return changed, nil
	})
	return out, err
}

// locked runs fn with the tunnels open (the cluster lock held) and the
// agent's record read; the record is written back when fn says it changed.
func (v *VXLAN) locked(fn func(*cluster.Tunnels, owned) (bool, error)) error {
	nd := v.n.Reopen()
	defer nd.Close()
	if err := nd.CheckBPFFS(); err != nil {
		return err
	}
	ts, err := cluster.OpenTunnels(nd)
	if err != nil {
		return err
	}
	defer ts.Close()
	own, err := v.load()
	if err != nil {
		return err
	}
	changed, err := fn(ts, own)
	if changed {
		err = errors.Join(err, own.save(v.record))
	}
	v.cache, v.cacheFile = own, nil
	if st, serr := os.Stat(v.record); serr == nil && err == nil {
		v.cacheFile = st
	}
	return err
}

// load returns the record: the cache itself while the file is the one it
// came from, else the file read. Not a copy: what fn changes in it is
// what locked keeps as the cache, and a change not written (an error)
// makes the next load read the file. (A copy at every call was 1,000
// entries copied for each of the 999 endpoints a full sync ensures, 100
// MB a minute at 1,000 nodes, which the heap grew by between two
// collections.)
func (v *VXLAN) load() (owned, error) {
	st, err := os.Stat(v.record)
	if err == nil && v.cacheFile != nil && os.SameFile(st, v.cacheFile) && st.ModTime().Equal(v.cacheFile.ModTime()) && st.Size() == v.cacheFile.Size() {
		return v.cache, nil
	}
	return loadOwned(v.record)
}

// owned is the agent's record of the endpoints it wrote.
type owned map[netip.Prefix]netip.Addr

// loadOwned reads the record at path (<stateDir>/agent/tunnels.json).
func loadOwned(path string) (owned, error) {
	own := owned{}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return own, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the agent's record: %w", err)
	}
	var raw map[string]string
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("reading the agent's record %s: %w (remove it: the agent then leaves the entries it wrote to be removed by hand)", path, err)
	}
	for d, n := range raw {
		dst, err1 := netip.ParsePrefix(d)
		via, err2 := netip.ParseAddr(n)
		if err1 == nil && err2 == nil {
			own[dst] = via
		}
	}
	return own, nil
}

// save writes the record; a crash leaves the old record or the new one.
func (own owned) save(path string) error {
	raw := map[string]string{}
	for d, n := range own {
		raw[d.String()] = n.String()
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return err
	}
	// Through a temporary file and a rename, as a conflist.
	if _, err := conflist.Write(filepath.Dir(path), filepath.Base(path), b, true); err != nil {
		return fmt.Errorf("writing the agent's record: %w", err)
	}
	return nil
}

func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}
