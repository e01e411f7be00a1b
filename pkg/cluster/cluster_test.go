package cluster

import (
	"net"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/clusterranges"
	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

func TestValidate(t *testing.T) {
	good := []Config{
		{},
		{Config: clusterranges.Config{ClusterCIDRs: []string{"10.244.0.0/16", "fd00:244::/48"}}},
		{Config: clusterranges.Config{ClusterCIDRs: []string{"10.244.0.0/16"}}, Overlay: "vxlan", VXLANPort: 8472, VXLANVNI: 42},
		{Config: clusterranges.Config{ClusterCIDRs: []string{"10.244.0.0/16"}}, Overlay: "none"},
	}
	for _, c := range good {
		s, err := c.Validate()
		require.NoError(t, err, "%+v", c)
		require.Equal(t, len(c.ClusterCIDRs) > 0, s.Enabled())
	}
	s, err := (&Config{Config: clusterranges.Config{ClusterCIDRs: []string{"10.244.0.0/16"}}, Overlay: "vxlan"}).Validate()
	require.NoError(t, err)
	require.Equal(t, uint16(DefaultVXLANPort), s.Port)
	require.Equal(t, uint32(DefaultVXLANVNI), s.VNI)

	bad := map[string]Config{
		"clusterCIDRs[1]": {Config: clusterranges.Config{ClusterCIDRs: []string{"10.244.0.0/16", "10.1/33"}}},
		"clusterCIDRs[0]": {Config: clusterranges.Config{ClusterCIDRs: []string{"0.0.0.0/0"}}},
		"overlay":         {Config: clusterranges.Config{ClusterCIDRs: []string{"10.244.0.0/16"}}, Overlay: "geneve"},
		"vxlanPort":       {Config: clusterranges.Config{ClusterCIDRs: []string{"10.244.0.0/16"}}, Overlay: "vxlan", VXLANPort: 70000},
		"vxlanVNI":        {Config: clusterranges.Config{ClusterCIDRs: []string{"10.244.0.0/16"}}, Overlay: "vxlan", VXLANVNI: 1 << 24},
	}
	for key, c := range bad {
		_, err := c.Validate()
		var ce *config.Error
		require.ErrorAs(t, err, &ce, key)
		require.Equal(t, key, ce.Key)
	}
	_, err = (&Config{Overlay: "vxlan"}).Validate()
	require.ErrorContains(t, err, "needs clusterCIDRs")
	_, err = (&Config{Config: clusterranges.Config{ClusterCIDRs: []string{"10.244.0.0/16"}}, VXLANVNI: 3}).Validate()
	require.ErrorContains(t, err, "vxlanVNI: set without overlay vxlan")
}

func cidr(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}

// TestRoutes: the cluster's ranges and the tunnel endpoints share one map
// and one prefix without undoing each other: releasing the ranges keeps the
// tunnels, Sync keeps the ranges.
func TestRoutes(t *testing.T) {
	bpfRoot, stateDir := testutil.BPFFS(t), filepath.Join(t.TempDir(), "not-yet") // the agent may come first
	require.NoError(t, AddRanges(nodeOf(t, bpfRoot, stateDir), []*net.IPNet{cidr("10.244.0.0/16"), cidr("10.245.0.0/16")}))
	require.Empty(t, MissingRanges(nodeOf(t, bpfRoot, stateDir), []*net.IPNet{cidr("10.244.0.0/16")}))

	ts, err := OpenTunnels(nodeOf(t, bpfRoot, stateDir))
	require.NoError(t, err)
	require.NoError(t, ts.Add(cidr("10.244.2.0/24"), net.ParseIP("192.0.2.12")))
	require.NoError(t, ts.Add(cidr("10.245.0.0/16"), net.ParseIP("2001:db8::13"))) // the same prefix as a range
	require.NoError(t, ts.Add(cidr("10.244.2.0/24"), net.ParseIP("192.0.2.22")))   // moved
	require.Error(t, ts.Add(cidr("10.244.3.0/24"), net.IPv4zero))
	list, err := ts.List()
	require.NoError(t, err)
	require.Equal(t, []string{"10.244.2.0/24 via 192.0.2.22", "10.245.0.0/16 via 2001:db8::13"}, names(list))

	require.NoError(t, ts.Sync([]Tunnel{{cidr("10.244.4.0/24"), net.ParseIP("192.0.2.14")}}))
	list, err = ts.List()
	require.NoError(t, err)
	require.Equal(t, []string{"10.244.4.0/24 via 192.0.2.14"}, names(list))
	ts.Close()
	require.Empty(t, MissingRanges(nodeOf(t, bpfRoot, stateDir), []*net.IPNet{cidr("10.244.0.0/16"), cidr("10.245.0.0/16")}), "Sync keeps the ranges")

	require.NoError(t, clearRanges(nodeOf(t, bpfRoot, stateDir)))
	require.Len(t, MissingRanges(nodeOf(t, bpfRoot, stateDir), []*net.IPNet{cidr("10.244.0.0/16")}), 1)
	ts, err = OpenTunnels(nodeOf(t, bpfRoot, stateDir))
	require.NoError(t, err)
	defer ts.Close()
	list, err = ts.List()
	require.NoError(t, err)
	require.Equal(t, []string{"10.244.4.0/24 via 192.0.2.14"}, names(list), "releasing the ranges keeps the tunnels")
	es, err := ts.t.entries()
	require.NoError(t, err)
	require.Len(t, es, 1, "entries without flags are deleted")
	require.Equal(t, maps.CniClusterFlagsCLUSTER_F_TUNNEL, es[0].Value.Flags)
}

func names(ts []Tunnel) []string {
	out := []string{}
	for _, t := range ts {
		out = append(out, t.String())
	}
	return out
}

// TestTunnelsInsideARange: a node's pod range lies inside the cluster's
// range, and the trie's lookup of the node's prefix answers with the
// range's entry when the node's has none. Adding, deleting and reading
// the node's endpoint touch its own prefix only: the range keeps its
// entry, and no entry is left behind.
func TestTunnelsInsideARange(t *testing.T) {
	bpfRoot, stateDir := testutil.BPFFS(t), t.TempDir()
	require.NoError(t, AddRanges(nodeOf(t, bpfRoot, stateDir), []*net.IPNet{cidr("10.244.0.0/16")}))
	ts, err := OpenTunnels(nodeOf(t, bpfRoot, stateDir))
	require.NoError(t, err)
	defer ts.Close()

	_, ok, err := ts.Get(cidr("10.244.2.0/24"))
	require.NoError(t, err)
	require.False(t, ok, "the range's entry answered for the node's prefix")
	require.NoError(t, ts.Del(cidr("10.244.2.0/24")), "deleting what is not there")
	require.NoError(t, ts.Add(cidr("10.244.2.0/24"), net.ParseIP("192.0.2.12")))
	node, ok, err := ts.Get(cidr("10.244.2.0/24"))
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "192.0.2.12", node.String())
	flags := func() map[string]maps.CniClusterFlags {
		es, err := ts.t.entries()
		require.NoError(t, err)
		out := map[string]maps.CniClusterFlags{}
		for _, e := range es {
			out[keyNet(e.Key).String()] = e.Value.Flags
		}
		return out
	}
	require.Equal(t, map[string]maps.CniClusterFlags{
		"10.244.0.0/16": maps.CniClusterFlagsCLUSTER_F_RANGE,
		"10.244.2.0/24": maps.CniClusterFlagsCLUSTER_F_TUNNEL,
	}, flags(), "the endpoint took the range's flag")
	require.NoError(t, ts.Del(cidr("10.244.2.0/24")))
	require.Equal(t, map[string]maps.CniClusterFlags{"10.244.0.0/16": maps.CniClusterFlagsCLUSTER_F_RANGE}, flags())
}

// nodeOf is a handle on the node under bpfRoot and stateDir, as a call
// has it (without the node lock), closed with the test.
func nodeOf(t *testing.T, bpfRoot, stateDir string) *node.Node {
	t.Helper()
	n, err := node.Open(node.Options{BPFRoot: bpfRoot, StateDir: stateDir, Lock: node.Unlocked})
	require.NoError(t, err)
	t.Cleanup(n.Close)
	return n
}
