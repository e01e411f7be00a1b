package programs_test

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/cluster"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/uplink"
)

const (
	tcpSYN    = 0x02
	tcpACK    = 0x10
	tcpSYNACK = 0x12
)

func udp4(srcMAC net.HardwareAddr, src, dst net.IP, sport, dport uint16) []byte {
	seg := make([]byte, 8)
	binary.BigEndian.PutUint16(seg[0:], sport)
	binary.BigEndian.PutUint16(seg[2:], dport)
	binary.BigEndian.PutUint16(seg[4:], 8)
	return append(ether(macWorld, srcMAC, 0x0800), ipv4(src, dst, 17, seg)...)
}

// flowEnv is a programEnv with the flow and cluster maps at hand.
type flowEnv struct {
	*programEnv
	flows, routes, config *ebpf.Map
	up                    netlink.Link
}

func newFlowEnv(t *testing.T) *flowEnv {
	e := &flowEnv{programEnv: newProgramEnv(t)}
	m, err := maps.OpenPinned(e.bpfRoot, maps.CniMapFlows, maps.CniMapClusterRoutes, maps.CniMapClusterConfig)
	require.NoError(t, err)
	e.flows, e.routes, e.config = m[maps.CniMapFlows], m[maps.CniMapClusterRoutes], m[maps.CniMapClusterConfig]
	t.Cleanup(func() { e.flows.Close(); e.routes.Close(); e.config.Close() })
	require.NoError(t, e.n.Do(func(ns.NetNS) error {
		e.up, err = netlink.LinkByName("up")
		return err
	}))
	return e
}

// runProg runs hook on pkt; the output is cut (or extended, within the
// buffer) to the input's length.
func (e *flowEnv) runProg(t *testing.T, hook string, ifindex int, pkt []byte) (uint32, []byte) {
	t.Helper()
	ret, out := e.runProgOut(t, hook, ifindex, pkt)
	return ret, out[:len(pkt)]
}

// runProgOut is runProg's output at the length the program left it.
func (e *flowEnv) runProgOut(t *testing.T, hook string, ifindex int, pkt []byte) (uint32, []byte) {
	t.Helper()
	var ret uint32
	opts := ebpf.RunOptions{Data: pkt, DataOut: make([]byte, len(pkt)+256), Context: skbCtx{Ifindex: uint32(ifindex)}}
	require.NoError(t, e.n.Do(func(ns.NetNS) error {
		var err error
		ret, err = mustProg(t, e.progs, hook).Run(&opts)
		return err
	}))
	return ret, opts.DataOut
}

// flow reads the flow entry of a pod's tuple; ok is false when there is none.
func (e *flowEnv) flow(t *testing.T, pod net.IP, pport uint16, remote net.IP, rport uint16, proto uint8) (maps.CniFlowEntry, bool) {
	t.Helper()
	k := maps.CniFlowKey{Family: maps.Family(pod), Proto: proto, Sport: pport>>8 | pport<<8, Dport: rport>>8 | rport<<8,
		Saddr: maps.Addr16(pod), Daddr: maps.Addr16(remote)}
	var v maps.CniFlowEntry
	err := e.flows.Lookup(&k, &v)
	return v, err == nil
}

func (e *flowEnv) putFlow(t *testing.T, pod net.IP, pport uint16, remote net.IP, rport uint16, v maps.CniFlowVerdict) {
	t.Helper()
	k := maps.CniFlowKey{Family: maps.Family(pod), Proto: 6, Sport: pport>>8 | pport<<8, Dport: rport>>8 | rport<<8,
		Saddr: maps.Addr16(pod), Daddr: maps.Addr16(remote)}
	// Seen now: an entry idle for longer than a flow lives (LastSeen 1
	// on a node up for hours) is a new flow to the programs.
	require.NoError(t, e.flows.Put(&k, &maps.CniFlowEntry{Verdict: v, LastSeen: maps.Monotonic()}))
}

// TestFlowPrograms runs the programs on crafted packets for the flow
// verdicts (bpf/lib/flow.h). The test netns has no netfilter rule, so
// conntrack tracks nothing there: every lookup finds no entry, which is
// the case that settles a flow on the fast path.
func TestFlowPrograms(t *testing.T) {
	e := newFlowEnv(t)
	a := e.hA.Attrs().Index
	from := endpoint.HookFromContainer.Name

	t.Run("a new flow goes through the stack until netfilter lets a packet through", func(t *testing.T) {
		before := e.count(t, maps.CniPktReasonREASON_FLOW_NEW)
		ret, _ := e.runProg(t, from, a, tcp4(macA, ipA4, world4, 40000, 80, tcpSYN))
		require.Equal(t, uint32(tcActPass), ret, "the SYN goes to the stack (netfilter sees it)")
		f, ok := e.flow(t, ipA4, 40000, world4, 80, 6)
		require.True(t, ok)
		require.Equal(t, maps.CniFlowVerdictFLOW_PENDING, f.Verdict)
		// Conntrack knows nothing of it: netfilter may have dropped
		// every packet so far (a Service without endpoints), so every
		// one goes to the stack, however many.
		for i := 0; i < 5; i++ {
			ret, _ = e.runProg(t, from, a, tcp4(macA, ipA4, world4, 40000, 80, tcpACK))
			require.Equal(t, uint32(tcActPass), ret, "pending packet %d", i+2)
		}
		require.Equal(t, before+6, e.count(t, maps.CniPktReasonREASON_FLOW_NEW))
		f, _ = e.flow(t, ipA4, 40000, world4, 80, 6)
		require.Equal(t, maps.CniFlowVerdictFLOW_PENDING, f.Verdict)
		require.Equal(t, uint8(6), f.Pending)
		// Its SYN (retransmitted) leaves the node (to_netdev, after
		// netfilter) without a conntrack entry: conntrack does not track
		// it, the fast path. (to_netdev settles a TCP flow by its SYN: a
		// pending flow's other packets come after a reply, which settles
		// it first.)
		ret, _ = e.runProg(t, uplink.HookToNetdev.Name, e.up.Attrs().Index, tcp4(macA, ipA4, world4, 40000, 80, tcpSYN))
		require.Equal(t, uint32(tcActPass), ret)
		f, _ = e.flow(t, ipA4, 40000, world4, 80, 6)
		require.Equal(t, maps.CniFlowVerdictFLOW_FAST, f.Verdict)
		require.Equal(t, maps.CniFlowFlagsFLOW_F_UNTRACKED, f.Flags, "the pod opened it; conntrack does not track it")
		ret, out := e.runProg(t, from, a, tcp4(macA, ipA4, world4, 40000, 80, tcpACK))
		require.Equal(t, uint32(tcActRedirect), ret, "settled: the fast path")
		require.Equal(t, []byte(macWorld), out[0:6])
	})

	t.Run("a fast UDP flow conntrack no longer knows goes back to the stack", func(t *testing.T) {
		put := func(proto uint8, pport uint16, flags maps.CniFlowFlags) {
			k := maps.CniFlowKey{Family: 4, Proto: proto, Sport: pport>>8 | pport<<8, Dport: 53 << 8,
				Saddr: maps.Addr16(ipA4), Daddr: maps.Addr16(world4)}
			require.NoError(t, e.flows.Put(&k, &maps.CniFlowEntry{Verdict: maps.CniFlowVerdictFLOW_FAST, Flags: flags, LastSeen: maps.Monotonic()}))
		}
		// Settled fast while conntrack had its entry (a reply); the
		// entry is gone now (kube-proxy deleted it): netfilter decides
		// again.
		put(17, 5300, 0)
		before := e.count(t, maps.CniPktReasonREASON_FLOW_NEW)
		ret, _ := e.runProg(t, from, a, udp4(macA, ipA4, world4, 5300, 53))
		require.Equal(t, uint32(tcActPass), ret, "to the stack")
		require.Equal(t, before+1, e.count(t, maps.CniPktReasonREASON_FLOW_NEW))
		f, _ := e.flow(t, ipA4, 5300, world4, 53, 17)
		require.Equal(t, maps.CniFlowVerdictFLOW_PENDING, f.Verdict)
		// With its entry in conntrack, it stays fast.
		put(17, 5304, 0)
		require.NoError(t, e.n.Do(func(ns.NetNS) error {
			return netlink.ConntrackCreate(netlink.ConntrackTable, netlink.FAMILY_V4, &netlink.ConntrackFlow{FamilyType: netlink.FAMILY_V4,
				Forward: netlink.IPTuple{SrcIP: ipA4, DstIP: world4, Protocol: 17, SrcPort: 5304, DstPort: 53},
				Reverse: netlink.IPTuple{SrcIP: world4, DstIP: ipA4, Protocol: 17, SrcPort: 53, DstPort: 5304}, TimeOut: 120})
		}))
		ret, _ = e.runProg(t, from, a, udp4(macA, ipA4, world4, 5304, 53))
		require.Equal(t, uint32(tcActRedirect), ret, "conntrack has its entry: the fast path")
		f, _ = e.flow(t, ipA4, 5304, world4, 53, 17)
		require.Equal(t, maps.CniFlowVerdictFLOW_FAST, f.Verdict)
		// Conntrack does not track it (seen leaving without an entry),
		// one opened toward the pod, or TCP: not asked, fast.
		for _, c := range []struct {
			proto uint8
			port  uint16
			flags maps.CniFlowFlags
		}{{17, 5301, maps.CniFlowFlagsFLOW_F_UNTRACKED}, {17, 5302, maps.CniFlowFlagsFLOW_F_INBOUND}, {6, 5303, 0}} {
			put(c.proto, c.port, c.flags)
			pkt := udp4(macA, ipA4, world4, c.port, 53)
			if c.proto == 6 {
				pkt = tcp4(macA, ipA4, world4, c.port, 53, tcpACK)
			}
			ret, _ = e.runProg(t, from, a, pkt)
			require.Equal(t, uint32(tcActRedirect), ret, "%+v", c)
			f, _ = e.flow(t, ipA4, c.port, world4, 53, c.proto)
			require.Equal(t, maps.CniFlowVerdictFLOW_FAST, f.Verdict, "%+v", c)
		}
	})

	t.Run("a reply settles a pending flow at once", func(t *testing.T) {
		ret, _ := e.runProg(t, from, a, tcp4(macA, ipA4, world4, 40001, 80, tcpSYN))
		require.Equal(t, uint32(tcActPass), ret)
		before := e.count(t, maps.CniPktReasonREASON_ROUTED_IN)
		ret, out := e.runProg(t, uplink.HookFromNetdev.Name, e.up.Attrs().Index, tcp4(macWorld, world4, ipA4, 80, 40001, tcpSYNACK))
		require.Equal(t, uint32(tcActRedirect), ret, "routed straight into the pod")
		require.Equal(t, before+1, e.count(t, maps.CniPktReasonREASON_ROUTED_IN))
		require.Equal(t, []byte(macA), out[0:6])
		f, _ := e.flow(t, ipA4, 40001, world4, 80, 6)
		require.Equal(t, maps.CniFlowVerdictFLOW_FAST, f.Verdict)
		ret, _ = e.runProg(t, from, a, tcp4(macA, ipA4, world4, 40001, 80, tcpACK))
		require.Equal(t, uint32(tcActRedirect), ret)
	})

	t.Run("a flow netfilter translated goes through the stack both ways", func(t *testing.T) {
		e.putFlow(t, ipA4, 40002, world4, 80, maps.CniFlowVerdictFLOW_STACK)
		before := e.count(t, maps.CniPktReasonREASON_STACK_REPLY)
		ret, _ := e.runProg(t, from, a, tcp4(macA, ipA4, world4, 40002, 80, tcpACK))
		require.Equal(t, uint32(tcActPass), ret)
		require.Equal(t, before+1, e.count(t, maps.CniPktReasonREASON_STACK_REPLY))
		before = e.count(t, maps.CniPktReasonREASON_FLOW_STACK)
		ret, _ = e.runProg(t, uplink.HookFromNetdev.Name, e.up.Attrs().Index, tcp4(macWorld, world4, ipA4, 80, 40002, tcpACK))
		require.Equal(t, uint32(tcActPass), ret, "its replies too")
		require.Equal(t, before+1, e.count(t, maps.CniPktReasonREASON_FLOW_STACK))
	})

	t.Run("mid-stream without an entry asks conntrack at once", func(t *testing.T) {
		ret, _ := e.runProg(t, from, a, tcp4(macA, ipA4, world4, 40003, 80, tcpACK))
		require.Equal(t, uint32(tcActRedirect), ret)
		f, ok := e.flow(t, ipA4, 40003, world4, 80, 6)
		require.True(t, ok)
		require.Equal(t, maps.CniFlowVerdictFLOW_FAST, f.Verdict)
		// A new connection on the same tuple starts over.
		ret, _ = e.runProg(t, from, a, tcp4(macA, ipA4, world4, 40003, 80, tcpSYN))
		require.Equal(t, uint32(tcActPass), ret)
		f, _ = e.flow(t, ipA4, 40003, world4, 80, 6)
		require.Equal(t, maps.CniFlowVerdictFLOW_PENDING, f.Verdict)
	})

	t.Run("UDP is tracked, ICMP echo is not", func(t *testing.T) {
		ret, _ := e.runProg(t, from, a, udp4(macA, ipA4, world4, 5353, 53))
		require.Equal(t, uint32(tcActPass), ret)
		_, ok := e.flow(t, ipA4, 5353, world4, 53, 17)
		require.True(t, ok)
		ret, _ = e.runProg(t, from, a, icmp4(macA, ipA4, world4, 64))
		require.Equal(t, uint32(tcActRedirect), ret)
	})

	t.Run("inbound flows are noted and never masqueraded", func(t *testing.T) {
		ret, _ := e.runProg(t, uplink.HookFromNetdev.Name, e.up.Attrs().Index, tcp4(macWorld, world4, ipA4, 33000, 8080, tcpSYN))
		require.Equal(t, uint32(tcActRedirect), ret)
		f, ok := e.flow(t, ipA4, 8080, world4, 33000, 6)
		require.True(t, ok)
		require.Equal(t, maps.CniFlowVerdictFLOW_FAST, f.Verdict)
		require.Equal(t, maps.CniFlowFlagsFLOW_F_INBOUND, f.Flags)

		m, err := maps.OpenPinned(e.bpfRoot, maps.CniMapMasqNets, maps.CniMapUplinks)
		require.NoError(t, err)
		defer m[maps.CniMapMasqNets].Close()
		defer m[maps.CniMapUplinks].Close()
		require.NoError(t, m[maps.CniMapMasqNets].Put(&maps.CniMasqNetKey{NetId: 0, Family: 4}, &maps.CniMasqNet{PortMin: 61000, PortMax: 65535}))
		ui := maps.CniUplinkInfo{Has4: 1}
		copy(ui.Ip4[:], uplink4)
		require.NoError(t, m[maps.CniMapUplinks].Put(uint32(e.up.Attrs().Index), &ui))
		for _, flags := range []byte{tcpSYNACK, tcpACK} {
			pkt := tcp4(macA, ipA4, world4, 8080, 33000, flags)
			ret, out := e.runProg(t, uplink.HookToNetdev.Name, e.up.Attrs().Index, bytes.Clone(pkt))
			require.Equal(t, uint32(tcActPass), ret)
			require.Equal(t, pkt, out, "the reply leaves with the pod's address")
		}
		ret, out := e.runProg(t, uplink.HookToNetdev.Name, e.up.Attrs().Index, tcp4(macA, ipA4, world4, 40100, 443, tcpSYN))
		require.Equal(t, uint32(tcActPass), ret)
		require.Equal(t, []byte(uplink4), out[14+12:14+16], "a flow the pod opens is masqueraded")
	})
}

// TestClusterPrograms: destinations in the cluster's ranges skip the flow
// table; another node's pod range behind the overlay is encapsulated
// (the program's own VXLAN headers out of the uplink, else the tunnel key
// and a redirect to the VXLAN device), and what the overlay
// delivers goes straight into the pod.
func TestClusterPrograms(t *testing.T) {
	e := newFlowEnv(t)
	a := e.hA.Attrs().Index
	from := endpoint.HookFromContainer.Name
	route := func(cidr string, flags maps.CniClusterFlags, node net.IP) {
		_, n, err := net.ParseCIDR(cidr)
		require.NoError(t, err)
		ones, _ := n.Mask.Size()
		k := maps.CniClusterKey{Prefixlen: uint32(32 + ones), Family: maps.Family(n.IP), Addr: maps.Addr16(n.IP)}
		v := maps.CniClusterRoute{Flags: flags}
		if node != nil {
			v.NodeFamily, v.Node = maps.Family(node), maps.Addr16(node)
		}
		require.NoError(t, e.routes.Put(&k, &v))
	}

	// A cluster range: no flow, the FIB at once.
	route("198.51.100.0/24", maps.CniClusterFlagsCLUSTER_F_RANGE, nil)
	ret, _ := e.runProg(t, from, a, tcp4(macA, ipA4, world4, 41000, 80, tcpSYN))
	require.Equal(t, uint32(tcActRedirect), ret)
	_, ok := e.flow(t, ipA4, 41000, world4, 80, 6)
	require.False(t, ok, "pods of the cluster are never Services: no flow entry")

	// Behind the overlay, without the overlay's device: dropped, counted.
	remote := net.ParseIP("10.9.2.7").To4()
	route("10.9.2.0/24", maps.CniClusterFlagsCLUSTER_F_TUNNEL, net.ParseIP("192.0.2.50"))
	before := e.count(t, maps.CniPktReasonREASON_DROP_TUNNEL)
	ret, _ = e.runProg(t, from, a, tcp4(macA, ipA4, remote, 41001, 80, tcpSYN))
	require.Equal(t, uint32(tcActShot), ret)
	require.Equal(t, before+1, e.count(t, maps.CniPktReasonREASON_DROP_TUNNEL))

	// With it: encapsulated toward the node, TTL spent by one.
	var vx netlink.Link
	require.NoError(t, e.n.Do(func(ns.NetNS) error {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = "vx"
		if err := netlink.LinkAdd(&netlink.Vxlan{LinkAttrs: attrs, FlowBased: true, Port: 4789}); err != nil {
			return err
		}
		var err error
		vx, err = netlink.LinkByName("vx")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(vx)
	}))
	require.NoError(t, e.config.Put(uint32(0), &maps.CniClusterSettings{VxlanIfindex: uint32(vx.Attrs().Index), Vni: 7}))
	for _, node := range []net.IP{net.ParseIP("192.0.2.50"), net.ParseIP("2001:db8::50")} {
		route("10.9.2.0/24", maps.CniClusterFlagsCLUSTER_F_TUNNEL, node)
		before = e.count(t, maps.CniPktReasonREASON_TUNNEL_ENCAP)
		ret, out := e.runProg(t, from, a, tcp4(macA, ipA4, remote, 41002, 80, tcpSYN))
		require.Equal(t, uint32(tcActRedirect), ret, "underlay %s", node)
		require.Equal(t, before+1, e.count(t, maps.CniPktReasonREASON_TUNNEL_ENCAP))
		require.Equal(t, byte(63), out[14+8], "TTL decremented")
		require.Zero(t, csum(out[14:34]))
	}

	// With the overlay's wire settings and the uplink's address known, an
	// IPv4 underlay's packet is encapsulated by the program itself: the
	// outer headers the device would write, out of the uplink.
	ms, err := maps.OpenPinned(e.bpfRoot, maps.CniMapOverlayConfig, maps.CniMapUplinks)
	require.NoError(t, err)
	defer ms[maps.CniMapOverlayConfig].Close()
	defer ms[maps.CniMapUplinks].Close()
	require.NoError(t, ms[maps.CniMapOverlayConfig].Put(uint32(0), &maps.CniOverlaySettings{Port: 4789>>8 | 4789&0xff<<8, VniWord: binary.NativeEndian.Uint32([]byte{0, 0, 7, 0})}))
	ui := maps.CniUplinkInfo{Has4: 1}
	copy(ui.Ip4[:], uplink4)
	require.NoError(t, ms[maps.CniMapUplinks].Put(uint32(e.up.Attrs().Index), &ui))
	node := net.ParseIP("192.0.2.50").To4()
	route("10.9.2.0/24", maps.CniClusterFlagsCLUSTER_F_TUNNEL, node)
	in := tcp4(macA, ipA4, remote, 41005, 80, tcpSYN)
	in[14+1] = 3 // ECN: congestion experienced
	in[14+10], in[14+11] = 0, 0
	binary.BigEndian.PutUint16(in[14+10:], csum(in[14:34]))
	before = e.count(t, maps.CniPktReasonREASON_TUNNEL_UPLINK)
	ret, out := e.runProgOut(t, from, a, bytes.Clone(in))
	require.Equal(t, uint32(tcActRedirect), ret)
	require.Equal(t, before+1, e.count(t, maps.CniPktReasonREASON_TUNNEL_UPLINK))
	require.Len(t, out, len(in)+cluster.OverheadIPv4)
	require.Equal(t, []byte{0x08, 0x00}, out[12:14], "outer Ethernet type IPv4")
	outer, udp, vxh, inner := out[14:34], out[34:42], out[42:50], out[50:]
	require.Equal(t, byte(0x45), outer[0])
	require.Equal(t, byte(2), outer[1], "the inner ECN field, CE as ECT(0)")
	require.Equal(t, uint16(len(out)-14), binary.BigEndian.Uint16(outer[2:]))
	require.Equal(t, []byte{0, 0}, outer[6:8], "no DF, as the device")
	require.Equal(t, byte(64), outer[8])
	require.Equal(t, byte(17), outer[9])
	require.Zero(t, csum(outer), "outer IPv4 header checksum")
	require.Equal(t, []byte(uplink4), outer[12:16], "from the uplink's address")
	require.Equal(t, []byte(node), outer[16:20], "to the node's")
	sport := binary.BigEndian.Uint16(udp[0:])
	require.GreaterOrEqual(t, sport, uint16(32768))
	require.Less(t, sport, uint16(60999))
	require.Equal(t, uint16(4789), binary.BigEndian.Uint16(udp[2:]))
	require.Equal(t, uint16(len(out)-34), binary.BigEndian.Uint16(udp[4:]))
	require.Equal(t, []byte{0, 0}, udp[6:8], "no UDP checksum over IPv4")
	require.Equal(t, []byte{0x08, 0, 0, 0, 0, 0, 7, 0}, vxh, "VXLAN: a VNI follows, 7")
	require.Equal(t, in[:12], inner[:12], "the pod's frame inside")
	require.Equal(t, byte(63), inner[14+8], "inner TTL decremented")
	require.Zero(t, csum(inner[14:34]), "inner IPv4 header checksum")
	require.Equal(t, in[34:], inner[34:], "the payload as sent")

	// A packet the outer headers would take past the uplink's MTU (a pod
	// MTU set too high): the device's way, which fragments the outer packet.
	var upMTU int
	require.NoError(t, e.n.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByIndex(e.up.Attrs().Index)
		if err == nil {
			upMTU = l.Attrs().MTU
		}
		return err
	}))
	seg := make([]byte, upMTU-20-cluster.OverheadIPv4+1) // one byte too many
	binary.BigEndian.PutUint16(seg[0:], 41006)
	binary.BigEndian.PutUint16(seg[2:], 80)
	seg[12], seg[13] = 5<<4, tcpACK
	big := append(ether(macWorld, macA, 0x0800), ipv4(ipA4, remote, 6, seg)...)
	before = e.count(t, maps.CniPktReasonREASON_TUNNEL_ENCAP)
	ret, out = e.runProgOut(t, from, a, big)
	require.Equal(t, uint32(tcActRedirect), ret)
	require.Equal(t, before+1, e.count(t, maps.CniPktReasonREASON_TUNNEL_ENCAP), "through the device")
	require.Len(t, out, len(big), "not encapsulated by the program")
	seg = seg[:len(seg)-1]
	big = append(ether(macWorld, macA, 0x0800), ipv4(ipA4, remote, 6, seg)...)
	before = e.count(t, maps.CniPktReasonREASON_TUNNEL_UPLINK)
	ret, out = e.runProgOut(t, from, a, big)
	require.Equal(t, uint32(tcActRedirect), ret)
	require.Equal(t, before+1, e.count(t, maps.CniPktReasonREASON_TUNNEL_UPLINK), "the largest that fits")
	require.Len(t, out, len(big)+cluster.OverheadIPv4)
	require.Equal(t, uint16(upMTU), binary.BigEndian.Uint16(out[14+2:]), "outer packet as long as the uplink's MTU")

	// The overlay's ingress: for a pod of the node, straight in.
	before = e.count(t, maps.CniPktReasonREASON_TUNNEL_DECAP)
	ret, out = e.runProg(t, cluster.HookFromTunnel.Name, vx.Attrs().Index, tcp4(macWorld, remote, ipA4, 80, 41003, tcpSYN))
	require.Equal(t, uint32(tcActRedirect), ret)
	require.Equal(t, before+1, e.count(t, maps.CniPktReasonREASON_TUNNEL_DECAP))
	require.Equal(t, []byte(macA), out[0:6])
	// Anything else to the stack.
	ret, _ = e.runProg(t, cluster.HookFromTunnel.Name, vx.Attrs().Index, tcp4(macWorld, remote, uplink4, 80, 41004, tcpSYN))
	require.Equal(t, uint32(tcActPass), ret)
}
