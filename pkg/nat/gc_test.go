package nat

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// TestTableGC: GC honours the dry-run contract: a dry run lists, one line
// per flow, what a real run then removes (the flows of pods that are gone,
// expired flows, reply entries whose flow is gone), and removes nothing;
// the real run returns the same lines, and the live pod's flow stays.
func TestTableGC(t *testing.T) {
	tb, err := OpenTable(testutil.BPFFS(t))
	require.NoError(t, err)
	defer tb.Close()
	node, remote := net.ParseIP("192.0.2.2"), net.ParseIP("198.51.100.7")
	now := maps.Monotonic()
	require.Greater(t, now, uint64(2*time.Minute), "the clock (since boot) must go back two minutes")
	// flow puts both entries of a masqueraded TCP flow of pod from port,
	// translated to the node's natPort, last seen idle ago.
	flow := func(pod string, port, natPort uint16, state uint8, idle time.Duration, withOut bool) {
		p := net.ParseIP(pod)
		out := maps.CniNatKey{Family: maps.Family(p), Proto: unix.IPPROTO_TCP, Dir: dirOut, Sport: maps.Port(port), Dport: maps.Port(80),
			Saddr: maps.Addr16(p), Daddr: maps.Addr16(remote)}
		seen := now - uint64(idle)
		if withOut {
			require.NoError(t, tb.nat.Put(&out, &maps.CniNatEntry{Addr: maps.Addr16(node), Port: maps.Port(natPort), State: state, Created: seen, LastSeen: seen}))
		}
		in := maps.CniNatKey{Family: out.Family, Proto: out.Proto, Dir: dirIn, Sport: maps.Port(80), Dport: maps.Port(natPort),
			Saddr: maps.Addr16(remote), Daddr: maps.Addr16(node)}
		require.NoError(t, tb.nat.Put(&in, &maps.CniNatEntry{Addr: maps.Addr16(p), Port: maps.Port(port), Created: seen, LastSeen: seen}))
	}
	flow("10.0.0.2", 40000, 40000, StateEstablished, 0, true)         // live
	flow("10.0.0.2", 40001, 40001, StateSynSent, 2*time.Minute, true) // live pod, expired (SYN: 60 s)
	flow("10.0.0.3", 40002, 61000, StateEstablished, 0, true)         // pod gone
	flow("10.0.0.2", 40003, 40003, StateEstablished, 0, false)        // reply entry alone
	dnat := maps.CniNatKey{Family: 4, Proto: unix.IPPROTO_TCP, Dir: dirDNAT, Sport: maps.Port(80), Dport: maps.Port(50000),
		Saddr: maps.Addr16(net.ParseIP("10.0.0.3")), Daddr: maps.Addr16(remote)}
	require.NoError(t, tb.nat.Put(&dnat, &maps.CniNatEntry{Addr: maps.Addr16(node), Port: maps.Port(8080), State: StateEstablished, Created: now, LastSeen: now}))

	live := func(ip net.IP) bool { return ip.Equal(net.ParseIP("10.0.0.2")) }
	want := []string{
		"nat flow tcp 10.0.0.2:40001 -> 198.51.100.7:80 as 192.0.2.2:40001 (expired)",
		"nat flow tcp 10.0.0.3:40002 -> 198.51.100.7:80 as 192.0.2.2:61000 (pod gone)",
		"nat reply entry tcp 198.51.100.7:80 -> 192.0.2.2:40003 for pod 10.0.0.2:40003 (its flow is gone)",
		"nat hostPort flow tcp 198.51.100.7:50000 -> 192.0.2.2:8080 -> pod 10.0.0.3:80 (pod gone)",
	}
	count := func() int {
		es, err := tb.entries()
		require.NoError(t, err)
		return len(es)
	}
	require.Equal(t, 8, count())
	dry, err := tb.GC(live, true)
	require.NoError(t, err)
	require.ElementsMatch(t, want, dry)
	require.Equal(t, 8, count(), "a dry run removed entries")
	done, err := tb.GC(live, false)
	require.NoError(t, err)
	require.ElementsMatch(t, want, done, "a real run removes what the dry run listed")
	require.Equal(t, 2, count(), "both entries of the live flow stay")
	again, err := tb.GC(live, true)
	require.NoError(t, err)
	require.Empty(t, again)
}

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
