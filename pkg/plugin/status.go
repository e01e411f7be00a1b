package plugin

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// CmdStatus reports whether an ADD can succeed now: bpffs mounted, the
// programs loaded and pinned (the first STATUS after boot loads them, so the
// first pod does not pay for it), and the IPAM plugin ready.
func CmdStatus(args *skel.CmdArgs) error {
	c, err := ParseConfig(args.StdinData, args.Args, false)
	if err != nil {
		return err
	}
	if _, err := attach.ParseMode(c.AttachMode); err != nil {
		return invalidConfig("attachMode", err.Error())
	}
	if err := maps.CheckBPFFS(c.BPFRoot); err != nil {
		return cniError(types.ErrPluginNotAvailable, "bpfRoot unusable", err)
	}
	// Unlocked: loading takes the node lock exclusively, for that moment.
	n, err := openNode(c, node.Unlocked)
	if err != nil {
		return err
	}
	defer n.Close()
	if _, err := n.Programs(); err != nil {
		return cniError(types.ErrPluginNotAvailable, "datapath programs unavailable", err)
	}
	if err := Delegate.Status(c); err != nil {
		return ipamError("STATUS", err)
	}
	return nil
}
