package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/conflist"
)

// Route is one entry a NodeRoutes keeps: the pod range Dst is reached
// through Via, the address of the node that holds it.
type Route struct {
	Dst netip.Prefix
	Via netip.Addr
}

func (r Route) String() string { return r.Dst.String() + " via " + r.Via.String() }

// NodeRoutes is how this node reaches the pods of another: the part of the
// agent that differs between direct routing and the VXLAN overlay. The
// reconciler decides what must exist and calls it; a NodeRoutes plans the
// entries of one peer, applies and withdraws single entries, and lists the
// entries it owns. It never touches an entry it did not install.
type NodeRoutes interface {
	// Mode is the conflist mode it implements.
	Mode() conflist.Mode
	// Plan returns the entries that make p's pod ranges reachable. A range
	// it cannot serve is left out and reported in the error; the entries
	// for the others are returned all the same.
	Plan(p Peer) ([]Route, error)
	// Ensure installs r, replacing its own entry for r.Dst when that
	// points elsewhere. Installing what is there already is cheap.
	Ensure(r Route) error
	// Remove withdraws r if installed as given (same Dst and Via): an entry
	// for r.Dst that another node has taken over since stays. Gone is fine.
	Remove(r Route) error
	// List returns every entry it installed.
	List() ([]Route, error)
}

// DefaultRouteProtocol tags the routes the agent installs (`ip route show
// proto 236`), so it only ever lists, replaces and removes its own. 236 is
// 0xec, as in the ec* host veth names; iproute2 and the common routing
// daemons (bird 12, zebra 11, babel 42, bgp 186..192, keepalived 18) use
// none near it.
const DefaultRouteProtocol = 236

// Direct routes each other node's pod ranges via its InternalIP: the nodes
// share an L2 segment, and the plugin's programs forward to the route's
// next hop with bpf_fib_lookup and bpf_redirect_neigh.
type Direct struct {
	h     netlinksafe.Handle
	proto netlink.RouteProtocol
}

// NewDirect uses h (the node's network namespace) and tags its routes with
// proto.
func NewDirect(h netlinksafe.Handle, proto int) (*Direct, error) {
	if proto <= unix.RTPROT_STATIC || proto > 255 {
		return nil, fmt.Errorf("route protocol %d: want 5..255 (0..4 belong to the kernel and to static routes)", proto)
	}
	return &Direct{h: h, proto: netlink.RouteProtocol(proto)}, nil
}

// Mode is direct.
func (d *Direct) Mode() conflist.Mode { return conflist.ModeDirect }

// Plan routes each range via the peer's InternalIP of the same family.
func (d *Direct) Plan(p Peer) ([]Route, error) { return PlanSameFamily(p) }

// PlanSameFamily maps each of p's ranges to its InternalIP of that family.
func PlanSameFamily(p Peer) ([]Route, error) {
	var out []Route
	var errs []error
	for _, c := range p.PodCIDRs {
		via, ok := p.AddrOfFamily(c)
		if !ok {
			errs = append(errs, fmt.Errorf("node %s has no InternalIP of the family of its pod range %s: direct mode routes a range via an address of its own family", p.Name, c))
			continue
		}
		out = append(out, Route{Dst: c, Via: via})
	}
	return out, errors.Join(errs...)
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func family(a netip.Addr) int {
	if a.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

// Ensure installs the route, or replaces the agent's own route to Dst.
// Another route to Dst (a static one, another agent's) is left alone and
// reported: the operator decides which wins.
func (d *Direct) Ensure(r Route) error {
	dst := ipNet(r.Dst)
	existing, err := d.h.RouteListFiltered(family(r.Via), &netlink.Route{Dst: dst, Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("listing routes to %s: %w", r.Dst, err)
	}
	for _, e := range existing {
		if e.Protocol != d.proto {
			return fmt.Errorf("route to %s: a route the agent did not install is there (proto %d): left alone; remove it to let the agent route the range via %s", r.Dst, e.Protocol, r.Via)
		}
		if e.Gw != nil && e.Gw.Equal(r.Via.AsSlice()) {
			return nil
		}
	}
	err = d.h.RouteReplace(&netlink.Route{Dst: dst, Gw: r.Via.AsSlice(), Protocol: d.proto, Table: unix.RT_TABLE_MAIN})
	if errors.Is(err, unix.ENETUNREACH) {
		return fmt.Errorf("routing %s: %s is not on a network this node is attached to: direct mode needs the nodes on one L2 segment (use mode vxlan otherwise)", r, r.Via)
	}
	if err != nil {
		return fmt.Errorf("routing %s: %w", r, err)
	}
	return nil
}

// Remove deletes the agent's route to Dst via Via; the kernel matches the
// protocol and the gateway, so no other route is touched.
func (d *Direct) Remove(r Route) error {
	err := d.h.RouteDel(&netlink.Route{Dst: ipNet(r.Dst), Gw: r.Via.AsSlice(), Protocol: d.proto, Table: unix.RT_TABLE_MAIN})
	if err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing the route %s: %w", r, err)
	}
	return nil
}

// List returns the agent's routes (its protocol, main table).
func (d *Direct) List() ([]Route, error) {
	routes, err := d.h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: d.proto, Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("listing the agent's routes: %w", err)
	}
	var out []Route
	for _, r := range routes {
		if r.Dst == nil || r.Gw == nil {
			continue // not a shape the agent writes
		}
		dst, ok1 := netip.AddrFromSlice(r.Dst.IP)
		via, ok2 := netip.AddrFromSlice(r.Gw)
		if !ok1 || !ok2 {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		out = append(out, Route{Dst: netip.PrefixFrom(dst.Unmap(), ones), Via: via.Unmap()})
	}
	return out, nil
}
