package cli

import (
	"errors"
	"flag"
	"fmt"

	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/conflist"
)

func init() {
	register(&Command{
		Name:    "conflist",
		Summary: "print a network configuration list for this node (what make install writes)",
		Help: `Prints the conflist that makes ebpf-cni a node's primary network: ebpf-cni
with ebpf-ipam, the portMappings, bandwidth and ips capabilities, masquerade
on unless --masquerade=false, and the node's pod range(s) from --pod-cidr
(required; "v4,v6" for dual stack). cniVersion 1.0.0 unless --cni-version:
containerd 1.6/1.7 and podman 4 take no 1.1.0 result (docs/deploy.md lists
runtime versions against spec versions). On a cluster, --cluster-cidrs
becomes the plugin's clusterCIDRs, and --mode vxlan adds "overlay": "vxlan"
(with --vxlan-port and --vxlan-vni when given). --device-type becomes the
plugin's deviceType (left out: auto, netkit where the kernel has it, else
veth; veth for a list chaining the reference bandwidth plugin). --bpf-root
and --state-dir are written when they differ from the defaults. It writes
no file:
  ebpf-cni conflist --pod-cidr 10.244.1.0/24 > /etc/cni/net.d/10-ebpf-cni.conflist

JSON: the output is the conflist itself, whatever -o says.`,
		Flags: func(fs *flag.FlagSet) func(*Context) error {
			var pod, cluster, service, name, version, mode, device string
			var masq bool
			var mtu, port, vni int
			fs.StringVar(&pod, "pod-cidr", "", "this node's pod `RANGES`, comma-separated, at most one per family (required)")
			fs.StringVar(&cluster, "cluster-cidrs", "", "every node's pod `RANGES`: traffic to them is not masqueraded")
			fs.StringVar(&service, "service-cidrs", "", "the cluster's Service `RANGES` (checked against the pod ranges)")
			fs.BoolVar(&masq, "masquerade", true, "masquerade pod traffic leaving the node (ipMasq)")
			fs.StringVar(&name, "name", conflist.DefaultName, "network `NAME`")
			fs.StringVar(&version, "cni-version", conflist.DefaultVersion, "cniVersion `V` of the list")
			fs.StringVar(&mode, "mode", string(conflist.ModeDirect), "how pods reach other nodes' pods: `direct|vxlan`")
			fs.IntVar(&port, "vxlan-port", 0, "UDP `PORT` of the overlay (mode vxlan; default 4789)")
			fs.IntVar(&vni, "vxlan-vni", 0, "`VNI` of the overlay (mode vxlan; default 1)")
			fs.IntVar(&mtu, "mtu", 0, "pod `MTU` (default: the uplink's, less the overlay's overhead)")
			fs.StringVar(&device, "device-type", "", "the pods' device `TYPE`: auto|netkit|veth (default auto: netkit where the kernel has it, else veth)")
			return func(ctx *Context) error {
				o := conflist.Options{Name: name, CNIVersion: version, Masquerade: masq, MTU: mtu, DeviceType: device, VXLANPort: port, VXLANVNI: vni}
				var err error
				if o.PodCIDRs, err = conflist.ParseCIDRs("--pod-cidr", pod); err != nil {
					return err
				}
				if o.ClusterCIDRs, err = conflist.ParseCIDRs("--cluster-cidrs", cluster); err != nil {
					return err
				}
				if o.ServiceCIDRs, err = conflist.ParseCIDRs("--service-cidrs", service); err != nil {
					return err
				}
				if o.Mode, err = conflist.ParseMode(mode); err != nil {
					return err
				}
				if ctx.BPFRoot != config.DefaultBPFRoot {
					o.BPFRoot = ctx.BPFRoot
				}
				if ctx.StateDir != config.DefaultStateDir {
					o.StateDir = ctx.StateDir
				}
				b, err := conflist.Build(o)
				var oe *conflist.OptionError
				if errors.As(err, &oe) {
					// Name the flag, not the option behind it.
					if f, ok := flagOf[oe.Key]; ok {
						return fmt.Errorf("invalid %s: %s", f, oe.Msg)
					}
					return err
				}
				if err != nil {
					return err
				}
				_, err = ctx.Stdout.Write(b)
				return err
			}
		},
	})
}

var flagOf = map[string]string{
	"name": "--name", "cniVersion": "--cni-version", "podCIDRs": "--pod-cidr",
	"clusterCIDRs": "--cluster-cidrs", "serviceCIDRs": "--service-cidrs", "mode": "--mode",
	"vxlanPort": "--vxlan-port", "vxlanVNI": "--vxlan-vni", "mtu": "--mtu", "deviceType": "--device-type", "bpfRoot": "--bpf-root", "stateDir": "--state-dir",
}
