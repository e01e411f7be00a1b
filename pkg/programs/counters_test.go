package programs_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/counters"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestDeviceCounters: every verdict is also counted for the device the
// program ran on, in a slot the program claims (or an entry it creates),
// and only there, under the program's direction (from_container: egress).
func TestDeviceCounters(t *testing.T) {
	e := newProgramEnv(t)
	d, done, err := counters.PinnedDevices(e.bpfRoot, false)
	require.NoError(t, err)
	defer done()
	m := d.Hash
	read := func() map[uint32]map[maps.CniPktReason]counters.ByDir {
		got, err := d.Sum()
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
	require.False(t, ok, "counters of ifindex %d left after DeleteDeviceCounters", a)
	var vals []maps.CniDevCounters
	require.True(t, errors.Is(m.Lookup(uint32(a), &vals), ebpf.ErrKeyNotExist))
	require.Empty(t, slotsOwned(t, d, a))
}

// slotsOwned lists the slots device_slots gives ifindex.
func slotsOwned(t *testing.T, d counters.Devices, ifindex int) []uint32 {
	t.Helper()
	var out []uint32
	var slot, owner uint32
	it := d.Owners.Iterate()
	for it.Next(&slot, &owner) {
		if owner == uint32(ifindex) {
			out = append(out, slot)
		}
	}
	require.NoError(t, it.Err())
	return out
}

// slotPackets sums a slot's packets over CPUs, reasons and directions.
func slotPackets(t *testing.T, d counters.Devices, slot uint32) uint64 {
	t.Helper()
	var vals []maps.CniDevCounters
	require.NoError(t, d.Slots.Lookup(slot, &vals))
	var n uint64
	for _, v := range vals {
		for _, r := range v.ByReason {
			for _, c := range r.ByDir {
				n += c.Packets
			}
		}
	}
	return n
}

// TestDeviceSlots: a device's first packet claims the first free of its
// slots and it counts there from then on, with no device_counters entry;
// a device whose slots are all taken is counted in device_counters; a
// reader adds both up; freeing a slot zeroes it first, so the next device
// to claim it starts from zero.
func TestDeviceSlots(t *testing.T) {
	e := newProgramEnv(t)
	d, done, err := counters.PinnedDevices(e.bpfRoot, false)
	require.NoError(t, err)
	defer done()
	a, b := e.hA.Attrs().Index, e.hB.Attrs().Index
	slots, probes := uint32(maps.CniDevSlotConstDEV_SLOTS), uint32(maps.CniDevSlotConstDEV_SLOT_PROBES)
	redirect := icmp4(macA, ipA4, ipB4, 64)
	packets := func(ifindex int) uint64 {
		got, err := d.Totals()
		require.NoError(t, err)
		return got[uint32(ifindex)][maps.CniPktReasonREASON_REDIRECT].Packets
	}
	var vals []maps.CniDevCounters

	// The first free slot from a's ifindex on: its first slot is taken.
	first := uint32(a) & (slots - 1)
	other := uint32(a) + slots // the same slots, another device
	require.NoError(t, d.Owners.Put(first, other))
	e.run(t, a, bytes.Clone(redirect))
	require.Equal(t, []uint32{(first + 1) & (slots - 1)}, slotsOwned(t, d, a))
	require.Equal(t, uint64(1), slotPackets(t, d, (first+1)&(slots-1)))
	require.True(t, errors.Is(d.Hash.Lookup(uint32(a), &vals), ebpf.ErrKeyNotExist), "counted in a slot and in device_counters")
	// Its first slot freed, it keeps counting in the slot it has.
	require.NoError(t, d.Owners.Put(first, uint32(0)))
	e.run(t, a, bytes.Clone(redirect))
	require.Equal(t, []uint32{(first + 1) & (slots - 1)}, slotsOwned(t, d, a))
	require.Equal(t, uint64(2), packets(a))

	// b with every slot taken: counted in device_counters, and read.
	for i := range probes {
		require.NoError(t, d.Owners.Put((uint32(b)+i)&(slots-1), uint32(b)+slots))
	}
	e.run(t, b, bytes.Clone(redirect)) // spoofed from b, but counted for b
	require.Empty(t, slotsOwned(t, d, b))
	require.NoError(t, d.Hash.Lookup(uint32(b), &vals), "b's counters are in device_counters")
	keys, err := d.Keys()
	require.NoError(t, err)
	require.Contains(t, keys, b)
	require.Contains(t, keys, a)
	for i := range probes {
		require.NoError(t, d.Owners.Put((uint32(b)+i)&(slots-1), uint32(0)))
	}

	// A device counted in both (an older build's programs counted it in
	// device_counters): a reader adds them up.
	cpus, err := ebpf.PossibleCPU()
	require.NoError(t, err)
	per := make([]maps.CniDevCounters, cpus)
	per[0].ByReason[maps.CniPktReasonREASON_REDIRECT].ByDir[counters.Egress].Packets = 40
	require.NoError(t, d.Hash.Put(uint32(a), per))
	require.Equal(t, uint64(42), packets(a))

	// DEL frees the slot zeroed and deletes the entry; whoever claims the
	// slot next starts from zero.
	slot := (first + 1) & (slots - 1)
	require.NoError(t, d.Delete(a))
	require.Empty(t, slotsOwned(t, d, a))
	require.Zero(t, slotPackets(t, d, slot))
	require.Zero(t, packets(a))
	require.NoError(t, d.Owners.Put(first, other)) // a's first slot taken again: a gets slot once more
	e.run(t, a, bytes.Clone(redirect))
	require.Equal(t, []uint32{slot}, slotsOwned(t, d, a))
	require.Equal(t, uint64(1), packets(a))
	require.NoError(t, d.Delete(a, b))
	keys, err = d.Keys()
	require.NoError(t, err)
	require.Equal(t, []int{int(other)}, keys, "only the fake owner is left")
	require.NoError(t, d.Owners.Put(first, uint32(0)))
}
