package k8s_test

import (
	"bufio"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// askQuick is the name of the server that answers a TCP connection from n
// to addr, or "" when none does within half a second (a denied SYN is
// dropped silently).
func askQuick(n ns.NetNS, addr string) string {
	var c net.Conn
	if err := n.Do(func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 500*time.Millisecond)
		return err
	}); err != nil {
		return ""
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return ""
	}
	return strings.Fields(line)[0]
}

// policyOf opens node n's NetworkPolicy maps.
func (n *node) policyOf() *policy.Maps {
	n.t.Helper()
	pm, err := policy.Open(nodetest.Handle(n.t, n.bpfRoot, n.stateDir))
	require.NoError(n.t, err)
	n.t.Cleanup(pm.Close)
	return pm
}

// ifindex is the host veth of pod p on node n.
func (n *node) ifindex(p *nettest.Pod) uint32 {
	n.t.Helper()
	var idx int
	require.NoError(n.t, n.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(veth.HostName(p.RT.ContainerID, p.RT.IfName))
		if err == nil {
			idx = l.Attrs().Index
		}
		return err
	}))
	return uint32(idx)
}

// allowTCP is the rule list letting the pods' addresses (both families)
// use TCP port.
func allowTCP(port uint16, pods ...*nettest.Pod) []policy.Entry {
	var out []policy.Entry
	for _, p := range pods {
		for _, fam := range []int{4, 6} {
			a, _ := netip.AddrFromSlice(p.IP(fam))
			a = a.Unmap()
			r := policy.Rule{N_ports: 1}
			r.Ports[0] = maps.CniPolicyPort{First: port, Last: port, Proto: 6}
			out = append(out, policy.Entry{Prefix: netip.PrefixFrom(a, a.BitLen()), Rule: r})
		}
	}
	return out
}

// NetworkPolicy with Services through kube-proxy (iptables), by direct
// routing and through the overlay: a policy is decided on the pod
// addresses after kube-proxy's translation. Backends that admit only pod a
// answer a through the ClusterIP and refuse z (on the other node) through
// it and directly; the node still reaches them. A client whose egress
// admits one backend gets only that one through the ClusterIP.
func TestPolicyServices(t *testing.T) {
	for _, overlay := range []bool{false, true} {
		name := "direct"
		if overlay {
			name = "vxlan"
		}
		t.Run(name, func(t *testing.T) { testPolicyServices(t, overlay) })
	}
}

func testPolicyServices(t *testing.T, overlay bool) {
	c := newCluster(t, 2, false)
	n1, n2 := c.nodes[0], c.nodes[1]
	var extra map[string]any
	if overlay {
		extra = map[string]any{"overlay": "vxlan"}
	} else {
		require.NoError(t, c.c.RouteDirect())
	}
	l1, l2 := n1.list("1.1.0", extra), n2.list("1.1.0", extra)
	if overlay {
		n1.tunnels(4, n2)
		n2.tunnels(4, n1)
	}
	a, b1 := n1.addPod(l1, "a"), n1.addPod(l1, "b1")
	b2, z := n2.addPod(l2, "b2"), n2.addPod(l2, "z")
	serve(t, b1.NS, "b1", backendPort)
	serve(t, b2.NS, "b2", backendPort)
	for _, fam := range []int{4, 6} {
		for _, n := range []*node{n1, n2} {
			require.NoError(t, kubeProxy(n, fam, b1, b2, b1).Install(n.NS, nettest.ModeIPTables))
		}
	}
	pm1, pm2 := n1.policyOf(), n2.policyOf()
	ib1, ib2, ia := n1.ifindex(b1), n2.ifindex(b2), n1.ifindex(a)

	// The backends admit a only.
	require.NoError(t, pm1.PutRules(ib1, policy.Ingress, allowTCP(backendPort, a)))
	require.NoError(t, pm1.SetEndpoint(ib1, policy.EndpointState{Ingress: uint8(policy.StateEnforce), IngressGen: 1}))
	require.NoError(t, pm2.PutRules(ib2, policy.Ingress, allowTCP(backendPort, a)))
	require.NoError(t, pm2.SetEndpoint(ib2, policy.EndpointState{Ingress: uint8(policy.StateEnforce), IngressGen: 1}))
	for _, fam := range []int{4, 6} {
		web := hp(pick(fam, webIP4, webIP6), servicePort)
		seen := map[string]int{}
		for i := 0; i < 40 && (i < 12 || len(seen) < 2); i++ { // 12 may pick one backend only
			w := askQuick(a.NS, web)
			require.NotEmpty(t, w, "IPv%d: a through the ClusterIP, connection %d", fam, i)
			seen[w]++
		}
		require.Len(t, seen, 2, "IPv%d: both backends answer a: %v", fam, seen)
		for i := 0; i < 4; i++ {
			require.Empty(t, askQuick(z.NS, web), "IPv%d: z through the ClusterIP, connection %d", fam, i)
		}
		require.Empty(t, askQuick(z.NS, hp(b1.IP(fam), backendPort)), "IPv%d: z to b1 directly", fam)
		require.Equal(t, "b2", askQuick(a.NS, hp(b2.IP(fam), backendPort)), "IPv%d: a to b2 directly", fam)
		require.Equal(t, "b1", askQuick(n1.NS, hp(b1.IP(fam), backendPort)), "IPv%d: node1 to b1", fam)
	}
	require.NoError(t, pm1.SetEndpoint(ib1, policy.EndpointState{}))
	require.NoError(t, pm2.SetEndpoint(ib2, policy.EndpointState{}))

	// a may reach b1 only, and nothing may reach a: through the
	// ClusterIP, b2 never answers, b1's replies (translated back by the
	// stack) do.
	require.NoError(t, pm1.PutRules(ia, policy.Egress, allowTCP(backendPort, b1)))
	require.NoError(t, pm1.SetEndpoint(ia, policy.EndpointState{Egress: uint8(policy.StateEnforce), EgressGen: 1,
		Ingress: uint8(policy.StateEnforce), IngressGen: 1}))
	before := n1.counters()
	for _, fam := range []int{4, 6} {
		web := hp(pick(fam, webIP4, webIP6), servicePort)
		seen := map[string]int{}
		for i := 0; i < 16; i++ {
			seen[askQuick(a.NS, web)]++
		}
		require.Zero(t, seen["b2"], "IPv%d: b2 answered a, whose egress admits b1 only: %v", fam, seen)
		require.NotZero(t, seen["b1"], "IPv%d: b1 never answered a: %v", fam, seen)
		require.NotZero(t, seen[""], "IPv%d: no connection of 16 went to b2 (and was refused): %v", fam, seen)
		require.Empty(t, askQuick(a.NS, hp(b2.IP(fam), backendPort)), "IPv%d: a to b2 directly", fam)
	}
	require.Positive(t, n1.delta(before, maps.CniPktReasonREASON_DROP_POLICY_EGRESS), "egress denials counted")
}
