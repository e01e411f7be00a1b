package flows

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

func TestTable(t *testing.T) {
	n, err := node.Open(node.Options{BPFRoot: testutil.BPFFS(t), Lock: node.Unlocked})
	require.NoError(t, err)
	defer n.Close()
	tb, err := Open(n)
	require.NoError(t, err)
	put := func(pod, remote string, sport uint16, v maps.CniFlowVerdict, f maps.CniFlowFlags) {
		p, r := net.ParseIP(pod), net.ParseIP(remote)
		k := maps.CniFlowKey{Family: maps.Family(p), Proto: 6, Sport: maps.Port(sport), Dport: maps.Port(80), Saddr: maps.Addr16(p), Daddr: maps.Addr16(r)}
		require.NoError(t, tb.m.Put(&k, &maps.CniFlowEntry{Verdict: v, Flags: f, LastSeen: maps.Monotonic()}))
	}
	put("10.0.0.2", "10.96.0.10", 40000, maps.CniFlowVerdictFLOW_STACK, 0)
	put("10.0.0.2", "198.51.100.7", 40001, maps.CniFlowVerdictFLOW_FAST, 0)
	put("fd00::2", "2001:db8::7", 40002, maps.CniFlowVerdictFLOW_FAST, maps.CniFlowFlagsFLOW_F_INBOUND)
	put("10.0.0.3", "198.51.100.7", 40003, maps.CniFlowVerdictFLOW_PENDING, 0)
	put("10.0.0.3", "198.51.100.8", 40004, maps.CniFlowVerdictFLOW_FAST, maps.CniFlowFlagsFLOW_F_UNTRACKED)

	list, err := tb.List()
	require.NoError(t, err)
	require.Len(t, list, 5)
	for _, f := range list {
		require.Equal(t, f.PodPort == 40004, f.Untracked, "%+v", f)
		if f.Pod.Equal(net.ParseIP("fd00::2")) {
			require.True(t, f.Inbound)
			require.Equal(t, uint16(40002), f.PodPort)
			require.Equal(t, uint16(80), f.RemotePort)
			require.Equal(t, "fast", VerdictNames[f.Verdict])
		}
	}
	gone, err := tb.FlushPod([]net.IP{net.ParseIP("10.0.0.2"), net.ParseIP("fd00::2")})
	require.NoError(t, err)
	require.Equal(t, 3, gone)
	put("10.0.0.4", "198.51.100.7", 40005, maps.CniFlowVerdictFLOW_FAST, 0)
	live := func(ip net.IP) bool { return ip.Equal(net.ParseIP("10.0.0.4")) }
	// A dry run lists what a real run removes, and removes nothing.
	dry, err := tb.GC(live, true)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{
		"flows tcp 10.0.0.3:40003 -> 198.51.100.7:80, pending (pod gone)",
		"flows tcp 10.0.0.3:40004 -> 198.51.100.8:80, fast (pod gone)",
	}, dry)
	list, err = tb.List()
	require.NoError(t, err)
	require.Len(t, list, 3)
	done, err := tb.GC(live, false)
	require.NoError(t, err)
	require.ElementsMatch(t, dry, done)
	list, err = tb.List()
	require.NoError(t, err)
	require.Len(t, list, 1, "the live pod's flow stays")
	done, err = tb.GC(func(net.IP) bool { return false }, false)
	require.NoError(t, err)
	require.Len(t, done, 1)
	list, err = tb.List()
	require.NoError(t, err)
	require.Empty(t, list)
}
