// Command ebpf-ipam is a CNI IPAM plugin whose allocations live in pinned BPF
// maps, a drop-in replacement for host-local.
package main

import (
	"runtime"
	"runtime/debug"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/ebpf-cni/ebpf-cni/pkg/buildinfo"
	// The call's heap on huge pages: a page fault costs tens of µs in a VM.
	_ "github.com/ebpf-cni/ebpf-cni/pkg/hugeheap"
	"github.com/ebpf-cni/ebpf-cni/pkg/ipam"
)

func init() {
	// Namespace and lock operations must stay on one OS thread.
	runtime.LockOSThread()
}

func main() {
	// A call lives for a few milliseconds and allocates little: collecting
	// garbage would only cost time.
	debug.SetGCPercent(-1)
	skel.PluginMainFuncs(ipam.Funcs(), ipam.Versions, buildinfo.About("ebpf-ipam"))
}
