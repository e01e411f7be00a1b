// Command ebpf-cni is the interface plugin of ebpf-cni: a veth pair per
// attachment, tc eBPF programs on the host end, no bridge.
package main

import (
	"runtime"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/ebpf-cni/ebpf-cni/pkg/buildinfo"
	"github.com/ebpf-cni/ebpf-cni/pkg/plugin"
)

func init() {
	// Namespace hops, locks and netlink calls must stay on one OS thread.
	runtime.LockOSThread()
}

func main() {
	skel.PluginMainFuncs(plugin.Funcs(), plugin.Versions, buildinfo.About("ebpf-cni"))
}
