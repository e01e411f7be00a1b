// Command ebpf-ipam is a CNI IPAM plugin whose allocations live in pinned BPF
// maps, a drop-in replacement for host-local.
package main

import (
	"runtime"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/ebpf-cni/ebpf-cni/pkg/buildinfo"
	// A call's process: the collector off, its heap on a huge page.
	_ "github.com/ebpf-cni/ebpf-cni/pkg/hugeheap"
	"github.com/ebpf-cni/ebpf-cni/pkg/ipam"
)

func init() {
	// Namespace and lock operations must stay on one OS thread.
	runtime.LockOSThread()
}

func main() {
	skel.PluginMainFuncs(ipam.Funcs(), ipam.Versions, buildinfo.About("ebpf-ipam"))
}
