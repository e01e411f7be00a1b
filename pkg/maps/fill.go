package maps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/cilium/ebpf"
)

// Fill is how full one pinned map is: the entries it holds and the most it
// can (max_entries).
type Fill struct {
	Name     string `json:"name"`
	Entries  int    `json:"entries"`
	Capacity uint32 `json:"capacity"`
}

// Percent is the share of the capacity in use, 0 to 100.
func (f Fill) Percent() float64 {
	if f.Capacity == 0 {
		return 0
	}
	return 100 * float64(f.Entries) / float64(f.Capacity)
}

// FillKind is what a full map costs.
type FillKind int

const (
	// FillRefuses: a full map refuses new entries; what needs one fails
	// (an ADD, a published port, an address, a policy).
	FillRefuses FillKind = iota
	// FillEvicts: an LRU map (flows, their NAT) evicts the least recently
	// used entry.
	FillEvicts
	// FillCounts: counters only. A device that finds device_slots full
	// counts in device_counters (a lookup more per packet); beyond
	// device_counters or policy_drops a device or rule goes uncounted.
	FillCounts
)

// Kind is what the map costs when it is full.
func (f Fill) Kind() FillKind {
	switch f.Name {
	case CniMapDeviceSlots, CniMapDeviceCounters, CniMapPolicyDrops:
		return FillCounts
	}
	if t, ok := fillTypes()[f.Name]; ok && (t == ebpf.LRUHash || t == ebpf.LRUCPUHash) {
		return FillEvicts
	}
	return FillRefuses
}

// fillSpec is the fillable maps' capacities and types, read once from the
// objects' specification.
var fillSpec = sync.OnceValues(func() (map[string]uint32, map[string]ebpf.MapType) {
	caps, types := map[string]uint32{}, map[string]ebpf.MapType{}
	spec, err := LoadCni()
	if err != nil {
		return caps, types
	}
	for name, ms := range spec.Maps {
		if ms.Pinning == ebpf.PinNone {
			continue
		}
		switch {
		case ms.Type == ebpf.Hash, ms.Type == ebpf.LRUHash, ms.Type == ebpf.LPMTrie, ms.Type == ebpf.PerCPUHash, ms.Type == ebpf.LRUCPUHash,
			name == CniMapDeviceSlots:
			caps[name], types[name] = ms.MaxEntries, ms.Type
		}
	}
	return caps, types
})

func fillTypes() map[string]ebpf.MapType { _, t := fillSpec(); return t }

// Fillable lists the pinned maps of bpf/maps.c a node can fill, with their
// capacities: every hash, LRU and LPM map (arrays have a fixed size), and
// device_slots, an array whose slots devices claim.
func Fillable() map[string]uint32 {
	caps, _ := fillSpec()
	out := make(map[string]uint32, len(caps))
	for k, v := range caps {
		out[k] = v
	}
	return out
}

// CountFill counts the entries of m, the pinned map name: Count, and for
// device_slots the slots a device owns.
func CountFill(name string, m *ebpf.Map) (int, error) {
	if name != CniMapDeviceSlots {
		return Count(m)
	}
	owners, err := SlotOwners(m)
	return len(owners), err
}

// SlotOwners reads device_slots (m): slot -> the ifindex that owns it, the
// slots in use only.
func SlotOwners(m *ebpf.Map) (map[uint32]uint32, error) {
	out := map[uint32]uint32{}
	var slot, ifindex uint32
	it := m.Iterate()
	for it.Next(&slot, &ifindex) {
		if ifindex != 0 {
			out[slot] = ifindex
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", CniMapDeviceSlots, err)
	}
	return out, nil
}

// ReadFill reads the fill of every fillable map pinned under bpfRoot,
// sorted by name; a map not pinned (no pod yet) is left out, and one that
// cannot be read is an error of errs, which names it.
func ReadFill(bpfRoot string) (fills []Fill, errs []error) {
	for name, capacity := range Fillable() {
		m, err := ebpf.LoadPinnedMap(filepath.Join(Dir(bpfRoot), name), &ebpf.LoadPinOptions{ReadOnly: true})
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("opening %s: %w", name, err))
			continue
		}
		n, err := CountFill(name, m)
		m.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("counting %s: %w", name, err))
			continue
		}
		fills = append(fills, Fill{Name: name, Entries: n, Capacity: capacity})
	}
	sort.Slice(fills, func(i, j int) bool { return fills[i].Name < fills[j].Name })
	return fills, errs
}
