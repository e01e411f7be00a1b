package deploy_test

import (
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
)

// TestDirectRoutesOnlyItsOwn: the direct backend on a real routing table
// lists, replaces and removes only the routes tagged with its protocol: a
// static route to a range is reported and left alone, and so is a route of
// the same range via another node; a next hop off the node's networks is
// refused with what to do.
func TestDirectRoutesOnlyItsOwn(t *testing.T) {
	_, h := lonelyNode(t, "192.0.2.11", "2001:db8:ffff::11")
	d, err := agent.NewDirect(h, agent.DefaultRouteProtocol)
	require.NoError(t, err)
	_, err = agent.NewDirect(h, unix.RTPROT_KERNEL)
	require.ErrorContains(t, err, "want 5..255")

	r := func(dst, via string) agent.Route {
		return agent.Route{Dst: netip.MustParsePrefix(dst), Via: netip.MustParseAddr(via)}
	}
	// An operator's static route.
	_, static, _ := net.ParseCIDR("10.244.9.0/24")
	require.NoError(t, h.RouteAdd(&netlink.Route{Dst: static, Gw: net.ParseIP("192.0.2.19"), Protocol: unix.RTPROT_STATIC}))

	require.NoError(t, d.Ensure(r("10.244.2.0/24", "192.0.2.12")))
	require.NoError(t, d.Ensure(r("10.244.2.0/24", "192.0.2.12")), "ensuring what is there")
	require.NoError(t, d.Ensure(r("fd00:10:244:2::/64", "2001:db8:ffff::12")))
	require.ErrorContains(t, d.Ensure(r("10.244.9.0/24", "192.0.2.12")), "a route the agent did not install is there (proto 4): left alone")
	require.ErrorContains(t, d.Ensure(r("10.244.3.0/24", "198.51.100.7")), "is not on a network this node is attached to: direct mode needs the nodes on one L2 segment")

	list, err := d.List()
	require.NoError(t, err)
	require.ElementsMatch(t, []agent.Route{r("10.244.2.0/24", "192.0.2.12"), r("fd00:10:244:2::/64", "2001:db8:ffff::12")}, list)

	// The range moves to another node: replaced in place.
	require.NoError(t, d.Ensure(r("10.244.2.0/24", "192.0.2.13")))
	// Removing the old entry leaves the new one.
	require.NoError(t, d.Remove(r("10.244.2.0/24", "192.0.2.12")))
	list, err = d.List()
	require.NoError(t, err)
	require.ElementsMatch(t, []agent.Route{r("10.244.2.0/24", "192.0.2.13"), r("fd00:10:244:2::/64", "2001:db8:ffff::12")}, list)

	for _, x := range list {
		require.NoError(t, d.Remove(x))
		require.NoError(t, d.Remove(x), "removing what is gone")
	}
	require.NoError(t, d.Remove(r("10.244.9.0/24", "192.0.2.19")), "the static route is not the agent's")
	routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: static}, netlink.RT_FILTER_DST)
	require.NoError(t, err)
	require.Len(t, routes, 1, "the static route survived")
	list, err = d.List()
	require.NoError(t, err)
	require.Empty(t, list)
}
