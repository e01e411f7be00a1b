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

// OpenPinned opens the named maps pinned under bpfRoot, creating and pinning
// those that do not exist yet. Concurrent callers may race to create a map:
// the loser finds the winner's pin and uses it.
func OpenPinned(bpfRoot string, names ...string) (map[string]*ebpf.Map, error) {
	if err := CheckBPFFS(bpfRoot); err != nil {
		return nil, err
	}
	dir := Dir(bpfRoot)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	spec, err := LoadCni()
	if err != nil {
		return nil, fmt.Errorf("loading map specs: %w", err)
	}
	out := make(map[string]*ebpf.Map, len(names))
	closeAll := func() {
		for _, m := range out {
			m.Close()
		}
	}
	for _, name := range names {
		ms, ok := spec.Maps[name]
		if !ok {
			closeAll()
			return nil, fmt.Errorf("no map %q in the embedded object", name)
		}
		var m *ebpf.Map
		for try := 0; try < 3; try++ {
			m, err = ebpf.NewMapWithOptions(ms, ebpf.MapOptions{PinPath: dir})
			if !errors.Is(err, unix.EEXIST) {
				break
			}
		}
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("opening map %s under %s: %w", name, dir, err)
		}
		out[name] = m
	}
	return out, nil
}
