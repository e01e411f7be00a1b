package programs

import (
	"fmt"
	"os"
	"strconv"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// loadPinned opens the program pinned at path. It is ebpf.LoadPinnedProgram
// without that function's first-call probe of the kernel (it creates a map
// to learn whether objects take names): 0.7-0.9 ms of every ADD, which
// opens one or two programs in a process of its own.
func loadPinned(path string) (*ebpf.Program, error) {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return nil, err
	}
	attr := struct {
		pathname      uint64
		fd, fileFlags uint32
	}{pathname: uint64(uintptr(unsafe.Pointer(p)))}
	r, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_OBJ_GET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	if errno != 0 {
		return nil, &os.PathError{Op: "BPF_OBJ_GET", Path: path, Err: errno}
	}
	fd := int(r)
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
