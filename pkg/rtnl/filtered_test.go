package rtnl

import (
	"fmt"
	"net"
	"os"
	"slices"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
)

// wantDefaults is what netlink's RouteList finds as default routes: the
// reference DefaultRoutes must agree with.
func wantDefaults(t *testing.T, family int) []Route {
	t.Helper()
	routes, err := netlink.RouteList(nil, family)
	require.NoError(t, err)
	var out []Route
	for _, r := range routes {
		if r.Dst != nil {
			if ones, _ := r.Dst.Mask.Size(); ones != 0 {
				continue
			}
		}
		x := Route{Family: family, Type: uint8(r.Type), Gw: r.Gw}
		if r.LinkIndex != 0 {
			x.Links = append(x.Links, r.LinkIndex)
		}
		for _, nh := range r.MultiPath {
			x.Links = append(x.Links, nh.LinkIndex)
			if x.Gw == nil {
				x.Gw = nh.Gw
			}
		}
		out = append(out, x)
	}
	return out
}

// wantAddrs is netlink's AddrList of one device.
func wantAddrs(t *testing.T, ifindex, family int) []Addr {
	t.Helper()
	l, err := netlink.LinkByIndex(ifindex)
	require.NoError(t, err)
	addrs, err := netlink.AddrList(l, family)
	require.NoError(t, err)
	var out []Addr
	for _, a := range addrs {
		ones, _ := a.Mask.Size()
		out = append(out, Addr{IP: a.IP, PrefixLen: ones, Scope: uint8(a.Scope), Flags: uint32(a.Flags), LinkIndex: a.LinkIndex})
	}
	return out
}

func normIP(ip net.IP) string {
	if ip == nil {
		return ""
	}
	return ip.String()
}

func routeStrings(rs []Route) []string {
	var out []string
	for _, r := range rs {
		out = append(out, fmt.Sprintf("fam=%d type=%d links=%v gw=%s", r.Family, r.Type, r.Links, normIP(r.Gw)))
	}
	slices.Sort(out)
	return out
}

func addrStrings(as []Addr) []string {
	var out []string
	for _, a := range as {
		out = append(out, fmt.Sprintf("%s/%d scope=%d flags=%#x dev=%d", normIP(a.IP), a.PrefixLen, a.Scope, a.Flags, a.LinkIndex))
	}
	slices.Sort(out)
	return out
}

// DefaultRoutes and LinkAddrs answer what netlink's full dumps answer,
// with the kernel filtering (strict checking) and without it, inside a
// span and outside one, on a node with default routes of every kind
// (a gateway, ECMP, a blackhole, one in another table) among many others.
func TestFilteredDumps(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	node, err := nettest.NewNetNS()
	require.NoError(t, err)
	defer nettest.CloseNetNS(node)
	cmds := [][]string{
		{"link", "add", "up0", "type", "veth", "peer", "name", "up0p"},
		{"link", "add", "up1", "type", "veth", "peer", "name", "up1p"},
		{"link", "set", "up0", "up"}, {"link", "set", "up1", "up"},
		{"link", "set", "up0p", "up"}, {"link", "set", "up1p", "up"},
		{"addr", "add", "192.0.2.2/24", "dev", "up0"},
		{"addr", "add", "192.0.2.3/24", "dev", "up0"}, // secondary
		{"addr", "add", "198.51.100.2/24", "dev", "up1"},
		{"-6", "addr", "add", "2001:db8::2/64", "dev", "up0", "nodad"},
		{"-6", "addr", "add", "2001:db8:1::2/64", "dev", "up1", "nodad"},
		{"-6", "addr", "add", "2001:db8::9/64", "dev", "up0", "nodad", "preferred_lft", "0"}, // deprecated
		{"route", "add", "default", "nexthop", "via", "192.0.2.1", "dev", "up0", "nexthop", "via", "198.51.100.1", "dev", "up1"},
		{"route", "add", "blackhole", "default", "metric", "500"},
		{"route", "add", "default", "via", "198.51.100.1", "table", "100"},
		{"-6", "route", "add", "default", "via", "2001:db8::1", "dev", "up0"},
		{"-6", "route", "add", "default", "via", "2001:db8:1::1", "dev", "up1", "metric", "2000"},
		{"-6", "route", "add", "default", "via", "2001:db8:1::1", "dev", "up1", "table", "100"},
	}
	// Pods' host veths: a route and a link-local address each.
	for i := range 20 {
		h := fmt.Sprintf("h%d", i)
		cmds = append(cmds, []string{"link", "add", h, "type", "veth", "peer", "name", fmt.Sprintf("p%d", i)},
			[]string{"link", "set", h, "up"},
			[]string{"route", "add", fmt.Sprintf("10.1.0.%d/32", i+1), "dev", h},
			[]string{"-6", "route", "add", fmt.Sprintf("fd00::%d/128", i+1), "dev", h})
	}
	for _, c := range cmds {
		_, err := nettest.Run(node, "ip", c...)
		require.NoError(t, err)
	}

	check := func(t *testing.T) {
		require.NoError(t, node.Do(func(ns.NetNS) error {
			for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
				got, err := DefaultRoutes(fam)
				require.NoError(t, err)
				want := wantDefaults(t, fam)
				require.Len(t, want, 2, "the test's own default routes of family %d in the main table", fam)
				require.Equal(t, routeStrings(want), routeStrings(got), "family %d", fam)
			}
			for _, name := range []string{"up0", "up1", "h3", "lo"} {
				l, err := netlink.LinkByName(name)
				require.NoError(t, err)
				for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
					got, err := LinkAddrs(l.Attrs().Index, fam)
					require.NoError(t, err)
					want := wantAddrs(t, l.Attrs().Index, fam)
					require.Equal(t, addrStrings(want), addrStrings(got), "%s family %d", name, fam)
				}
			}
			// Both families in one dump (uplink.Find): IPv4's first, each
			// family's in its own order, each address with its family.
			for _, name := range []string{"up0", "up1"} {
				l, err := netlink.LinkByName(name)
				require.NoError(t, err)
				both, err := LinkAddrs(l.Attrs().Index, unix.AF_UNSPEC)
				require.NoError(t, err)
				var order []string
				for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
					one, err := LinkAddrs(l.Attrs().Index, fam)
					require.NoError(t, err)
					for _, a := range one {
						require.Equal(t, fam, a.Family, "%s %s", name, a.IP)
						order = append(order, a.IP.String())
					}
				}
				var got []string
				for _, a := range both {
					got = append(got, a.IP.String())
				}
				require.Equal(t, order, got, "%s: AF_UNSPEC", name)
			}
			l, err := netlink.LinkByName("up0")
			require.NoError(t, err)
			got, err := LinkAddrs(l.Attrs().Index, unix.AF_INET)
			require.NoError(t, err)
			dev := l.Attrs().Index
			require.Equal(t, []string{fmt.Sprintf("192.0.2.2/24 scope=0 flags=0x80 dev=%d", dev), fmt.Sprintf("192.0.2.3/24 scope=0 flags=0x81 dev=%d", dev)},
				addrStrings(got), "the primary address, then the secondary (IFA_F_SECONDARY), both permanent")

			// Every device's global addresses: netlink's full dump, less
			// the link-local (every veth's) and host (lo's) scopes.
			for _, fam := range []int{unix.AF_UNSPEC, unix.AF_INET, unix.AF_INET6} {
				all, err := netlink.AddrList(nil, fam)
				require.NoError(t, err)
				var want []string
				for _, a := range all {
					if a.Scope == unix.RT_SCOPE_UNIVERSE {
						ones, _ := a.Mask.Size()
						want = append(want, addrStrings([]Addr{{IP: a.IP, PrefixLen: ones, Flags: uint32(a.Flags), LinkIndex: a.LinkIndex}})...)
					}
				}
				slices.Sort(want)
				require.Len(t, want, map[int]int{unix.AF_UNSPEC: 6, unix.AF_INET: 3, unix.AF_INET6: 3}[fam], "family %d", fam)
				got, err := GlobalAddrs(fam)
				require.NoError(t, err)
				require.Equal(t, want, addrStrings(got), "family %d", fam)
			}
			return nil
		}))
	}
	t.Run("strict", check)
	t.Run("in a span", func(t *testing.T) {
		require.NoError(t, node.Do(func(ns.NetNS) error {
			end := Begin()
			defer end()
			check(t)
			require.Equal(t, 1, Sockets(), "one query socket for the node, kept")
			return nil
		}))
	})
	t.Run("without strict checking", func(t *testing.T) {
		strictCheck = false
		defer func() { strictCheck = true }()
		check(t)
	})
}

// Within a span the default routes are dumped once per namespace, both
// families at once: a route added during the span is not seen until the
// next one (a call changes no default route), and outside a span every
// ask dumps anew.
func TestDefaultRoutesSpan(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	node, err := nettest.NewNetNS()
	require.NoError(t, err)
	defer nettest.CloseNetNS(node)
	for _, c := range [][]string{
		{"link", "add", "up0", "type", "veth", "peer", "name", "up0p"},
		{"link", "set", "up0", "up"},
		{"addr", "add", "192.0.2.2/24", "dev", "up0"},
		{"-6", "addr", "add", "2001:db8::2/64", "dev", "up0", "nodad"},
		{"route", "add", "default", "via", "192.0.2.1"},
	} {
		_, err := nettest.Run(node, "ip", c...)
		require.NoError(t, err)
	}
	count := func(fam int) int {
		rs, err := DefaultRoutes(fam)
		require.NoError(t, err)
		return len(rs)
	}
	require.NoError(t, node.Do(func(ns.NetNS) error {
		end := Begin()
		require.Equal(t, 1, count(unix.AF_INET))
		require.Equal(t, 0, count(unix.AF_INET6))
		_, err := nettest.Run(node, "ip", "-6", "route", "add", "default", "via", "2001:db8::1")
		require.NoError(t, err)
		require.Equal(t, 0, count(unix.AF_INET6), "the span's dump, from before the route")
		end()
		require.Equal(t, 1, count(unix.AF_INET6), "outside the span: a dump of its own")
		end = Begin()
		defer end()
		require.Equal(t, 1, count(unix.AF_INET6), "a new span dumps anew")
		rs, err := DefaultRoutes(unix.AF_INET)
		require.NoError(t, err)
		require.Equal(t, unix.AF_INET, rs[0].Family)
		require.Equal(t, "192.0.2.1", rs[0].Gw.String())
		return nil
	}))
}

// A dump the kernel refuses (strict checking: a route dump request may
// not carry a prefix length) is an error, and the span's socket answers
// the next question.
func TestFilteredDumpRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	node, err := nettest.NewNetNS()
	require.NoError(t, err)
	defer nettest.CloseNetNS(node)
	require.NoError(t, node.Do(func(ns.NetNS) error {
		end := Begin()
		defer end()
		q, done, err := spanQuery()
		require.NoError(t, err)
		defer done()
		require.True(t, q.strict, "the kernel filters (Linux 4.20 or later)")
		body := make([]byte, unix.SizeofRtMsg)
		body[0], body[1] = unix.AF_INET, 32 // rtm_dst_len
		calls := 0
		err = q.dump(unix.RTM_GETROUTE, body, func([]byte) error { calls++; return nil })
		require.ErrorIs(t, err, unix.EINVAL)
		require.Zero(t, calls)
		routes, err := DefaultRoutes(unix.AF_INET)
		require.NoError(t, err)
		require.Empty(t, routes, "a fresh namespace has no default route")
		require.Equal(t, 1, Sockets())
		return nil
	}))
}
