package maps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ErrNotBPFFS means a path is not on a mounted bpf filesystem.
var ErrNotBPFFS = errors.New("not on a bpf filesystem")

// Dir is where the maps are pinned under a bpfRoot.
func Dir(bpfRoot string) string { return filepath.Join(bpfRoot, "maps") }

// PinName is s made a name bpffs takes: bpffs refuses every name with a
// '.' in it (reserved, the kernel's bpf_lookup: EPERM), which a release
// version (v0.2.0) or a VLAN device (eth0.100) has. A '.' becomes "%2e",
// a '%' "%25", so that two names never meet; FromPinName undoes it.
func PinName(s string) string {
	if !strings.ContainsAny(s, ".%") {
		return s
	}
	return strings.NewReplacer("%", "%25", ".", "%2e").Replace(s)
}

// FromPinName is the name PinName made name from.
func FromPinName(name string) string {
	if !strings.Contains(name, "%") {
		return name
	}
	return strings.NewReplacer("%2e", ".", "%25", "%").Replace(name)
}

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

// layouts (layouts_gen.go, generated from the object) are the type, key and
// value sizes of every map. Opening an existing pin checks them instead of
// parsing the embedded object, which would cost more than the rest of an
// IPAM call (and a millisecond or more of every ADD and DEL).
type layout struct{ typ, key, value uint32 }

func layoutOf(ms *ebpf.MapSpec) layout { return layout{uint32(ms.Type), ms.KeySize, ms.ValueSize} }

// ObjGet opens the object pinned at path (BPF_OBJ_GET, read-write) and
// returns its descriptor. ebpf.LoadPinnedMap and LoadPinnedProgram do the
// same, then read the link /proc/self/fd/N to learn the object's kind, for
// each of the 15-20 objects an ADD opens (3 µs each in a hot loop on the
// 2-vCPU VM, more in a call's fresh process). Callers here
// learn the kind from what they ask of the object next (a map's type and
// sizes, see OpenPinned). A missing pin is an error wrapping os.ErrNotExist.
func ObjGet(path string) (int, error) {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return -1, err
	}
	attr := struct {
		pathname      uint64
		fd, fileFlags uint32
	}{pathname: uint64(uintptr(unsafe.Pointer(p)))}
	r, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_OBJ_GET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(p)
	if errno != 0 {
		return -1, &os.PathError{Op: "BPF_OBJ_GET", Path: path, Err: errno}
	}
	return int(r), nil
}

// openPin opens the map pinned at path. Something else pinned there (a
// program, a link) is not told apart by its kind: its info read as a map's
// has another type or other sizes, which the caller's layout check refuses.
func openPin(path string) (*ebpf.Map, error) {
	fd, err := ObjGet(path)
	if err != nil {
		return nil, err
	}
	return ebpf.NewMapFromFD(fd) // closes fd when it fails
}

// ErrNotPinned means a map is not pinned (yet): no pod was ever added, or
// it belongs to a feature an older build did not have.
var ErrNotPinned = errors.New("map not pinned")

// OpenPinnedReadOnly opens the map name pinned under bpfRoot read-only,
// checked like OpenPinned's (its layout, not its contents); it never
// creates one: ErrNotPinned (wrapped) when there is none. For readers that
// must not change the node (the operator CLI's views).
func OpenPinnedReadOnly(bpfRoot, name string) (*ebpf.Map, error) {
	path := filepath.Join(Dir(bpfRoot), name)
	m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("%s: %w", path, ErrNotPinned)
	case errors.Is(err, os.ErrPermission):
		return nil, fmt.Errorf("opening %s: %w (run as root)", path, err)
	case err != nil:
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	if l, ok := layouts[name]; ok {
		if got := (layout{uint32(m.Type()), m.KeySize(), m.ValueSize()}); got != l {
			m.Close()
			return nil, fmt.Errorf("%s: %w (%s, key %d, value %d bytes; this build expects %s, %d, %d): use the CLI of the ebpf-cni version that made it",
				path, ErrIncompatible, m.Type(), got.key, got.value, ebpf.MapType(l.typ), l.key, l.value)
		}
	}
	return m, nil
}

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
	return OpenPinnedChecked(bpfRoot, names...)
}

// OpenPinnedChecked is OpenPinned for a caller that has checked bpfRoot
// (CheckBPFFS) in the same call.
func OpenPinnedChecked(bpfRoot string, names ...string) (map[string]*ebpf.Map, error) {
	dir := Dir(bpfRoot)
	out := make(map[string]*ebpf.Map, len(names))
	closeAll := func() {
		for _, m := range out {
			m.Close()
		}
	}
	var spec *ebpf.CollectionSpec
	for _, name := range names {
		m, err := openPin(filepath.Join(dir, name))
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
				if ms := spec.Maps[name]; ms != nil {
					l = layoutOf(ms)
				}
			}
			if got := (layout{uint32(m.Type()), m.KeySize(), m.ValueSize()}); got != l {
				m.Close()
				closeAll()
				return nil, fmt.Errorf("%s/%s: %w (%s, key %d, value %d bytes; want %s, %d, %d)", dir, name, ErrIncompatible,
					m.Type(), got.key, got.value, ebpf.MapType(l.typ), l.key, l.value)
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
var Retired = []string{"pkt_counters", "endpoint_counters", "policy_names"}

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
