package datapath_test

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// TestChaining: ebpf-cni first in a list with Debian's tuning, portmap,
// bandwidth and firewall: ADD, CHECK and DEL succeed, the chained plugins
// did their part, and the pods keep full connectivity.
func TestChaining(t *testing.T) {
	for _, v := range []string{"0.4.0", "1.0.0"} { // firewall needs 0.4.0; Debian's plugins stop at 1.0.0
		t.Run(v, func(t *testing.T) {
			e := newEnv(t)
			tuning := map[string]any{"type": "tuning", "mtu": 1400, "sysctl": map[string]any{"net.ipv4.conf.eth0.arp_ignore": "1"},
				"capabilities": map[string]any{"mac": true}}
			portmap := map[string]any{"type": "portmap", "capabilities": map[string]any{"portMappings": true}}
			bandwidth := map[string]any{"type": "bandwidth", "capabilities": map[string]any{"bandwidth": true}}
			firewall := map[string]any{"type": "firewall"}
			// The reference bandwidth plugin's egress limit needs tcx
			// (attachMode auto), see TestChainedBandwidth.
			// The reference bandwidth plugin finds the host end through the
			// pod's veth: such a chain makes veth pods (docs/configuration.md).
			vethOnly := map[string]any{"deviceType": "veth"}
			list := e.confList(netOpts{version: v, attachMode: "auto", chained: []map[string]any{tuning, portmap, bandwidth, firewall}, extra: vethOnly})
			// Debian's portmap fails every CHECK of an attachment without
			// IPv6 port rules (containernetworking/plugins#819, whatever the
			// interface plugin), so CHECK runs the chain without it, with the
			// same cached result.
			checkList := e.confList(netOpts{version: v, attachMode: "auto", chained: []map[string]any{tuning, bandwidth, firewall}, extra: vethOnly})
			bw := map[string]any{"ingressRate": 100_000_000, "ingressBurst": 1_000_000}
			if chainedEgressLimits() { // else see TestChainedBandwidth
				bw["egressRate"], bw["egressBurst"] = 100_000_000, 1_000_000
			}
			caps := func(i int) map[string]any {
				return map[string]any{
					"mac":          fmt.Sprintf("0e:00:00:00:00:%02x", i+1),
					"portMappings": []any{map[string]any{"hostPort": 18080 + i, "containerPort": 8080, "protocol": "tcp"}},
					"bandwidth":    bw,
				}
			}
			var pods []*nettest.Pod
			for i := range 3 {
				p, err := e.cni.AddPod(list, fmt.Sprintf("chain-%d", i), caps(i))
				require.NoError(t, err, "ADD through the chain")
				t.Cleanup(func() { _ = e.cni.DelPod(list, p) })
				pods = append(pods, p)
			}
			for _, p := range pods {
				require.NoError(t, e.cni.Check(checkList, p.RT), "CHECK through the chain")
			}

			// tuning: MTU and sysctl; firewall and portmap: their chains.
			require.NoError(t, pods[0].NS.Do(func(ns.NetNS) error {
				l, err := netlink.LinkByName("eth0")
				if err == nil {
					require.Equal(t, 1400, l.Attrs().MTU)
				}
				return err
			}))
			o, err := nettest.Run(pods[0].NS, "sysctl", "-n", "net.ipv4.conf.eth0.arp_ignore")
			require.NoError(t, err)
			require.Equal(t, "1\n", o)
			rules, err := nettest.Run(e.node.NS, "iptables-save")
			require.NoError(t, err)
			require.Contains(t, rules, "CNI-FORWARD")
			require.Contains(t, rules, "CNI-HOSTPORT-DNAT")
			qd, err := nettest.Run(e.node.NS, "tc", "qdisc", "show")
			require.NoError(t, err)
			require.Contains(t, qd, "tbf", "bandwidth shaping installed")

			mustConnect(t, pods)
			for _, p := range pods {
				o, err := nettest.Ping(p.NS, nettest.NodeIP4, 1)
				require.NoError(t, err, o)
			}
			// hostPort from the node reaches the pod.
			l, err := nettest.ListenPort(pods[1].NS, net.IPv4zero, 8080)
			require.NoError(t, err)
			defer l.Close()
			c, err := nettest.Dial(e.node.NS, fmt.Sprintf("%s:%d", nettest.NodeIP4, 18081))
			require.NoError(t, err, "hostPort through portmap")
			require.NoError(t, nettest.Echo(c, "hostport\n"))
			c.Close()

			for _, p := range pods {
				require.NoError(t, e.cni.Del(list, p.RT))
				require.NoError(t, e.cni.Del(list, p.RT))
			}
			e.requireClean()
		})
	}
}

// TestHostLocal: the reference host-local IPAM works in place of ebpf-ipam,
// under every spec version it speaks.
func TestHostLocal(t *testing.T) {
	for _, v := range testutil.SpecVersions {
		if testutil.AtLeast(v, "1.1.0") {
			continue // Debian's host-local stops at 1.0.0
		}
		t.Run(v, func(t *testing.T) {
			e := newEnv(t)
			list := e.confList(netOpts{version: v, ipam: map[string]any{"type": "host-local", "dataDir": t.TempDir(),
				"ranges": []any{
					[]any{map[string]any{"subnet": "10.244.1.0/24"}},
					[]any{map[string]any{"subnet": "fd00:244:1::/64"}},
				}}})
			a := e.addPod(list, "hl-a")
			b := e.addPod(list, "hl-b")
			mustConnect(t, []*nettest.Pod{a, b})
			if testutil.AtLeast(v, "0.4.0") {
				require.NoError(t, e.cni.Check(list, a.RT))
			}
			require.NoError(t, e.cni.DelPod(list, a))
			require.NoError(t, e.cni.DelPod(list, b))
			e.requireClean()
		})
	}
}

// TestHostLocalHandsOutTheNode: host-local configured over the node's own
// uplink subnet hands out the node's address: ebpf-cni refuses the result
// with code 7 naming it, and leaves nothing (no veth, no record, the
// address released in host-local). (host-local itself never gives out its
// range's gateway.)
func TestHostLocalHandsOutTheNode(t *testing.T) {
	for _, v := range []string{"0.4.0", "1.0.0"} { // Debian's host-local stops at 1.0.0
		t.Run(v, func(t *testing.T) {
			e := newEnv(t)
			dataDir := t.TempDir()
			node := nettest.NodeIP4.String()
			list := e.confList(netOpts{version: v, ipam: map[string]any{"type": "host-local", "dataDir": dataDir,
				"ranges": []any{[]any{map[string]any{"subnet": "192.0.2.0/24", "rangeStart": node, "rangeEnd": node}}}}})
			_, err := e.cni.AddPod(list, "hl-node", nil)
			require.Equal(t, uint(7), cniCode(t, err), "%v", err)
			require.Contains(t, err.Error(), "ipam result ips[0]")
			e.requireClean()
			left, _ := filepath.Glob(filepath.Join(dataDir, "*", node))
			require.Empty(t, left, "host-local still holds %s", node)
		})
	}
}

// TestChainedBandwidth: the reference bandwidth plugin chained after
// ebpf-cni shapes the pod as it does behind bridge: its ifb (the pod's
// egress) and its tbf on the host veth (the pod's ingress) see every
// path, the world's and the other pods'. ebpf-cni has no limit of its own
// here (no bandwidth capability): what holds the rates is the chained
// plugin's qdiscs, which the programs learn of and hand the pod's traffic
// to (bpf/lib/qdisc.h).
//
// On a kernel without tcx (attachMode auto falls back to tc) ebpf-cni's
// clsact qdisc holds the host veth's ingress hook, and the reference
// plugin's egress limit, which needs an ingress qdisc there, fails its ADD
// ("create ingress qdisc: file exists"): there the test checks that
// failure and runs the ingress limit alone (docs/kernels.md).
func TestChainedBandwidth(t *testing.T) {
	egress := chainedEgressLimits()
	for _, v := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0"} { // the reference plugin chains from 0.3.0; Debian's stops at 1.0.0
		t.Run(v, func(t *testing.T) {
			e := newEnv(t)
			e.routeWorldToPods()
			bw := map[string]any{"type": "bandwidth", "capabilities": map[string]any{"bandwidth": true}}
			// A chain with the reference plugin asks for tcx where the
			// kernel has it (attachMode auto): the default, tc, holds the
			// ingress hook with a clsact qdisc, where the plugin's egress
			// limit puts its ingress qdisc (docs/configuration.md).
			// The reference plugin finds the host end through the pod's
			// veth (its ethtool peer index): a chain with it makes veth
			// pods (deviceType veth, docs/configuration.md).
			vethOnly := map[string]any{"deviceType": "veth"}
			list := e.confList(netOpts{version: v, attachMode: "auto", chained: []map[string]any{bw}, extra: vethOnly})
			limits := map[string]any{"ingressRate": 50_000_000, "ingressBurst": 500_000}
			withEgress := map[string]any{"egressRate": 20_000_000, "egressBurst": 200_000}
			for k, x := range limits {
				withEgress[k] = x
			}
			if testutil.DefaultMode() == "tc" {
				requireChainedEgressRefused(t, e, e.confList(netOpts{version: v, chained: []map[string]any{bw}, extra: vethOnly}), map[string]any{"bandwidth": withEgress})
			}
			if egress {
				limits = withEgress
			} else {
				requireChainedEgressRefused(t, e, list, map[string]any{"bandwidth": withEgress})
			}
			caps := map[string]any{"bandwidth": limits}
			p, err := e.cni.AddPod(list, "chained-bw", caps)
			require.NoError(t, err)
			t.Cleanup(func() { _ = e.cni.DelPod(list, p) })
			other := e.addPod(list, "chained-other")
			if testutil.AtLeast(v, "0.4.0") {
				require.NoError(t, e.cni.Check(list, p.RT), "CHECK through the chain")
			}
			ifbs := 0
			for _, kind := range e.linkKinds() {
				if kind == "ifb" {
					ifbs++
				}
			}
			require.Equal(t, map[bool]int{true: 1, false: 0}[egress], ifbs, "the reference plugin's ifb")

			cases := []struct {
				name     string
				from, to ns.NetNS
				dst      net.IP
				want     float64
			}{
				{"egress to the world", p.NS, e.node.World, nettest.WorldIP4, 20e6},
				{"ingress from the world", e.node.World, p.NS, p.IP(4), 50e6},
				{"egress to a pod", p.NS, other.NS, other.IP(4), 20e6},
				{"ingress from a pod", other.NS, p.NS, p.IP(4), 50e6},
				{"egress to the world, IPv6", p.NS, e.node.World, nettest.WorldIP6, 20e6},
				{"ingress from a pod, IPv6", other.NS, p.NS, p.IP(6), 50e6},
			}
			before := e.counters()
			for i, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					if !egress && strings.HasPrefix(c.name, "egress") {
						t.Skip("kernel without tcx: the reference plugin's egress limit cannot chain (see requireChainedEgressRefused)")
					}
					if testutil.Emulated() { // the traffic, for the counters below
						r, err := nettest.Iperf(c.from, c.to, c.dst, 15301+i, 3)
						require.NoError(t, err)
						testutil.SkipRateUnderEmulation(t, fmt.Sprintf("%.1f Mbit/s against %.0f", r.BitsPerSecond/1e6, c.want/1e6))
					}
					r := iperfRate(t, c.from, c.to, c.dst, 15301+i, 3, c.want, 0.10)
					require.InDelta(t, c.want, r.BitsPerSecond, c.want*0.10, "achieved rate over 3 s")
				})
			}
			after := e.counters()
			toQdisc, viaQdisc := int(maps.CniPktReasonREASON_TO_QDISC), int(maps.CniPktReasonREASON_VIA_QDISC)
			if egress {
				require.Greater(t, after[toQdisc], before[toQdisc], "the pod's packets went to the ifb's filter")
			}
			require.Greater(t, after[viaQdisc], before[viaQdisc], "deliveries went through the tbf")
			for _, ip := range []net.IP{p.IP(4), p.IP(6)} {
				require.NotZero(t, e.endpointFlags(ip)&uint32(maps.CniEndpointFlagsEP_F_QDISC), "%s: EP_F_QDISC learned", ip)
			}
			for _, ip := range []net.IP{other.IP(4), other.IP(6)} {
				require.Zero(t, e.endpointFlags(ip)&uint32(maps.CniEndpointFlagsEP_F_QDISC), "%s: the other pod has no qdisc", ip)
			}
			// The operator CLI shows the chained plugin's qdiscs, in use.
			eps := e.cliEndpoints()
			if egress {
				require.ElementsMatch(t, []string{"root tbf", "ingress"}, eps["chained-bw"].Qdiscs)
			} else {
				require.ElementsMatch(t, []string{"root tbf"}, eps["chained-bw"].Qdiscs)
			}
			require.True(t, eps["chained-bw"].ViaQdisc)
			require.Empty(t, eps["chained-other"].Qdiscs)
			require.False(t, eps["chained-other"].ViaQdisc)

			// The unlimited pod is not slowed down, and keeps the fast path.
			before = e.counters()
			r, err := nettest.Iperf(other.NS, e.node.World, nettest.WorldIP4, 15310, 1)
			require.NoError(t, err)
			requireFast(t, r, "unlimited pod")
			require.Equal(t, before[toQdisc], e.counters()[toQdisc], "the unlimited pod's packets were redirected")

			// Without the qdiscs the pod is back on the fast path with its
			// next packets.
			host := veth.HostName(p.RT.ContainerID, p.RT.IfName)
			parents := []string{"root"}
			if egress { // else the ingress hook is ebpf-cni's own clsact
				parents = append(parents, "ingress")
			}
			for _, parent := range parents {
				_, err := nettest.Run(e.node.NS, "tc", "qdisc", "del", "dev", host, parent)
				require.NoError(t, err)
			}
			r, err = nettest.Iperf(p.NS, other.NS, other.IP(4), 15311, 1)
			require.NoError(t, err)
			requireFast(t, r, "qdiscs gone: no limit")
			require.Zero(t, e.endpointFlags(p.IP(4))&uint32(maps.CniEndpointFlagsEP_F_QDISC), "EP_F_QDISC cleared")

			require.NoError(t, e.cni.DelPod(list, p))
			require.NoError(t, e.cni.DelPod(list, other))
			for name, kind := range e.linkKinds() {
				require.NotEqual(t, "ifb", kind, "ifb %s left", name)
			}
			e.requireClean()
		})
	}
}

// requireFast: an unlimited path carries more than 200 Mbit/s (skipped,
// visibly, under emulation).
func requireFast(t *testing.T, r *nettest.IperfResult, what string) {
	t.Helper()
	t.Run(what, func(t *testing.T) {
		testutil.SkipRateUnderEmulation(t, fmt.Sprintf("%.1f Mbit/s against 200", r.BitsPerSecond/1e6))
		require.Greater(t, r.BitsPerSecond, 200e6, what)
	})
}

// chainedEgressLimits: the reference bandwidth plugin's egress limit (an
// ingress qdisc and an ifb) can chain after ebpf-cni only where ebpf-cni
// attaches with tcx; its clsact (attachMode tc, auto without tcx) holds
// the ingress hook the reference plugin needs.
func chainedEgressLimits() bool { return testutil.BestMode() == "tcx" }

// requireChainedEgressRefused: on a kernel without tcx, an ADD whose
// chained reference bandwidth plugin has an egress limit fails, saying
// why, and DEL (which the runtime calls then) leaves nothing behind.
func requireChainedEgressRefused(t *testing.T, e *env, list *libcni.NetworkConfigList, caps map[string]any) {
	t.Helper()
	n, err := nettest.NewNetNS()
	require.NoError(t, err)
	defer nettest.CloseNetNS(n)
	rt := &libcni.RuntimeConf{ContainerID: "chained-egress", NetNS: n.Path(), IfName: "eth0", CapabilityArgs: caps}
	_, err = e.cni.Add(list, rt)
	require.ErrorContains(t, err, "create ingress qdisc: file exists", "the reference plugin's egress limit next to ebpf-cni's clsact")
	require.NoError(t, e.cni.Del(list, rt))
	e.requireClean()
}

// endpointFlags reads the endpoints entry of ip.
func (e *env) endpointFlags(ip net.IP) uint32 {
	e.t.Helper()
	nd := e.handle()
	defer nd.Close()
	em, err := endpoint.MapsOf(nd)
	require.NoError(e.t, err)
	var v maps.CniEndpointInfo
	require.NoError(e.t, em.Endpoints.Lookup(maps.EndpointKey(ip), &v), "endpoints[%s]", ip)
	return v.Flags
}

// cliEndpoints is `ebpf-cni endpoints -o json` in the node, by container ID.
func (e *env) cliEndpoints() map[string]cli.Endpoint {
	e.t.Helper()
	out, err := nettest.Run(e.node.NS, filepath.Join(e.paths[0], "ebpf-cni"), "endpoints", "-o", "json",
		"--bpf-root", e.bpfRoot, "--state-dir", e.stateDir)
	require.NoError(e.t, err, out)
	var list []cli.Endpoint
	require.NoError(e.t, json.Unmarshal([]byte(out), &list), out)
	m := map[string]cli.Endpoint{}
	for _, ep := range list {
		m[ep.ContainerID] = ep
	}
	return m
}
