package maps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

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

// layouts are the key and value sizes of every map, from the generated
// types. Opening an existing pin checks them instead of parsing the
// embedded object, which would cost more than the rest of an IPAM call
// (and a millisecond or more of every ADD and DEL).
var layouts = map[string][2]uintptr{
	CniMapIpamAllocs:       {unsafe.Sizeof(CniIpamKey{}), unsafe.Sizeof(CniIpamOwner{})},
	CniMapIpamCursors:      {unsafe.Sizeof(CniIpamCursorKey{}), unsafe.Sizeof(CniIpamCursor{})},
	CniMapIpamNets:         {4, unsafe.Sizeof(CniIpamNet{})},
	CniMapEndpoints:        {unsafe.Sizeof(CniEndpointKey{}), unsafe.Sizeof(CniEndpointInfo{})},
	CniMapEndpointDevs:     {4, unsafe.Sizeof(CniEndpointDev{})},
	CniMapPktCounters:      {4, unsafe.Sizeof(CniPktCounter{})},
	CniMapEndpointCounters: {4, unsafe.Sizeof(CniDevCounters{})},
	CniMapNat:              {unsafe.Sizeof(CniNatKey{}), unsafe.Sizeof(CniNatEntry{})},
	CniMapNatTimeouts:      {4, unsafe.Sizeof(CniNatLifetimes{})},
	CniMapMasqNets:         {unsafe.Sizeof(CniMasqNetKey{}), unsafe.Sizeof(CniMasqNet{})},
	CniMapMasqSkip:         {unsafe.Sizeof(CniMasqSkipKey{}), 4},
	CniMapUplinks:          {4, unsafe.Sizeof(CniUplinkInfo{})},
	CniMapBwBuckets:        {4, unsafe.Sizeof(CniBwState{})},
	CniMapHostports:        {unsafe.Sizeof(CniHostportKey{}), unsafe.Sizeof(CniHostportEntry{})},
	CniMapNodeAddrs:        {unsafe.Sizeof(CniEndpointKey{}), 4},
	CniMapHostportConfig:   {4, unsafe.Sizeof(CniHostportSettings{})},
	CniMapSockRevnat:       {unsafe.Sizeof(CniSockRevKey{}), unsafe.Sizeof(CniSockRev{})},
	CniMapLocalNetns:       {8, 4},
	CniMapFlows:            {unsafe.Sizeof(CniFlowKey{}), unsafe.Sizeof(CniFlowEntry{})},
	CniMapClusterRoutes:    {unsafe.Sizeof(CniClusterKey{}), unsafe.Sizeof(CniClusterRoute{})},
	CniMapClusterConfig:    {4, unsafe.Sizeof(CniClusterSettings{})},
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
