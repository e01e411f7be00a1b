package datapath_test

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/conflisttest"
	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// rangeRoutes lists the node's unreachable routes of pod ranges.
func (e *env) rangeRoutes() []string {
	e.t.Helper()
	var out []string
	require.NoError(e.t, e.node.NS.Do(func(ns.NetNS) error {
		rs, err := veth.RangeRoutes()
		for _, r := range rs {
			out = append(out, r.String())
		}
		return err
	}))
	return out
}

// snmp reads one counter of /proc/net/snmp (IPv4, "Ip:" lines) or
// /proc/net/snmp6 (name starting with "Ip6") in netns n.
func snmp(t testing.TB, n ns.NetNS, name string) int {
	t.Helper()
	if strings.HasPrefix(name, "Ip6") {
		out, err := nettest.Run(n, "cat", "/proc/net/snmp6")
		require.NoError(t, err)
		for _, l := range strings.Split(out, "\n") {
			if f := strings.Fields(l); len(f) == 2 && f[0] == name {
				v, err := strconv.Atoi(f[1])
				require.NoError(t, err)
				return v
			}
		}
		t.Fatalf("no %s in /proc/net/snmp6", name)
	}
	out, err := nettest.Run(n, "cat", "/proc/net/snmp")
	require.NoError(t, err)
	sc := bufio.NewScanner(strings.NewReader(out))
	var names []string
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != "Ip:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, x := range names {
			if x == name {
				v, err := strconv.Atoi(f[i])
				require.NoError(t, err)
				return v
			}
		}
	}
	t.Fatalf("no %s in /proc/net/snmp", name)
	return 0
}

// forwardCounter counts, in the router's FORWARD path, the packets to dst:
// how often a packet for dst crossed the router, so the node's uplink.
type forwardCounter struct {
	t      *testing.T
	router ns.NetNS
}

func newForwardCounter(t *testing.T, router ns.NetNS, dsts ...net.IP) *forwardCounter {
	t.Helper()
	rules := "add table inet rangetest\nadd chain inet rangetest counts { type filter hook forward priority 0; policy accept; }\n"
	for _, d := range dsts {
		fam := "ip"
		if d.To4() == nil {
			fam = "ip6"
		}
		rules += fmt.Sprintf("add rule inet rangetest counts %s daddr %s counter comment \"%s\"\n", fam, d, d)
	}
	_, err := nettest.Run(router, "sh", "-c", "nft -f - <<'EOF'\n"+rules+"EOF")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = nettest.Run(router, "nft", "delete", "table", "inet", "rangetest") })
	return &forwardCounter{t: t, router: router}
}

// packets is how many packets to dst the router forwarded.
func (c *forwardCounter) packets(dst net.IP) int {
	c.t.Helper()
	out, err := nettest.Run(c.router, "nft", "list", "chain", "inet", "rangetest", "counts")
	require.NoError(c.t, err)
	for _, l := range strings.Split(out, "\n") {
		if !strings.Contains(l, "daddr "+dst.String()+" ") {
			continue
		}
		f := strings.Fields(l)
		for i := range f {
			if f[i] == "packets" && i+1 < len(f) {
				v, err := strconv.Atoi(f[i+1])
				require.NoError(c.t, err)
				return v
			}
		}
	}
	c.t.Fatalf("no counter for %s in\n%s", dst, out)
	return 0
}

// TestFreePodAddress is the must-hold case of the pod ranges' unreachable
// routes: with a router in front of the node that routes the node's pod
// ranges to it, one packet to a pod address no pod holds is answered by
// the node (ICMP unreachable) and crosses the uplink once, instead of
// going back out of the uplink and ping-ponging with the router until its
// TTL runs out; IPv4 and IPv6, with and without masquerade (uplink
// programs). A pod that pings a free address of its own range gets the
// same answer, and nothing leaves the node. The routes come with the
// range's first pod and go with its last; GC removes one no pod accounts
// for.
func TestFreePodAddress(t *testing.T) {
	for _, masq := range []bool{false, true} {
		t.Run(fmt.Sprintf("ipMasq=%v", masq), func(t *testing.T) {
			e := newEnv(t)
			list := e.confList(netOpts{extra: map[string]any{"ipMasq": masq}})
			require.Empty(t, e.rangeRoutes())

			// The world routes to a host beyond it and to the node's pod
			// ranges through the node: a router in front of the node.
			far4, far6 := net.ParseIP("203.0.113.2"), net.ParseIP("2001:db8:fa::2")
			far := farHost(t, e.node.World, far4, far6)
			for _, r := range conflisttest.DefaultSubnets {
				via := nettest.NodeIP4
				if strings.Contains(r, ":") {
					via = nettest.NodeIP6
				}
				_, err := nettest.Run(e.node.World, "ip", "route", "add", r, "via", via.String())
				require.NoError(t, err)
			}

			a := e.addPod(list, "range-a")
			b := e.addPod(list, "range-b")
			require.ElementsMatch(t, conflisttest.DefaultSubnets, e.rangeRoutes(), "one unreachable route per pod range")
			out, err := nettest.Run(e.node.NS, "ip", "-4", "route", "show", "proto", "237")
			require.NoError(t, err)
			require.Contains(t, out, "unreachable "+conflisttest.DefaultSubnets[0])

			// Pods still reach each other and are reached from beyond the
			// router: their host routes are more specific.
			mustConnect(t, []*nettest.Pod{a, b})
			for _, fam := range []int{4, 6} {
				require.NoError(t, nettest.TCP(far, a.NS, a.IP(fam)), "far host -> pod %s", a.IP(fam))
				o, err := nettest.Ping(far, a.IP(fam), 1)
				require.NoError(t, err, "far host pings pod %s (its reply keeps the pod's address): %s", a.IP(fam), o)
			}

			free4, free6 := net.ParseIP("10.244.1.200"), net.ParseIP("fd00:244:1::c8")
			fc := newForwardCounter(t, e.node.World, free4, free6)
			for _, c := range []struct {
				free, node net.IP
				fwd        string
			}{{free4, nettest.NodeIP4, "ForwDatagrams"}, {free6, nettest.NodeIP6, "Ip6OutForwDatagrams"}} {
				nodeFwd := snmp(t, e.node.NS, c.fwd)
				out, err := nettest.Run(far, "ping", "-n", "-c", "1", "-W", "2", c.free.String())
				require.Error(t, err, "a free pod address answered: %s", out)
				require.Contains(t, out, "From "+c.node.String(), "the node answers for the free address %s", c.free)
				require.Contains(t, strings.ToLower(out), "unreachable")
				require.Equal(t, 1, fc.packets(c.free), "the packet to %s crossed the router (and the uplink) more than once", c.free)
				require.Equal(t, nodeFwd, snmp(t, e.node.NS, c.fwd), "the node forwarded the packet to %s", c.free)

				// From a pod: answered on the node, never out of the uplink.
				out, err = nettest.Run(a.NS, "ping", "-n", "-c", "1", "-W", "2", c.free.String())
				require.Error(t, err, "a free pod address answered: %s", out)
				require.Contains(t, strings.ToLower(out), "unreachable")
				require.Equal(t, 1, fc.packets(c.free), "a pod's packet to %s left the node", c.free)
			}

			// GC: a range route no pod accounts for goes, a live one stays.
			_, err = nettest.Run(e.node.NS, "ip", "route", "add", "unreachable", "10.99.0.0/24", "proto", "237")
			require.NoError(t, err)
			require.NoError(t, e.cni.GC(list, []types.GCAttachment{{ContainerID: "range-a", IfName: "eth0"}, {ContainerID: "range-b", IfName: "eth0"}}))
			require.ElementsMatch(t, conflisttest.DefaultSubnets, e.rangeRoutes())

			// The first DEL leaves the routes (b is in the ranges), the last
			// takes them.
			require.NoError(t, e.cni.DelPod(list, a))
			require.ElementsMatch(t, conflisttest.DefaultSubnets, e.rangeRoutes())
			require.NoError(t, e.cni.DelPod(list, b))
			require.Empty(t, e.rangeRoutes(), "the last pod of the ranges took their routes")
			e.requireClean()
		})
	}
}

// TestRangeRoutesPerRange: pods of two networks on one node; the routes of
// a network's ranges go with the network's last pod while the other's
// stay; an ADD that fails after its routes were made takes them back; a
// route made for the same prefix by someone else is left alone.
func TestRangeRoutesPerRange(t *testing.T) {
	e := newEnv(t)
	first := e.confList(netOpts{})
	second := e.confList(netOpts{name: "second", ipam: map[string]any{"type": "ebpf-ipam",
		"ranges": []any{[]any{map[string]any{"subnet": "10.246.0.0/24"}}, []any{map[string]any{"subnet": "fd00:246::/64"}}}}})
	a := e.addPod(first, "net1")
	b := e.addPod(second, "net2")
	all := append([]string{"10.246.0.0/24", "fd00:246::/64"}, conflisttest.DefaultSubnets...)
	require.ElementsMatch(t, all, e.rangeRoutes())
	require.NoError(t, e.cni.DelPod(second, b))
	require.ElementsMatch(t, conflisttest.DefaultSubnets, e.rangeRoutes(), "the second network's ranges go with its last pod")

	// An ADD on a range of its own that fails after the veth and its
	// routes were made (masquerade's uplink is looked up in its Add).
	third := e.confList(netOpts{name: "third", ipam: map[string]any{"type": "ebpf-ipam",
		"ranges": []any{[]any{map[string]any{"subnet": "10.247.0.0/24"}}}}, extra: map[string]any{"uplinks": []string{"nosuchdev0"}, "ipMasq": true}})
	_, err := e.cni.AddPod(third, "net3", nil)
	require.Error(t, err)
	require.Contains(t, err.Error(), "uplinks[0]")
	require.ElementsMatch(t, conflisttest.DefaultSubnets, e.rangeRoutes(), "a failed ADD left a range route")

	// Someone else's route for a pod range is not ours to take.
	_, err = nettest.Run(e.node.NS, "ip", "route", "add", "blackhole", "10.246.0.0/24")
	require.NoError(t, err)
	b = e.addPod(second, "net2-again")
	require.NoError(t, e.cni.DelPod(second, b))
	out, err := nettest.Run(e.node.NS, "ip", "route", "show", "10.246.0.0/24")
	require.NoError(t, err)
	require.Contains(t, out, "blackhole 10.246.0.0/24", "the node's own route for the range is kept")
	require.NoError(t, e.cni.DelPod(first, a))
	require.Empty(t, e.rangeRoutes())
}
