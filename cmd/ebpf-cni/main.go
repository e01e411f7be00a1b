// Command ebpf-cni is the interface plugin of ebpf-cni: a veth pair per
// attachment, tc eBPF programs on the host end, no bridge. Run by a person
// (no CNI_COMMAND in the environment) it is the operator CLI instead.
package main

import (
	"os"
	"runtime"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/ebpf-cni/ebpf-cni/pkg/buildinfo"
	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
	// A call's process: the collector off, its heap on a huge page.
	_ "github.com/ebpf-cni/ebpf-cni/pkg/hugeheap"
	"github.com/ebpf-cni/ebpf-cni/pkg/plugin"
)

func init() {
	// Namespace hops, locks and netlink calls must stay on one OS thread.
	runtime.LockOSThread()
}

func main() {
	// A runtime always sets CNI_COMMAND (VERSION included); a person does not.
	if _, ok := os.LookupEnv("CNI_COMMAND"); !ok {
		os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	skel.PluginMainFuncs(plugin.Funcs(), plugin.Versions, buildinfo.About("ebpf-cni"))
}
