// Package counters reads what the programs account for: node_counters
// (node-wide, per reason and direction) and the per-device counters (per
// device, reason and direction: a device's slot, else device_counters;
// see Devices), and names the reasons (enum pkt_reason) and directions
// (enum pkt_dir) for people and for JSON.
package counters

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// ReasonNames names the node_counters indexes for people, ReasonKeys for
// JSON and scripts (the C names, lower case, without REASON_; drop reasons
// start with "drop_"). Both come from maps.PktReasons, generated from enum
// pkt_reason: a reason added in C is named and, if a drop, counted as one.
var ReasonNames, ReasonKeys, drops = reasonTables()

func reasonTables() (names, keys map[maps.CniPktReason]string, drops map[maps.CniPktReason]bool) {
	names, keys, drops = map[maps.CniPktReason]string{}, map[maps.CniPktReason]string{}, map[maps.CniPktReason]bool{}
	for _, r := range maps.PktReasons {
		names[r.Reason], keys[r.Reason], drops[r.Reason] = r.Text, r.Key, r.Drop
	}
	return names, keys, drops
}

// IsDrop reports whether a reason is a drop.
func IsDrop(r maps.CniPktReason) bool { return drops[r] }

// The directions a program counts a packet under (enum pkt_dir, from the
// pod or, on an uplink, from the node), and their JSON and label names.
const (
	Egress  = maps.CniPktDirPKT_DIR_EGRESS
	Ingress = maps.CniPktDirPKT_DIR_INGRESS
)

// Dirs are the directions in enum order; DirKeys names them.
var (
	Dirs    = []maps.CniPktDir{Egress, Ingress}
	DirKeys = map[maps.CniPktDir]string{Egress: "egress", Ingress: "ingress"}
)

// Counter is one reason's total over all CPUs.
type Counter struct{ Packets, Bytes uint64 }

// Add adds c to the counter.
func (c *Counter) Add(o Counter) { c.Packets += o.Packets; c.Bytes += o.Bytes }

// ByDir is one reason's counters per direction (indexed by maps.CniPktDir).
type ByDir [maps.CniPktDirPKT_DIR_MAX]Counter

// Total is the sum over directions.
func (b ByDir) Total() Counter {
	var t Counter
	for _, c := range b {
		t.Add(c)
	}
	return t
}

// add sums one CPU's value into b.
func (b *ByDir) add(v maps.CniDirCounters) {
	for d, c := range v.ByDir {
		b[d].Add(Counter{c.Packets, c.Bytes})
	}
}

// Totals sums each reason's directions.
func Totals(by map[maps.CniPktReason]ByDir) map[maps.CniPktReason]Counter {
	out := make(map[maps.CniPktReason]Counter, len(by))
	for r, b := range by {
		out[r] = b.Total()
	}
	return out
}

// ReadCounters sums node_counters over CPUs and directions.
func ReadCounters(bpfRoot string) (map[maps.CniPktReason]Counter, error) {
	path := filepath.Join(maps.Dir(bpfRoot), maps.CniMapNodeCounters)
	m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	defer m.Close()
	by, err := SumNode(m)
	if err != nil {
		return nil, err
	}
	return Totals(by), nil
}

// SumCounters sums an open node_counters map over CPUs and directions.
func SumCounters(m *ebpf.Map) (map[maps.CniPktReason]Counter, error) {
	by, err := SumNode(m)
	if err != nil {
		return nil, err
	}
	return Totals(by), nil
}

// SumNode sums an open node_counters map over CPUs: reason -> direction.
func SumNode(m *ebpf.Map) (map[maps.CniPktReason]ByDir, error) {
	out := map[maps.CniPktReason]ByDir{}
	var k uint32
	var vals []maps.CniDirCounters
	it := m.Iterate()
	for it.Next(&k, &vals) {
		var b ByDir
		for _, v := range vals {
			b.add(v)
		}
		out[maps.CniPktReason(k)] = b
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", maps.CniMapNodeCounters, err)
	}
	return out, nil
}

// Devices are the maps of the per-device counters (bpf/lib/counters.h):
// a device's counters are in the slots of slot_counters that device_slots
// says it owns, and in its entry of device_counters (a device whose slots
// were taken, or counted by the programs of a build before the slots).
// Readers add them up. A nil map is one the node has not pinned.
type Devices struct{ Hash, Owners, Slots *ebpf.Map }

// DeviceMaps are the names of the maps Devices holds.
var DeviceMaps = []string{maps.CniMapDeviceCounters, maps.CniMapDeviceSlots, maps.CniMapSlotCounters}

// DevicesOf picks the device maps out of maps opened by name.
func DevicesOf(ms map[string]*ebpf.Map) Devices {
	return Devices{ms[maps.CniMapDeviceCounters], ms[maps.CniMapDeviceSlots], ms[maps.CniMapSlotCounters]}
}

// OpenDevices opens the device maps with open, which returns nil for a
// map that is not pinned (node.Node.PinnedMap).
func OpenDevices(open func(name string) (*ebpf.Map, error)) (Devices, error) {
	ms := map[string]*ebpf.Map{}
	for _, name := range DeviceMaps {
		m, err := open(name)
		if err != nil {
			return Devices{}, err
		}
		ms[name] = m
	}
	return DevicesOf(ms), nil
}

// PinnedDevices opens the device maps pinned under bpfRoot; a missing map
// stays nil (DEL is idempotent and must not create maps). done closes them.
func PinnedDevices(bpfRoot string, readOnly bool) (d Devices, done func(), err error) {
	var opened []*ebpf.Map
	done = func() {
		for _, m := range opened {
			m.Close()
		}
	}
	d, err = OpenDevices(func(name string) (*ebpf.Map, error) {
		path := filepath.Join(maps.Dir(bpfRoot), name)
		m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: readOnly})
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("opening %s: %w", path, err)
		}
		opened = append(opened, m)
		return m, nil
	})
	if err != nil {
		done()
		return Devices{}, nil, err
	}
	return d, done, nil
}

// Totals sums every device's counters over CPUs and directions: ifindex
// -> reason -> counter, non-zero reasons only.
func (d Devices) Totals() (map[uint32]map[maps.CniPktReason]Counter, error) {
	devs, err := d.Sum()
	if err != nil {
		return nil, err
	}
	out := make(map[uint32]map[maps.CniPktReason]Counter, len(devs))
	for k, by := range devs {
		out[k] = Totals(by)
	}
	return out, nil
}

// devSum is one device's counters being summed, by reason.
type devSum [len(maps.CniDevCounters{}.ByReason)]ByDir

func (s *devSum) add(vals []maps.CniDevCounters) {
	for _, v := range vals {
		for r := range v.ByReason {
			s[r].add(v.ByReason[r])
		}
	}
}

// Sum sums every device's counters over CPUs: ifindex -> reason ->
// direction, the reasons with a non-zero count only. Entries deleted
// while it reads are left out.
func (d Devices) Sum() (map[uint32]map[maps.CniPktReason]ByDir, error) {
	sums := map[uint32]*devSum{}
	sumOf := func(ifindex uint32) *devSum {
		s := sums[ifindex]
		if s == nil {
			s = &devSum{}
			sums[ifindex] = s
		}
		return s
	}
	if err := d.each(func(ifindex uint32, vals []maps.CniDevCounters) { sumOf(ifindex).add(vals) }); err != nil {
		return nil, err
	}
	out := make(map[uint32]map[maps.CniPktReason]ByDir, len(sums))
	for k, sum := range sums {
		dev := map[maps.CniPktReason]ByDir{}
		for r, b := range sum {
			if t := b.Total(); t.Packets != 0 || t.Bytes != 0 {
				dev[maps.CniPktReason(r)] = b
			}
		}
		out[k] = dev
	}
	return out, nil
}

// each calls f with the per-CPU counters of every device's
// device_counters entry and of every slot a device owns.
func (d Devices) each(f func(ifindex uint32, vals []maps.CniDevCounters)) error {
	var vals []maps.CniDevCounters
	if d.Hash != nil {
		var k uint32
		it := d.Hash.Iterate()
		for it.Next(&k, &vals) {
			f(k, vals)
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("reading %s: %w", maps.CniMapDeviceCounters, err)
		}
	}
	if d.Slots == nil {
		return nil
	}
	owners, err := d.owners()
	if err != nil {
		return err
	}
	for slot, ifindex := range owners {
		if err := d.Slots.Lookup(slot, &vals); err != nil {
			return fmt.Errorf("reading %s[%d]: %w", maps.CniMapSlotCounters, slot, err)
		}
		f(ifindex, vals)
	}
	return nil
}

// owners lists the slots in use: slot -> the ifindex that owns it.
func (d Devices) owners() (map[uint32]uint32, error) {
	if d.Owners == nil {
		return map[uint32]uint32{}, nil
	}
	return maps.SlotOwners(d.Owners)
}

// slotsOf are the slots a device may own (bpf/lib/counters.h's
// device_slot).
func slotsOf(ifindex uint32) []uint32 {
	out := make([]uint32, maps.CniDevSlotConstDEV_SLOT_PROBES)
	for i := range out {
		out[i] = (ifindex + uint32(i)) & uint32(maps.CniDevSlotConstDEV_SLOTS-1)
	}
	return out
}

// Delete removes the counters of the devices with these ifindexes: their
// device_counters entries, and their slots, zeroed before they are freed
// (the next device to claim one starts from zero). Only for devices that
// are gone: a program running on one would count or claim again. Nothing
// to remove is fine.
func (d Devices) Delete(ifindexes ...int) error {
	var errs []error
	var zero []maps.CniDevCounters
	for _, i := range ifindexes {
		if d.Hash != nil {
			if err := d.Hash.Delete(uint32(i)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("deleting %s[%d]: %w", maps.CniMapDeviceCounters, i, err))
			}
		}
		if d.Owners == nil || d.Slots == nil || i <= 0 {
			continue
		}
		for _, slot := range slotsOf(uint32(i)) {
			var owner uint32
			if err := d.Owners.Lookup(slot, &owner); err != nil {
				errs = append(errs, fmt.Errorf("reading %s[%d]: %w", maps.CniMapDeviceSlots, slot, err))
				continue
			}
			if owner != uint32(i) {
				continue
			}
			if zero == nil {
				cpus, err := ebpf.PossibleCPU()
				if err != nil {
					return errors.Join(append(errs, err)...)
				}
				zero = make([]maps.CniDevCounters, cpus)
			}
			if err := d.Slots.Put(slot, zero); err != nil {
				errs = append(errs, fmt.Errorf("zeroing %s[%d]: %w", maps.CniMapSlotCounters, slot, err))
				continue // a slot not zeroed stays taken: its counts would go to the next device
			}
			if err := d.Owners.Put(slot, uint32(0)); err != nil {
				errs = append(errs, fmt.Errorf("freeing %s[%d]: %w", maps.CniMapDeviceSlots, slot, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Keys lists the ifindexes that have counters.
func (d Devices) Keys() ([]int, error) {
	seen := map[int]bool{}
	var out []int
	add := func(i int) {
		if !seen[i] {
			seen[i] = true
			out = append(out, i)
		}
	}
	if err := d.each(func(ifindex uint32, _ []maps.CniDevCounters) { add(int(ifindex)) }); err != nil {
		return nil, err
	}
	return out, nil
}

// DeleteDeviceCounters is Devices.Delete on the maps pinned under bpfRoot.
func DeleteDeviceCounters(bpfRoot string, ifindexes ...int) error {
	d, done, err := PinnedDevices(bpfRoot, false)
	if err != nil {
		return err
	}
	defer done()
	return d.Delete(ifindexes...)
}

// DeviceCounterKeys is Devices.Keys of the maps pinned under bpfRoot.
func DeviceCounterKeys(bpfRoot string) ([]int, error) {
	d, done, err := PinnedDevices(bpfRoot, true)
	if err != nil {
		return nil, err
	}
	defer done()
	return d.Keys()
}
