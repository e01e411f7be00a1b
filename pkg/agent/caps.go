package agent

import (
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/conflist"
)

// CapsOf are the capabilities the agent uses in each mode: routes need
// NET_ADMIN, the tunnel endpoints (bpf() on the plugin's pinned map) BPF.
var CapsOf = map[conflist.Mode][]int{
	conflist.ModeDirect: {unix.CAP_NET_ADMIN},
	conflist.ModeVXLAN:  {unix.CAP_BPF},
}

// MetricsCaps are what the metrics add: BPF, to read the plugin's pinned
// maps (bpf() on them).
var MetricsCaps = []int{unix.CAP_BPF}

// PolicyCaps are what the network policies add: BPF, to write the plugin's
// policy maps.
var PolicyCaps = []int{unix.CAP_BPF}

// keepOnlyCaps drops every capability but keep from the process's
// effective, permitted and inheritable sets, on every thread (capabilities
// are per thread, hence AllThreadsSyscall; threads made later copy them).
// The DaemonSet grants the agent's container the capabilities of both
// modes, since the mode is a ConfigMap value read at run time: the agent
// keeps those of its own. It never executes anything, so the bounding set
// (which a new program of uid 0 would get back) needs no change. Built
// with cgo (not how the image is built), it cannot: ENOTSUP.
func keepOnlyCaps(keep []int) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("reading the capabilities: %w", err)
	}
	var mask [2]uint32
	for _, c := range keep {
		mask[c/32] |= 1 << (c % 32)
	}
	for i := range data {
		data[i].Effective &= mask[i]
		data[i].Permitted &= mask[i]
		data[i].Inheritable &= mask[i]
	}
	_, _, errno := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0)
	if errno != 0 {
		return fmt.Errorf("dropping capabilities: %w", errno)
	}
	return nil
}
