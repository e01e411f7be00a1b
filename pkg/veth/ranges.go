package veth

import (
	"errors"
	"fmt"
	"net"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/rtnl"
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
		if err := rtnl.H().RouteAdd(rangeRoute(r)); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("adding unreachable route %s: %w", r, err)
		}
	}
	return nil
}

// RangeRoutes lists the node's unreachable routes for pod ranges.
func RangeRoutes() ([]*net.IPNet, error) {
	routes, err := rtnl.H().RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: RangeProtocol, Table: unix.RT_TABLE_MAIN},
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
	if err := rtnl.H().RouteDel(rangeRoute(r)); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENOENT) {
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
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		var of []*net.IPNet
		for _, r := range ranges {
			if (r.IP.To4() != nil) == (fam == netlink.FAMILY_V4) {
				of = append(of, r)
			}
		}
		if len(of) == 0 {
			continue
		}
		used, err := hostRoutesIn(fam, of)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for i, r := range of {
			if !used[i] {
				errs = append(errs, RemoveRange(r))
			}
		}
	}
	return errors.Join(errs...)
}

// hostRoutesIn reports which of the ranges (of family fam) hold a route of
// the main table to a device for a single address: a pod's host route
// (HostRoutes). One dump of the family's routes, of which it reads only
// the header and the destination (a node with 10,000 pods has 10,000 of
// them: netlink's full parse of each would cost a DEL tens of ms), and
// stops looking once every range has one.
func hostRoutesIn(fam int, ranges []*net.IPNet) (map[int]bool, error) {
	bits := 32
	if fam == netlink.FAMILY_V6 {
		bits = 128
	}
	var used map[int]bool
	var err error
	for try := 0; try < 5; try++ {
		used = map[int]bool{}
		req := nl.NewNetlinkRequest(unix.RTM_GETROUTE, unix.NLM_F_DUMP)
		req.AddData(&nl.RtMsg{RtMsg: unix.RtMsg{Family: uint8(fam)}})
		err = req.ExecuteIter(unix.NETLINK_ROUTE, unix.RTM_NEWROUTE, func(m []byte) bool {
			h := nl.DeserializeRtMsg(m)
			if h.Table != unix.RT_TABLE_MAIN || h.Type != unix.RTN_UNICAST || int(h.Dst_len) != bits || h.Flags&unix.RTM_F_CLONED != 0 {
				return true
			}
			attrs, perr := nl.ParseRouteAttr(m[h.Len():])
			if perr != nil {
				return true
			}
			var dst net.IP
			oif := false
			for _, a := range attrs {
				switch a.Attr.Type {
				case unix.RTA_DST:
					dst = net.IP(a.Value)
				case unix.RTA_OIF:
					oif = true
				}
			}
			if dst == nil || !oif {
				return true
			}
			for i, r := range ranges {
				if !used[i] && r.Contains(dst) {
					used[i] = true
				}
			}
			return len(used) < len(ranges)
		})
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("listing routes: %w", err)
	}
	return used, nil
}
