package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// errNoMap means a map is not pinned (yet): no pod was ever added, or it
// belongs to a feature an older build did not have. Commands show it empty.
var errNoMap = errors.New("map not pinned")

// bpffsMount finds the directory whose file system holds path (path itself
// or its nearest existing ancestor) and whether it is bpffs.
func bpffsMount(path string) (dir string, ok bool, err error) {
	p := filepath.Clean(path)
	for {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if err == nil {
			return p, st.Type == unix.BPF_FS_MAGIC, nil
		}
		if !errors.Is(err, unix.ENOENT) || p == "/" {
			return p, false, fmt.Errorf("statfs %s: %w", p, err)
		}
		p = filepath.Dir(p)
	}
}

// checkRoot says what to do when bpfRoot cannot hold the plugin's state:
// bpffs not mounted, or nothing there yet.
func checkRoot(bpfRoot string) error {
	dir, ok, err := bpffsMount(bpfRoot)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("bpffs not mounted at %s: mount -t bpf bpf %s (or point --bpf-root at the plugin's bpfRoot)", dir, dir)
	}
	if dir != filepath.Clean(bpfRoot) {
		return fmt.Errorf("no ebpf-cni state at %s: no pod was added on this node yet, or --bpf-root is not the plugin's bpfRoot", bpfRoot)
	}
	return nil
}

var (
	specOnce sync.Once
	spec     *ebpf.CollectionSpec
	specErr  error
)

// openMap opens a pinned map read-only and checks its layout against this
// binary's; errNoMap when it is not pinned. It never creates anything.
func openMap(bpfRoot, name string) (*ebpf.Map, error) {
	path := filepath.Join(maps.Dir(bpfRoot), name)
	m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("%s: %w", path, errNoMap)
	case errors.Is(err, os.ErrPermission):
		return nil, fmt.Errorf("opening %s: %w (run as root)", path, err)
	case err != nil:
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	specOnce.Do(func() { spec, specErr = maps.LoadCni() })
	if specErr != nil {
		m.Close()
		return nil, fmt.Errorf("loading map specs: %w", specErr)
	}
	if ms, ok := spec.Maps[name]; ok && (m.KeySize() != ms.KeySize || m.ValueSize() != ms.ValueSize) {
		m.Close()
		return nil, fmt.Errorf("%s: %w (key %d, value %d bytes; this build expects %d, %d): use the CLI of the ebpf-cni version that made it",
			path, maps.ErrIncompatible, m.KeySize(), m.ValueSize(), ms.KeySize, ms.ValueSize)
	}
	return m, nil
}

// openMaps opens several maps; missing ones are nil. close releases them.
func openMaps(bpfRoot string, names ...string) (ms map[string]*ebpf.Map, close func(), err error) {
	ms = map[string]*ebpf.Map{}
	close = func() {
		for _, m := range ms {
			if m != nil {
				m.Close()
			}
		}
	}
	for _, n := range names {
		m, err := openMap(bpfRoot, n)
		if err != nil && !errors.Is(err, errNoMap) {
			close()
			return nil, func() {}, err
		}
		ms[n] = m
	}
	return ms, close, nil
}

// tagVersion is the binary version a program tag was built from
// ("<version>-<digest>").
func tagVersion(tag string) string {
	if i := strings.LastIndexByte(tag, '-'); i > 0 {
		return tag[:i]
	}
	return tag
}

// sortedKeys lists a map's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
