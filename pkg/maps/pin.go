package maps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ErrNotBPFFS means a path is not on a mounted bpf filesystem.
var ErrNotBPFFS = errors.New("not on a bpf filesystem")

// Dir is where the maps are pinned under a bpfRoot.
func Dir(bpfRoot string) string { return filepath.Join(bpfRoot, "maps") }

// CheckBPFFS verifies that path, or the nearest ancestor that exists, lies on
// bpffs. It creates nothing, so a failed check leaves nothing behind.
func CheckBPFFS(path string) error {
	p := filepath.Clean(path)
	for {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if err == nil {
			if st.Type != unix.BPF_FS_MAGIC {
				return fmt.Errorf("%s: %w (mount one: mount -t bpf bpf %s)", p, ErrNotBPFFS, p)
			}
			return nil
		}
		if !errors.Is(err, unix.ENOENT) || p == "/" {
			return fmt.Errorf("statfs %s: %w", p, err)
		}
		p = filepath.Dir(p)
	}
}

// layouts (layouts_gen.go, generated from the object) are the key and
// value sizes of every map. Opening an existing pin checks them instead of
// parsing the embedded object, which would cost more than the rest of an
// IPAM call (and a millisecond or more of every ADD and DEL).

// ErrIncompatible means a pinned map does not have the layout this binary
// expects (left by another version of ebpf-cni).
var ErrIncompatible = errors.New("pinned map has another layout")

// OpenPinned opens the named maps pinned under bpfRoot, creating and pinning
// those that do not exist yet. Concurrent callers may race to create a map:
// the loser finds the winner's pin and uses it.
func OpenPinned(bpfRoot string, names ...string) (map[string]*ebpf.Map, error) {
	if err := CheckBPFFS(bpfRoot); err != nil {
		return nil, err
	}
	dir := Dir(bpfRoot)
	out := make(map[string]*ebpf.Map, len(names))
	closeAll := func() {
		for _, m := range out {
			m.Close()
		}
	}
	var spec *ebpf.CollectionSpec
	for _, name := range names {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), nil)
		if err == nil {
			l, ok := layouts[name]
			if !ok { // no fast check for this map: compare with the full spec
				if spec == nil {
					if spec, err = LoadCni(); err != nil {
						m.Close()
						closeAll()
						return nil, fmt.Errorf("loading map specs: %w", err)
					}
				}
				ms := spec.Maps[name]
				l = [2]uintptr{uintptr(ms.KeySize), uintptr(ms.ValueSize)}
			}
			if uintptr(m.KeySize()) != l[0] || uintptr(m.ValueSize()) != l[1] {
				m.Close()
				closeAll()
				return nil, fmt.Errorf("%s/%s: %w (key %d, value %d bytes; want %d, %d)", dir, name, ErrIncompatible, m.KeySize(), m.ValueSize(), l[0], l[1])
			}
			out[name] = m
			continue
		}
		if !errors.Is(err, os.ErrNotExist) {
			closeAll()
			return nil, fmt.Errorf("opening pinned map %s/%s: %w", dir, name, err)
		}
		if spec == nil {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				closeAll()
				return nil, fmt.Errorf("creating %s: %w", dir, err)
			}
			if spec, err = LoadCni(); err != nil {
				closeAll()
				return nil, fmt.Errorf("loading map specs: %w", err)
			}
		}
		ms, ok := spec.Maps[name]
		if !ok {
			closeAll()
			return nil, fmt.Errorf("no map %q in the embedded object", name)
		}
		for try := 0; try < 3; try++ {
			m, err = ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
			if !errors.Is(err, unix.EEXIST) {
				break
			}
		}
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("creating map %s under %s: %w", name, dir, err)
		}
		out[name] = m
	}
	return out, nil
}

// Retired are maps an earlier build pinned that this one no longer has: a
// pinned map keeps its layout for its life, so a map whose layout changes
// gets a new name (pkt_counters and endpoint_counters counted by reason
// only; node_counters and device_counters count by direction too). The
// upgrade unpins them once every attachment runs this build's programs.
var Retired = []string{"pkt_counters", "endpoint_counters"}

// UnpinRetired removes the pins of the Retired maps under bpfRoot; a
// missing one is fine. A program of an older build still holding one keeps
// it alive until it is detached.
func UnpinRetired(bpfRoot string) error {
	var errs []error
	for _, name := range Retired {
		if err := os.Remove(filepath.Join(Dir(bpfRoot), name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpinning retired map %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
