package plugin

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ipam"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// CmdStatus reports whether an ADD can succeed now: bpffs mounted, the
// programs loaded and pinned (the first STATUS after boot loads them, so the
// first pod does not pay for it), and the IPAM plugin ready.
func CmdStatus(args *skel.CmdArgs) error {
	c, err := ParseConfig(args.StdinData, args.Args, false)
	if err != nil {
		return err
	}
	mode, err := datapath.ParseMode(c.AttachMode)
	if err != nil {
		return invalidConfig("attachMode", err.Error())
	}
	if err := kernelSupports(mode); err != nil {
		return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
	}
	if err := maps.CheckBPFFS(c.BPFRoot); err != nil {
		return cniError(types.ErrPluginNotAvailable, "bpfRoot unusable", err)
	}
	progs, _, err := datapath.EnsurePrograms(c.BPFRoot, c.StateDir)
	if err != nil {
		return cniError(types.ErrPluginNotAvailable, "datapath programs unavailable", err)
	}
	progs.Close()
	if err := ipam.ExecStatus(c.IPAMType, c.IPAMConf); err != nil {
		return ipamError("STATUS", err)
	}
	return nil
}
