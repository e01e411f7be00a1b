package veth

import (
	"errors"
	"fmt"
	"net"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RangeProtocol tags the node's unreachable routes for its pod ranges
// (`ip route` shows "proto 237"): they are found, and only they removed, by
// it. The node agent's routes to other nodes use 236.
const RangeProtocol = netlink.RouteProtocol(237)

// PodRanges are the pod subnets the addresses belong to (each address with
// its prefix, as IPAM gave it), once each. A full-length prefix has no
// range beyond the pod's own host route, and a /0 is no range the node is
// responsible for: neither has one.
func PodRanges(ips []*current.IPConfig) []*net.IPNet {
	var out []*net.IPNet
	seen := map[string]bool{}
	for _, c := range ips {
		ones, bits := c.Address.Mask.Size()
		if ones == 0 || ones == bits {
			continue
		}
		r := &net.IPNet{IP: c.Address.IP.Mask(c.Address.Mask), Mask: c.Address.Mask}
		if r.IP == nil || seen[r.String()] {
			continue
		}
		seen[r.String()] = true
		out = append(out, r)
	}
	return out
}

// RecordRanges is PodRanges of addresses in CIDR notation (a record's).
func RecordRanges(cidrs []string) []*net.IPNet {
	var ips []*current.IPConfig
	for _, s := range cidrs {
		ip, n, err := net.ParseCIDR(s)
		if err != nil {
			continue
		}
		ips = append(ips, &current.IPConfig{Address: net.IPNet{IP: ip, Mask: n.Mask}})
	}
	return PodRanges(ips)
}

// rangeRoute is the route that ends the node's responsibility for a pod
// range: a packet for an address of the range that no pod holds (no host
// route, which is more specific) is answered with ICMP unreachable instead
// of following the default route back out of the uplink, where a router
// with a route to the range would send it back, until its TTL runs out.
func rangeRoute(r *net.IPNet) *netlink.Route {
	return &netlink.Route{Dst: r, Type: unix.RTN_UNREACHABLE, Protocol: RangeProtocol, Table: unix.RT_TABLE_MAIN}
}

// EnsureRanges adds the unreachable route of each range unless the node
// has a route for exactly that prefix already (its own, or one someone
// else made, which is left as it is). Idempotent.
func EnsureRanges(ranges []*net.IPNet) error {
	for _, r := range ranges {
		if err := netlink.RouteAdd(rangeRoute(r)); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("adding unreachable route %s: %w", r, err)
		}
	}
	return nil
}

// RangeRoutes lists the node's unreachable routes for pod ranges.
func RangeRoutes() ([]*net.IPNet, error) {
	routes, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: RangeProtocol, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("listing unreachable routes: %w", err)
	}
	var out []*net.IPNet
	for _, rt := range routes {
		if rt.Type == unix.RTN_UNREACHABLE && rt.Dst != nil {
			out = append(out, rt.Dst)
		}
	}
	return out, nil
}

// RemoveRange removes the unreachable route of a range; one already gone
// is fine.
func RemoveRange(r *net.IPNet) error {
	if err := netlink.RouteDel(rangeRoute(r)); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing unreachable route %s: %w", r, err)
	}
	return nil
}

// ReleaseRanges removes the unreachable route of each range in which the
// node routes no address to a device any more (no pod host route left:
// the last pod of the range is gone). It reads the node's routes, not the
// records: the kernel is the truth.
func ReleaseRanges(ranges []*net.IPNet) error {
	var errs []error
	for _, r := range ranges {
		used, err := hostRouteIn(r)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !used {
			errs = append(errs, RemoveRange(r))
		}
	}
	return errors.Join(errs...)
}

// hostRouteIn reports whether the main table has a full-length route to a
// device for an address of r: a pod's host route (HostRoutes).
func hostRouteIn(r *net.IPNet) (bool, error) {
	fam := netlink.FAMILY_V4
	if r.IP.To4() == nil {
		fam = netlink.FAMILY_V6
	}
	routes, err := netlinksafe.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return false, fmt.Errorf("listing routes: %w", err)
	}
	for _, rt := range routes {
		if rt.Dst == nil || rt.LinkIndex == 0 || rt.Type != unix.RTN_UNICAST {
			continue
		}
		if ones, bits := rt.Dst.Mask.Size(); ones == bits && r.Contains(rt.Dst.IP) {
			return true, nil
		}
	}
	return false, nil
}
