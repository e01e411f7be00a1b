package nat

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// TestForgetNetworks: the masquerade settings of networks without a live
// endpoint are listed by a dry run, which keeps them, and removed by a
// real run, which lists the same; a live network's stay.
func TestForgetNetworks(t *testing.T) {
	bpfRoot := testutil.BPFFS(t)
	n, err := node.Open(node.Options{BPFRoot: bpfRoot, StateDir: t.TempDir(), Lock: node.Unlocked})
	require.NoError(t, err)
	defer n.Close()
	nets, err := n.Map(maps.CniMapMasqNets)
	require.NoError(t, err)
	skip, err := n.Map(maps.CniMapMasqSkip)
	require.NoError(t, err)
	for _, id := range []uint32{1, 2} {
		require.NoError(t, nets.Put(&maps.CniMasqNetKey{NetId: id, Family: 4}, &maps.CniMasqNet{}))
		_, cidr, _ := net.ParseCIDR("10.244.0.0/16")
		require.NoError(t, skip.Put(skipKey(id, cidr), uint32(1)))
	}
	live := func(id uint32) bool { return id == 1 }
	want := []string{"masq_nets[network 0x2, IPv4] (no pod of the network left)", "masq_skip[network 0x2, 10.244.0.0/16] (no pod of the network left)"}
	dry, err := ForgetNetworks(n, live, true)
	require.NoError(t, err)
	require.ElementsMatch(t, want, dry)
	require.NoError(t, nets.Lookup(&maps.CniMasqNetKey{NetId: 2, Family: 4}, &maps.CniMasqNet{}), "the dry run removed a setting")
	done, err := ForgetNetworks(n, live, false)
	require.NoError(t, err)
	require.ElementsMatch(t, want, done)
	require.Error(t, nets.Lookup(&maps.CniMasqNetKey{NetId: 2, Family: 4}, &maps.CniMasqNet{}))
	require.NoError(t, nets.Lookup(&maps.CniMasqNetKey{NetId: 1, Family: 4}, &maps.CniMasqNet{}), "the live network's setting stays")
	again, err := ForgetNetworks(n, live, true)
	require.NoError(t, err)
	require.Empty(t, again)
}
