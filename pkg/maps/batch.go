package maps

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// batchSize is the most entries one BPF_MAP_LOOKUP_BATCH call reads: a
// full NAT table (131,072 entries) in 32 calls instead of two per entry,
// which is what keeps a DEL's flush fast however many flows the node has.
// The first call reads firstBatch, and each next one twice as many: a map
// with a few hundred entries (ebpf-ipam's, read by every STATUS) must not
// cost the allocation and zeroing of 4,096 keys and values (750 KB for
// ipam_allocs: 1.7 of STATUS's 3 ms).
const (
	batchSize  = 4096
	firstBatch = 256
)

// Entry is one key and value of a map.
type Entry[K, V any] struct {
	Key   K
	Value V
}

// Entries reads every entry of m, in batches where the kernel has them.
func Entries[K, V any](m *ebpf.Map) ([]Entry[K, V], error) {
	var out []Entry[K, V]
	err := Walk(m, func(k *K, v *V) { out = append(out, Entry[K, V]{*k, *v}) })
	return out, err
}

// Walk calls fn with every entry of m, in batches where the kernel has
// them, reusing one batch's buffers: a walk that keeps little (a DEL's
// flush looks for one pod's flows) reads a full NAT table in about 30 ms,
// where collecting its 131,072 entries first took 300 (the allocations'
// page faults, with the plugin's garbage collection off). fn must not keep
// k or v.
func Walk[K, V any](m *ebpf.Map, fn func(k *K, v *V)) error {
	var cursor ebpf.MapBatchCursor
	size := min(firstBatch, max(int(m.MaxEntries()), 1))
	keys := make([]K, size)
	vals := make([]V, size)
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := 0; i < n; i++ {
			fn(&keys[i], &vals[i])
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if errors.Is(err, ebpf.ErrNotSupported) {
			return iterate(m, fn)
		}
		if errors.Is(err, unix.ENOSPC) && n == 0 && size < batchSize {
			// A hash bucket holds more than size entries: read it again, larger.
			size = batchSize
			keys, vals = make([]K, size), make([]V, size)
			continue
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", m, err)
		}
		if size < batchSize {
			size *= 2
			keys, vals = make([]K, size), make([]V, size)
		}
	}
}

// DeleteMatching deletes from m the entries for which drop holds (an entry
// already gone is no error), walking m once without keeping it; it returns
// how many it deleted.
func DeleteMatching[K, V any](m *ebpf.Map, drop func(k *K, v *V) bool) (int, error) {
	var doomed []K
	if err := Walk(m, func(k *K, v *V) {
		if drop(k, v) {
			doomed = append(doomed, *k)
		}
	}); err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for i := range doomed {
		if err := m.Delete(&doomed[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// DeleteEntries deletes from m the entries of es for which drop holds (an
// entry already gone is no error); it returns how many it deleted.
func DeleteEntries[K, V any](m *ebpf.Map, es []Entry[K, V], drop func(*Entry[K, V]) bool) (int, error) {
	n := 0
	var errs []error
	for i := range es {
		if !drop(&es[i]) {
			continue
		}
		if err := m.Delete(&es[i].Key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// iterate walks m one entry at a time (kernels without batches).
func iterate[K, V any](m *ebpf.Map, fn func(k *K, v *V)) error {
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		fn(&k, &v)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading %s: %w", m, err)
	}
	return nil
}

// Count is how many entries m holds, for a fill level: batches of keys
// and values where the kernel has them (hash and LRU maps: a full NAT
// table in 32 calls), one key at a time where it has not (LPM tries) and
// for per-CPU maps. Entries added or deleted meanwhile may or may not be
// counted.
func Count(m *ebpf.Map) (int, error) {
	switch m.Type() {
	case ebpf.PerCPUHash, ebpf.LRUCPUHash, ebpf.PerCPUArray:
	default:
		ks, vs := int(m.KeySize()), int(m.ValueSize())
		size := min(batchSize, max(int(m.MaxEntries()), 1))
		keys := reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(ks, reflect.TypeFor[byte]())), size, size).Interface()
		vals := reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(vs, reflect.TypeFor[byte]())), size, size).Interface()
		var cursor ebpf.MapBatchCursor
		total := 0
		for {
			n, err := m.BatchLookup(&cursor, keys, vals, nil)
			total += n
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				return total, nil
			}
			if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.ENOSPC) {
				break // one key at a time, from the start
			}
			if err != nil {
				return 0, fmt.Errorf("counting %s: %w", m, err)
			}
		}
	}
	key := make([]byte, m.KeySize())
	next := make([]byte, m.KeySize())
	var prev any // nil: the first key
	total := 0
	for {
		err := m.NextKey(prev, next)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return total, nil
		}
		if err != nil {
			return 0, fmt.Errorf("counting %s: %w", m, err)
		}
		total++
		copy(key, next)
		prev = key
	}
}
