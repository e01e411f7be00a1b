// Package kernel probes the running kernel for the features ebpf-cni uses,
// so that the operator CLI (ebpf-cni status), the CNI verbs (a clear error
// at ADD when a configured feature is missing) and the tests (a skip with
// its reason) ask the same questions and get the same answers.
//
// What each feature needs, and which kernels the tests proved it on, is in
// docs/kernels.md.
package kernel

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Feature is one probed kernel feature: whether the kernel has it, and a
// sentence saying what was found (or why it is missing, and what follows).
type Feature struct {
	Available bool   `json:"available"`
	Detail    string `json:"detail"`
}

// Names of the features Probe reports, in the order status lists them.
const (
	BTF     = "btf"
	TCX     = "tcx"
	FQ      = "fq"
	KernCtx = "kern_ctx"
	Netkit  = "netkit"
)

// Names lists the features Probe reports.
var Names = []string{BTF, TCX, FQ, KernCtx, Netkit}

// Probe probes every feature. Each probe runs once per process.
func Probe() map[string]Feature {
	return map[string]Feature{BTF: HaveBTF(), TCX: HaveTCX(), FQ: HaveFQ(), KernCtx: HaveKernCtx(), Netkit: HaveNetkit()}
}

// Release is the running kernel's release (uname -r).
func Release() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "(unknown)"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// HaveNetkit asks the kernel for the netkit programs of the loopback
// device: a kernel with netkit (6.7 or newer, CONFIG_NETKIT) answers that
// lo is no netkit device (ENXIO); one without refuses the attach type
// (EINVAL). A query only: no device is made.
var HaveNetkit = sync.OnceValue(func() Feature {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return Feature{false, fmt.Sprintf("cannot probe: %v", err)}
	}
	_, err = link.QueryPrograms(link.QueryOptions{Target: lo.Attrs().Index, Attach: ebpf.AttachNetkitPrimary})
	if errors.Is(err, unix.ENXIO) {
		return Feature{true, "netkit devices (kernel >= 6.7, CONFIG_NETKIT); deviceType auto makes netkit pods"}
	}
	return Feature{false, fmt.Sprintf("no netkit devices (kernel < 6.7 or without CONFIG_NETKIT: %v); deviceType auto makes veth pods", err)}
})

// HaveBTF: the kernel describes its types (CONFIG_DEBUG_INFO_BTF); the
// programs' CO-RE relocations need it.
const vmlinuxBTF = "/sys/kernel/btf/vmlinux"

var HaveBTF = sync.OnceValue(func() Feature {
	if _, err := os.Stat(vmlinuxBTF); err != nil {
		return Feature{false, fmt.Sprintf("%s: %v: ebpf-cni needs a kernel built with CONFIG_DEBUG_INFO_BTF", vmlinuxBTF, err)}
	}
	return Feature{true, vmlinuxBTF}
})

// HaveTCX asks the kernel for the tcx programs of the loopback device: a
// query only, which kernels before 6.6 refuse.
var HaveTCX = sync.OnceValue(func() Feature {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return Feature{false, fmt.Sprintf("cannot probe: %v", err)}
	}
	if _, err := link.QueryPrograms(link.QueryOptions{Target: lo.Attrs().Index, Attach: ebpf.AttachTCXIngress}); err != nil {
		return Feature{false, fmt.Sprintf("no tcx links (kernel < 6.6: %v): attachMode auto uses tc (clsact + cls_bpf)", err)}
	}
	return Feature{true, "tcx links (kernel >= 6.6); attachMode auto uses them"}
})

// HaveFQ adds an fq qdisc to the loopback device of a network namespace
// made for the probe. The probing thread never returns to the scheduler
// (no UnlockOSThread): when the goroutine ends the thread exits and the
// namespace with it. Nothing outside that namespace is touched.
var HaveFQ = sync.OnceValue(func() Feature {
	ch := make(chan Feature, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- Feature{false, fmt.Sprintf("cannot probe: unshare: %v", err)}
			return
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			ch <- Feature{false, fmt.Sprintf("cannot probe: %v", err)}
			return
		}
		q := &netlink.GenericQdisc{QdiscType: "fq",
			QdiscAttrs: netlink.QdiscAttrs{LinkIndex: lo.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT}}
		if err := netlink.QdiscAdd(q); err != nil {
			if errors.Is(err, unix.ENOENT) {
				ch <- Feature{false, "this kernel has no fq qdisc (sch_fq)"}
			} else {
				ch <- Feature{false, fmt.Sprintf("adding an fq qdisc: %v", err)}
			}
			return
		}
		ch <- Feature{true, "qdisc fq (EDT pacing)"}
	}()
	return <-ch
})

// HaveKernCtx: the bpf_cast_to_kern_ctx kfunc (6.2). from_container reads
// the host veth's qdiscs (another plugin chained after ebpf-cni) through
// it with plain loads; without it, with bpf_probe_read_kernel (a few more
// nanoseconds a packet, and it needs a kernel not locked down for
// confidentiality).
var HaveKernCtx = sync.OnceValue(func() Feature {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return Feature{false, fmt.Sprintf("cannot probe: %v", err)}
	}
	var fn *btf.Func
	if err := spec.TypeByName("bpf_cast_to_kern_ctx", &fn); err != nil {
		return Feature{false, "no bpf_cast_to_kern_ctx kfunc (kernel < 6.2): chained qdiscs are read with bpf_probe_read_kernel"}
	}
	return Feature{true, "bpf_cast_to_kern_ctx kfunc (kernel >= 6.2): chained qdiscs are read with plain loads"}
})
