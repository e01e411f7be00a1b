package maps

import (
	"fmt"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ID returns the kernel's ID of a map with one BPF_OBJ_GET_INFO_BY_FD call.
// (ebpf.Map.Info also parses /proc/self/fdinfo, which a short-lived plugin
// calling it on every request does not need.)
func ID(m *ebpf.Map) (uint32, error) { return ObjectID(m.FD()) }

// ObjectID is ID for any BPF object fd: struct bpf_map_info and struct
// bpf_prog_info both start with type, id.
func ObjectID(fd int) (uint32, error) {
	var info [2]uint32
	// info is a pointer, not a number: the stack it is on may move.
	attr := struct {
		fd, infoLen uint32
		info        unsafe.Pointer
	}{uint32(fd), uint32(unsafe.Sizeof(info)), unsafe.Pointer(&info)}
	const bpfObjGetInfoByFD = 15
	if _, _, errno := unix.Syscall(unix.SYS_BPF, bpfObjGetInfoByFD, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr)); errno != 0 {
		return 0, fmt.Errorf("reading object info: %w", errno)
	}
	return info[1], nil
}
