// Package counters reads what the programs account for: pkt_counters
// (node-wide, per reason) and endpoint_counters (per device and reason),
// and names the reasons (enum pkt_reason) for people and for JSON.
package counters

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// ReasonNames names the pkt_counters indexes for people, ReasonKeys for
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

// Counter is one reason's total over all CPUs.
type Counter struct{ Packets, Bytes uint64 }

// Add adds c to the counter.
func (c *Counter) Add(o Counter) { c.Packets += o.Packets; c.Bytes += o.Bytes }

// ReadCounters sums pkt_counters over CPUs.
func ReadCounters(bpfRoot string) (map[maps.CniPktReason]Counter, error) {
	path := filepath.Join(maps.Dir(bpfRoot), maps.CniMapPktCounters)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	defer m.Close()
	return SumCounters(m)
}

// SumCounters sums an open pkt_counters map over CPUs.
func SumCounters(m *ebpf.Map) (map[maps.CniPktReason]Counter, error) {
	out := map[maps.CniPktReason]Counter{}
	var k uint32
	var vals []maps.CniPktCounter
	it := m.Iterate()
	for it.Next(&k, &vals) {
		var c Counter
		for _, v := range vals {
			c.Add(Counter{v.Packets, v.Bytes})
		}
		out[maps.CniPktReason(k)] = c
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", maps.CniMapPktCounters, err)
	}
	return out, nil
}

// SumDeviceCounters sums an open endpoint_counters map over CPUs: ifindex
// -> reason -> counter. Entries deleted while it iterates are left out.
func SumDeviceCounters(m *ebpf.Map) (map[uint32]map[maps.CniPktReason]Counter, error) {
	out := map[uint32]map[maps.CniPktReason]Counter{}
	var k uint32
	var vals []maps.CniDevCounters
	it := m.Iterate()
	for it.Next(&k, &vals) {
		dev := map[maps.CniPktReason]Counter{}
		for _, v := range vals {
			for r, c := range v.ByReason {
				if c.Packets != 0 || c.Bytes != 0 {
					sum := dev[maps.CniPktReason(r)]
					sum.Add(Counter{c.Packets, c.Bytes})
					dev[maps.CniPktReason(r)] = sum
				}
			}
		}
		out[k] = dev
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", maps.CniMapEndpointCounters, err)
	}
	return out, nil
}

// DeleteDevices removes the per-device counters of ifindexes from m
// (endpoint_counters); a missing entry is fine.
func DeleteDevices(m *ebpf.Map, ifindexes ...int) error {
	var errs []error
	for _, i := range ifindexes {
		if err := m.Delete(uint32(i)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("deleting %s[%d]: %w", maps.CniMapEndpointCounters, i, err))
		}
	}
	return errors.Join(errs...)
}

// DeleteDeviceCounters is DeleteDevices on the map pinned under bpfRoot; a
// missing map is fine (DEL is idempotent and must not create maps).
func DeleteDeviceCounters(bpfRoot string, ifindexes ...int) error {
	path := filepath.Join(maps.Dir(bpfRoot), maps.CniMapEndpointCounters)
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

// DeviceKeys lists the ifindexes m (endpoint_counters) has entries for.
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
	path := filepath.Join(maps.Dir(bpfRoot), maps.CniMapEndpointCounters)
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
