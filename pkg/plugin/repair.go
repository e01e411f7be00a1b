package plugin

import (
	"os"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/repair"
)

// Network is the call's network as the repair layer needs it: its name,
// configuration and attach modes, and its IPAM to release what a gone
// attachment of it holds.
func (c *Config) Network() *repair.Network {
	net := &repair.Network{Name: c.Name, Conf: c.IPAMConf, Mode: c.Mode, DeviceMode: attach.DeviceMode(c.AttachMode),
		Release: func(containerID, ifName, netns string) error {
			return c.ipam().Del(otherAttachment(containerID, ifName, netns), c)
		}}
	if c.IPAMType == DefaultIPAM {
		net.EbpfIPAM = c.IPAMConf
	}
	return net
}

// otherAttachment are the IPAM arguments of an attachment that is not the
// call's (the repair releases its addresses): its identity, no CNI_ARGS,
// and this process's CNI_PATH (the calling verb's, which skel read from
// there).
func otherAttachment(containerID, ifName, netns string) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: containerID, IfName: ifName, Netns: netns, Path: os.Getenv("CNI_PATH")}
}
