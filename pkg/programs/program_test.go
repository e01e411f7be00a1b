package programs_test

import (
	"bytes"
	"encoding/binary"
	"net"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/utils/sysctl"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
)

// skbCtx is the head of struct __sk_buff up to ifindex, the part
// BPF_PROG_TEST_RUN lets a caller set.
type skbCtx struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto, Priority, IngressIfindex, Ifindex uint32
}

const (
	tcActPass     = 0xffffffff // TC_ACT_UNSPEC (TCX_NEXT): handed on to the stack (lib/verdict.h)
	tcActShot     = 2
	tcActRedirect = 7
)

var (
	macA     = net.HardwareAddr{0x0e, 0, 0, 0, 0, 0xa}
	macB     = net.HardwareAddr{0x0e, 0, 0, 0, 0, 0xb}
	macWorld = net.HardwareAddr{0x0e, 0, 0, 0, 0, 0xf}
	ipA4     = net.ParseIP("10.0.0.2").To4()
	ipB4     = net.ParseIP("10.0.0.3").To4()
	ipA6     = net.ParseIP("fd00::2")
	ipB6     = net.ParseIP("fd00::3")
	gw4      = net.ParseIP("10.0.0.1").To4()
	world4   = net.ParseIP("198.51.100.7").To4()
	uplink4  = net.ParseIP("192.0.2.2").To4()
)

func csum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = (s >> 16) + (s & 0xffff)
	}
	return ^uint16(s)
}

func ether(dst, src net.HardwareAddr, proto uint16) []byte {
	b := append(append([]byte{}, dst...), src...)
	return binary.BigEndian.AppendUint16(b, proto)
}

// icmp4 is an Ethernet + IPv4 + ICMP echo packet.
func icmp4(srcMAC net.HardwareAddr, src, dst net.IP, ttl byte) []byte {
	ip := make([]byte, 20)
	ip[0], ip[8], ip[9] = 0x45, ttl, 1
	binary.BigEndian.PutUint16(ip[2:], 28)
	copy(ip[12:], src.To4())
	copy(ip[16:], dst.To4())
	binary.BigEndian.PutUint16(ip[10:], csum(ip))
	icmp := []byte{8, 0, 0, 0, 0, 1, 0, 1}
	binary.BigEndian.PutUint16(icmp[2:], csum(icmp))
	return append(append(ether(macWorld, srcMAC, 0x0800), ip...), icmp...)
}

// udp6 is an Ethernet + IPv6 + UDP packet (checksum not checked here).
func udp6(srcMAC net.HardwareAddr, src, dst net.IP, hop byte) []byte {
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], 8)
	ip[6], ip[7] = 17, hop
	copy(ip[8:], src.To16())
	copy(ip[24:], dst.To16())
	udp := []byte{0x30, 0x39, 0x30, 0x39, 0, 8, 0, 0}
	return append(append(ether(macWorld, srcMAC, 0x86dd), ip...), udp...)
}

// arpRequest asks for tip from (sha, sip), broadcast.
func arpRequest(sha net.HardwareAddr, sip, tip net.IP) []byte {
	b := ether(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, sha, 0x0806)
	b = append(b, 0, 1, 8, 0, 6, 4, 0, 1)
	b = append(append(b, sha...), sip.To4()...)
	b = append(append(b, make([]byte, 6)...), tip.To4()...)
	return b
}

// programEnv is a netns with two host veths whose endpoints are in the maps
// and an uplink with a static neighbour, for program-level runs.
type programEnv struct {
	n        ns.NetNS
	prog     *ebpf.Program
	progs    *programs.Set
	bpfRoot  string
	hA, hB   netlink.Link
	counters *ebpf.Map
}

func newProgramEnv(t testing.TB) *programEnv {
	bpfRoot, _, p := testPrograms(t)
	e := &programEnv{n: testutil.NetNS(t), prog: mustProg(t, p, endpoint.HookFromContainer.Name), progs: p, bpfRoot: bpfRoot}
	e.hA = testVeth(t, e.n, "hA")
	e.hB = testVeth(t, e.n, "hB")
	up := testVeth(t, e.n, "up")
	require.NoError(t, e.n.Do(func(ns.NetNS) error {
		for _, l := range []netlink.Link{e.hA, e.hB, up} {
			require.NoError(t, netlink.LinkSetUp(l))
		}
		peer, err := netlink.LinkByName("upp")
		require.NoError(t, err)
		require.NoError(t, netlink.LinkSetUp(peer))
		require.NoError(t, netlink.AddrAdd(up, &netlink.Addr{IPNet: &net.IPNet{IP: uplink4, Mask: net.CIDRMask(24, 32)}}))
		gw := net.ParseIP("192.0.2.1")
		require.NoError(t, netlink.NeighAdd(&netlink.Neigh{LinkIndex: up.Attrs().Index, IP: gw, HardwareAddr: macWorld, State: netlink.NUD_PERMANENT}))
		require.NoError(t, netlink.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Gw: gw}))
		_, err = sysctl.Sysctl("net/ipv4/ip_forward", "1")
		require.NoError(t, err)
		var errA error
		e.hA, errA = netlink.LinkByName("hA")
		require.NoError(t, errA)
		e.hB, errA = netlink.LinkByName("hB")
		return errA
	}))
	em, err := endpoint.MapsOf(openNode(t, bpfRoot))
	require.NoError(t, err)
	require.NoError(t, em.Put(&endpoint.Entry{HostIfIndex: e.hA.Attrs().Index, HostMAC: e.hA.Attrs().HardwareAddr, MAC: macA, IPs: []net.IP{ipA4, ipA6}, ContainerID: "a", IfName: "eth0"}))
	require.NoError(t, em.Put(&endpoint.Entry{HostIfIndex: e.hB.Attrs().Index, HostMAC: e.hB.Attrs().HardwareAddr, MAC: macB, IPs: []net.IP{ipB4, ipB6}, ContainerID: "b", IfName: "eth0"}))
	e.counters, err = ebpf.LoadPinnedMap(filepath.Join(maps.Dir(bpfRoot), maps.CniMapNodeCounters), nil)
	require.NoError(t, err)
	t.Cleanup(func() { e.counters.Close() })
	return e
}

// uplink is the env's uplink device.
func (e *programEnv) uplink(t testing.TB) netlink.Link {
	t.Helper()
	var up netlink.Link
	require.NoError(t, e.n.Do(func(ns.NetNS) error {
		var err error
		up, err = netlink.LinkByName("up")
		return err
	}))
	return up
}

// pinned opens maps pinned under the env's bpfRoot, closed at cleanup.
func (e *programEnv) pinned(t testing.TB, names ...string) map[string]*ebpf.Map {
	t.Helper()
	m, err := maps.OpenPinned(e.bpfRoot, names...)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, mm := range m {
			mm.Close()
		}
	})
	return m
}

// masquerade has the uplink masquerade network 0's IPv4 with its address
// and the ports min-max.
func (e *programEnv) masquerade(t testing.TB, up netlink.Link, min, max uint16) {
	t.Helper()
	m := e.pinned(t, maps.CniMapMasqNets, maps.CniMapUplinks)
	require.NoError(t, m[maps.CniMapMasqNets].Put(&maps.CniMasqNetKey{NetId: 0, Family: 4}, &maps.CniMasqNet{PortMin: min, PortMax: max}))
	var ui maps.CniUplinkInfo
	copy(ui.Ip4[:], uplink4)
	ui.Has4 = 1
	require.NoError(t, m[maps.CniMapUplinks].Put(uint32(up.Attrs().Index), &ui))
}

func (e *programEnv) count(t *testing.T, reason maps.CniPktReason) uint64 {
	var vals []maps.CniDirCounters
	require.NoError(t, e.counters.Lookup(uint32(reason), &vals))
	var n uint64
	for _, v := range vals {
		for _, d := range v.ByDir {
			n += d.Packets
		}
	}
	return n
}

// run runs the program on pkt as if it arrived on ifindex.
func (e *programEnv) run(t *testing.T, ifindex int, pkt []byte) (uint32, []byte) {
	var ret uint32
	out := make([]byte, len(pkt)+256)
	require.NoError(t, e.n.Do(func(ns.NetNS) error {
		var err error
		ret, err = e.prog.Run(&ebpf.RunOptions{Data: pkt, DataOut: out, Context: skbCtx{Ifindex: uint32(ifindex)}})
		return err
	}))
	return ret, out[:len(pkt)]
}

// TestFromContainer runs the program on crafted packets: forwarding,
// answering ARP, and every drop reason.
func TestFromContainer(t *testing.T) {
	e := newProgramEnv(t)
	a, b := e.hA.Attrs(), e.hB.Attrs()
	tests := []struct {
		name    string
		ifindex int
		pkt     []byte
		ret     uint32
		reason  maps.CniPktReason
		check   func(t *testing.T, out []byte)
	}{
		{"pod to pod v4", a.Index, icmp4(macA, ipA4, ipB4, 64), tcActRedirect, maps.CniPktReasonREASON_REDIRECT, func(t *testing.T, out []byte) {
			require.Equal(t, []byte(macB), out[0:6], "dst MAC is the peer pod's")
			require.Equal(t, []byte(b.HardwareAddr), out[6:12], "src MAC is the peer's gateway")
			require.Equal(t, byte(63), out[14+8], "TTL decremented")
			require.Zero(t, csum(out[14:34]), "IPv4 checksum still valid")
		}},
		{"pod to pod v6", a.Index, udp6(macA, ipA6, ipB6, 64), tcActRedirect, maps.CniPktReasonREASON_REDIRECT, func(t *testing.T, out []byte) {
			require.Equal(t, []byte(macB), out[0:6])
			require.Equal(t, byte(63), out[14+7], "hop limit decremented")
		}},
		{"ttl 1 goes to the stack", a.Index, icmp4(macA, ipA4, ipB4, 1), tcActPass, maps.CniPktReasonREASON_PASS, nil},
		{"to the node", a.Index, icmp4(macA, ipA4, uplink4, 64), tcActPass, maps.CniPktReasonREASON_PASS, nil},
		{"to the world via fib", a.Index, icmp4(macA, ipA4, world4, 64), tcActRedirect, maps.CniPktReasonREASON_FIB_REDIRECT, func(t *testing.T, out []byte) {
			require.Equal(t, []byte(macWorld), out[0:6], "next hop's MAC from the neighbour table")
			require.Equal(t, byte(63), out[14+8])
			require.Zero(t, csum(out[14:34]))
		}},
		{"arp for the gateway", a.Index, arpRequest(macA, ipA4, gw4), tcActRedirect, maps.CniPktReasonREASON_ARP_REPLY, func(t *testing.T, out []byte) {
			require.Equal(t, []byte(macA), out[0:6])
			require.Equal(t, []byte{0, 2}, out[20:22], "ARP reply")
			require.Equal(t, []byte(a.HardwareAddr), out[22:28], "gateway MAC is the host veth's")
			require.Equal(t, []byte(gw4), out[28:32])
			require.Equal(t, []byte(ipA4), out[38:42])
		}},
		{"v6 link-local source passes", a.Index, udp6(macA, net.ParseIP("fe80::1234"), net.ParseIP("ff02::1:ff00:1"), 255), tcActPass, maps.CniPktReasonREASON_PASS, nil},
		{"spoofed v4 source", a.Index, icmp4(macA, ipB4, ipA4, 64), tcActShot, maps.CniPktReasonREASON_DROP_SPOOF_SRC, nil},
		{"unknown v4 source", a.Index, icmp4(macA, net.ParseIP("10.9.9.9"), ipB4, 64), tcActShot, maps.CniPktReasonREASON_DROP_SPOOF_SRC, nil},
		{"spoofed v6 source", a.Index, udp6(macA, ipB6, ipA6, 64), tcActShot, maps.CniPktReasonREASON_DROP_SPOOF_SRC, nil},
		{"spoofed MAC", a.Index, icmp4(macB, ipA4, ipB4, 64), tcActShot, maps.CniPktReasonREASON_DROP_SPOOF_MAC, nil},
		{"arp with a spoofed sender", a.Index, arpRequest(macA, ipB4, gw4), tcActShot, maps.CniPktReasonREASON_DROP_SPOOF_SRC, nil},
		{"arp with a spoofed sender MAC", a.Index, arpRequest(macB, ipA4, gw4), tcActShot, maps.CniPktReasonREASON_DROP_SPOOF_MAC, nil},
		{"truncated ARP", a.Index, arpRequest(macA, ipA4, gw4)[:24], tcActShot, maps.CniPktReasonREASON_DROP_MALFORMED, nil},
		{"device without endpoint", 1, icmp4(macA, ipA4, ipB4, 64), tcActShot, maps.CniPktReasonREASON_DROP_NO_ENDPOINT, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := e.count(t, tc.reason)
			ret, out := e.run(t, tc.ifindex, bytes.Clone(tc.pkt))
			require.Equal(t, tc.ret, ret)
			require.Equal(t, before+1, e.count(t, tc.reason), "counted under %v", tc.reason)
			if tc.check != nil {
				tc.check(t, out)
			}
		})
	}
}
