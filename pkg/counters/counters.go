// Package counters reads what the programs account for: node_counters
// (node-wide, per reason and direction) and device_counters (per device,
// reason and direction), and names the reasons (enum pkt_reason) and
// directions (enum pkt_dir) for people and for JSON.
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

// SumDeviceCounters sums an open device_counters map over CPUs and
// directions: ifindex -> reason -> counter, non-zero reasons only.
func SumDeviceCounters(m *ebpf.Map) (map[uint32]map[maps.CniPktReason]Counter, error) {
	devs, err := SumDevices(m)
	if err != nil {
		return nil, err
	}
	out := make(map[uint32]map[maps.CniPktReason]Counter, len(devs))
	for k, by := range devs {
		out[k] = Totals(by)
	}
	return out, nil
}

// SumDevices sums an open device_counters map over CPUs: ifindex ->
// reason -> direction, the reasons with a non-zero count only. Entries
// deleted while it iterates are left out.
func SumDevices(m *ebpf.Map) (map[uint32]map[maps.CniPktReason]ByDir, error) {
	out := map[uint32]map[maps.CniPktReason]ByDir{}
	var k uint32
	var vals []maps.CniDevCounters
	it := m.Iterate()
	for it.Next(&k, &vals) {
		var sum [len(maps.CniDevCounters{}.ByReason)]ByDir
		for _, v := range vals {
			for r := range v.ByReason {
				sum[r].add(v.ByReason[r])
			}
		}
		dev := map[maps.CniPktReason]ByDir{}
		for r, b := range sum {
			if t := b.Total(); t.Packets != 0 || t.Bytes != 0 {
				dev[maps.CniPktReason(r)] = b
			}
		}
		out[k] = dev
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", maps.CniMapDeviceCounters, err)
	}
	return out, nil
}

// DeleteDevices removes the per-device counters of ifindexes from m
// (device_counters); a missing entry is fine.
func DeleteDevices(m *ebpf.Map, ifindexes ...int) error {
	var errs []error
	for _, i := range ifindexes {
		if err := m.Delete(uint32(i)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("deleting %s[%d]: %w", maps.CniMapDeviceCounters, i, err))
		}
	}
	return errors.Join(errs...)
}

// DeleteDeviceCounters is DeleteDevices on the map pinned under bpfRoot; a
// missing map is fine (DEL is idempotent and must not create maps).
func DeleteDeviceCounters(bpfRoot string, ifindexes ...int) error {
	path := filepath.Join(maps.Dir(bpfRoot), maps.CniMapDeviceCounters)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("opening %s: %w", path, err)
	}
	defer m.Close()
	return DeleteDevices(m, ifindexes...)
}

// DeviceKeys lists the ifindexes m (device_counters) has entries for.
func DeviceKeys(m *ebpf.Map) ([]int, error) {
	devs, err := SumDeviceCounters(m)
	if err != nil {
		return nil, err
	}
	out := make([]int, 0, len(devs))
	for k := range devs {
		out = append(out, int(k))
	}
	return out, nil
}

// DeviceCounterKeys is DeviceKeys of the map pinned under bpfRoot.
func DeviceCounterKeys(bpfRoot string) ([]int, error) {
	path := filepath.Join(maps.Dir(bpfRoot), maps.CniMapDeviceCounters)
	m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	defer m.Close()
	return DeviceKeys(m)
}
