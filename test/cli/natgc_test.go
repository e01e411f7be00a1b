package cli_test

import (
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/conflisttest"
	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
	"github.com/ebpf-cni/ebpf-cni/pkg/conntrack"
	"github.com/ebpf-cni/ebpf-cni/pkg/flows"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// natFlowsOf counts the NAT table's flows of pod ip.
func (e *env) natFlowsOf(ip net.IP) int {
	e.t.Helper()
	n := e.handle()
	defer n.Close()
	t, err := conntrack.Open(n)
	require.NoError(e.t, err)
	fs, err := t.Flows()
	require.NoError(e.t, err)
	return countOf(fs, ip, func(f conntrack.Flow) net.IP { return f.Pod })
}

// flowsOf counts the flow table's entries of pod ip.
func (e *env) flowsOf(ip net.IP) int {
	e.t.Helper()
	nd := e.handle()
	defer nd.Close()
	t, err := flows.Open(nd)
	require.NoError(e.t, err)
	fs, err := t.List()
	require.NoError(e.t, err)
	return countOf(fs, ip, func(f flows.Flow) net.IP { return f.Pod })
}

// countOf counts the items of l whose pod is ip.
func countOf[T any](l []T, ip net.IP, pod func(T) net.IP) int {
	n := 0
	for _, x := range l {
		if pod(x).Equal(ip) {
			n++
		}
	}
	return n
}

// killPod removes a pod's netns without a DEL (a runtime that lost it) and
// waits for its host veth to go with it.
func (e *env) killPod(p *nettest.Pod) {
	e.t.Helper()
	veth := p.Result.Interfaces[0].Name
	nettest.CloseNetNS(p.NS)
	eventually(e.t, "the dead pod's veth to go", func() bool {
		var gone bool
		_ = e.node.NS.Do(func(ns.NetNS) error {
			_, err := netlink.LinkByName(veth)
			gone = err != nil
			return nil
		})
		return gone
	})
}

// linesWith are the lines of ls that contain every one of subs.
func linesWith(ls []string, subs ...string) []string {
	var out []string
next:
	for _, l := range ls {
		for _, s := range subs {
			if !strings.Contains(l, s) {
				continue next
			}
		}
		out = append(out, l)
	}
	return out
}

// TestGCNATFlows: the masqueraded flows (and Services flow-table entries)
// of a pod whose netns went away without a DEL are leftovers `gc --dry-run`
// lists, one line each, without removing them; `gc` removes them and lists
// the same lines; the flows of the pod that stays are kept.
func TestGCNATFlows(t *testing.T) {
	e := newEnv(t)
	list := conflisttest.List(t, conflisttest.Options{Name: "clinet", BPFRoot: e.bpfRoot, StateDir: e.stateDir, Keys: map[string]any{"ipMasq": true}})
	keep := e.addPod(list, "keep")
	dead := e.addPod(list, "dead")
	srv, err := nettest.ServeWho(e.node.World, "world", 0)
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	to := net.JoinHostPort(nettest.WorldIP4.String(), strconv.Itoa(srv.Port))
	for _, p := range []*nettest.Pod{keep, dead} {
		w, err := nettest.AskWhoUDP(p.NS, to)
		require.NoError(t, err)
		require.True(t, w.SeenIP().Equal(nettest.NodeIP4), "masqueraded: %s", w.Seen)
		_, err = nettest.AskWho(p.NS, to, 0)
		require.NoError(t, err)
	}
	deadIP := dead.IP(4)
	require.Equal(t, 2, e.natFlowsOf(deadIP), "the dead pod's UDP and TCP flows")
	require.Equal(t, 2, e.natFlowsOf(keep.IP(4)))
	deadFlows := e.flowsOf(deadIP)

	e.killPod(dead)

	var dry gcJSON
	e.json(&dry, cli.ExitOK, "gc", "--dry-run")
	require.Len(t, dry.Endpoints, 1)
	natLines := linesWith(dry.Leftovers, "nat flow", deadIP.String()+":", "(pod gone)")
	require.Len(t, natLines, 2, "one line per NAT flow of the dead pod: %q", dry.Leftovers)
	require.Len(t, linesWith(dry.Leftovers, "flows ", deadIP.String()+":"), deadFlows, "the dead pod's flow-table entries: %q", dry.Leftovers)
	require.Empty(t, linesWith(dry.Leftovers, keep.IP(4).String()+":"), "the live pod's flows are no leftovers")
	require.Equal(t, 2, e.natFlowsOf(deadIP), "the dry run removed NAT flows")
	require.Equal(t, deadFlows, e.flowsOf(deadIP), "the dry run removed flow-table entries")

	// gc removes them with the dead endpoint (as DEL would).
	var done gcJSON
	e.json(&done, cli.ExitOK, "gc")
	require.Len(t, done.Endpoints, 1)
	require.Zero(t, e.natFlowsOf(deadIP))
	require.Zero(t, e.flowsOf(deadIP))
	require.Equal(t, 2, e.natFlowsOf(keep.IP(4)), "the live pod's flows stay")
	var again gcJSON
	e.json(&again, cli.ExitOK, "gc", "--dry-run")
	require.Empty(t, linesWith(again.Leftovers, deadIP.String()+":"))

	// A flow no endpoint accounts for at all (its pod was deleted while
	// the packet that made it was in flight): listed by the dry run, then
	// removed and listed by gc.
	gone := net.ParseIP("10.244.1.99").To4()
	m, err := maps.OpenPinned(e.bpfRoot, maps.CniMapNat)
	require.NoError(t, err)
	defer m[maps.CniMapNat].Close()
	out := maps.CniNatKey{Family: 4, Proto: unix.IPPROTO_UDP, Dir: uint8(maps.CniNatDirNAT_DIR_OUT), Sport: maps.Port(5353), Dport: maps.Port(53),
		Saddr: maps.Addr16(gone), Daddr: maps.Addr16(nettest.WorldIP4)}
	now := maps.Monotonic()
	require.NoError(t, m[maps.CniMapNat].Put(&out, &maps.CniNatEntry{Addr: maps.Addr16(nettest.NodeIP4), Port: maps.Port(5353),
		State: conntrack.StateOpen, Created: now, LastSeen: now}))
	want := "nat flow udp 10.244.1.99:5353 -> 192.0.2.1:53 as 192.0.2.2:5353 (pod gone)"
	e.json(&dry, cli.ExitOK, "gc", "--dry-run")
	require.Contains(t, dry.Leftovers, want)
	require.Equal(t, 1, e.natFlowsOf(gone), "the dry run removed the flow")
	e.json(&done, cli.ExitOK, "gc")
	require.Contains(t, done.Leftovers, want, "gc lists what it removed")
	require.Zero(t, e.natFlowsOf(gone))
	require.Equal(t, 2, e.natFlowsOf(keep.IP(4)), "the live pod's flows stay")
}
