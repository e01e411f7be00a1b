package k8s_test

import (
	"fmt"
	"net"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/cluster"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	noderec "github.com/ebpf-cni/ebpf-cni/pkg/node"
)

func world(fam int) net.IP {
	if fam == 4 {
		return nettest.ClusterWorld4
	}
	return nettest.ClusterWorld6
}

// TestInbound is the must-hold case of connections opened toward a pod,
// under every spec version: with ipMasq on, an outside host with a route to
// the node's pod range, another node and the node itself connect to a pod
// (TCP and UDP, IPv4 and IPv6); the pod sees each client's own address and
// each gets its replies from the pod's address (the connection could not
// work otherwise). The pod's own connections to the world are still
// masqueraded.
func TestInbound(t *testing.T) {
	for _, v := range testutil.SpecVersions {
		t.Run(v, func(t *testing.T) {
			c := newCluster(t, 2, false)
			require.NoError(t, c.c.RouteDirect())
			n1, n2 := c.nodes[0], c.nodes[1]
			require.NoError(t, c.c.RouteFromRouter(n1.ClusterNode))
			p := n1.addPod(n1.list(v, nil), "server")
			serve(t, p.NS, "server", 8080)
			before := n1.counters()
			for _, fam := range []int{4, 6} {
				mustSee(t, c.c.World, p.IP(fam), 8080, "server", world(fam), fmt.Sprintf("the world to the pod, IPv%d", fam))
				mustSee(t, n2.NS, p.IP(fam), 8080, "server", n2.Addr(fam), fmt.Sprintf("node2 to the pod, IPv%d", fam))
				w, err := nettest.AskWho(n1.NS, hp(p.IP(fam), 8080), 0)
				require.NoError(t, err, "node1 to its pod, IPv%d", fam)
				require.False(t, p.IP(fam).Equal(w.SeenIP()))
			}
			require.Positive(t, n1.delta(before, maps.CniPktReasonREASON_ROUTED_IN), "routed in straight to the pod")
			require.Zero(t, n1.delta(before, maps.CniPktReasonREASON_SNAT), "replies of inbound connections are never masqueraded")
			inbound := 0
			for _, f := range n1.flows() {
				if f.Inbound && f.Pod == p.IP(4).String() && f.Remote == nettest.ClusterWorld4.String() {
					inbound++
					require.Equal(t, "fast", f.Verdict)
				}
			}
			require.Positive(t, inbound, "the world's connections are noted as inbound, fast path")

			// The pod's own connections to the world: masqueraded.
			srv := serve(t, c.c.World, "world", 0)
			for _, fam := range []int{4, 6} {
				mustSee(t, p.NS, world(fam), srv.Port, "world", n1.Addr(fam), fmt.Sprintf("the pod to the world, IPv%d", fam))
			}
		})
	}
}

// TestInboundHostPort: with ipMasq on, published ports keep answering from
// outside, through ebpf-cni's own hostPort and through the reference
// portmap chained after it (its DNAT is netfilter's: the pod's replies go
// back through the stack to be translated).
func TestInboundHostPort(t *testing.T) {
	cg := testutil.Cgroup(t)
	c := newCluster(t, 1, false)
	n1 := c.nodes[0]
	own := n1.list("1.1.0", map[string]any{"cgroupPath": cg, "capabilities": map[string]any{"portMappings": true}})
	pm := map[string]any{"type": "portmap", "capabilities": map[string]any{"portMappings": true}}
	chained := n1.list("1.0.0", nil, pm)
	mapping := func(host int) map[string]any {
		return map[string]any{"portMappings": []any{
			map[string]any{"hostPort": host, "containerPort": 8080, "protocol": "tcp"},
			map[string]any{"hostPort": host, "containerPort": 8080, "protocol": "udp"},
		}}
	}
	a, err := n1.cni.AddPod(own, "own", mapping(18080))
	require.NoError(t, err)
	t.Cleanup(func() { _ = n1.cni.DelPod(own, a) })
	b, err := n1.cni.AddPod(chained, "chained", mapping(19080))
	require.NoError(t, err)
	t.Cleanup(func() { _ = n1.cni.DelPod(chained, b) })
	serve(t, a.NS, "own", 8080)
	serve(t, b.NS, "chained", 8080)
	mustSee(t, c.c.World, n1.IP4, 18080, "own", world(4), "the world to ebpf-cni's hostPort")
	mustSee(t, c.c.World, n1.IP4, 19080, "chained", world(4), "the world to the chained portmap's hostPort")
	mustSee(t, c.c.World, n1.IP6, 18080, "own", world(6), "the world to ebpf-cni's hostPort, IPv6")
}

// TestClusterConfig: a bad cluster key is refused with code 7 naming it and
// leaves nothing behind; CHECK names what is missing of the cluster's
// state (the overlay's device, the ranges).
func TestClusterConfig(t *testing.T) {
	c := newCluster(t, 1, false)
	n1 := c.nodes[0]
	for key, extra := range map[string]map[string]any{
		"clusterCIDRs[1]": {"clusterCIDRs": []string{"10.244.0.0/16", "not-a-cidr"}},
		"overlay":         {"overlay": "geneve"},
		"vxlanVNI":        {"overlay": "vxlan", "vxlanVNI": 1 << 24},
	} {
		_, err := n1.cni.AddPod(n1.list("1.1.0", extra), "bad", nil)
		var te *types.Error
		require.ErrorAs(t, err, &te, key)
		require.EqualValues(t, types.ErrInvalidNetworkConfig, te.Code, te.Msg)
		require.Contains(t, te.Msg, key)
		recs, err := noderec.Records(n1.stateDir)
		require.NoError(t, err)
		require.Empty(t, recs)
	}

	list := n1.list("1.1.0", map[string]any{"overlay": "vxlan"})
	p := n1.addPod(list, "p")
	require.NoError(t, n1.cni.Check(list, p.RT))
	_, err := nettest.Run(n1.NS, "ip", "link", "del", cluster.Device)
	require.NoError(t, err)
	err = n1.cni.Check(list, p.RT)
	require.ErrorContains(t, err, "overlay device "+cluster.Device+" missing")
	// The next ADD makes it again.
	n1.addPod(list, "q")
	require.NoError(t, n1.cni.Check(list, p.RT))
}
