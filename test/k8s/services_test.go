package k8s_test

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/flows"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// Service addresses: the Service ranges, a ClusterIP with two backends
// (one per node) and its externalIP, one whose only backend calls it
// (hairpin), and the NodePort of the first.
var (
	serviceCIDR4, serviceCIDR6 = cidr("10.96.0.0/16"), cidr("fd00:96::/112")
	webIP4, webIP6             = net.ParseIP("10.96.0.10"), net.ParseIP("fd00:96::10")
	selfIP4, selfIP6           = net.ParseIP("10.96.0.20"), net.ParseIP("fd00:96::20")
	extIP4, extIP6             = net.ParseIP("198.51.100.200"), net.ParseIP("2001:db8:4::200")
)

const (
	servicePort = 80
	backendPort = 8080
	nodePort    = 30080
)

func cidr(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}

func pick(fam int, v4, v6 net.IP) net.IP {
	if fam == 4 {
		return v4
	}
	return v6
}

// kubeProxy is node n's kube-proxy for family fam: the web Service (TCP and
// UDP, NodePort, externalIP) backed by b1 and b2, and the self Service
// backed by h alone.
func kubeProxy(n *node, fam int, b1, b2, h *nettest.Pod) *nettest.KubeProxy {
	k := &nettest.KubeProxy{ClusterCIDR: nettest.ClusterCIDR4, ServiceCIDR: serviceCIDR4, NodeIPs: []net.IP{n.IP4}}
	if fam == 6 {
		k = &nettest.KubeProxy{ClusterCIDR: nettest.ClusterCIDR6, ServiceCIDR: serviceCIDR6, NodeIPs: []net.IP{n.IP6}}
	}
	eps := []nettest.Endpoint{{IP: b1.IP(fam), Port: backendPort}, {IP: b2.IP(fam), Port: backendPort}}
	for _, proto := range []string{"tcp", "udp"} {
		k.Services = append(k.Services, &nettest.Service{Namespace: "default", Name: "web", PortName: "http-" + proto, Protocol: proto,
			ClusterIP: pick(fam, webIP4, webIP6), Port: servicePort, NodePort: nodePort,
			ExternalIPs: []net.IP{pick(fam, extIP4, extIP6)}, Endpoints: eps})
	}
	k.Services = append(k.Services, &nettest.Service{Namespace: "default", Name: "self", PortName: "http", Protocol: "tcp",
		ClusterIP: pick(fam, selfIP4, selfIP6), Port: servicePort, Endpoints: []nettest.Endpoint{{IP: h.IP(fam), Port: backendPort}}})
	return k
}

// TestServices is the must-hold case for Services, with kube-proxy-shaped
// rule sets of both of kube-proxy's modes in both nodes' netfilter, IPv4
// and IPv6: a pod reaches a ClusterIP whose two backends are pods, one per
// node (both answer over 12 connections, and see the pod's own address);
// the node reaches it; a backend reaches itself through its own Service
// (hairpin, masqueraded by kube-proxy's mark); NodePort from pods, from
// the node and from the world, on this node and the other; externalIPs
// from the world; kube-proxy's masquerade mark and --random-fully on
// external traffic; and no packet meets kube-proxy's INVALID drop.
func TestServices(t *testing.T) {
	for _, mode := range []nettest.ProxyMode{nettest.ModeIPTables, nettest.ModeNFTables} {
		t.Run(string(mode), func(t *testing.T) { testServices(t, mode, nil) })
	}
}

// TestServicesMixedDevices: TestServices on a node whose client pod is a
// veth pod (made before an upgrade to netkit pods, or asked for) while its
// backends are netkit pods, and the reverse.
func TestServicesMixedDevices(t *testing.T) {
	testutil.RequireNetkit(t)
	for _, mode := range []nettest.ProxyMode{nettest.ModeIPTables, nettest.ModeNFTables} {
		for _, client := range []string{"veth", "netkit"} {
			t.Run(string(mode)+"/"+client+"-client", func(t *testing.T) {
				other := map[string]string{"veth": "netkit", "netkit": "veth"}[client]
				testServices(t, mode, map[string]string{"a": client, "b1": other, "h": other})
			})
		}
	}
}

// testServices runs the Services case; devices gives node1's pods (a, b1,
// h) a deviceType (none: the default).
func testServices(t *testing.T, mode nettest.ProxyMode, devices map[string]string) {
	c := newCluster(t, 2, false)
	require.NoError(t, c.c.RouteDirect())
	n1, n2 := c.nodes[0], c.nodes[1]
	l1, l2 := n1.list("1.1.0", nil), n2.list("1.1.0", nil)
	pod := func(id string) *nettest.Pod {
		if d := devices[id]; d != "" {
			return n1.addPod(n1.list("1.1.0", map[string]any{"deviceType": d}), id)
		}
		return n1.addPod(l1, id)
	}
	a, b1, h := pod("a"), pod("b1"), pod("h")
	b2 := n2.addPod(l2, "b2")
	for name, p := range map[string]*nettest.Pod{"b1": b1, "b2": b2, "h": h} {
		serve(t, p.NS, name, backendPort)
	}
	for _, fam := range []int{4, 6} {
		for _, n := range []*node{n1, n2} {
			require.NoError(t, kubeProxy(n, fam, b1, b2, h).Install(n.NS, mode), "kube-proxy rules on %s", n.Name)
		}
		require.NoError(t, c.c.RouteToRouter(n1.ClusterNode, pick(fam, extIP4, extIP6)))
	}
	before := n1.counters()

	for _, fam := range []int{4, 6} {
		web := pick(fam, webIP4, webIP6)
		t.Run(fmt.Sprintf("IPv%d", fam), func(t *testing.T) {
			// A pod to the ClusterIP: both backends, the pod's own address.
			// At least 12 of each, up to 40 until both backends answered: a
			// random pick leaves one out of 12 once in 2,048 tries.
			tcp, udp := map[string]int{}, map[string]int{}
			for i := 0; i < 40 && (i < 12 || len(tcp) < 2 || len(udp) < 2); i++ {
				w, err := nettest.AskWho(a.NS, hp(web, servicePort), 0)
				require.NoError(t, err, "TCP connection %d to the ClusterIP", i)
				require.True(t, a.IP(fam).Equal(w.SeenIP()), "backend %s saw %s, want the pod's %s", w.Name, w.Seen, a.IP(fam))
				tcp[w.Name]++
				w, err = nettest.AskWhoUDP(a.NS, hp(web, servicePort))
				require.NoError(t, err, "UDP datagram %d to the ClusterIP", i)
				require.True(t, a.IP(fam).Equal(w.SeenIP()), "backend %s saw %s over UDP", w.Name, w.Seen)
				udp[w.Name]++
			}
			require.Len(t, tcp, 2, "both backends answer over up to 40 TCP connections: %v", tcp)
			require.Len(t, udp, 2, "both backends answer over up to 40 UDP flows: %v", udp)

			// The node to the ClusterIP: kube-proxy masquerades it.
			w, err := nettest.AskWho(n1.NS, hp(web, servicePort), 0)
			require.NoError(t, err, "the node to the ClusterIP")
			require.True(t, n1.Addr(fam).Equal(w.SeenIP()), "%s saw the node as %s", w.Name, w.Seen)

			// Hairpin: the self Service's only backend calls it.
			w, err = nettest.AskWho(h.NS, hp(pick(fam, selfIP4, selfIP6), servicePort), 0)
			require.NoError(t, err, "hairpin through the self Service")
			require.Equal(t, "h", w.Name)
			require.False(t, h.IP(fam).Equal(w.SeenIP()), "hairpin traffic is masqueraded (KUBE-MARK-MASQ of the endpoint)")

			// NodePort, on this node and the other: from a pod, the node,
			// the world (masqueraded with --random-fully: the backend sees
			// the node's address and another port).
			for ti, target := range []*node{n1, n2} {
				np := hp(target.Addr(fam), nodePort)
				for _, from := range []struct {
					name string
					ns   ns.NetNS
				}{{"pod a", a.NS}, {"node1", n1.NS}} {
					_, err := nettest.AskWho(from.ns, np, 0)
					require.NoError(t, err, "%s to NodePort %s", from.name, np)
					_, err = nettest.AskWhoUDP(from.ns, np)
					require.NoError(t, err, "%s to UDP NodePort %s", from.name, np)
				}
				lport := 41000 + 10*fam + ti // a closed connection holds its port in TIME_WAIT
				w, err := nettest.AskWho(c.c.World, np, lport)
				require.NoError(t, err, "the world to NodePort %s", np)
				require.True(t, target.Addr(fam).Equal(w.SeenIP()), "NodePort from the world: %s saw %s, want the node's address", w.Name, w.Seen)
				require.NotEqual(t, lport, w.SeenPort(), "MASQUERADE --random-fully moves the port")
			}

			// externalIPs, routed to node1 by the router.
			ext := hp(pick(fam, extIP4, extIP6), servicePort)
			w, err = nettest.AskWho(c.c.World, ext, 0)
			require.NoError(t, err, "the world to the externalIP %s", ext)
			require.True(t, n1.Addr(fam).Equal(w.SeenIP()), "externalIP from the world: %s saw %s", w.Name, w.Seen)
			_, err = nettest.AskWhoUDP(c.c.World, ext)
			require.NoError(t, err, "the world to the UDP externalIP %s", ext)
		})
	}

	// The flows the ClusterIP translated go through the stack, the others
	// keep the fast path; pods of a node still talk by redirect.
	verdicts := map[string]map[string]bool{}
	for _, f := range n1.flows() {
		if verdicts[f.Remote] == nil {
			verdicts[f.Remote] = map[string]bool{}
		}
		verdicts[f.Remote][f.Verdict] = true
	}
	for _, ip := range []net.IP{webIP4, webIP6} {
		require.Equal(t, map[string]bool{"stack": true}, verdicts[ip.String()], "flows to %s: %v", ip, verdicts)
	}
	b1Who, err := nettest.AskWho(a.NS, hp(b1.IP(4), backendPort), 0)
	require.NoError(t, err)
	require.Equal(t, "b1", b1Who.Name)
	require.Positive(t, n1.delta(before, maps.CniPktReasonREASON_REDIRECT), "pod to pod on a node: redirect_peer")
	require.Positive(t, n1.delta(before, maps.CniPktReasonREASON_FLOW_NEW), "first packets handed to netfilter")
	require.Positive(t, n1.delta(before, maps.CniPktReasonREASON_FLOW_STACK), "replies from node2's backend to the stack, to be un-DNATed")

	if mode == nettest.ModeIPTables {
		for _, n := range []*node{n1, n2} {
			for _, tool := range []string{"iptables", "ip6tables"} {
				out, err := nettest.Run(n.NS, tool, "-t", "filter", "-L", "KUBE-FORWARD", "-v", "-x", "-n")
				require.NoError(t, err, out)
				require.Equal(t, "0", invalidDrops(out), "%s %s: packets dropped as INVALID (one direction of a flow skipped conntrack):\n%s", n.Name, tool, out)
			}
		}
	}
}

// invalidDrops is the packet count of the ctstate INVALID drop rule in a
// verbose listing of KUBE-FORWARD.
func invalidDrops(listing string) string {
	for _, line := range strings.Split(listing, "\n") {
		if strings.Contains(line, "INVALID") && strings.Contains(line, "DROP") {
			if f := strings.Fields(line); len(f) > 0 {
				return f[0]
			}
		}
	}
	return "no INVALID rule"
}

// flows is `ebpf-cni flows -o json` on the node.
func (n *node) flows() []flows.FlowEntry {
	n.t.Helper()
	out, err := nettest.Run(n.NS, testutil.PluginDir(n.t)+"/ebpf-cni", "flows", "-o", "json", "--bpf-root", n.bpfRoot, "--state-dir", n.stateDir)
	require.NoError(n.t, err, out)
	var fs []flows.FlowEntry
	require.NoError(n.t, json.Unmarshal([]byte(out), &fs), out)
	return fs
}

// TestServicesOverlay: Services whose backends are pods behind the VXLAN
// overlay. The first packet of a connection to the ClusterIP crosses the
// node's stack, whose DNAT sends it to the other node's pod range: the
// cluster's route through the overlay's device takes it there, and
// to_tunnel gives it its tunnel key. Clients on both nodes reach both
// backends, the world reaches a NodePort, IPv4 and IPv6 over an IPv4
// underlay, in both kube-proxy modes.
func TestServicesOverlay(t *testing.T) {
	for _, mode := range []nettest.ProxyMode{nettest.ModeIPTables, nettest.ModeNFTables} {
		t.Run(string(mode), func(t *testing.T) {
			c := newCluster(t, 1, true)
			n1, n2 := c.nodes[0], c.nodes[1]
			vxlan := map[string]any{"overlay": "vxlan"}
			l1, l2 := n1.list("1.1.0", vxlan), n2.list("1.1.0", vxlan)
			n1.tunnels(4, n2)
			n2.tunnels(4, n1)
			a, b1 := n1.addPod(l1, "a"), n1.addPod(l1, "b1")
			b2, z := n2.addPod(l2, "b2"), n2.addPod(l2, "z")
			serve(t, b1.NS, "b1", backendPort)
			serve(t, b2.NS, "b2", backendPort)
			for _, fam := range []int{4, 6} {
				for _, n := range []*node{n1, n2} {
					require.NoError(t, kubeProxy(n, fam, b1, b2, b1).Install(n.NS, mode))
				}
			}
			before := n1.counters()
			for _, fam := range []int{4, 6} {
				for _, client := range []*nettest.Pod{a, z} {
					seen := map[string]int{}
					for i := 0; i < 40 && (i < 12 || len(seen) < 2); i++ { // 12 may pick one backend only
						w, err := nettest.AskWho(client.NS, hp(pick(fam, webIP4, webIP6), servicePort), 0)
						require.NoError(t, err, "IPv%d connection %d to the ClusterIP", fam, i)
						require.True(t, client.IP(fam).Equal(w.SeenIP()), "%s saw %s", w.Name, w.Seen)
						seen[w.Name]++
					}
					require.Len(t, seen, 2, "IPv%d: both backends answer over up to 40 connections: %v", fam, seen)
				}
				w, err := nettest.AskWho(c.c.World, hp(n2.Addr(fam), nodePort), 0)
				require.NoError(t, err, "the world to NodePort on the far node, IPv%d", fam)
				require.True(t, n2.Addr(fam).Equal(w.SeenIP()))
			}
			require.Positive(t, n1.delta(before, maps.CniPktReasonREASON_TUNNEL_ENCAP), "to_tunnel keyed the stack's packets")
			if mode == nettest.ModeIPTables {
				for _, n := range []*node{n1, n2} {
					out, err := nettest.Run(n.NS, "iptables", "-t", "filter", "-L", "KUBE-FORWARD", "-v", "-x", "-n")
					require.NoError(t, err, out)
					require.Equal(t, "0", invalidDrops(out), "%s: INVALID drops:\n%s", n.Name, out)
				}
			}
			require.NoError(t, n1.cni.Check(l1, a.RT))
		})
	}
}
