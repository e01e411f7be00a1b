package maps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
)

// Rescue pins again, under bpfRoot, the maps that the programs progs use
// and that have no pin there: a bpffs unmounted and mounted again lost its
// pins, but the programs still attached to the node's devices (tc filters
// hold them) keep their maps alive in the kernel, with every endpoint, flow
// and published port. Once pinned, the programs loaded next share them
// (OpenPinned), so the node goes on with its state instead of empty maps.
// A map is known by its kernel name (the first 15 bytes of ours) and must
// have the layout this build expects. It returns the names pinned.
func Rescue(bpfRoot string, progs []ebpf.ProgramID) ([]string, error) {
	spec, err := LoadCni()
	if err != nil {
		return nil, fmt.Errorf("loading map specs: %w", err)
	}
	byKernelName := map[string]*ebpf.MapSpec{}
	for name, ms := range spec.Maps {
		if ms.Pinning == ebpf.PinNone || strings.HasPrefix(name, ".") {
			continue
		}
		k := name
		if len(k) > kernelNameLen {
			k = k[:kernelNameLen]
		}
		byKernelName[k] = ms
	}
	dir := Dir(bpfRoot)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	seen := map[ebpf.MapID]bool{}
	var pinned []string
	var errs []error
	for _, pid := range progs {
		p, err := ebpf.NewProgramFromID(pid)
		if err != nil {
			continue // gone meanwhile
		}
		info, err := p.Info()
		p.Close()
		if err != nil {
			continue
		}
		ids, _ := info.MapIDs()
		for _, id := range ids {
			if seen[id] {
				continue
			}
			seen[id] = true
			name, err := rescueOne(dir, id, byKernelName)
			if err != nil {
				errs = append(errs, err)
			} else if name != "" {
				pinned = append(pinned, name)
			}
		}
	}
	return pinned, errors.Join(errs...)
}

func rescueOne(dir string, id ebpf.MapID, byKernelName map[string]*ebpf.MapSpec) (string, error) {
	m, err := ebpf.NewMapFromID(id)
	if err != nil {
		return "", nil
	}
	defer m.Close()
	info, err := m.Info()
	if err != nil {
		return "", nil
	}
	ms, ok := byKernelName[info.Name]
	if !ok {
		return "", nil // a program's own map (.rodata, scratch)
	}
	if info.Type != ms.Type || info.KeySize != ms.KeySize || info.ValueSize != ms.ValueSize {
		return "", nil // another build's layout: not ours to keep
	}
	path := filepath.Join(dir, ms.Name)
	if _, err := os.Stat(path); err == nil {
		return "", nil // pinned already: that one is the node's
	}
	if err := m.Pin(path); errors.Is(err, os.ErrExist) {
		return "", nil // a concurrent call pinned it
	} else if err != nil {
		return "", fmt.Errorf("pinning map %s (id %d) again: %w", ms.Name, id, err)
	}
	return ms.Name, nil
}

// kernelNameLen is how much of a map's name the kernel keeps
// (BPF_OBJ_NAME_LEN less its NUL).
const kernelNameLen = 15
