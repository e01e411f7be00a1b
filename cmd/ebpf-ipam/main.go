// Command ebpf-ipam is a CNI IPAM plugin whose allocations live in pinned BPF
// maps, a drop-in replacement for host-local.
package main

import (
	// First of all packages to initialise (its import path sorts first): a
	// call's process gets the collector off and its heap on a huge page.
	_ "0hugeheap"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/ebpf-cni/ebpf-cni/pkg/buildinfo"
	"github.com/ebpf-cni/ebpf-cni/pkg/ipam"
)

// No runtime.LockOSThread: see cmd/ebpf-cni.
func main() {
	skel.PluginMainFuncs(ipam.Funcs(), ipam.Versions, buildinfo.About("ebpf-ipam"))
}
