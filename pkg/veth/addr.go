package veth

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/utils/sysctl"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/rtnl"
)

// Gateways the pod routes through when the IPAM result names none (IPv4) and
// always for IPv6: the host veth answers for them (ARP in BPF, NDP by the
// kernel for the link-local address ebpf-cni puts on the host veth).
var (
	FallbackGatewayV4 = net.IPv4(169, 254, 1, 1).To4()
	GatewayV6         = net.ParseIP("fe80::1")
)

// gatewayV6Addr is the host veth's extra link-local address.
var gatewayV6Addr = &net.IPNet{IP: GatewayV6, Mask: net.CIDRMask(64, 128)}

func isV4(ip net.IP) bool { return ip.To4() != nil }

// Gateways fills in the gateway of each address as the pod will use it.
func Gateways(ips []*current.IPConfig) {
	for _, c := range ips {
		if isV4(c.Address.IP) {
			if c.Gateway == nil || !isV4(c.Gateway) || c.Gateway.Equal(c.Address.IP) {
				c.Gateway = FallbackGatewayV4
			}
			c.Gateway = c.Gateway.To4()
		} else {
			c.Gateway = GatewayV6
		}
	}
}

// PodRoutes is the pod's routing table: its subnets and the IPAM routes via
// the gateway of their family, and a default route per family when IPAM
// gives no route of that family (so the pod reaches the node and beyond).
// Gateways must have run on ips.
func PodRoutes(ips []*current.IPConfig, ipamRoutes []*types.Route) []*types.Route {
	gw := map[bool]net.IP{}
	for _, c := range ips {
		if _, ok := gw[isV4(c.Address.IP)]; !ok {
			gw[isV4(c.Address.IP)] = c.Gateway
		}
	}
	var out []*types.Route
	seen := map[string]bool{}
	add := func(r *types.Route) {
		k := r.Dst.String()
		if !seen[k] {
			seen[k] = true
			out = append(out, r)
		}
	}
	for _, c := range ips {
		ones, bits := c.Address.Mask.Size()
		if ones == bits {
			continue
		}
		sub := net.IPNet{IP: c.Address.IP.Mask(c.Address.Mask), Mask: c.Address.Mask}
		add(&types.Route{Dst: sub, GW: c.Gateway})
	}
	hasRoute := map[bool]bool{}
	for _, r := range ipamRoutes {
		v4 := isV4(r.Dst.IP)
		g, ok := gw[v4]
		if !ok {
			continue // no address of that family: the route cannot work
		}
		rr := *r
		if rr.GW == nil {
			rr.GW = g
		}
		hasRoute[v4] = true
		add(&rr)
	}
	for v4, g := range gw {
		if hasRoute[v4] {
			continue
		}
		dst := net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
		if !v4 {
			dst = net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
		}
		add(&types.Route{Dst: dst, GW: g})
	}
	return out
}

func hasV6(ips []*current.IPConfig) bool {
	for _, c := range ips {
		if !isV4(c.Address.IP) {
			return true
		}
	}
	return false
}

func hasV4(ips []*current.IPConfig) bool {
	for _, c := range ips {
		if isV4(c.Address.IP) {
			return true
		}
	}
	return false
}

// ConfigurePod brings ifName up inside podNS with the addresses and routes.
// Addresses get no prefix route (everything goes via the gateway, which the
// host veth answers for) and no DAD (the link is point-to-point and ours).
//
// A route the pod has already (a default route from a first network, the
// subnet route of a second interface of the same network) is skipped, as
// the spec asks; the interface then gets a table of its own with every
// route through it, and a rule sending what its addresses send there, so
// replies from those addresses leave by the interface they belong to (its
// host veth accepts only them). It returns the pod's interface and the
// routes it added to the main table.
func ConfigurePod(podNS ns.NetNS, ifName string, ips []*current.IPConfig, routes []*types.Route) (netlink.Link, []*types.Route, error) {
	var added []*types.Route
	var l netlink.Link
	err := podNS.Do(func(ns.NetNS) error {
		var err error
		l, err = rtnl.H().LinkByName(ifName)
		if err != nil {
			return fmt.Errorf("looking up %s: %w", ifName, err)
		}
		if hasV6(ips) {
			if _, err := sysctl.Sysctl(fmt.Sprintf("net/ipv6/conf/%s/disable_ipv6", ifName), "0"); err != nil {
				return fmt.Errorf("enabling ipv6 on %s: %w", ifName, err)
			}
		}
		if err := rtnl.H().LinkSetUp(l); err != nil {
			return fmt.Errorf("setting %s up: %w", ifName, err)
		}
		for _, c := range ips {
			a := &netlink.Addr{IPNet: &c.Address, Flags: unix.IFA_F_NOPREFIXROUTE | unix.IFA_F_NODAD}
			if err := rtnl.H().AddrAdd(l, a); err != nil {
				return fmt.Errorf("adding address %s to %s: %w", c.Address.String(), ifName, err)
			}
		}
		skipped := false
		for _, r := range routes {
			nr := podRoute(l.Attrs().Index, r)
			err := rtnl.H().RouteAdd(nr)
			if errors.Is(err, unix.EEXIST) && r.Table == nil {
				skipped = true // another interface's: this one's own table has it
				continue
			}
			if err != nil {
				return fmt.Errorf("adding route %s via %s: %w", r.Dst.String(), r.GW, err)
			}
			added = append(added, r)
		}
		if skipped {
			return ownTable(l, ips, routes)
		}
		return nil
	})
	return l, added, err
}

// ownTable routes what ifName's addresses send through ifName: a table
// numbered after the interface (ownTableBase + its index) with every route
// of the interface, and one rule per address.
func ownTable(l netlink.Link, ips []*current.IPConfig, routes []*types.Route) error {
	table := ownTableBase + l.Attrs().Index
	for _, r := range routes {
		nr := podRoute(l.Attrs().Index, r)
		if r.Table == nil {
			nr.Table = table
		}
		if err := rtnl.H().RouteReplace(nr); err != nil {
			return fmt.Errorf("adding route %s via %s to table %d: %w", r.Dst.String(), r.GW, table, err)
		}
	}
	for _, c := range ips {
		rule := netlink.NewRule()
		rule.Table = table
		rule.Priority = ownRulePriority
		bits := 32
		rule.Family = netlink.FAMILY_V4
		if !isV4(c.Address.IP) {
			bits, rule.Family = 128, netlink.FAMILY_V6
		}
		rule.Src = &net.IPNet{IP: c.Address.IP, Mask: net.CIDRMask(bits, bits)}
		if err := rtnl.H().RuleAdd(rule); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("adding rule from %s lookup %d: %w", c.Address.IP, table, err)
		}
	}
	return nil
}

// The tables and rules of interfaces whose routes the pod had already.
const (
	ownTableBase    = 1000
	ownRulePriority = 1000
)

func podRoute(ifindex int, r *types.Route) *netlink.Route {
	dst := r.Dst
	nr := &netlink.Route{LinkIndex: ifindex, Dst: &dst, Gw: r.GW, MTU: r.MTU, AdvMSS: r.AdvMSS, Priority: r.Priority}
	if r.GW != nil {
		nr.Flags = int(netlink.FLAG_ONLINK)
	}
	if r.Table != nil {
		nr.Table = *r.Table
	}
	if r.Scope != nil {
		nr.Scope = netlink.Scope(*r.Scope)
	}
	return nr
}

// ConfigureHost brings the host veth up, gives it the IPv6 gateway address
// when the pod has IPv6, routes the pod's addresses through it, and turns on
// forwarding for the families in use (bpf_fib_lookup honours it too).
func ConfigureHost(host netlink.Link, ips []*current.IPConfig) error {
	name := host.Attrs().Name
	if hasV4(ips) {
		if err := ensureSysctl("net/ipv4/ip_forward", "1"); err != nil {
			return fmt.Errorf("enabling ipv4 forwarding: %w", err)
		}
	}
	if hasV6(ips) {
		if err := ensureSysctl("net/ipv6/conf/all/forwarding", "1"); err != nil {
			return fmt.Errorf("enabling ipv6 forwarding: %w", err)
		}
		for k, v := range map[string]string{"disable_ipv6": "0", "accept_ra": "0"} {
			if _, err := sysctl.Sysctl(fmt.Sprintf("net/ipv6/conf/%s/%s", name, k), v); err != nil {
				return fmt.Errorf("setting net.ipv6.conf.%s.%s: %w", name, k, err)
			}
		}
	}
	if err := rtnl.H().LinkSetUp(host); err != nil {
		return fmt.Errorf("setting %s up: %w", name, err)
	}
	if hasV6(ips) {
		a := &netlink.Addr{IPNet: gatewayV6Addr, Flags: unix.IFA_F_NODAD}
		if err := rtnl.H().AddrAdd(host, a); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("adding %s to %s: %w", gatewayV6Addr, name, err)
		}
	}
	for _, r := range HostRoutes(host.Attrs().Index, ips) {
		if err := rtnl.H().RouteReplace(r); err != nil {
			return fmt.Errorf("adding host route %s dev %s: %w", r.Dst, name, err)
		}
	}
	return nil
}

// HostRoutes are the node's routes to the pod: one host route per address.
func HostRoutes(ifindex int, ips []*current.IPConfig) []*netlink.Route {
	var out []*netlink.Route
	for _, c := range ips {
		bits := 32
		if !isV4(c.Address.IP) {
			bits = 128
		}
		dst := &net.IPNet{IP: c.Address.IP, Mask: net.CIDRMask(bits, bits)}
		out = append(out, &netlink.Route{LinkIndex: ifindex, Dst: dst, Scope: netlink.SCOPE_LINK})
	}
	return out
}

// RoutePresent reports whether the table of the current netns has a route
// to dst via gw on l.
func RoutePresent(l netlink.Link, r *types.Route) (bool, error) {
	fam := netlink.FAMILY_V4
	if !isV4(r.Dst.IP) {
		fam = netlink.FAMILY_V6
	}
	routes, err := rtnl.H().RouteList(l, fam)
	if err != nil {
		return false, err
	}
	want := r.Dst.String()
	for _, x := range routes {
		dst := "0.0.0.0/0"
		if fam == netlink.FAMILY_V6 {
			dst = "::/0"
		}
		if x.Dst != nil && x.Dst.IP != nil { // netlink gives a default route as nil or as 0/0
			dst = x.Dst.String()
		}
		if dst == want && (r.GW == nil || r.GW.Equal(x.Gw)) {
			return true, nil
		}
	}
	return false, nil
}

// ensureSysctl sets key to value unless it has it already: a write of
// IPv6's forwarding switch takes RTNL even when the value stays (and
// restarts while another ADD holds it); a read takes nothing.
func ensureSysctl(key, value string) error {
	if got, err := sysctl.Sysctl(key); err == nil && strings.TrimSpace(got) == value {
		return nil
	}
	_, err := sysctl.Sysctl(key, value)
	return err
}

// RemoveOwnRules deletes, in the pod's netns at netnsPath, the source rules
// ownTable added for ips (DEL of an interface that got a table of its own:
// its table's routes go with the interface, its rules would stay). A netns
// that is gone has nothing left to remove.
func RemoveOwnRules(netnsPath string, ips []net.IP) error {
	if netnsPath == "" || len(ips) == 0 {
		return nil
	}
	podNS, err := ns.GetNS(netnsPath)
	if err != nil {
		return nil
	}
	defer podNS.Close()
	return podNS.Do(func(ns.NetNS) error {
		var errs []error
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rules, err := rtnl.H().RuleList(fam)
			if err != nil {
				errs = append(errs, fmt.Errorf("listing rules: %w", err))
				continue
			}
			for _, r := range rules {
				if r.Priority != ownRulePriority || r.Table < ownTableBase || r.Src == nil {
					continue
				}
				for _, ip := range ips {
					if ones, bits := r.Src.Mask.Size(); ones == bits && r.Src.IP.Equal(ip) {
						if err := rtnl.H().RuleDel(&r); err != nil && !errors.Is(err, unix.ENOENT) {
							errs = append(errs, fmt.Errorf("deleting rule from %s lookup %d: %w", ip, r.Table, err))
						}
					}
				}
			}
		}
		return errors.Join(errs...)
	})
}
