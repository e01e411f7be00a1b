package programs_test

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/counters"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestDeviceCounters: every verdict is also counted for the device the
// program ran on, in an entry the program creates, and only there, under
// the program's direction (from_container: egress).
func TestDeviceCounters(t *testing.T) {
	e := newProgramEnv(t)
	m, err := ebpf.LoadPinnedMap(filepath.Join(maps.Dir(e.bpfRoot), maps.CniMapDeviceCounters), nil)
	require.NoError(t, err)
	defer m.Close()
	read := func() map[uint32]map[maps.CniPktReason]counters.ByDir {
		got, err := counters.SumDevices(m)
		require.NoError(t, err)
		return got
	}
	a, b := e.hA.Attrs().Index, e.hB.Attrs().Index
	tests := []struct {
		name    string
		ifindex int
		pkt     []byte
		reason  maps.CniPktReason
	}{
		{"redirect from a", a, icmp4(macA, ipA4, ipB4, 64), maps.CniPktReasonREASON_REDIRECT},
		{"spoofed source from a", a, icmp4(macA, ipB4, ipA4, 64), maps.CniPktReasonREASON_DROP_SPOOF_SRC},
		{"spoofed MAC from b", b, icmp4(macA, ipB4, ipA4, 64), maps.CniPktReasonREASON_DROP_SPOOF_MAC},
		{"device without endpoint", 1, icmp4(macA, ipA4, ipB4, 64), maps.CniPktReasonREASON_DROP_NO_ENDPOINT},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := read()
			e.run(t, tc.ifindex, bytes.Clone(tc.pkt))
			after := read()
			got := after[uint32(tc.ifindex)][tc.reason]
			was := before[uint32(tc.ifindex)][tc.reason]
			require.Equal(t, was[counters.Egress].Packets+1, got[counters.Egress].Packets)
			require.Equal(t, was[counters.Egress].Bytes+uint64(len(tc.pkt)), got[counters.Egress].Bytes)
			require.Equal(t, was[counters.Ingress], got[counters.Ingress], "counted as ingress")
			for dev, rs := range after {
				for r, c := range rs {
					if dev != uint32(tc.ifindex) || r != tc.reason {
						require.Equal(t, before[dev][r], c, "device %d reason %d changed", dev, r)
					}
				}
			}
		})
	}

	require.NoError(t, counters.DeleteDeviceCounters(e.bpfRoot, a, a))
	_, ok := read()[uint32(a)]
	require.False(t, ok, "entry of ifindex %d left after DeleteDeviceCounters", a)
	var vals []maps.CniDevCounters
	require.True(t, errors.Is(m.Lookup(uint32(a), &vals), ebpf.ErrKeyNotExist))
}
