package plugin

import (
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// CmdCheck verifies the attachment against prevResult and against what ADD
// made (host veth, host routes, then what each feature checks), then asks
// the IPAM plugin. The error names every difference found.
func CmdCheck(args *skel.CmdArgs) (err error) {
	cl := startCall("CHECK", args, nil)
	defer func() { cl.end(err) }()
	c, err := ParseConfig(args.StdinData, args.Args, true)
	if err != nil {
		return err
	}
	if c.RawPrevResult == nil {
		return invalidConfig("prevResult", "CHECK needs the result of ADD")
	}
	prev, err := prevResult(c)
	if err != nil {
		return err
	}
	podNS, n, err := openPod(c, args.Netns, nil)
	if err != nil {
		return err
	}
	cl.opened(n)
	defer podNS.Close()
	defer n.Close()

	hostName := veth.HostName(args.ContainerID, args.IfName)
	hostIf, contIf, ips, problems := expected(prev, args, hostName)
	rec, err := n.Record(hostName)
	if err != nil {
		problems = append(problems, err.Error())
	}
	// Pod side, host side, then the endpoint and every feature.
	found, contMAC, err := veth.CheckPod(podNS, args.Netns, args.IfName, macOf(contIf), ips, prev.Routes)
	if err != nil {
		return cniError(errcode.CheckFailed, "inspecting the pod", err)
	}
	problems = append(problems, found...)
	found, host := veth.CheckHost(hostName, macOf(hostIf), ips)
	problems = append(problems, found...)
	if host != nil {
		ep := checked(args, c, rec, host, contMAC, ips)
		ep.PodNS = podNS
		report := func(ps []string) {
			for _, p := range ps {
				// Features that share a part (the uplinks) report it alike.
				if !slices.Contains(problems, p) {
					problems = append(problems, p)
				}
			}
		}
		_ = features.InOrder(func() error {
			report(endpoint.Check(n, ep))
			return nil
		}, func(i int, _ feature.Feature) error {
			report(c.Pods[i].Check(n, ep))
			return nil
		})
	}

	if len(problems) > 0 {
		return types.NewError(errcode.CheckFailed, fmt.Sprintf("check of %s/%s failed: %s", args.ContainerID, args.IfName, strings.Join(problems, "; ")), "")
	}
	if err := c.ipam().Check(args, c); err != nil {
		return ipamError("CHECK", err)
	}
	return nil
}

// expected is what prevResult says of the attachment: its interfaces (the
// pod's in its sandbox, the host veth) and the pod's addresses; problems
// names an interface it lacks.
func expected(prev *current.Result, args *skel.CmdArgs, hostName string) (hostIf, contIf *current.Interface, ips []*current.IPConfig, problems []string) {
	contIdx := -1
	for i, iface := range prev.Interfaces {
		switch {
		case iface.Name == args.IfName && iface.Sandbox == args.Netns:
			contIf, contIdx = iface, i
		case iface.Name == hostName && iface.Sandbox == "":
			hostIf = iface
		}
	}
	if contIf == nil {
		problems = append(problems, fmt.Sprintf("prevResult lists no interface %s in sandbox %s", args.IfName, args.Netns))
	}
	if hostIf == nil {
		problems = append(problems, fmt.Sprintf("prevResult lists no host interface %s", hostName))
	}
	for _, ipc := range prev.IPs {
		if ipc.Interface == nil || *ipc.Interface == contIdx {
			ips = append(ips, ipc)
		}
	}
	return hostIf, contIf, ips, problems
}

func macOf(i *current.Interface) string {
	if i == nil {
		return ""
	}
	return i.Mac
}

// checked is the endpoint the features check: what the runtime expects
// (prevResult's addresses, the interfaces found), with the record's
// attachments and feature state.
func checked(args *skel.CmdArgs, c *Config, rec *node.Record, host netlink.Link, contMAC net.HardwareAddr, ips []*current.IPConfig) *feature.Endpoint {
	r := &node.Record{}
	if rec != nil {
		*r = *rec
	}
	r.ContainerID, r.IfName, r.Network = args.ContainerID, args.IfName, c.Name
	r.HostIfName, r.HostIfIndex, r.HostMAC = host.Attrs().Name, host.Attrs().Index, veth.MAC(host)
	r.MAC = ""
	if contMAC != nil {
		r.MAC = contMAC.String()
	}
	r.IPs = nil
	for _, ipc := range ips {
		r.IPs = append(r.IPs, ipc.Address.String())
	}
	return &feature.Endpoint{Record: r, Recorded: rec != nil, Mode: c.Mode, Host: host}
}
