package conntrack

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
	n, err := node.Open(node.Options{BPFRoot: testutil.BPFFS(t), Lock: node.Unlocked})
	require.NoError(t, err)
	defer n.Close()
	tb, err := Open(n)
	require.NoError(t, err)
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
	want := map[Kind][]string{
		Masquerade: {
			"nat flow tcp 10.0.0.2:40001 -> 198.51.100.7:80 as 192.0.2.2:40001 (expired)",
			"nat flow tcp 10.0.0.3:40002 -> 198.51.100.7:80 as 192.0.2.2:61000 (pod gone)",
			"nat reply entry tcp 198.51.100.7:80 -> 192.0.2.2:40003 for pod 10.0.0.2:40003 (its flow is gone)",
		},
		HostPort: {"nat hostPort flow tcp 198.51.100.7:50000 -> 192.0.2.2:8080 -> pod 10.0.0.3:80 (pod gone)"},
	}
	count := func() int {
		es, err := tb.entries()
		require.NoError(t, err)
		return len(es)
	}
	require.Equal(t, 8, count())
	for _, k := range []Kind{Masquerade, HostPort} {
		dry, err := tb.GC(k, live, true)
		require.NoError(t, err)
		require.ElementsMatch(t, want[k], dry, "kind %d", k)
	}
	require.Equal(t, 8, count(), "a dry run removed entries")
	done, err := tb.GC(HostPort, live, false)
	require.NoError(t, err)
	require.ElementsMatch(t, want[HostPort], done, "a real run removes what the dry run listed")
	require.Equal(t, 7, count(), "hostPort's GC leaves masquerade's entries")
	done, err = tb.GC(Masquerade, live, false)
	require.NoError(t, err)
	require.ElementsMatch(t, want[Masquerade], done, "a real run removes what the dry run listed")
	require.Equal(t, 2, count(), "both entries of the live flow stay")
	for _, k := range []Kind{Masquerade, HostPort} {
		again, err := tb.GC(k, live, true)
		require.NoError(t, err)
		require.Empty(t, again)
	}
}

// TestFlushPod: each kind flushes its own entries of the pod, and together
// they leave none of it.
func TestFlushPod(t *testing.T) {
	n, tb := testTable(t)
	pod, other, remote, nodeIP := net.ParseIP("10.0.0.2"), net.ParseIP("10.0.0.3"), net.ParseIP("198.51.100.7"), net.ParseIP("192.0.2.2")
	put := udpEntries(t, tb, remote)
	for _, ip := range []net.IP{pod, other} {
		put(dirOut, ip, nodeIP)
		put(dirDNAT, ip, nodeIP)
	}
	put(dirIn, remote, pod) // the pod's reply entry: its value is the pod
	mine := func() int {
		c, err := tb.Count(func(_ uint8, p net.IP) bool { return p.Equal(pod) })
		require.NoError(t, err)
		return c
	}
	require.Equal(t, 3, mine())
	FlushPodLater(n, HostPort, []net.IP{pod})
	require.NoError(t, n.Settle())
	require.Equal(t, 2, mine(), "hostPort's flush takes its DNAT entry only")
	FlushPodLater(n, Masquerade, []net.IP{pod})
	require.NoError(t, n.Settle())
	require.Zero(t, mine(), "masquerade's takes the OUT and IN entries")
	all, err := tb.Count(func(uint8, net.IP) bool { return true })
	require.NoError(t, err)
	require.Equal(t, 2, all, "the other pod's entries stay")
}

// TestFlushPodLater: the flushes two features queue in one call are done
// at Settle, in one walk, each of its own kind: nothing before it, and
// after it the queued pods' entries of the queued kinds only.
func TestFlushPodLater(t *testing.T) {
	n, tb := testTable(t)
	masq, hp, other, remote, nodeIP := net.ParseIP("10.0.0.2"), net.ParseIP("10.0.0.3"), net.ParseIP("10.0.0.4"), net.ParseIP("198.51.100.7"), net.ParseIP("192.0.2.2")
	put := udpEntries(t, tb, remote)
	for _, ip := range []net.IP{masq, hp, other} {
		put(dirOut, ip, nodeIP)
		put(dirDNAT, ip, nodeIP)
	}
	count := func(ip net.IP, dir uint8) int {
		c, err := tb.Count(func(d uint8, p net.IP) bool { return d == dir && p.Equal(ip) })
		require.NoError(t, err)
		return c
	}
	FlushPodLater(n, Masquerade, []net.IP{masq})
	FlushPodLater(n, HostPort, []net.IP{hp})
	FlushPodLater(n, HostPort, nil) // a pod without addresses: nothing
	all, err := tb.Count(func(uint8, net.IP) bool { return true })
	require.NoError(t, err)
	require.Equal(t, 6, all, "nothing goes before Settle")
	require.NoError(t, n.Settle())
	require.Zero(t, count(masq, dirOut), "masquerade's flow of the pod that queued it")
	require.Equal(t, 1, count(masq, dirDNAT), "its hostPort flow: not queued")
	require.Zero(t, count(hp, dirDNAT), "hostPort's flow of the pod that queued it")
	require.Equal(t, 1, count(hp, dirOut), "its masqueraded flow: not queued")
	require.Equal(t, 1, count(other, dirOut))
	require.Equal(t, 1, count(other, dirDNAT))
	require.NoError(t, n.Settle(), "settled work is forgotten")
	all, err = tb.Count(func(uint8, net.IP) bool { return true })
	require.NoError(t, err)
	require.Equal(t, 4, all)
}

// testTable is a node handle on a private bpffs and its table.
func testTable(t *testing.T) (*node.Node, *Table) {
	n, err := node.Open(node.Options{BPFRoot: testutil.BPFFS(t), Lock: node.Unlocked})
	require.NoError(t, err)
	t.Cleanup(n.Close)
	tb, err := Open(n)
	require.NoError(t, err)
	return n, tb
}

// udpEntries returns a writer of open UDP entries (port 1000 to remote:53)
// of direction dir, keyed by saddr, translated to addr.
func udpEntries(t *testing.T, tb *Table, remote net.IP) func(dir uint8, saddr, addr net.IP) {
	now := maps.Monotonic()
	return func(dir uint8, saddr, addr net.IP) {
		k := maps.CniNatKey{Family: 4, Proto: unix.IPPROTO_UDP, Dir: dir, Sport: maps.Port(1000), Dport: maps.Port(53), Saddr: maps.Addr16(saddr), Daddr: maps.Addr16(remote)}
		require.NoError(t, tb.nat.Put(&k, &maps.CniNatEntry{Addr: maps.Addr16(addr), Port: maps.Port(1000), State: StateOpen, Created: now, LastSeen: now}))
	}
}
