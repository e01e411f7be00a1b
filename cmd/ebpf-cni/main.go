// Command ebpf-cni is the interface plugin of ebpf-cni: a veth pair per
// attachment, tc eBPF programs on the host end, no bridge. Run by a person
// (no CNI_COMMAND in the environment) it is the operator CLI instead.
package main

import (
	// First of all packages to initialise (its import path sorts first): a
	// call's process gets the collector off and its heap on a huge page.
	_ "0hugeheap"

	"os"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/ebpf-cni/ebpf-cni/pkg/buildinfo"
	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
	"github.com/ebpf-cni/ebpf-cni/pkg/plugin"
)

// No runtime.LockOSThread here, unlike the reference plugins: nothing of
// ours moves the main goroutine's thread into another namespace (every
// hop is ns.Do's, on a goroutine of its own that locks its thread), and
// file locks (flock) and netlink sockets belong to no thread. Locked, the
// main goroutine made the runtime hand its P to another thread and wake
// the main thread back each time it waited (ns.Do, channels), and start
// a thread at init: ADD p50 0.5-0.7 ms longer (docs/performance.md).
func main() {
	// A runtime always sets CNI_COMMAND (VERSION included); a person does not.
	if _, ok := os.LookupEnv("CNI_COMMAND"); !ok {
		os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	skel.PluginMainFuncs(plugin.Funcs(), plugin.Versions, buildinfo.About("ebpf-cni"))
}
