package programs_test

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/nodetest"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/flows"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/uplink"
)

// TestBypassPrograms runs from_container on crafted packets for the flows
// set up in BPF (bpf/lib/xlat.h): while the node agent's lease runs, a new
// flow to a destination outside the set of those netfilter may translate
// is fast from its first packet; a destination in the set, or any once the
// lease is over, meets netfilter first as before.
func TestBypassPrograms(t *testing.T) {
	e := newFlowEnv(t)
	a := e.hA.Attrs().Index
	from := endpoint.HookFromContainer.Name
	set, err := flows.OpenTranslated(nodetest.Handle(t, e.bpfRoot, t.TempDir()))
	require.NoError(t, err)
	svc := netip.MustParsePrefix("10.96.0.0/16")
	want := flows.Set{}
	want.Add(svc, maps.CniXlatKindXLAT_SERVICE_RANGE)
	require.NoError(t, set.Write(want))

	t.Run("no lease: every new flow meets netfilter", func(t *testing.T) {
		ret, _ := e.runProg(t, from, a, tcp4(macA, ipA4, world4, 42000, 80, tcpSYN))
		require.Equal(t, uint32(tcActPass), ret, "written but never leased: the SYN goes to the stack")
		f, _ := e.flow(t, ipA4, 42000, world4, 80, 6)
		require.Equal(t, maps.CniFlowVerdictFLOW_PENDING, f.Verdict)
	})

	require.NoError(t, set.Renew(time.Minute))
	l, err := set.Lease()
	require.NoError(t, err)
	require.True(t, l.Valid())
	require.Equal(t, uint32(1), l.Entries)

	t.Run("a destination outside the set: fast from the first packet", func(t *testing.T) {
		before := e.count(t, maps.CniPktReasonREASON_FLOW_NEW)
		ret, out := e.runProg(t, from, a, tcp4(macA, ipA4, world4, 42001, 80, tcpSYN))
		require.Equal(t, uint32(tcActRedirect), ret, "the SYN takes the fast path")
		require.Equal(t, []byte(macWorld), out[0:6])
		_, ok := e.flow(t, ipA4, 42001, world4, 80, 6)
		require.False(t, ok, "its verdict is to_netdev's to keep (TestBypassNATPrograms)")
		ret, _ = e.runProg(t, from, a, tcp4(macA, ipA4, world4, 42001, 80, tcpACK))
		require.Equal(t, uint32(tcActRedirect), ret)
		require.Equal(t, before, e.count(t, maps.CniPktReasonREASON_FLOW_NEW), "nothing handed to netfilter")
	})

	t.Run("a destination in the set meets netfilter", func(t *testing.T) {
		ret, _ := e.runProg(t, from, a, tcp4(macA, ipA4, netip.MustParseAddr("10.96.3.4").AsSlice(), 42002, 80, tcpSYN))
		require.Equal(t, uint32(tcActPass), ret)
		f, _ := e.flow(t, ipA4, 42002, netip.MustParseAddr("10.96.3.4").AsSlice(), 80, 6)
		require.Equal(t, maps.CniFlowVerdictFLOW_PENDING, f.Verdict)
	})

	t.Run("a UDP flow whose destination joins the set meets netfilter", func(t *testing.T) {
		ret, _ := e.runProg(t, from, a, udp4(macA, ipA4, world4, 5400, 53))
		require.Equal(t, uint32(tcActRedirect), ret)
		f, _ := e.flow(t, ipA4, 5400, world4, 53, 17)
		require.Equal(t, maps.CniFlowFlagsFLOW_F_BYPASS, f.Flags)
		ret, _ = e.runProg(t, from, a, udp4(macA, ipA4, world4, 5400, 53))
		require.Equal(t, uint32(tcActRedirect), ret, "conntrack is not asked: it has no entry of a flow set up in BPF")
		// The world address becomes an externalIP.
		grown := flows.Set{}
		grown.Add(svc, maps.CniXlatKindXLAT_SERVICE_RANGE)
		grown.AddAddr(netip.AddrFrom4([4]byte(world4)), maps.CniXlatKindXLAT_EXTERNAL_IP)
		require.NoError(t, set.Write(grown))
		ret, _ = e.runProg(t, from, a, udp4(macA, ipA4, world4, 5400, 53))
		require.Equal(t, uint32(tcActPass), ret, "to the stack, where kube-proxy's rules decide")
		f, _ = e.flow(t, ipA4, 5400, world4, 53, 17)
		require.Equal(t, maps.CniFlowVerdictFLOW_PENDING, f.Verdict)
		require.Zero(t, f.Flags&maps.CniFlowFlagsFLOW_F_BYPASS)
		require.NoError(t, set.Write(want))
	})

	t.Run("an expired lease: every new flow meets netfilter", func(t *testing.T) {
		require.NoError(t, set.Expire())
		ret, _ := e.runProg(t, from, a, tcp4(macA, ipA4, world4, 42003, 80, tcpSYN))
		require.Equal(t, uint32(tcActPass), ret)
		f, _ := e.flow(t, ipA4, 42003, world4, 80, 6)
		require.Equal(t, maps.CniFlowVerdictFLOW_PENDING, f.Verdict)
		// A UDP flow set up in BPF meets it at its next packet.
		ret, _ = e.runProg(t, from, a, udp4(macA, ipA4, world4, 5401, 53))
		require.Equal(t, uint32(tcActPass), ret)
		require.NoError(t, set.Renew(time.Minute))
		ret, _ = e.runProg(t, from, a, udp4(macA, ipA4, world4, 5402, 53))
		require.Equal(t, uint32(tcActRedirect), ret)
		require.NoError(t, set.Renew(-time.Second))
		ret, _ = e.runProg(t, from, a, udp4(macA, ipA4, world4, 5402, 53))
		require.Equal(t, uint32(tcActPass), ret, "the lease ran out: to the stack")
	})
}

// TestBypassNATPrograms: a TCP flow set up in BPF and masqueraded keeps
// its verdict in its NAT OUT entry (NAT_F_BYPASS), not in flows: its SYN
// writes nothing there (an earlier connection's entry of the tuple goes),
// its next packets and its replies take the fast path without looking it
// up or writing it, until the stack delivers a packet of it (to_container),
// which sends it through the stack both ways. A run here cannot carry the
// SYN's tc_index to to_netdev (BPF_PROG_TEST_RUN takes none), so the flag
// is written as to_netdev writes it; test/k8s's TestBypass sends real
// packets through both.
func TestBypassNATPrograms(t *testing.T) {
	e := newFlowEnv(t)
	e.masquerade(t, e.up, 61000, 65535)
	a := e.hA.Attrs().Index
	up := e.up.Attrs().Index
	from := endpoint.HookFromContainer.Name
	m := e.pinned(t, maps.CniMapNat)
	set, err := flows.OpenTranslated(nodetest.Handle(t, e.bpfRoot, t.TempDir()))
	require.NoError(t, err)
	require.NoError(t, set.Write(flows.Set{}))
	require.NoError(t, set.Renew(time.Minute))
	bypass := uint8(maps.CniNatFlagsNAT_F_BYPASS)
	key := func(port uint16) maps.CniNatKey {
		return maps.CniNatKey{Family: 4, Proto: 6, Dir: uint8(maps.CniNatDirNAT_DIR_OUT), Sport: maps.Port(port), Dport: maps.Port(80),
			Saddr: maps.Addr16(ipA4), Daddr: maps.Addr16(world4)}
	}
	entry := func(port uint16) maps.CniNatEntry {
		t.Helper()
		var v maps.CniNatEntry
		require.NoError(t, m[maps.CniMapNat].Lookup(key(port), &v))
		return v
	}
	// open runs a connection's SYN through from_container and to_netdev
	// and flags its entry as a marked SYN makes to_netdev do; it returns
	// the translated port.
	open := func(port uint16) uint16 {
		t.Helper()
		ret, _ := e.runProg(t, from, a, tcp4(macA, ipA4, world4, port, 80, tcpSYN))
		require.Equal(t, uint32(tcActRedirect), ret, "the SYN takes the fast path")
		_, ok := e.flow(t, ipA4, port, world4, 80, 6)
		require.False(t, ok, "a TCP flow set up in BPF gets no entry in flows")
		ret, out := e.runProg(t, uplink.HookToNetdev.Name, up, tcp4(macA, ipA4, world4, port, 80, tcpSYN))
		require.Equal(t, uint32(tcActPass), ret)
		v := entry(port)
		v.Flags |= bypass
		require.NoError(t, m[maps.CniMapNat].Put(key(port), &v))
		return binary.BigEndian.Uint16(out[34:])
	}

	flowNew := e.count(t, maps.CniPktReasonREASON_FLOW_NEW)
	port := open(42100)
	ret, out := e.runProg(t, uplink.HookFromNetdev.Name, up, tcp4(macWorld, world4, uplink4, 80, port, tcpSYNACK))
	require.Equal(t, uint32(tcActRedirect), ret, "its SYN-ACK goes into the pod")
	require.Equal(t, ipA4.To4(), net.IP(out[14+16:14+20]))
	for i := 0; i < 3; i++ {
		ret, out = e.runProg(t, from, a, tcp4(macA, ipA4, world4, 42100, 80, tcpACK))
		require.Equal(t, uint32(tcActRedirect), ret, "packet %d: the fast path", i)
		require.Equal(t, uplink4.To4(), net.IP(out[14+12:14+16]), "packet %d: translated by from_container", i)
		ret, _ = e.runProg(t, uplink.HookFromNetdev.Name, up, tcp4(macWorld, world4, uplink4, 80, port, tcpACK))
		require.Equal(t, uint32(tcActRedirect), ret, "reply %d: into the pod", i)
	}
	// A pod the stack delivered flows to (EP_F_STACK: it talks to
	// Services) looks its flows up first: the flow is missing there, its
	// NAT entry says fast.
	devs := e.pinned(t, maps.CniMapEndpointDevs)[maps.CniMapEndpointDevs]
	setStack := func(on bool) {
		t.Helper()
		var d maps.CniEndpointDev
		require.NoError(t, devs.Lookup(uint32(a), &d))
		d.Flags &^= uint16(maps.CniEndpointFlagsEP_F_STACK)
		if on {
			d.Flags |= uint16(maps.CniEndpointFlagsEP_F_STACK)
		}
		require.NoError(t, devs.Put(uint32(a), &d))
	}
	setStack(true)
	ret, out = e.runProg(t, from, a, tcp4(macA, ipA4, world4, 42100, 80, tcpACK))
	require.Equal(t, uint32(tcActRedirect), ret, "a pod with flows through the stack: the fast path")
	require.Equal(t, uplink4.To4(), net.IP(out[14+12:14+16]), "translated by from_container")
	setStack(false)
	_, ok := e.flow(t, ipA4, 42100, world4, 80, 6)
	require.False(t, ok, "neither the pod's packets nor the replies wrote its flow")
	require.Equal(t, flowNew, e.count(t, maps.CniPktReasonREASON_FLOW_NEW), "nothing handed to netfilter")
	require.Equal(t, uint8(maps.CniNatStateNAT_STATE_ESTABLISHED), entry(42100).State)

	// A chained plugin's ingress qdisc on the pod's veth (its filters
	// want the pod's packets, the stack forwards them after): through the
	// stack both ways (flow_via_stack, as for a packet the stack delivers
	// to the pod, which a run here cannot make: its skb has a socket).
	ingress := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: a, Parent: netlink.HANDLE_INGRESS, Handle: netlink.MakeHandle(0xffff, 0)}}
	require.NoError(t, e.n.Do(func(ns.NetNS) error { return netlink.QdiscAdd(ingress) }))
	ret, _ = e.runProg(t, from, a, tcp4(macA, ipA4, world4, 42100, 80, tcpACK))
	require.Equal(t, uint32(tcActPass), ret, "to the other plugin's qdisc")
	require.NoError(t, e.n.Do(func(ns.NetNS) error { return netlink.QdiscDel(ingress) }))
	f, ok := e.flow(t, ipA4, 42100, world4, 80, 6)
	require.True(t, ok)
	require.Equal(t, maps.CniFlowVerdictFLOW_STACK, f.Verdict)
	require.Zero(t, entry(42100).Flags&(bypass|uint8(maps.CniNatFlagsNAT_F_FAST)), "its NAT entry no longer says fast")
	ret, _ = e.runProg(t, from, a, tcp4(macA, ipA4, world4, 42100, 80, tcpACK))
	require.Equal(t, uint32(tcActPass), ret, "the pod's packets go to the stack")
	ret, _ = e.runProg(t, uplink.HookFromNetdev.Name, up, tcp4(macWorld, world4, uplink4, 80, port, tcpACK))
	require.Equal(t, uint32(tcActPass), ret, "and so do the replies")

	// A new connection on the tuple: the earlier one's entry in flows
	// goes; a SYN to_netdev gets unmarked (it met netfilter) clears the
	// flag.
	ret, _ = e.runProg(t, from, a, tcp4(macA, ipA4, world4, 42100, 80, tcpSYN))
	require.Equal(t, uint32(tcActRedirect), ret)
	_, ok = e.flow(t, ipA4, 42100, world4, 80, 6)
	require.False(t, ok, "the earlier connection's verdict is gone")
	v := entry(42100)
	v.Flags |= bypass
	require.NoError(t, m[maps.CniMapNat].Put(key(42100), &v))
	_, _ = e.runProg(t, uplink.HookToNetdev.Name, up, tcp4(macA, ipA4, world4, 42100, 80, tcpSYN))
	require.Zero(t, entry(42100).Flags&bypass, "an unmarked SYN: not set up in BPF")

	// A UDP flow keeps its entry in flows (its destination is asked
	// again at every packet).
	ret, _ = e.runProg(t, from, a, udp4(macA, ipA4, world4, 5500, 53))
	require.Equal(t, uint32(tcActRedirect), ret)
	f, ok = e.flow(t, ipA4, 5500, world4, 53, 17)
	require.True(t, ok)
	require.Equal(t, maps.CniFlowFlagsFLOW_F_BYPASS, f.Flags)
}
