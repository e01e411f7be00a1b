package k8s_test

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
	"github.com/ebpf-cni/ebpf-cni/pkg/flows"
)

// probeTable counts, in the node's netfilter, the packets pod a sends to
// the world that meet it at all (prerouting, before anything else).
const probeTable = "ebpfcni_probe"

func installProbe(t *testing.T, n *node, a *nettest.Pod) {
	t.Helper()
	rules := fmt.Sprintf(`table inet %s {
	chain pre {
		type filter hook prerouting priority -450; policy accept;
		ip saddr %s ip daddr %s counter
		ip6 saddr %s ip6 daddr %s counter
	}
}
`, probeTable, a.IP(4), world(4), a.IP(6), world(6))
	require.NoError(t, n.NS.Do(func(ns.NetNS) error {
		cmd := exec.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(rules)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("nft -f: %w: %s", err, out)
		}
		return nil
	}))
}

var probeCounter = regexp.MustCompile(`ip6? saddr \S+ ip6? daddr (\S+) counter packets (\d+)`)

// probed is how many packets of pod a to the world of family fam met the
// node's netfilter so far.
func probed(t *testing.T, n *node, fam int) int {
	t.Helper()
	out, err := nettest.Run(n.NS, "nft", "list", "table", "inet", probeTable)
	require.NoError(t, err, out)
	for _, m := range probeCounter.FindAllStringSubmatch(out, -1) {
		if m[1] == world(fam).String() {
			c, err := strconv.Atoi(m[2])
			require.NoError(t, err)
			return c
		}
	}
	t.Fatalf("no counter for %s in:\n%s", world(fam), out)
	return 0
}

// worldFlows are the flows of pod a to the world's port: how many, how
// many of them were set up in BPF, and how many of those keep their
// verdict in their NAT entry (masqueraded TCP: table "nat").
func worldFlows(n *node, a *nettest.Pod, port int) (all, bypass, inNAT int) {
	for _, f := range n.flows() {
		if f.RemotePort == uint16(port) && (f.Pod == a.IP(4).String() || f.Pod == a.IP(6).String()) {
			all++
			if f.Bypass {
				bypass++
				if f.Verdict != "fast" {
					panic(fmt.Sprintf("a bypass flow is %s", f.Verdict))
				}
			}
			if f.Table == "nat" {
				inNAT++
				if f.Proto != "tcp" || !f.Bypass {
					panic(fmt.Sprintf("a %s flow in the NAT table, bypass %v", f.Proto, f.Bypass))
				}
			}
		}
	}
	return all, bypass, inNAT
}

// TestBypass is the must-hold case of the translated destinations
// (bpf/lib/xlat.h), on a node with kube-proxy's iptables rules and
// masquerade, IPv4 and IPv6, TCP and UDP:
//   - never written (no agent): a pod's first packets to the world meet
//     the node's netfilter, as before;
//   - written by the agent's code (agent.XlatSet of the Services and the
//     Node, XlatController.Sync) and leased: a pod's flows to the world
//     are set up in BPF, not one of their packets meets netfilter (a
//     counter in prerouting), the world sees the node's address and the
//     replies come back; a ClusterIP, in the set, is still DNATed by
//     kube-proxy's rules to its backend and its flow goes through the
//     stack; nothing meets kube-proxy's INVALID drop;
//   - the lease over: the world's flows meet netfilter again, the
//     ClusterIP still works;
//   - leased again, the world not masqueraded: still set up in BPF, the
//     world sees the pod's own address.
func TestBypass(t *testing.T) {
	c := newCluster(t, 1, false)
	n1 := c.nodes[0]
	l1 := n1.list("1.1.0", nil)
	a, b1 := n1.addPod(l1, "a"), n1.addPod(l1, "b1")
	serve(t, b1.NS, "b1", backendPort)
	var svcs []*corev1.Service
	var nodes []*corev1.Node
	for _, fam := range []int{4, 6} {
		k := kubeProxy(n1, fam, b1, b1, b1)
		require.NoError(t, k.Install(n1.NS, nettest.ModeIPTables))
		s, ns := k.APIObjects(n1.Name)
		svcs, nodes = append(svcs, s...), append(nodes, ns...)
	}
	installProbe(t, n1, a)
	handle := nodetest.Handle(t, n1.bpfRoot, n1.stateDir)
	set := agent.XlatSet(svcs, nodes, []netip.Prefix{netip.MustParsePrefix(serviceCIDR4.String()), netip.MustParsePrefix(serviceCIDR6.String())})
	for _, ip := range []net.IP{webIP4, webIP6, extIP4, extIP6, n1.IP4, n1.IP6} {
		require.True(t, set.Contains(ip), "%s in the set:\n%s", ip, set)
	}
	require.False(t, set.Contains(world(4)) || set.Contains(world(6)), "the world is not in the set:\n%s", set)

	// phase asks the world (a server of its own, so that the phase's flows
	// are told apart) and the ClusterIP from pod a, and returns how many
	// of a's packets to the world met netfilter meanwhile, per family.
	phase := func(name string) map[int]int {
		srv := serve(t, c.c.World, "world-"+name, 0)
		met := map[int]int{}
		for _, fam := range []int{4, 6} {
			before := probed(t, n1, fam)
			mustSee(t, a.NS, world(fam), srv.Port, "world-"+name, n1.Addr(fam), fmt.Sprintf("%s: the pod to the world, IPv%d (masqueraded, replies back)", name, fam))
			met[fam] = probed(t, n1, fam) - before
			mustSee(t, a.NS, pick(fam, webIP4, webIP6), servicePort, "b1", a.IP(fam), fmt.Sprintf("%s: the pod to the ClusterIP, IPv%d (kube-proxy's DNAT)", name, fam))
		}
		all, bypass, inNAT := worldFlows(n1, a, srv.Port)
		require.Equal(t, 4, all, "%s: the flows to the world (TCP and UDP, IPv4 and IPv6)", name)
		if name == "leased" {
			require.Equal(t, 4, bypass, "%s: set up in BPF", name)
			require.Equal(t, 2, inNAT, "%s: the TCP flows' verdicts are in their NAT entries (to_netdev saw their SYNs marked)", name)
		} else {
			require.Zero(t, bypass, "%s: none set up in BPF", name)
			require.Zero(t, inNAT, name)
		}
		for _, f := range n1.flows() {
			if f.Remote == webIP4.String() || f.Remote == webIP6.String() {
				require.Equal(t, "stack", f.Verdict, "%s: a flow kube-proxy translated goes through the stack", name)
				require.False(t, f.Bypass, name)
			}
		}
		return met
	}

	met := phase("never-written")
	require.Positive(t, met[4], "no lease: the first packets meet netfilter (IPv4)")
	require.Positive(t, met[6], "no lease: the first packets meet netfilter (IPv6)")

	xc := agent.NewXlatController(nil, agent.XlatConfig{Node: handle, Lease: time.Hour})
	require.NoError(t, xc.Sync(set))
	met = phase("leased")
	require.Zero(t, met[4], "leased: no packet of the world's IPv4 flows meets netfilter")
	require.Zero(t, met[6], "leased: no packet of the world's IPv6 flows meets netfilter")

	tr, err := flows.OpenTranslated(handle)
	require.NoError(t, err)
	require.NoError(t, tr.Expire())
	met = phase("expired")
	require.Positive(t, met[4], "the lease over: the first packets meet netfilter again (IPv4)")
	require.Positive(t, met[6], "the lease over: the first packets meet netfilter again (IPv6)")

	// Not masqueraded (the world in the network's nonMasqueradeCIDRs, the
	// router routing the node's pod ranges back): a TCP flow set up in BPF
	// has no NAT entry to keep its verdict, to_netdev writes it in flows.
	require.NoError(t, c.c.RouteFromRouter(n1.ClusterNode))
	n1.addPod(n1.list("1.1.0", map[string]any{"nonMasqueradeCIDRs": []string{world(4).String() + "/32", world(6).String() + "/128"}}), "c")
	require.NoError(t, xc.Sync(set))
	direct := serve(t, c.c.World, "world-direct", 0)
	for _, fam := range []int{4, 6} {
		before := probed(t, n1, fam)
		mustSee(t, a.NS, world(fam), direct.Port, "world-direct", a.IP(fam), fmt.Sprintf("unmasqueraded: the pod to the world, IPv%d", fam))
		require.Zero(t, probed(t, n1, fam)-before, "unmasqueraded, leased: no packet meets netfilter (IPv%d)", fam)
	}
	all, bypass, inNAT := worldFlows(n1, a, direct.Port)
	require.Equal(t, 4, all, "unmasqueraded: the flows to the world")
	require.Equal(t, 4, bypass, "unmasqueraded: set up in BPF")
	require.Zero(t, inNAT, "unmasqueraded: every verdict in flows (to_netdev wrote the TCP ones)")

	for _, tool := range []string{"iptables", "ip6tables"} {
		out, err := nettest.Run(n1.NS, tool, "-t", "filter", "-L", "KUBE-FORWARD", "-v", "-x", "-n")
		require.NoError(t, err, out)
		require.Equal(t, "0", invalidDrops(out), "%s: packets dropped as INVALID:\n%s", tool, out)
	}
}
