package podflush_test

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/podflush"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// setup loads the programs into a private bpffs, which pins the tables.
func setup(t *testing.T) (n *node.Node, nat, flows *ebpf.Map) {
	testutil.RequireRoot(t)
	n, err := node.Open(node.Options{BPFRoot: testutil.BPFFS(t), StateDir: t.TempDir(), Objects: podflush.Objects(), Lock: node.Unlocked})
	require.NoError(t, err)
	t.Cleanup(n.Close)
	_, err = n.Programs()
	require.NoError(t, err)
	nat, err = n.PinnedMap(maps.CniMapNat)
	require.NoError(t, err)
	flows, err = n.PinnedMap(maps.CniMapFlows)
	require.NoError(t, err)
	require.NotNil(t, nat)
	require.NotNil(t, flows)
	return n, nat, flows
}

var (
	podA4, podA6 = net.ParseIP("10.0.0.2"), net.ParseIP("fd00::2")
	podB         = net.ParseIP("10.0.0.3")
	nodeIP       = net.ParseIP("192.0.2.1")
)

// filler is the address of the i-th other pod.
func filler(i int) net.IP { return net.IPv4(10, 1, byte(i>>8), byte(i)) }

// natPort is the node's port of the last flow putFlow wrote: one of its
// own for every flow, so that no IN entry replaces another.
var natPort uint16 = 1024

// putFlow writes a masqueraded flow of pod (its OUT and IN entries) and a
// flow to one of its hostPorts (DNAT), numbered i.
func putFlow(t *testing.T, nat *ebpf.Map, pod net.IP, i int) {
	t.Helper()
	natPort++
	remote := net.ParseIP("2001:db8::7")
	self := net.ParseIP("2001:db8::1")
	if pod.To4() != nil {
		remote, self = net.ParseIP("198.51.100.7"), nodeIP
	}
	f := maps.Family(pod)
	port := maps.Port(uint16(1024 + i%60000))
	np := maps.Port(natPort)
	out := maps.CniNatKey{Family: f, Proto: 6, Dir: uint8(maps.CniNatDirNAT_DIR_OUT), Sport: port, Dport: maps.Port(443), Saddr: maps.Addr16(pod), Daddr: maps.Addr16(remote)}
	in := maps.CniNatKey{Family: f, Proto: 6, Dir: uint8(maps.CniNatDirNAT_DIR_IN), Sport: maps.Port(443), Dport: np, Saddr: maps.Addr16(remote), Daddr: maps.Addr16(self)}
	dnat := maps.CniNatKey{Family: f, Proto: 6, Dir: uint8(maps.CniNatDirNAT_DIR_DNAT), Sport: maps.Port(8080), Dport: port, Saddr: maps.Addr16(pod), Daddr: maps.Addr16(remote)}
	require.NoError(t, nat.Put(&out, &maps.CniNatEntry{Addr: maps.Addr16(self), Port: np}))
	require.NoError(t, nat.Put(&in, &maps.CniNatEntry{Addr: maps.Addr16(pod), Port: port}))
	require.NoError(t, nat.Put(&dnat, &maps.CniNatEntry{Addr: maps.Addr16(self), Port: maps.Port(80)}))
}

// natLeft counts the entries of nat by pod address and direction.
func natLeft(t *testing.T, nat *ebpf.Map) map[string]map[uint8]int {
	t.Helper()
	es, err := maps.Entries[maps.CniNatKey, maps.CniNatEntry](nat)
	require.NoError(t, err)
	out := map[string]map[uint8]int{}
	for _, e := range es {
		pod := maps.IP(e.Key.Family, e.Key.Saddr)
		if e.Key.Dir == uint8(maps.CniNatDirNAT_DIR_IN) {
			pod = maps.IP(e.Key.Family, e.Value.Addr)
		}
		if out[pod.String()] == nil {
			out[pod.String()] = map[uint8]int{}
		}
		out[pod.String()][e.Key.Dir]++
	}
	return out
}

func noWalk(t *testing.T) func() (int, error) {
	return func() (int, error) { t.Fatal("walked the table instead of running the program"); return 0, nil }
}

// The program deletes exactly the listed pods' entries of the listed
// directions, among thousands of others.
func TestFlushNAT(t *testing.T) {
	n, nat, _ := setup(t)
	const others = 5000
	for i := range others {
		putFlow(t, nat, filler(i), i)
	}
	for i := range 7 {
		putFlow(t, nat, podA4, i)
		putFlow(t, nat, podA6, i)
		putFlow(t, nat, podB, i)
	}
	masq := maps.CniFlushTablesFLUSH_NAT_OUT | maps.CniFlushTablesFLUSH_NAT_IN
	got, err := podflush.Flush(n, podflush.NAT, []podflush.Pod{{IP: podA4, Tables: masq}, {IP: podA6, Tables: masq}}, noWalk(t))
	require.NoError(t, err)
	require.Equal(t, 28, got, "7 OUT and 7 IN entries of each address")
	left := natLeft(t, nat)
	out, in, dnat := uint8(maps.CniNatDirNAT_DIR_OUT), uint8(maps.CniNatDirNAT_DIR_IN), uint8(maps.CniNatDirNAT_DIR_DNAT)
	require.Equal(t, map[uint8]int{dnat: 7}, left[podA4.String()], "the hostPort flows stay")
	require.Equal(t, map[uint8]int{dnat: 7}, left[podA6.String()])
	require.Equal(t, map[uint8]int{out: 7, in: 7, dnat: 7}, left[podB.String()])
	require.Len(t, left, others+3)
	for i := range others {
		require.Equal(t, map[uint8]int{out: 1, in: 1, dnat: 1}, left[filler(i).String()])
	}

	got, err = podflush.Flush(n, podflush.NAT, []podflush.Pod{{IP: podA4, Tables: maps.CniFlushTablesFLUSH_NAT_DNAT}}, noWalk(t))
	require.NoError(t, err)
	require.Equal(t, 7, got)
	left = natLeft(t, nat)
	require.NotContains(t, left, podA4.String())
	require.Equal(t, map[uint8]int{dnat: 7}, left[podA6.String()])

}

func TestFlushFlows(t *testing.T) {
	n, _, flows := setup(t)
	put := func(pod net.IP, port int) {
		remote := net.ParseIP("198.51.100.7")
		if pod.To4() == nil {
			remote = net.ParseIP("2001:db8::7")
		}
		k := maps.CniFlowKey{Family: maps.Family(pod), Proto: 6, Sport: maps.Port(uint16(port)), Dport: maps.Port(80), Saddr: maps.Addr16(pod), Daddr: maps.Addr16(remote)}
		require.NoError(t, flows.Put(&k, &maps.CniFlowEntry{Verdict: maps.CniFlowVerdictFLOW_FAST, LastSeen: maps.Monotonic()}))
	}
	for i := range 3000 {
		put(filler(i), 1024+i)
	}
	for i := range 5 {
		put(podA4, 2000+i)
		put(podA6, 2000+i)
		put(podB, 2000+i)
	}
	got, err := podflush.Flush(n, podflush.Flows, []podflush.Pod{
		{IP: podA4, Tables: maps.CniFlushTablesFLUSH_FLOWS},
		{IP: podA6, Tables: maps.CniFlushTablesFLUSH_FLOWS},
		{IP: podB, Tables: maps.CniFlushTablesFLUSH_NAT_OUT}, // not this table
	}, noWalk(t))
	require.NoError(t, err)
	require.Equal(t, 10, got)
	es, err := maps.Entries[maps.CniFlowKey, maps.CniFlowEntry](flows)
	require.NoError(t, err)
	require.Len(t, es, 3005)
	for _, e := range es {
		pod := maps.IP(e.Key.Family, e.Key.Saddr)
		require.False(t, pod.Equal(podA4) || pod.Equal(podA6), "%s's flow is left", pod)
	}
}

// More addresses than one run takes go in several runs; an address asked
// for twice is flushed from every table asked for.
func TestFlushMany(t *testing.T) {
	n, nat, _ := setup(t)
	var pods []podflush.Pod
	for i := range 20 {
		putFlow(t, nat, filler(i), i)
		pods = append(pods, podflush.Pod{IP: filler(i), Tables: maps.CniFlushTablesFLUSH_NAT_OUT})
		pods = append(pods, podflush.Pod{IP: filler(i), Tables: maps.CniFlushTablesFLUSH_NAT_IN})
	}
	putFlow(t, nat, podB, 1)
	got, err := podflush.Flush(n, podflush.NAT, pods, noWalk(t))
	require.NoError(t, err)
	require.Equal(t, 40, got)
	left := natLeft(t, nat)
	require.Len(t, left, 21)
	for i := range 20 {
		require.Equal(t, map[uint8]int{uint8(maps.CniNatDirNAT_DIR_DNAT): 1}, left[filler(i).String()])
	}
	require.Len(t, left[podB.String()], 3)
}

// Where the program cannot run (programs of another build, which lack it;
// something else pinned in its place) the caller's walk does the flush.
func TestFlushWalks(t *testing.T) {
	n, nat, _ := setup(t)
	putFlow(t, nat, podA4, 1)
	walked := 0
	walk := func() (int, error) { walked++; return 42, nil }
	pods := []podflush.Pod{{IP: podA4, Tables: 0xf}}
	require.NoError(t, os.Remove(filepath.Join(programs.Dir(n.BPFRoot()), n.Tag(), podflush.NAT)))
	got, err := podflush.Flush(n, podflush.NAT, pods, walk)
	require.NoError(t, err)
	require.Equal(t, 42, got)
	require.Equal(t, 1, walked)
	require.Len(t, natLeft(t, nat)[podA4.String()], 3, "the walk stood in for it")

	// A pin that is no program of the set's, or a program the kernel will
	// not run so: the walk again.
	path := filepath.Join(programs.Dir(n.BPFRoot()), n.Tag(), podflush.NAT)
	require.NoError(t, nat.Pin(path))
	got, err = podflush.Flush(n, podflush.NAT, pods, walk)
	require.NoError(t, err)
	require.Equal(t, 42, got)
	require.Equal(t, 2, walked, "a map pinned where the program was")
	require.NoError(t, nat.Unpin())
	xdp, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.LoadImm(asm.R0, 0, asm.DWord), asm.Return()}})
	require.NoError(t, err)
	defer xdp.Close()
	require.NoError(t, xdp.Pin(path))
	got, err = podflush.Flush(n, podflush.NAT, pods, walk)
	require.NoError(t, err)
	require.Equal(t, 42, got)
	require.Equal(t, 3, walked, "a program that does not run without a packet")

	errWalk := errors.New("walk failed")
	_, err = podflush.Flush(n, podflush.NAT, pods, func() (int, error) { return 0, errWalk })
	require.ErrorIs(t, err, errWalk)
	got, err = podflush.Flush(n, podflush.NAT, nil, walk)
	require.NoError(t, err)
	require.Zero(t, got)
	require.Equal(t, 3, walked, "no pod, no walk")
}
