package programs_test

import (
	"encoding/binary"
	"net"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/uplink"
)

// TestNATSkipsPublishedPorts runs to_netdev on pods' first packets: the
// masquerade never translates to a port published as a hostPort on the
// masquerade address and protocol (on every node address, or on that one),
// neither keeping the pod's own port nor picking one from the range; a
// port published for another protocol or on another address is no
// obstacle.
func TestNATSkipsPublishedPorts(t *testing.T) {
	e := newProgramEnv(t)
	up := e.uplink(t)
	// A range of two ports, one of them published.
	e.masquerade(t, up, 61000, 61001)
	m := e.pinned(t, maps.CniMapHostports)
	publish := func(proto uint8, port uint16, hostIP net.IP) {
		v := maps.CniHostportEntry{N: 1}
		if hostIP == nil {
			v.Any = 1
		} else {
			copy(v.HostIp[0][:], hostIP.To4())
		}
		copy(v.To[0].Addr[:], ipB4.To4())
		v.To[0].Port = be16(80)
		require.NoError(t, m[maps.CniMapHostports].Put(&maps.CniHostportKey{Family: 4, Proto: proto, Port: be16(port)}, &v))
	}
	publish(6, 40000, nil)     // TCP on every node address
	publish(6, 40001, uplink4) // TCP on the masquerade address
	publish(6, 40002, world4)  // TCP on another address
	publish(17, 40003, nil)    // UDP only
	publish(6, 61000, nil)     // half of the masquerade's range

	toNetdev := mustProg(t, e.progs, uplink.HookToNetdev.Name)
	snat := func(sport, dport uint16) uint16 {
		t.Helper()
		pkt := tcp4(macA, ipA4, world4, sport, dport, 0x02)
		out := make([]byte, len(pkt)+256)
		var ret uint32
		require.NoError(t, e.n.Do(func(ns.NetNS) error {
			var err error
			ret, err = toNetdev.Run(&ebpf.RunOptions{Data: pkt, DataOut: out, Context: skbCtx{Ifindex: uint32(up.Attrs().Index)}})
			return err
		}))
		require.Equal(t, uint32(tcActPass), ret, "SYN from port %d", sport)
		require.Equal(t, []byte(uplink4), out[26:30], "source is the node's")
		return binary.BigEndian.Uint16(out[34:])
	}
	// Every flow goes to another remote port: the range's one free port
	// serves them all.
	for i, c := range []struct {
		sport uint16
		kept  bool
		why   string
	}{
		{40000, false, "published on every node address"},
		{40001, false, "published on the masquerade address"},
		{40002, true, "published on another address only"},
		{40003, true, "published for UDP only"},
		{40004, true, "not published"},
	} {
		got := snat(c.sport, 80+uint16(i))
		if c.kept {
			require.Equal(t, c.sport, got, "port %d (%s) is kept", c.sport, c.why)
		} else {
			require.Equal(t, uint16(61001), got, "port %d (%s) must not be used: the range's unpublished port is", c.sport, c.why)
		}
	}
	// Many flows from a published port, each to another remote port: the
	// range's published port is never picked (each try picks one of the
	// two at random).
	for dport := uint16(1000); dport < 1032; dport++ {
		require.Equal(t, uint16(61001), snat(40000, dport), "flow to port %d", dport)
	}
}
