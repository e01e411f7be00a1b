// Command ebpf-cni is the interface plugin of ebpf-cni.
//
// The datapath (veth per attachment, tc programs) arrives with its own issue;
// until then the plugin speaks the CNI protocol and refuses to attach.
package main

import (
	"runtime"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/ebpf-cni/ebpf-cni/pkg/buildinfo"
)

func init() {
	runtime.LockOSThread()
}

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{}, version.All, buildinfo.About("ebpf-cni"))
}
