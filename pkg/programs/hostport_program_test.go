package programs_test

import (
	"encoding/binary"
	"hash/crc32"
	"net"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/uplink"
)

func be16(p uint16) uint16 { return p>>8 | p<<8 }

// sctp4 is an Ethernet + IPv4 + SCTP packet (one DATA chunk) with a right
// CRC32c.
func sctp4(srcMAC net.HardwareAddr, src, dst net.IP, sport, dport uint16) []byte {
	seg := make([]byte, 12, 32)
	binary.BigEndian.PutUint16(seg[0:], sport)
	binary.BigEndian.PutUint16(seg[2:], dport)
	binary.BigEndian.PutUint32(seg[4:], 0x01020304) // verification tag
	seg = append(seg, 0, 3, 0, 20, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 'd', 'a', 't', 'a')
	binary.LittleEndian.PutUint32(seg[8:], sctpSum(seg))
	return append(ether(macWorld, srcMAC, 0x0800), ipv4(src, dst, 132, seg)...)
}

// sctpSum is SCTP's CRC32c of a packet, its checksum field taken as zero.
func sctpSum(seg []byte) uint32 {
	c := append([]byte{}, seg...)
	copy(c[8:12], []byte{0, 0, 0, 0})
	return crc32.Checksum(c, crc32.MakeTable(crc32.Castagnoli))
}

// TestHostPortPrograms runs from_netdev and from_container on crafted
// packets: a published TCP port is translated to the pod and its reply
// back with every checksum right; an SCTP port (hostPort = containerPort)
// changes address only, so its CRC32c stays right untouched.
func TestHostPortPrograms(t *testing.T) {
	e := newProgramEnv(t)
	up := e.uplink(t)
	m := e.pinned(t, maps.CniMapHostports, maps.CniMapNodeAddrs, maps.CniMapHostportConfig)
	pub := func(proto uint8, host, pod uint16) {
		v := maps.CniHostportEntry{Any: 1, N: 1}
		copy(v.To[0].Addr[:], ipA4.To4())
		v.To[0].Port = be16(pod)
		require.NoError(t, m[maps.CniMapHostports].Put(&maps.CniHostportKey{Family: 4, Proto: proto, Port: be16(host)}, &v))
	}
	pub(6, 8080, 80)
	pub(132, 9999, 9999)
	require.NoError(t, m[maps.CniMapNodeAddrs].Put(maps.EndpointKey(uplink4), uint32(up.Attrs().Index)))
	require.NoError(t, m[maps.CniMapHostportConfig].Put(uint32(0), &maps.CniHostportSettings{Active: 1}))
	em, err := endpoint.MapsOf(openNode(t, e.bpfRoot))
	require.NoError(t, err)
	require.NoError(t, em.Put(&endpoint.Entry{HostIfIndex: e.hA.Attrs().Index, HostMAC: e.hA.Attrs().HardwareAddr, MAC: macA,
		IPs: []net.IP{ipA4, ipA6}, ContainerID: "a", IfName: "eth0", Flags: uint32(maps.CniEndpointFlagsEP_F_HOSTPORT)}))

	run := func(prog *ebpf.Program, ifindex int, pkt []byte) (uint32, []byte) {
		var ret uint32
		out := make([]byte, len(pkt)+256)
		require.NoError(t, e.n.Do(func(ns.NetNS) error {
			var err error
			ret, err = prog.Run(&ebpf.RunOptions{Data: pkt, DataOut: out, Context: skbCtx{Ifindex: uint32(ifindex)}})
			return err
		}))
		return ret, out[:len(pkt)]
	}
	fromNetdev := mustProg(t, e.progs, uplink.HookFromNetdev.Name)

	// A client outside to the published port: to the pod, client kept.
	before := e.count(t, maps.CniPktReasonREASON_DNAT)
	ret, out := run(fromNetdev, up.Attrs().Index, tcp4(macWorld, world4, uplink4, 40000, 8080, 0x02))
	require.Equal(t, uint32(tcActRedirect), ret)
	require.Equal(t, before+1, e.count(t, maps.CniPktReasonREASON_DNAT))
	require.Equal(t, []byte(macA), out[0:6])
	require.Equal(t, []byte(world4.To4()), out[26:30], "the client's address is kept")
	require.Equal(t, []byte(ipA4.To4()), out[30:34], "destination is the pod")
	require.Equal(t, uint16(80), binary.BigEndian.Uint16(out[36:]), "destination port is the containerPort")
	require.Zero(t, csum(out[14:34]), "IPv4 header checksum")
	require.Zero(t, l4sum(world4, ipA4, 6, out[34:]), "TCP checksum after DNAT")

	// The pod's reply: the node's address and the hostPort again.
	before = e.count(t, maps.CniPktReasonREASON_REV_DNAT)
	ret, out = run(e.prog, e.hA.Attrs().Index, tcp4(macA, ipA4, world4, 80, 40000, 0x12))
	require.NotEqual(t, uint32(tcActShot), ret)
	require.Equal(t, before+1, e.count(t, maps.CniPktReasonREASON_REV_DNAT))
	require.Equal(t, []byte(uplink4.To4()), out[26:30], "source is the node's")
	require.Equal(t, uint16(8080), binary.BigEndian.Uint16(out[34:]), "source port is the hostPort")
	require.Zero(t, csum(out[14:34]))
	require.Zero(t, l4sum(uplink4, world4, 6, out[34:]), "TCP checksum after reverse DNAT")

	// SCTP: the address changes, the ports and the CRC32c do not.
	in := sctp4(macWorld, world4, uplink4, 5000, 9999)
	ret, out = run(fromNetdev, up.Attrs().Index, in)
	require.Equal(t, uint32(tcActRedirect), ret)
	require.Equal(t, []byte(ipA4.To4()), out[30:34])
	require.Zero(t, csum(out[14:34]))
	require.Equal(t, in[34:], out[34:], "SCTP header and chunks untouched")
	require.Equal(t, binary.LittleEndian.Uint32(out[34+8:]), sctpSum(out[34:]), "CRC32c still right")

	// A port nobody published passes untouched.
	pkt := tcp4(macWorld, world4, uplink4, 40000, 8081, 0x02)
	ret, out = run(fromNetdev, up.Attrs().Index, append([]byte{}, pkt...))
	require.Equal(t, uint32(tcActPass), ret)
	require.Equal(t, pkt, out)
}
