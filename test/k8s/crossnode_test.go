package k8s_test

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/cluster"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestCrossNode is the must-hold case of pods across nodes, under every
// spec version: node1 and node2 share a segment (direct routing: each
// routes the other's pod ranges via it), node3 is behind a router (VXLAN
// overlay between node1 and node3). ipMasq is on, clusterCIDRs set. Pods
// talk both ways over TCP and UDP, IPv4 and IPv6, and each receiver sees
// the sender pod's own address; a pod still reaches the world masqueraded
// to its node's address.
func TestCrossNode(t *testing.T) {
	for _, v := range testutil.SpecVersions {
		t.Run(v, func(t *testing.T) { testCrossNode(t, v) })
	}
}

func testCrossNode(t *testing.T, version string) {
	c := newCluster(t, 2, true)
	require.NoError(t, c.c.RouteDirect())
	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	vxlan := map[string]any{"overlay": "vxlan"}
	l1, l2, l3 := n1.list(version, vxlan), n2.list(version, nil), n3.list(version, vxlan)
	n1.tunnels(4, n3)
	n3.tunnels(4, n1)
	a, b, p3 := n1.addPod(l1, "a"), n2.addPod(l2, "b"), n3.addPod(l3, "c")
	require.Equal(t, 1500-cluster.OverheadIPv4, mtu(t, a), "the overlay's overhead comes off the pod's MTU")
	require.Equal(t, 1500, mtu(t, b), "no overlay: the uplink's MTU")

	pods := map[string]*nettest.Pod{"a": a, "b": b, "c": p3}
	for name, p := range pods {
		serve(t, p.NS, name, 8080)
	}
	before1, before2, before3 := n1.counters(), n2.counters(), n3.counters()
	// What to_tunnel counts on the overlay's device: a packet with its key
	// set (from_container's) or keyed there (the stack's).
	viaDevice := func() uint64 {
		return n1.deviceCount(cluster.Device, maps.CniPktReasonREASON_REDIRECT) + n1.deviceCount(cluster.Device, maps.CniPktReasonREASON_TUNNEL_ENCAP)
	}
	keyed := viaDevice()
	for _, pair := range [][2]string{{"a", "b"}, {"b", "a"}, {"a", "c"}, {"c", "a"}} {
		from, to := pods[pair[0]], pods[pair[1]]
		for _, fam := range []int{4, 6} {
			mustSee(t, from.NS, to.IP(fam), 8080, pair[1], from.IP(fam), fmt.Sprintf("pod %s -> pod %s IPv%d", pair[0], pair[1], fam))
		}
	}
	// The exchanges' small packets are decapsulated by the uplink's program
	// (from_netdev), straight into the pod; bulk TCP arrives as GSO
	// packets, which the overlay's device decapsulates (from_tunnel).
	require.Positive(t, n1.deviceCount("uplink", maps.CniPktReasonREASON_TUNNEL_DECAP), "node3 -> node1: decapsulated on the uplink")
	decapDev := n1.deviceCount(cluster.Device, maps.CniPktReasonREASON_TUNNEL_DECAP)
	bulk(t, p3, a)
	require.Greater(t, n1.deviceCount(cluster.Device, maps.CniPktReasonREASON_TUNNEL_DECAP), decapDev, "bulk node3 -> node1: GSO packets through the overlay's device")
	// Over an IPv4 underlay from_container writes the outer headers itself
	// and sends the packet out of the uplink, bulk TCP's GSO packets
	// (the echo node1 -> node3) included: to_tunnel on the device, which
	// counts what the device transmits with a key set, saw none of them.
	require.Positive(t, n1.delta(before1, maps.CniPktReasonREASON_TUNNEL_UPLINK), "node1 -> node3 encapsulated by the program")
	require.Positive(t, n3.delta(before3, maps.CniPktReasonREASON_TUNNEL_UPLINK), "node3 -> node1 encapsulated by the program")
	require.Equal(t, keyed, viaDevice(), "node1 -> node3 not through the overlay's device")
	// The overlay over the nodes' IPv6 addresses: outer headers of the
	// other size, decapsulated on the uplink the same way. (The pods' MTU
	// is an IPv4 underlay's: lowered by hand for the larger outer header, as
	// the mtu key would for a node with an IPv6 underlay.)
	n1.tunnels(6, n3)
	n3.tunnels(6, n1)
	for _, p := range []*nettest.Pod{a, p3} {
		require.NoError(t, p.NS.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			return netlink.LinkSetMTU(l, 1500-cluster.OverheadIPv6)
		}))
	}
	decapUp := n1.deviceCount("uplink", maps.CniPktReasonREASON_TUNNEL_DECAP)
	for _, fam := range []int{4, 6} {
		mustSee(t, p3.NS, a.IP(fam), 8080, "a", p3.IP(fam), fmt.Sprintf("pod c -> pod a IPv%d, IPv6 underlay", fam))
		mustSee(t, a.NS, p3.IP(fam), 8080, "c", a.IP(fam), fmt.Sprintf("pod a -> pod c IPv%d, IPv6 underlay", fam))
	}
	require.Greater(t, n1.deviceCount("uplink", maps.CniPktReasonREASON_TUNNEL_DECAP), decapUp, "IPv6 underlay: decapsulated on the uplink")
	require.Greater(t, n1.deviceCount(cluster.Device, maps.CniPktReasonREASON_REDIRECT), keyed, "IPv6 underlay: encapsulated by the overlay's device, with the key from_container set")
	require.Zero(t, n1.deviceCount(cluster.Device, maps.CniPktReasonREASON_TUNNEL_ENCAP), "to_tunnel reads an IPv6 underlay's key, it does not set it again")
	n1.tunnels(4, n3)
	n3.tunnels(4, n1)
	require.Positive(t, n1.delta(before1, maps.CniPktReasonREASON_TUNNEL_ENCAP), "node1 -> node3 through the overlay's device (IPv6 underlay)")
	require.Positive(t, n1.delta(before1, maps.CniPktReasonREASON_TUNNEL_DECAP), "node3 -> node1 from the overlay straight in")
	require.Positive(t, n1.delta(before1, maps.CniPktReasonREASON_FIB_REDIRECT), "node1 -> node2 by the FIB")
	require.Positive(t, n2.delta(before2, maps.CniPktReasonREASON_ROUTED_IN), "node2 delivers from its uplink straight in")
	require.Zero(t, n2.delta(before2, maps.CniPktReasonREASON_SNAT), "cluster traffic is never masqueraded")

	world := serve(t, c.c.World, "world", 0)
	for _, p := range []struct {
		pod  *nettest.Pod
		node *node
	}{{a, n1}, {b, n2}, {p3, n3}} {
		for _, fam := range []int{4, 6} {
			dst := nettest.ClusterWorld4
			if fam == 6 {
				dst = nettest.ClusterWorld6
			}
			mustSee(t, p.pod.NS, dst, world.Port, "world", p.node.Addr(fam), fmt.Sprintf("%s -> world IPv%d", p.node.Name, fam))
		}
	}

	if testutil.AtLeast(version, "0.4.0") {
		require.NoError(t, n1.cni.Check(l1, a.RT))
		require.NoError(t, n2.cni.Check(l2, b.RT))
		// An empty overlay_config (a node upgraded from a build without
		// it): CHECK names it, the next ADD writes it again.
		ms, err := maps.OpenPinned(n1.bpfRoot, maps.CniMapOverlayConfig)
		require.NoError(t, err)
		require.NoError(t, ms[maps.CniMapOverlayConfig].Put(uint32(0), &maps.CniOverlaySettings{}))
		require.NoError(t, ms[maps.CniMapOverlayConfig].Close())
		require.ErrorContains(t, n1.cni.Check(l1, a.RT), maps.CniMapOverlayConfig)
		a2 := n1.addPod(l1, "a2")
		require.NoError(t, n1.cni.Check(l1, a.RT))
		require.NoError(t, n1.cni.DelPod(l1, a2))
	}
	// The node's last DEL takes the overlay's device away; the tunnel
	// endpoints (the node agent's) stay for the next pod.
	require.NoError(t, n1.cni.DelPod(l1, a))
	var links []string
	require.NoError(t, n1.NS.Do(func(ns.NetNS) error {
		ifs, err := net.Interfaces()
		for _, i := range ifs {
			links = append(links, i.Name)
		}
		return err
	}))
	require.NotContains(t, links, cluster.Device)
	out, err := nettest.Run(n1.NS, testutil.PluginDir(t)+"/ebpf-cni", "tunnels", "--bpf-root", n1.bpfRoot, "--state-dir", n1.stateDir)
	require.NoError(t, err, out)
	require.Contains(t, out, n3.PodCIDR4.String())
	require.Contains(t, out, n3.IP4.String())
}

// bulk sends 4 MiB over TCP from pod from to an echo server in pod to, both
// ways at once, and checks every byte that comes back.
func bulk(t *testing.T, from, to *nettest.Pod) {
	t.Helper()
	l, err := nettest.Listen(to.NS, to.IP(4))
	require.NoError(t, err)
	defer l.Close()
	c, err := nettest.Dial(from.NS, l.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	want := make([]byte, 4<<20)
	_, _ = rand.Read(want)
	errs := make(chan error, 1)
	go func() {
		_, err := c.Write(want)
		errs <- err
	}()
	require.NoError(t, c.SetDeadline(time.Now().Add(30*time.Second)))
	got := make([]byte, len(want))
	_, err = io.ReadFull(c, got)
	require.NoError(t, err, "reading the echo")
	require.NoError(t, <-errs, "writing")
	require.True(t, bytes.Equal(want, got), "the echo differs from what was sent")
}
