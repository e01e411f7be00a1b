package programs_test

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/uplink"
)

// l4sum is the one's-complement sum of an IPv4 pseudo-header and segment:
// 0 when the segment's checksum is right.
func l4sum(src, dst net.IP, proto byte, seg []byte) uint16 {
	ph := append(append(append([]byte{}, src.To4()...), dst.To4()...), 0, proto)
	ph = binary.BigEndian.AppendUint16(ph, uint16(len(seg)))
	return csum(append(ph, seg...))
}

func ipv4(src, dst net.IP, proto byte, payload []byte) []byte {
	ip := make([]byte, 20)
	ip[0], ip[8], ip[9] = 0x45, 64, proto
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(payload)))
	copy(ip[12:], src.To4())
	copy(ip[16:], dst.To4())
	binary.BigEndian.PutUint16(ip[10:], csum(ip))
	return append(ip, payload...)
}

// tcp4 is an Ethernet + IPv4 + TCP segment with correct checksums.
func tcp4(srcMAC net.HardwareAddr, src, dst net.IP, sport, dport uint16, flags byte) []byte {
	seg := make([]byte, 20)
	binary.BigEndian.PutUint16(seg[0:], sport)
	binary.BigEndian.PutUint16(seg[2:], dport)
	seg[12], seg[13] = 5<<4, flags
	binary.BigEndian.PutUint16(seg[14:], 64240)
	binary.BigEndian.PutUint16(seg[16:], l4sum(src, dst, 6, seg))
	return append(ether(macWorld, srcMAC, 0x0800), ipv4(src, dst, 6, seg)...)
}

// TestNATPrograms runs to_netdev and from_netdev on crafted packets: the
// translation both ways keeps every checksum right (veths do not verify
// them, so the namespace tests would not notice), and an ICMP error about
// the flow reaches the pod with its quoted header translated too.
func TestNATPrograms(t *testing.T) {
	e := newProgramEnv(t)
	p := e.progs
	up := e.uplink(t)
	e.masquerade(t, up, 61000, 65535)

	run := func(prog *ebpf.Program, pkt []byte) (uint32, []byte) {
		var ret uint32
		out := make([]byte, len(pkt)+256)
		require.NoError(t, e.n.Do(func(ns.NetNS) error {
			var err error
			ret, err = prog.Run(&ebpf.RunOptions{Data: pkt, DataOut: out, Context: skbCtx{Ifindex: uint32(up.Attrs().Index)}})
			return err
		}))
		return ret, out[:len(pkt)]
	}
	toNetdev, fromNetdev := mustProg(t, p, uplink.HookToNetdev.Name), mustProg(t, p, uplink.HookFromNetdev.Name)

	// Out: the pod's SYN leaves with the node's address, port kept.
	before := e.count(t, maps.CniPktReasonREASON_SNAT)
	ret, out := run(toNetdev, tcp4(macA, ipA4, world4, 40000, 80, 0x02))
	require.Equal(t, uint32(tcActPass), ret)
	require.Equal(t, before+1, e.count(t, maps.CniPktReasonREASON_SNAT))
	ip := out[14:34]
	require.Equal(t, []byte(uplink4), ip[12:16], "source is the node's")
	require.Zero(t, csum(ip), "IPv4 header checksum")
	require.Equal(t, uint16(40000), binary.BigEndian.Uint16(out[34:]), "a free port is kept")
	require.Zero(t, l4sum(uplink4, world4, 6, out[34:]), "TCP checksum after SNAT")

	// In: the SYN-ACK goes to the pod, translated back.
	ret, out = run(fromNetdev, tcp4(macWorld, world4, uplink4, 80, 40000, 0x12))
	require.Equal(t, uint32(tcActRedirect), ret)
	require.Equal(t, []byte(macA), out[0:6])
	require.Equal(t, []byte(ipA4), out[14+16:14+20], "destination is the pod's")
	require.Zero(t, csum(out[14:34]))
	require.Zero(t, l4sum(world4, ipA4, 6, out[34:]), "TCP checksum after reverse SNAT")

	// An ICMP fragmentation-needed about the flow, quoting what left.
	quoted := ipv4(uplink4, world4, 6, []byte{0x9c, 0x40, 0, 80, 0, 0, 0, 1})
	icmp := append([]byte{3, 4, 0, 0, 0, 0, 0x05, 0x00}, quoted...)
	binary.BigEndian.PutUint16(icmp[2:], csum(icmp))
	ret, out = run(fromNetdev, append(ether(macA, macWorld, 0x0800), ipv4(world4, uplink4, 1, icmp)...))
	require.Equal(t, uint32(tcActRedirect), ret)
	require.Equal(t, []byte(ipA4), out[30:34], "outer destination is the pod")
	require.Zero(t, csum(out[14:34]))
	inner := out[34+8:]
	require.Equal(t, []byte(ipA4), inner[12:16], "quoted source is the pod")
	require.Zero(t, csum(inner[:20]), "quoted header checksum")
	require.Equal(t, uint16(40000), binary.BigEndian.Uint16(inner[20:]))
	require.Zero(t, csum(out[34:]), "ICMP checksum")

	// The node's own traffic passes both ways untouched.
	pkt := tcp4(macWorld, uplink4, world4, 50000, 80, 0x02)
	ret, out = run(toNetdev, bytes.Clone(pkt))
	require.Equal(t, uint32(tcActPass), ret)
	require.Equal(t, pkt, out)
	pkt = tcp4(macWorld, world4, uplink4, 80, 50001, 0x12)
	ret, out = run(fromNetdev, bytes.Clone(pkt))
	require.Equal(t, uint32(tcActPass), ret)
	require.Equal(t, pkt, out)
}

// TestNATEstablishedRechecks: a packet of a translated flow in the same
// second as the flow's last one takes to_netdev's short path (its
// translation stands); the first packet of a later second takes the whole
// path again, so a change of the node's address (written by the next ADD)
// reaches a live flow: it starts over from the new address.
func TestNATEstablishedRechecks(t *testing.T) {
	e := newProgramEnv(t)
	up := e.uplink(t)
	e.masquerade(t, up, 61000, 65535)
	toNetdev := mustProg(t, e.progs, uplink.HookToNetdev.Name)
	m := e.pinned(t, maps.CniMapNat, maps.CniMapUplinks)
	run := func(pkt []byte) []byte {
		t.Helper()
		out := make([]byte, len(pkt)+256)
		require.NoError(t, e.n.Do(func(ns.NetNS) error {
			ret, err := toNetdev.Run(&ebpf.RunOptions{Data: pkt, DataOut: out, Context: skbCtx{Ifindex: uint32(up.Attrs().Index)}})
			if err == nil && ret != tcActPass {
				t.Fatalf("to_netdev returned %d", ret)
			}
			return err
		}))
		return out[:len(pkt)]
	}
	source := func(out []byte) net.IP {
		t.Helper()
		require.Zero(t, csum(out[14:34]), "IPv4 header checksum")
		require.Zero(t, l4sum(out[14+12:14+16], world4, 6, out[34:]), "TCP checksum")
		return net.IP(out[14+12 : 14+16])
	}
	require.Equal(t, uplink4, source(run(tcp4(macA, ipA4, world4, 40100, 80, 0x02))), "the SYN")
	before := e.count(t, maps.CniPktReasonREASON_SNAT)
	require.Equal(t, uplink4, source(run(tcp4(macA, ipA4, world4, 40100, 80, 0x10))), "an ACK")
	require.Equal(t, before+1, e.count(t, maps.CniPktReasonREASON_SNAT), "counted as translated")

	// The node's address moves; the flow's last packet is two seconds
	// old (its entry aged by hand: a test cannot wait for a second's
	// boundary without timing itself).
	moved := net.ParseIP("192.0.2.3").To4()
	var ui maps.CniUplinkInfo
	copy(ui.Ip4[:], moved)
	ui.Has4 = 1
	require.NoError(t, m[maps.CniMapUplinks].Put(uint32(up.Attrs().Index), &ui))
	key := maps.CniNatKey{Family: 4, Proto: 6, Dir: uint8(maps.CniNatDirNAT_DIR_OUT), Sport: maps.Port(40100), Dport: maps.Port(80),
		Saddr: maps.Addr16(ipA4), Daddr: maps.Addr16(world4)}
	var v maps.CniNatEntry
	require.NoError(t, m[maps.CniMapNat].Lookup(&key, &v))
	v.LastSeen -= 2 << 30
	require.NoError(t, m[maps.CniMapNat].Put(&key, &v))
	require.Equal(t, moved, source(run(tcp4(macA, ipA4, world4, 40100, 80, 0x10))), "the first packet of a later second")
	require.NoError(t, m[maps.CniMapNat].Lookup(&key, &v))
	require.Equal(t, maps.Addr16(moved), v.Addr, "the flow started over from the new address")
}

// TestNATFromContainer: a packet of a flow to_netdev masqueraded, in the
// same second as its last one, leaves from_container translated already
// (bpf/lib/conntrack.h: nat_established), checksums right, its flow's
// clock and state kept; its SYN, and every packet where NetworkPolicy is
// on, leave it as the pod sent them, for to_netdev.
func TestNATFromContainer(t *testing.T) {
	e := newFlowEnv(t)
	e.masquerade(t, e.up, 61000, 65535)
	a := e.hA.Attrs().Index
	from := endpoint.HookFromContainer.Name
	m := e.pinned(t, maps.CniMapNat, maps.CniMapPolicyConfig)
	source := func(out []byte) (net.IP, uint16) {
		t.Helper()
		require.Zero(t, csum(out[14:34]), "IPv4 header checksum")
		require.Zero(t, l4sum(out[14+12:14+16], world4, 6, out[34:]), "TCP checksum")
		return net.IP(out[14+12 : 14+16]), binary.BigEndian.Uint16(out[34:])
	}
	key := maps.CniNatKey{Family: 4, Proto: 6, Dir: uint8(maps.CniNatDirNAT_DIR_OUT), Sport: maps.Port(40300), Dport: maps.Port(80),
		Saddr: maps.Addr16(ipA4), Daddr: maps.Addr16(world4)}

	// The pod's SYN goes through the stack (its flow is new) as the pod
	// sent it; to_netdev translates it, which makes the entry, and
	// settles its flow on the fast path (conntrack does not track it).
	ret, out := e.runProg(t, from, a, tcp4(macA, ipA4, world4, 40300, 80, tcpSYN))
	require.Equal(t, uint32(tcActPass), ret)
	ip, _ := source(out)
	require.Equal(t, ipA4.To4(), ip, "the SYN leaves from_container as the pod sent it")
	ret, out = e.runProg(t, uplink.HookToNetdev.Name, e.up.Attrs().Index, tcp4(macA, ipA4, world4, 40300, 80, tcpSYN))
	require.Equal(t, uint32(tcActPass), ret)
	ip, port := source(out)
	require.Equal(t, uplink4.To4(), ip)
	var v maps.CniNatEntry
	require.NoError(t, m[maps.CniMapNat].Lookup(&key, &v))
	require.Equal(t, maps.Port(port), v.Port, "the entry holds the translated port")

	// Its next packets: translated where they leave the pod's veth.
	v.LastSeen = maps.Monotonic()
	require.NoError(t, m[maps.CniMapNat].Put(&key, &v))
	ret, out = e.runProg(t, from, a, tcp4(macA, ipA4, world4, 40300, 80, tcpACK))
	require.Equal(t, uint32(tcActRedirect), ret)
	require.Equal(t, []byte(macWorld), out[0:6], "routed out of the uplink")
	ip, p := source(out)
	require.Equal(t, uplink4.To4(), ip, "translated by from_container")
	require.Equal(t, port, p)
	require.Equal(t, byte(63), out[14+8], "TTL decremented too")
	var after maps.CniNatEntry
	require.NoError(t, m[maps.CniMapNat].Lookup(&key, &after))
	require.GreaterOrEqual(t, after.LastSeen, v.LastSeen, "the flow's clock")
	fast := uint8(maps.CniNatFlagsNAT_F_FAST)
	require.Equal(t, fast, after.Flags&fast, "on the fast path: its replies skip the flow lookup")

	// A reply: into the pod, translated back.
	ret, out = e.runProg(t, uplink.HookFromNetdev.Name, e.up.Attrs().Index, tcp4(macWorld, world4, uplink4, 80, port, tcpACK))
	require.Equal(t, uint32(tcActRedirect), ret, "the reply goes into the pod")
	require.Equal(t, ipA4.To4(), net.IP(out[14+16:14+20]))

	// A packet of the flow that reaches to_netdev untranslated (the
	// stack forwarded it) turns that off: its replies look the flow up
	// again, which may send them to the stack.
	_, out = e.runProg(t, uplink.HookToNetdev.Name, e.up.Attrs().Index, tcp4(macA, ipA4, world4, 40300, 80, tcpACK))
	ip, _ = source(out)
	require.Equal(t, uplink4.To4(), ip)
	require.NoError(t, m[maps.CniMapNat].Lookup(&key, &after))
	require.Zero(t, after.Flags&fast, "to_netdev saw the flow's packet: its replies look its flow up")
	e.putFlow(t, ipA4, 40300, world4, 80, maps.CniFlowVerdictFLOW_STACK)
	ret, _ = e.runProg(t, uplink.HookFromNetdev.Name, e.up.Attrs().Index, tcp4(macWorld, world4, uplink4, 80, port, tcpACK))
	require.Equal(t, uint32(tcActPass), ret, "a reply of a flow through the stack goes to the stack")
	e.putFlow(t, ipA4, 40300, world4, 80, maps.CniFlowVerdictFLOW_FAST)
	require.NoError(t, m[maps.CniMapNat].Lookup(&key, &after))
	ret, _ = e.runProg(t, from, a, tcp4(macA, ipA4, world4, 40300, 80, 0x11))
	require.Equal(t, uint32(tcActRedirect), ret)
	require.NoError(t, m[maps.CniMapNat].Lookup(&key, &after))
	require.Equal(t, uint8(maps.CniNatStateNAT_STATE_CLOSING), after.State, "its FIN tracked")

	// The first packet of a later second: to_netdev looks at it whole.
	after.LastSeen -= 2 << 30
	require.NoError(t, m[maps.CniMapNat].Put(&key, &after))
	_, out = e.runProg(t, from, a, tcp4(macA, ipA4, world4, 40300, 80, tcpACK))
	ip, _ = source(out)
	require.Equal(t, ipA4.To4(), ip, "a packet of a later second is left to to_netdev")

	// NetworkPolicy on: to_netdev decides the flow by the pod's tuple.
	require.NoError(t, m[maps.CniMapNat].Lookup(&key, &after))
	after.LastSeen = maps.Monotonic()
	require.NoError(t, m[maps.CniMapNat].Put(&key, &after))
	require.NoError(t, m[maps.CniMapPolicyConfig].Put(uint32(0), &maps.CniPolicySettings{Active: 1}))
	t.Cleanup(func() { _ = m[maps.CniMapPolicyConfig].Put(uint32(0), &maps.CniPolicySettings{}) })
	_, out = e.runProg(t, from, a, tcp4(macA, ipA4, world4, 40300, 80, tcpACK))
	ip, _ = source(out)
	require.Equal(t, ipA4.To4(), ip, "with NetworkPolicy on, to_netdev translates")
}

// TestNATNodeSocketWins: a reply of an established masqueraded flow that
// kept the pod's port is the pod's, without a socket lookup; once a
// connection of the node from that port to that peer is answered (its
// SYN-ACK), the node's socket wins, and so it does for the tuple's later
// replies: the flow is left closing.
func TestNATNodeSocketWins(t *testing.T) {
	e := newFlowEnv(t)
	e.masquerade(t, e.up, 61000, 65535)
	m := e.pinned(t, maps.CniMapNat)
	up := e.up.Attrs().Index
	from := uplink.HookFromNetdev.Name
	key := maps.CniNatKey{Family: 4, Proto: 6, Dir: uint8(maps.CniNatDirNAT_DIR_OUT), Sport: maps.Port(40400), Dport: maps.Port(80),
		Saddr: maps.Addr16(ipA4), Daddr: maps.Addr16(world4)}
	state := func() uint8 {
		t.Helper()
		var v maps.CniNatEntry
		require.NoError(t, m[maps.CniMapNat].Lookup(&key, &v))
		return v.State
	}

	// The pod's connection, its port kept, answered and established.
	ret, out := e.runProg(t, uplink.HookToNetdev.Name, up, tcp4(macA, ipA4, world4, 40400, 80, tcpSYN))
	require.Equal(t, uint32(tcActPass), ret)
	require.Equal(t, uint16(40400), binary.BigEndian.Uint16(out[34:]), "the pod's port kept")
	ret, _ = e.runProg(t, from, up, tcp4(macWorld, world4, uplink4, 80, 40400, tcpSYNACK))
	require.Equal(t, uint32(tcActRedirect), ret, "the SYN-ACK goes to the pod")
	require.Equal(t, uint8(maps.CniNatStateNAT_STATE_ESTABLISHED), state())
	ret, _ = e.runProg(t, from, up, tcp4(macWorld, world4, uplink4, 80, 40400, tcpACK))
	require.Equal(t, uint32(tcActRedirect), ret)

	// A connection of the node from the same port to the same peer (its
	// SYN left as the node's own: nothing answers it here, it stays
	// SYN_SENT).
	require.NoError(t, e.n.Do(func(ns.NetNS) error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		t.Cleanup(func() { unix.Close(fd) })
		var local, peer unix.SockaddrInet4
		local.Port, peer.Port = 40400, 80
		copy(local.Addr[:], uplink4.To4())
		copy(peer.Addr[:], world4.To4())
		if err := unix.Bind(fd, &local); err != nil {
			return err
		}
		if err := unix.Connect(fd, &peer); err != nil && err != unix.EINPROGRESS {
			return err
		}
		return nil
	}))
	ret, _ = e.runProg(t, from, up, tcp4(macWorld, world4, uplink4, 80, 40400, tcpSYNACK))
	require.Equal(t, uint32(tcActPass), ret, "the node's connection gets its SYN-ACK")
	require.Equal(t, uint8(maps.CniNatStateNAT_STATE_CLOSING), state(), "the pod's flow is left closing")
	ret, _ = e.runProg(t, from, up, tcp4(macWorld, world4, uplink4, 80, 40400, tcpACK))
	require.Equal(t, uint32(tcActPass), ret, "and its later packets")
}

// TestNATRenew: a new connection on the tuple of an expired masqueraded
// flow that kept the pod's port starts over in the same entries (the
// translation nat_create would choose: the pod's own port, free), its
// state and flags fresh, its replies translated back; where another pod's
// live flow has claimed that port on the remote since, the pod's flow
// moves to another port and the other flow's IN entry stays.
func TestNATRenew(t *testing.T) {
	e := newFlowEnv(t)
	e.masquerade(t, e.up, 61000, 65535)
	m := e.pinned(t, maps.CniMapNat)
	up := e.up.Attrs().Index
	to := uplink.HookToNetdev.Name
	out := func(pod net.IP, port uint16) maps.CniNatKey {
		return maps.CniNatKey{Family: 4, Proto: 6, Dir: uint8(maps.CniNatDirNAT_DIR_OUT), Sport: maps.Port(port), Dport: maps.Port(80),
			Saddr: maps.Addr16(pod), Daddr: maps.Addr16(world4)}
	}
	in := func(port uint16) maps.CniNatKey {
		return maps.CniNatKey{Family: 4, Proto: 6, Dir: uint8(maps.CniNatDirNAT_DIR_IN), Sport: maps.Port(80), Dport: maps.Port(port),
			Saddr: maps.Addr16(world4), Daddr: maps.Addr16(uplink4)}
	}
	get := func(k maps.CniNatKey) maps.CniNatEntry {
		t.Helper()
		var v maps.CniNatEntry
		require.NoError(t, m[maps.CniMapNat].Lookup(&k, &v))
		return v
	}
	expire := func(k maps.CniNatKey) maps.CniNatEntry {
		t.Helper()
		v := get(k)
		v.State = uint8(maps.CniNatStateNAT_STATE_CLOSING) // a closed connection's lifetime: 10 s
		v.LastSeen -= 3 * uint64(maps.CniNatDefaultLifetimeNAT_DEFAULT_TCP_CLOSING) * 1e9
		v.Created = v.LastSeen
		require.NoError(t, m[maps.CniMapNat].Put(&k, &v))
		return v
	}
	syn := func(port uint16) uint16 {
		t.Helper()
		ret, pkt := e.runProg(t, to, up, tcp4(macA, ipA4, world4, port, 80, tcpSYN))
		require.Equal(t, uint32(tcActPass), ret)
		require.Equal(t, uplink4.To4(), net.IP(pkt[14+12:14+16]))
		return binary.BigEndian.Uint16(pkt[34:])
	}

	// A connection that kept its port, answered, then idle past its
	// lifetime.
	require.Equal(t, uint16(40500), syn(40500), "the pod's port kept")
	ret, _ := e.runProg(t, uplink.HookFromNetdev.Name, up, tcp4(macWorld, world4, uplink4, 80, 40500, tcpSYNACK))
	require.Equal(t, uint32(tcActRedirect), ret)
	old := expire(out(ipA4, 40500))
	require.NotZero(t, old.Flags&uint8(maps.CniNatFlagsNAT_F_REPLIED))

	// A new connection from the same port: the same translation, fresh.
	require.Equal(t, uint16(40500), syn(40500), "renewed on the pod's own port")
	v := get(out(ipA4, 40500))
	require.Greater(t, v.Created, old.Created, "started over")
	require.Equal(t, uint8(maps.CniNatStateNAT_STATE_SYN_SENT), v.State)
	require.Equal(t, uint8(maps.CniNatFlagsNAT_F_KEPT), v.Flags, "no reply yet")
	iv := get(in(40500))
	require.Equal(t, maps.Addr16(ipA4), iv.Addr)
	require.Equal(t, v.Created, iv.Created, "its IN entry renewed too")
	ret, pkt := e.runProg(t, uplink.HookFromNetdev.Name, up, tcp4(macWorld, world4, uplink4, 80, 40500, tcpSYNACK))
	require.Equal(t, uint32(tcActRedirect), ret, "its replies reach the pod")
	require.Equal(t, ipA4.To4(), net.IP(pkt[14+16:14+20]))

	// Expired again, and meanwhile pod B's flow to the same remote took
	// the port (its IN entry and its live OUT entry): A moves, B keeps
	// its entries.
	expire(out(ipA4, 40500))
	now := maps.Monotonic()
	require.NoError(t, m[maps.CniMapNat].Put(in(40500), &maps.CniNatEntry{Addr: maps.Addr16(ipB4), Port: maps.Port(40500), Created: now, LastSeen: now}))
	require.NoError(t, m[maps.CniMapNat].Put(out(ipB4, 40500), &maps.CniNatEntry{Addr: maps.Addr16(uplink4), Port: maps.Port(40500),
		State: uint8(maps.CniNatStateNAT_STATE_ESTABLISHED), Flags: uint8(maps.CniNatFlagsNAT_F_KEPT), Created: now, LastSeen: now}))
	moved := syn(40500)
	require.NotEqual(t, uint16(40500), moved, "the port is B's now")
	require.GreaterOrEqual(t, moved, uint16(61000))
	require.Equal(t, maps.Addr16(ipB4), get(in(40500)).Addr, "B's IN entry stays")
	ret, pkt = e.runProg(t, uplink.HookFromNetdev.Name, up, tcp4(macWorld, world4, uplink4, 80, 40500, tcpACK))
	require.Equal(t, uint32(tcActRedirect), ret, "B's replies still reach B")
	require.Equal(t, ipB4.To4(), net.IP(pkt[14+16:14+20]))
}
