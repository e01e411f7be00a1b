// Command ebpf-ipam is a CNI IPAM plugin whose allocations live in pinned BPF
// maps, a drop-in replacement for host-local.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/ebpf-cni/ebpf-cni/pkg/buildinfo"
	// A call's process: the collector off, its heap on a huge page.
	_ "github.com/ebpf-cni/ebpf-cni/pkg/hugeheap"
	"github.com/ebpf-cni/ebpf-cni/pkg/ipam"
)

// No runtime.LockOSThread: see cmd/ebpf-cni.
func main() {
	skel.PluginMainFuncs(ipam.Funcs(), ipam.Versions, buildinfo.About("ebpf-ipam"))
}
