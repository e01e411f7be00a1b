package deploy_test

import (
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/cluster"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// TestTunnelsOnlyItsOwn: the vxlan backend on the plugin's real map lists,
// replaces and removes only the endpoints it wrote: one written by hand
// (ebpf-cni tunnels --add) is reported and left alone, and so is one of its
// own that someone pointed elsewhere; one of its own deleted by hand comes
// back; the cluster's range in the same map is never touched; a restarted
// agent knows its entries again.
func TestTunnelsOnlyItsOwn(t *testing.T) {
	testutil.RequireRoot(t)
	bpfRoot, stateDir := testutil.BPFFS(t), t.TempDir()
	v, err := agent.NewVXLAN(nodetest.Handle(t, bpfRoot, stateDir), 4) // no pod ran: it makes the map
	require.NoError(t, err)
	nd, err := node.Open(node.Options{BPFRoot: bpfRoot, StateDir: stateDir, Lock: node.Unlocked})
	require.NoError(t, err)
	defer nd.Close()
	require.NoError(t, cluster.AddRanges(nd, []*net.IPNet{ipnet("10.244.0.0/16")}))
	byHand := func(f func(*cluster.Tunnels) error) {
		ts, err := cluster.OpenTunnels(nodetest.Handle(t, bpfRoot, stateDir))
		require.NoError(t, err)
		defer ts.Close()
		require.NoError(t, f(ts))
	}
	r := func(dst, via string) agent.Route {
		return agent.Route{Dst: netip.MustParsePrefix(dst), Via: netip.MustParseAddr(via)}
	}
	list := func(v *agent.VXLAN) []agent.Route {
		l, err := v.List()
		require.NoError(t, err)
		return l
	}
	inMap := func() []string {
		var out []string
		byHand(func(ts *cluster.Tunnels) error {
			l, err := ts.List()
			for _, x := range l {
				out = append(out, x.String())
			}
			return err
		})
		return out
	}

	byHand(func(ts *cluster.Tunnels) error { return ts.Add(ipnet("10.244.9.0/24"), net.ParseIP("192.0.2.19")) })
	require.NoError(t, v.Ensure(r("10.244.2.0/24", "192.0.2.12")))
	require.NoError(t, v.Ensure(r("10.244.2.0/24", "192.0.2.12")), "ensuring what is there")
	require.NoError(t, v.Ensure(r("fd00:10:244:2::/64", "192.0.2.12")))
	require.ErrorContains(t, v.Ensure(r("10.244.9.0/24", "192.0.2.12")), "one the agent did not write is there (via 192.0.2.19): left alone; remove it (ebpf-cni tunnels --del 10.244.9.0/24)")
	require.ElementsMatch(t, []agent.Route{r("10.244.2.0/24", "192.0.2.12"), r("fd00:10:244:2::/64", "192.0.2.12")}, list(v))

	// The range moves to another node: replaced in place; removing the
	// old entry keeps the new one.
	require.NoError(t, v.Ensure(r("10.244.2.0/24", "198.51.100.13")))
	require.NoError(t, v.Remove(r("10.244.2.0/24", "192.0.2.12")))
	require.ElementsMatch(t, []agent.Route{r("10.244.2.0/24", "198.51.100.13"), r("fd00:10:244:2::/64", "192.0.2.12")}, list(v))

	// A restarted agent knows its own.
	v, err = agent.NewVXLAN(nodetest.Handle(t, bpfRoot, stateDir), 4)
	require.NoError(t, err)
	require.ElementsMatch(t, []agent.Route{r("10.244.2.0/24", "198.51.100.13"), r("fd00:10:244:2::/64", "192.0.2.12")}, list(v))

	// Someone points the agent's IPv6 entry elsewhere, and deletes its
	// IPv4 one: the first is no longer the agent's, the second comes back.
	byHand(func(ts *cluster.Tunnels) error {
		return ts.Add(ipnet("fd00:10:244:2::/64"), net.ParseIP("192.0.2.99"))
	})
	byHand(func(ts *cluster.Tunnels) error { return ts.Del(ipnet("10.244.2.0/24")) })
	require.Empty(t, list(v))
	require.ErrorContains(t, v.Ensure(r("fd00:10:244:2::/64", "192.0.2.12")), "did not write")
	require.NoError(t, v.Remove(r("fd00:10:244:2::/64", "192.0.2.12")))
	require.NoError(t, v.Ensure(r("10.244.2.0/24", "198.51.100.13")))
	require.Equal(t, []agent.Route{r("10.244.2.0/24", "198.51.100.13")}, list(v))

	for _, x := range list(v) {
		require.NoError(t, v.Remove(x))
		require.NoError(t, v.Remove(x), "removing what is gone")
	}
	require.NoError(t, v.Remove(r("10.244.9.0/24", "192.0.2.19")), "the entry by hand is not the agent's")
	require.Empty(t, list(v))
	require.Equal(t, []string{"10.244.9.0/24 via 192.0.2.19", "fd00:10:244:2::/64 via 192.0.2.99"}, inMap(), "what the agent did not write stays")
	require.Empty(t, cluster.MissingRanges(nd, []*net.IPNet{ipnet("10.244.0.0/16")}), "the cluster's range stays")
}

// TestTunnelsPlan: every pod range of a peer, IPv4 and IPv6, goes to its
// address of the underlay family the plugin sized the pods' MTU for; a
// peer without one is reached at its other; one without any is reported.
func TestTunnelsPlan(t *testing.T) {
	testutil.RequireRoot(t)
	bpfRoot, stateDir := testutil.BPFFS(t), t.TempDir()
	peer := agent.Peer{Name: "b",
		InternalIPs: []netip.Addr{netip.MustParseAddr("2001:db8::12"), netip.MustParseAddr("192.0.2.12")},
		PodCIDRs:    []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("fd00:10:244:2::/64")}}
	for fam, via := range map[int]string{4: "192.0.2.12", 6: "2001:db8::12"} {
		v, err := agent.NewVXLAN(nodetest.Handle(t, bpfRoot, stateDir), fam)
		require.NoError(t, err)
		routes, err := v.Plan(peer)
		require.NoError(t, err)
		want := netip.MustParseAddr(via)
		require.Equal(t, []agent.Route{{Dst: peer.PodCIDRs[0], Via: want}, {Dst: peer.PodCIDRs[1], Via: want}}, routes, "underlay IPv%d", fam)
	}
	v, err := agent.NewVXLAN(nodetest.Handle(t, bpfRoot, stateDir), 4)
	require.NoError(t, err)
	v6only := peer
	v6only.InternalIPs = peer.InternalIPs[:1]
	routes, err := v.Plan(v6only)
	require.NoError(t, err)
	require.Equal(t, netip.MustParseAddr("2001:db8::12"), routes[0].Via)
	_, err = v.Plan(agent.Peer{Name: "c", PodCIDRs: peer.PodCIDRs})
	require.ErrorContains(t, err, "node c has no InternalIP")
}

func ipnet(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}
