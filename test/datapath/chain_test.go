package datapath_test

import (
	"fmt"
	"net"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
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
			list := e.confList(netOpts{version: v, chained: []map[string]any{tuning, portmap, bandwidth, firewall}})
			// Debian's portmap fails every CHECK of an attachment without
			// IPv6 port rules (containernetworking/plugins#819, whatever the
			// interface plugin), so CHECK runs the chain without it, with the
			// same cached result.
			checkList := e.confList(netOpts{version: v, chained: []map[string]any{tuning, bandwidth, firewall}})
			caps := func(i int) map[string]any {
				return map[string]any{
					"mac":          fmt.Sprintf("0e:00:00:00:00:%02x", i+1),
					"portMappings": []any{map[string]any{"hostPort": 18080 + i, "containerPort": 8080, "protocol": "tcp"}},
					"bandwidth":    map[string]any{"ingressRate": 100_000_000, "ingressBurst": 1_000_000, "egressRate": 100_000_000, "egressBurst": 1_000_000},
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
