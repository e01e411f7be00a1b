package plugin

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
	"github.com/ebpf-cni/ebpf-cni/pkg/kernel"
)

// kernelSupports refuses, before anything is made, a configuration that
// asks for a kernel feature this kernel lacks: a clear error naming the key
// instead of a failure deep in an attach (ADD) or a silent fallback. What
// the kernel lacks but the plugin works around (fq for EDT, the
// bpf_cast_to_kern_ctx kfunc) is not an error: ebpf-cni status reports it.
// ADD answers with errcode.KernelFeature, STATUS with "plugin not available".
func kernelSupports(mode attach.Mode) error {
	if f := kernel.HaveBTF(); !f.Available {
		return fmt.Errorf("kernel without BTF: %s", f.Detail)
	}
	if mode == attach.ModeTCX {
		if f := kernel.HaveTCX(); !f.Available {
			return fmt.Errorf("attachMode tcx: this kernel has no tcx links (kernel 6.6 or newer): use attachMode auto or tc (%s)", f.Detail)
		}
	}
	return nil
}

func kernelError(err error) error {
	return types.NewError(errcode.KernelFeature, err.Error(), "")
}
