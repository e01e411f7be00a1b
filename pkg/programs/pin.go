package programs

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"unsafe"

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

// Run runs prog once with context ctx (BPF_PROG_TEST_RUN) and returns
// what it returned. It is ebpf.Program.Run without that function's
// first-call probe of the kernel (it loads a program to learn whether
// programs can be run): a DEL runs one or two programs in a process of its
// own.
func Run(prog *ebpf.Program, ctx []byte) (uint32, error) {
	// ctxIn is a pointer, not a number: ctx may live on the goroutine's
	// stack, which moves (and has its pointers moved) when it grows.
	attr := struct {
		progFD, retval, dataSizeIn, dataSizeOut uint32
		dataIn, dataOut                         uint64
		repeat, duration, ctxSizeIn, ctxSizeOut uint32
		ctxIn                                   unsafe.Pointer
		ctxOut                                  uint64
		flags, cpu, batchSize                   uint32
		_                                       uint32
	}{progFD: uint32(prog.FD()), ctxSizeIn: uint32(len(ctx)), ctxIn: unsafe.Pointer(unsafe.SliceData(ctx))}
	_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_TEST_RUN, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(ctx)
	if errno != 0 {
		return 0, fmt.Errorf("running %s: %w", prog, errno)
	}
	return attr.retval, nil
}
