package datapath_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/conntrack"
	"github.com/ebpf-cni/ebpf-cni/pkg/counters"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/portmap"
)

// hostPortList is a network whose ebpf-cni serves portMappings, with the
// socket hooks on the test's own cgroup.
func (e *env) hostPortList(version, mode string, cgroup string, extra map[string]any) *libcni.NetworkConfigList {
	x := map[string]any{"capabilities": map[string]any{"mac": true, "portMappings": true}, "cgroupPath": cgroup}
	for k, v := range extra {
		x[k] = v
	}
	return e.confList(netOpts{version: version, attachMode: mode, extra: x})
}

func mapping(host, cont int, proto string) map[string]any {
	return map[string]any{"hostPort": host, "containerPort": cont, "protocol": proto}
}

// portMappingsCaps is the portMappings capability of ms (nil without).
func portMappingsCaps(ms []map[string]any) map[string]any {
	if len(ms) == 0 {
		return nil
	}
	l := []any{}
	for _, m := range ms {
		l = append(l, m)
	}
	return map[string]any{"portMappings": l}
}

func (e *env) addPodWith(list *libcni.NetworkConfigList, id string, ms ...map[string]any) *nettest.Pod {
	e.t.Helper()
	p, err := e.cni.AddPod(list, id, portMappingsCaps(ms))
	require.NoError(e.t, err, "ADD %s", id)
	e.t.Cleanup(func() { _ = e.cni.DelPod(list, p) })
	return p
}

// published lists the hostports map.
func (e *env) published() []portmap.Published {
	e.t.Helper()
	m, err := maps.OpenPinned(e.bpfRoot, maps.CniMapHostports)
	require.NoError(e.t, err)
	defer m[maps.CniMapHostports].Close()
	l, err := portmap.List(m[maps.CniMapHostports])
	require.NoError(e.t, err)
	return l
}

// dnatFlows counts NAT table entries of hostPort flows towards ip.
func (e *env) dnatFlows(ip net.IP) int {
	e.t.Helper()
	n := e.handle()
	defer n.Close()
	t, err := conntrack.Open(n)
	require.NoError(e.t, err)
	c, err := t.Count(func(dir uint8, pod net.IP) bool { return dir == conntrack.DirDNAT && pod.Equal(ip) })
	require.NoError(e.t, err)
	return c
}

func hp(ip net.IP, port int) string { return net.JoinHostPort(ip.String(), strconv.Itoa(port)) }

// nodeDial connects from the node's netns (a socket of the test's cgroup)
// and checks an echo; it returns what getpeername says.
func nodeDial(n ns.NetNS, addr string) (net.Addr, error) {
	c, err := nettest.Dial(n, addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	return c.RemoteAddr(), nettest.Echo(c, "hostport from the node\n")
}

// nodeUDP sends one datagram from an unconnected socket of the node and
// returns the source address of the echo, as recvfrom shows it.
func nodeUDP(n ns.NetNS, dst string) (netip.AddrPort, error) {
	var from netip.AddrPort
	err := n.Do(func(ns.NetNS) error {
		c, err := net.ListenUDP("udp", nil)
		if err != nil {
			return err
		}
		defer c.Close()
		to, err := net.ResolveUDPAddr("udp", dst)
		if err != nil {
			return err
		}
		buf := make([]byte, 64)
		for try := 0; try < 3; try++ {
			if _, err := c.WriteToUDP([]byte("ping"), to); err != nil {
				return err
			}
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			if _, a, err := c.ReadFromUDPAddrPort(buf); err == nil {
				from = netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
				return nil
			}
		}
		return errors.New("no UDP echo")
	})
	return from, err
}

// TestHostPort is the must-hold case, under every spec version and both
// attach modes: a published TCP and UDP port of a pod answers from outside
// the node (the pod sees the client's address), from the node (its
// addresses and localhost, replies showing what was asked for), from
// another pod and from the pod itself (hairpin), over IPv4 and IPv6; no
// netfilter rule exists; CHECK passes; after DEL the port is gone, with its
// flows.
func TestHostPort(t *testing.T) {
	cg := testutil.Cgroup(t)
	for _, v := range testutil.SpecVersions {
		for _, mode := range testutil.AttachModes {
			t.Run(v+"/"+mode, func(t *testing.T) {
				testutil.RequireMode(t, mode)
				testHostPort(t, cg, v, mode)
			})
		}
	}
}

func testHostPort(t *testing.T, cg, version, mode string) {
	e := newEnv(t)
	list := e.hostPortList(version, mode, cg, nil)
	rules := e.ruleset()
	a := e.addPodWith(list, "hp-a", mapping(8080, 80, "tcp"), mapping(8080, 80, "udp"))
	b := e.addPodWith(list, "hp-b")
	srv := newServer(t, a.NS, 80)
	before, err := counters.ReadCounters(e.bpfRoot)
	require.NoError(t, err)

	// From outside: the pod sees the client.
	world := e.node.World
	for _, fam := range []struct{ node, client net.IP }{{nettest.NodeIP4, nettest.WorldIP4}, {nettest.NodeIP6, nettest.WorldIP6}} {
		c, err := dialFrom(world, 0, fam.node, 8080)
		require.NoError(t, err, "TCP from outside to %s", hp(fam.node, 8080))
		c.Close()
		require.Equal(t, addr(fam.client), srv.last("tcp").Addr(), "the pod sees the outside client")
		require.NoError(t, udpFrom(world, 0, fam.node, 8080), "UDP from outside to %s", hp(fam.node, 8080))
		require.Equal(t, addr(fam.client), srv.last("udp").Addr())
	}

	// From the node: its addresses and localhost. getpeername and recvfrom
	// show what the program asked for.
	for _, ip := range []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback, nettest.NodeIP4, nettest.NodeIP6} {
		peer, err := nodeDial(e.node.NS, hp(ip, 8080))
		require.NoError(t, err, "TCP from the node to %s", hp(ip, 8080))
		require.Equal(t, hp(ip, 8080), peer.String(), "getpeername")
		from, err := nodeUDP(e.node.NS, hp(ip, 8080))
		require.NoError(t, err, "UDP from the node to %s", hp(ip, 8080))
		require.Equal(t, netip.AddrPortFrom(addr(ip), 8080), from, "the echo's source as recvfrom shows it")
	}

	// From another pod and from the pod itself.
	for _, fam := range []struct {
		node net.IP
		f    int
	}{{nettest.NodeIP4, 4}, {nettest.NodeIP6, 6}} {
		c, err := dialFrom(b.NS, 0, fam.node, 8080)
		require.NoError(t, err, "TCP from pod b to %s", hp(fam.node, 8080))
		c.Close()
		require.Equal(t, addr(b.IP(fam.f)), srv.last("tcp").Addr(), "the pod sees the other pod")
		require.NoError(t, udpFrom(b.NS, 0, fam.node, 8080))
		c, err = dialFrom(a.NS, 0, fam.node, 8080)
		require.NoError(t, err, "hairpin: TCP from pod a to its own %s", hp(fam.node, 8080))
		c.Close()
		require.NoError(t, udpFrom(a.NS, 0, fam.node, 8080), "hairpin UDP")
	}

	after, err := counters.ReadCounters(e.bpfRoot)
	require.NoError(t, err)
	for _, r := range []maps.CniPktReason{maps.CniPktReasonREASON_DNAT, maps.CniPktReasonREASON_REV_DNAT} {
		require.GreaterOrEqual(t, after[r].Packets-before[r].Packets, uint64(12), counters.ReasonKeys[r])
	}
	require.Equal(t, rules, e.ruleset(), "ADD changed the netfilter ruleset")
	if testutil.AtLeast(version, "0.4.0") {
		require.NoError(t, e.cni.Check(list, a.RT))
	}
	require.Len(t, e.published(), 4, "tcp and udp, IPv4 and IPv6")
	require.Positive(t, e.dnatFlows(a.IP(4)))

	// The operator CLI lists the ports with their holder and live flows.
	out, err := nettest.Run(e.node.NS, filepath.Join(e.paths[0], "ebpf-cni"), "ports", "-o", "json", "--bpf-root", e.bpfRoot)
	require.NoError(t, err, out)
	var ports []struct {
		Proto         string `json:"protocol"`
		HostIP        string `json:"hostIP"`
		HostPort      int    `json:"hostPort"`
		PodIP         string `json:"podIP"`
		ContainerPort int    `json:"containerPort"`
		ContainerID   string `json:"containerID"`
		Flows         int    `json:"flows"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &ports), out)
	require.Len(t, ports, 4, out)
	for _, p := range ports {
		require.Equal(t, "hp-a", p.ContainerID, out)
		require.Equal(t, "*", p.HostIP, out)
		require.Equal(t, 8080, p.HostPort, out)
		require.Equal(t, 80, p.ContainerPort, out)
		require.Positive(t, p.Flows, "flows through %s %s: %s", p.Proto, p.PodIP, out)
	}

	// DEL: the port no longer answers, from anywhere, and its flows are gone.
	require.NoError(t, e.cni.DelPod(list, a))
	require.Empty(t, e.published())
	require.Zero(t, e.dnatFlows(a.IP(4)))
	require.Zero(t, e.dnatFlows(a.IP(6)))
	_, err = dialFrom(world, 0, nettest.NodeIP4, 8080)
	require.Error(t, err, "the port answers from outside after DEL")
	_, err = nodeDial(e.node.NS, hp(net.ParseIP("127.0.0.1"), 8080))
	require.Error(t, err, "the port answers on localhost after DEL")
	require.Equal(t, rules, e.ruleset())

	require.NoError(t, e.cni.DelPod(list, b))
	e.requireClean()
	_, err = os.Stat(filepath.Join(e.bpfRoot, feature.CgroupPins))
	require.True(t, os.IsNotExist(err), "the socket hooks stay attached without pods")
}

// TestHostPortClash: a port held by another pod is refused at ADD with a
// CNI error naming the holder, and nothing of that ADD remains; other
// protocols and hostIPs of the same port are fine, a port on every address
// clashes with one on a single address.
func TestHostPortClash(t *testing.T) {
	cg := testutil.Cgroup(t)
	e := newEnv(t)
	list := e.hostPortList("1.1.0", "", cg, nil)
	a := e.addPodWith(list, "clash-a", mapping(8080, 80, "tcp"), map[string]any{"hostPort": 9090, "containerPort": 90, "hostIP": nettest.NodeIP4.String()})
	_ = e.addPodWith(list, "clash-b", mapping(8080, 80, "udp"), map[string]any{"hostPort": 9090, "containerPort": 90, "hostIP": "127.0.0.1"})
	links, entries := len(e.hostLinks()), len(e.published())
	addrs, _ := e.endpointEntries()

	for i, ms := range [][]any{
		{mapping(8080, 81, "tcp")},
		{map[string]any{"hostPort": 8080, "containerPort": 80, "hostIP": nettest.NodeIP4.String()}},
		{mapping(9090, 90, "tcp")},
		{mapping(7070, 70, "tcp"), mapping(8080, 80, "TCP")}, // the first one must not stay either
	} {
		_, err := e.cni.AddPod(list, fmt.Sprintf("clash-c%d", i), map[string]any{"portMappings": ms})
		require.Error(t, err, "case %d", i)
		var te *types.Error
		require.ErrorAs(t, err, &te)
		require.EqualValues(t, 120, te.Code, te.Msg)
		require.Contains(t, te.Msg, "clash-a", "the message names the holder")
		require.Len(t, e.hostLinks(), links, "a refused ADD left its veth")
		require.Len(t, e.published(), entries, "a refused ADD left a mapping")
		n, _ := e.endpointEntries()
		require.Equal(t, addrs, n, "a refused ADD left endpoint entries")
	}
	require.Len(t, e.ipamOwners(), 4, "a refused ADD kept its addresses")
	require.NoError(t, e.cni.DelPod(list, a))
	_ = e.addPodWith(list, "clash-d", mapping(8080, 81, "tcp")) // free again
}

// TestHostPortBadConfig: every bad mapping key gets code 7 naming it, and
// leaves nothing behind.
func TestHostPortBadConfig(t *testing.T) {
	cg := testutil.Cgroup(t)
	e := newEnv(t)
	for _, c := range []struct {
		key  string
		m    map[string]any
		conf map[string]any
	}{
		{"portMappings[0].hostPort", mapping(0, 80, "tcp"), nil},
		{"portMappings[0].hostPort", mapping(70000, 80, "tcp"), nil},
		{"portMappings[0].containerPort", mapping(8080, -1, "tcp"), nil},
		{"portMappings[0].protocol", mapping(8080, 80, "icmp"), nil},
		{"portMappings[0].hostIP", map[string]any{"hostPort": 8080, "containerPort": 80, "hostIP": "nonsense"}, nil},
		{"portMappings[0].containerPort", mapping(8080, 80, "sctp"), nil},
		{"cgroupPath", mapping(8080, 80, "tcp"), map[string]any{"cgroupPath": "relative/path"}},
		{"cgroupPath", mapping(8080, 80, "tcp"), map[string]any{"cgroupPath": t.TempDir()}},
	} {
		list := e.hostPortList("1.1.0", "", cg, c.conf)
		_, err := e.cni.AddPod(list, "bad", map[string]any{"portMappings": []any{c.m}})
		var te *types.Error
		require.ErrorAs(t, err, &te, c.key)
		require.EqualValues(t, types.ErrInvalidNetworkConfig, te.Code, te.Msg)
		require.Contains(t, te.Msg, c.key)
	}
	e.requireClean()
	require.Empty(t, e.ipamOwners())
	require.Empty(t, e.published())
}

// TestHostPortRestart: a UDP client keeps sending to a published port
// while the pod behind it is deleted and a new one publishes the port: the
// new pod gets the client's datagrams at once (no stale translation, the
// portmap plugin's known conntrack problem), and no flow of the old pod
// survives its DEL.
func TestHostPortRestart(t *testing.T) {
	cg := testutil.Cgroup(t)
	e := newEnv(t)
	list := e.hostPortList("1.1.0", "", cg, nil)
	old := e.addPodWith(list, "restart-1", mapping(5353, 53, "udp"))
	srv := newServer(t, old.NS, 53)
	const lport = 40000
	require.NoError(t, udpFrom(e.node.World, lport, nettest.NodeIP4, 5353))
	require.Equal(t, netip.AddrPortFrom(addr(nettest.WorldIP4), lport), srv.last("udp"))
	require.NoError(t, e.cni.DelPod(list, old))
	require.Zero(t, e.dnatFlows(old.IP(4)), "DEL left the old pod's flows")

	fresh := e.addPodWith(list, "restart-2", mapping(5353, 53, "udp"))
	srv2 := newServer(t, fresh.NS, 53)
	require.NoError(t, udpFrom(e.node.World, lport, nettest.NodeIP4, 5353), "the same client flow reaches the new pod")
	require.Equal(t, netip.AddrPortFrom(addr(nettest.WorldIP4), lport), srv2.last("udp"))
}

// TestHostPortCheck: CHECK fails when a mapping went missing.
func TestHostPortCheck(t *testing.T) {
	cg := testutil.Cgroup(t)
	e := newEnv(t)
	list := e.hostPortList("1.1.0", "", cg, nil)
	a := e.addPodWith(list, "check-a", mapping(8080, 80, "tcp"))
	require.NoError(t, e.cni.Check(list, a.RT))
	m, err := maps.OpenPinned(e.bpfRoot, maps.CniMapHostports)
	require.NoError(t, err)
	k := maps.CniHostportKey{Family: 4, Proto: 6, Port: 8080>>8 | 8080<<8&0xff00}
	require.NoError(t, m[maps.CniMapHostports].Delete(&k))
	m[maps.CniMapHostports].Close()
	err = e.cni.Check(list, a.RT)
	var te *types.Error
	require.ErrorAs(t, err, &te)
	require.Contains(t, te.Msg, "tcp port 8080 is not published")

	// A CHECK that asks for other mappings than ADD published fails too.
	b := e.addPodWith(list, "check-b", mapping(9090, 90, "udp"))
	rt := *b.RT
	rt.CapabilityArgs = map[string]any{"portMappings": []any{mapping(9091, 90, "udp")}}
	err = e.cni.Check(list, &rt)
	require.ErrorAs(t, err, &te)
	require.Contains(t, te.Msg, "udp 9091")
	require.Contains(t, te.Msg, "udp 9090")
}

// TestHostPortChainedPortmap: the reference portmap plugin chained after
// ebpf-cni (ebpf-cni without the capability) keeps working from outside
// and from another pod: the pod's replies to flows the node's netfilter
// translated go back through the stack.
func TestHostPortChainedPortmap(t *testing.T) {
	for _, v := range testutil.SpecVersions {
		if !testutil.AtLeast(v, "0.3.0") || testutil.AtLeast(v, "1.1.0") {
			continue // chaining needs prevResult; Debian's portmap stops at 1.0.0
		}
		t.Run(v, func(t *testing.T) {
			e := newEnv(t)
			pm := map[string]any{"type": "portmap", "capabilities": map[string]any{"portMappings": true}}
			list := e.confList(netOpts{version: v, chained: []map[string]any{pm}})
			a := e.addPodWith(list, "chain-a", mapping(18080, 80, "tcp"), mapping(18080, 80, "udp"))
			b := e.addPodWith(list, "chain-b")
			srv := newServer(t, a.NS, 80)
			c, err := dialFrom(e.node.World, 0, nettest.NodeIP4, 18080)
			require.NoError(t, err, "TCP from outside through the chained portmap")
			c.Close()
			require.NoError(t, udpFrom(e.node.World, 0, nettest.NodeIP4, 18080), "UDP from outside through the chained portmap")
			c, err = dialFrom(b.NS, 0, nettest.NodeIP4, 18080)
			require.NoError(t, err, "TCP from another pod through the chained portmap")
			c.Close()
			require.True(t, srv.sources("tcp")[addr(nettest.WorldIP4)], "the outside client's address reached the pod")
			cs, err := counters.ReadCounters(e.bpfRoot)
			require.NoError(t, err)
			require.Positive(t, cs[maps.CniPktReasonREASON_STACK_REPLY].Packets, "replies handed to the stack")
			require.NoError(t, e.cni.DelPod(list, a))
			require.NoError(t, e.cni.DelPod(list, b))
			e.requireClean()
		})
	}
}

// ipamOwners lists the IPAM allocations (by address).
func (e *env) ipamOwners() []string {
	e.t.Helper()
	m, err := maps.OpenPinned(e.bpfRoot, maps.CniMapIpamAllocs)
	require.NoError(e.t, err)
	defer m[maps.CniMapIpamAllocs].Close()
	var out []string
	var k maps.CniIpamKey
	var v maps.CniIpamOwner
	it := m[maps.CniMapIpamAllocs].Iterate()
	for it.Next(&k, &v) {
		out = append(out, fmt.Sprintf("%x", k.Addr))
	}
	require.NoError(e.t, it.Err())
	return out
}
