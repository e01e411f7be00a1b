package programs

import (
	"fmt"
	"os"
	"strconv"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// loadPinned opens the program pinned at path. It is ebpf.LoadPinnedProgram
// without that function's first-call probe of the kernel (it creates a map
// to learn whether objects take names): 0.7-0.9 ms of every ADD, which
// opens one or two programs in a process of its own.
func loadPinned(path string) (*ebpf.Program, error) {
	fd, err := maps.ObjGet(path)
	if err != nil {
		return nil, err
	}
	// A pinned map under the programs' directory would pass for a program
	// of some type: the kernel names the fd's kind.
	kind, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil || kind != "anon_inode:bpf-prog" {
		unix.Close(fd)
		return nil, fmt.Errorf("%s is not a program (%q): %v", path, kind, err)
	}
	prog, err := ebpf.NewProgramFromFD(fd) // closes fd when it fails
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return prog, nil
}
