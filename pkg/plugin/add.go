// Package plugin implements the CNI verbs of ebpf-cni over pkg/datapath.
package plugin

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ipam"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/bandwidth"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/nat"
	"github.com/ebpf-cni/ebpf-cni/pkg/portmap"
)

// Funcs are the CNI verbs of ebpf-cni, for skel.PluginMainFuncs.
func Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: CmdAdd, Del: CmdDel, Check: CmdCheck, GC: CmdGC, Status: CmdStatus}
}

// Versions lists every CNI spec version ebpf-cni speaks.
var Versions = version.All

func openNetNS(path string) (ns.NetNS, error) {
	if path == "" {
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables, "invalid CNI_NETNS: empty", "")
	}
	n, err := ns.GetNS(path)
	if err != nil {
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("invalid CNI_NETNS %q: %v", path, err), "")
	}
	return n, nil
}

func checkIfName(name string) error {
	if name == "" || len(name) > 15 || name == "." || name == ".." {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("invalid CNI_IFNAME %q", name), "")
	}
	return nil
}

// CmdAdd creates the attachment: IPAM, veth, pod addresses and routes, host
// routes, endpoint entries, program attachments, record. Any failure undoes
// every step already done, in reverse.
func CmdAdd(args *skel.CmdArgs) (err error) {
	c, err := ParseConfig(args.StdinData, args.Args, true)
	if err != nil {
		return err
	}
	if err := kernelSupports(c.Mode); err != nil {
		return kernelError(err)
	}
	if err := checkIfName(args.IfName); err != nil {
		return err
	}
	podNS, err := openNetNS(args.Netns)
	if err != nil {
		return err
	}
	defer podNS.Close()
	if err := maps.CheckBPFFS(c.BPFRoot); err != nil {
		return cniError(ErrBPFFS, "invalid bpfRoot", err)
	}
	progs, _, err := datapath.EnsurePrograms(c.BPFRoot, c.StateDir)
	if err != nil {
		return cniError(ErrProgramLoad, "loading the datapath programs", err)
	}
	defer progs.Close()
	lock, err := datapath.NodeLock(c.StateDir, false)
	if err != nil {
		return cniError(types.ErrIOFailure, "invalid stateDir", err)
	}
	defer lock.Unlock()

	hostName := datapath.HostVethName(args.ContainerID, args.IfName)
	if _, err := datapath.ReadRecord(c.StateDir, hostName); err == nil {
		return types.NewError(ErrInterfaceExists, fmt.Sprintf("attachment %s/%s already exists (host veth %s); DEL it first", args.ContainerID, args.IfName, hostName), "")
	}
	// Checked before IPAM, so a taken name costs no allocation; CreateVeth
	// checks again against a race.
	var exists bool
	_ = podNS.Do(func(ns.NetNS) error {
		_, lerr := netlinkLinkByName(args.IfName)
		exists = lerr == nil
		return nil
	})
	if exists {
		return types.NewError(ErrInterfaceExists, fmt.Sprintf("interface %s already exists in %s", args.IfName, args.Netns), "")
	}

	// Closed after the undo steps below have run (defers run last first).
	var em *datapath.EndpointMaps
	defer func() { em.Close() }()
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()

	r, err := ipam.ExecAdd(c.IPAMType, c.IPAMConf)
	if err != nil {
		return ipamError("ADD", err)
	}
	undo = append(undo, func() { _ = ipam.ExecDel(c.IPAMType, c.IPAMConf) })
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return cniError(ErrIPAM, "converting the IPAM result", err)
	}
	if len(res.IPs) == 0 {
		return types.NewError(ErrIPAM, fmt.Sprintf("IPAM plugin %s returned no address", c.IPAMType), "")
	}
	datapath.Gateways(res.IPs)
	routes := datapath.PodRoutes(res.IPs, res.Routes)
	var podIPs []net.IP
	for _, ipc := range res.IPs {
		podIPs = append(podIPs, ipc.Address.IP)
	}
	ports, err := c.HostPorts.Ports(podIPs)
	if err != nil {
		return hostPortError(err)
	}

	mtu := c.MTU
	if mtu == 0 {
		mtu = clusterMTU(c, defaultMTU())
	}
	veth, err := datapath.CreateVeth(hostName, podNS, args.IfName, mtu, c.MAC, datapath.Alias(args.ContainerID, args.IfName))
	if err != nil {
		if errors.Is(err, datapath.ErrInterfaceExists) {
			return cniError(ErrInterfaceExists, "creating the veth pair", err)
		}
		return cniError(ErrLinkSetup, "creating the veth pair", err)
	}
	undo = append(undo, func() { _ = datapath.DeleteHostVeth(hostName) })

	if err := datapath.ConfigurePod(podNS, args.IfName, res.IPs, routes); err != nil {
		return cniError(ErrLinkSetup, "configuring "+args.IfName+" in the pod", err)
	}
	if err := datapath.ConfigureHost(veth.Host, res.IPs); err != nil {
		return cniError(ErrLinkSetup, "configuring host veth "+hostName, err)
	}

	if c.Masq.Enabled {
		var podNets []*net.IPNet
		for _, ipc := range res.IPs {
			podNets = append(podNets, &net.IPNet{IP: ipc.Address.IP.Mask(ipc.Address.Mask), Mask: ipc.Address.Mask})
		}
		// The node's last endpoint takes masquerade with it; so does a
		// failed first ADD.
		undo = append(undo, func() { releaseNode(c, lock) })
		if err := nat.Apply(c.BPFRoot, c.StateDir, c.Name, c.Masq, podNets, c.Mode, progs); err != nil {
			return natError(err)
		}
	}

	if err := clusterAdd(c, progs, &undo, lock); err != nil {
		return err
	}

	em, err = datapath.OpenEndpointMaps(c.BPFRoot)
	if err != nil {
		return cniError(ErrBPFFS, "opening the endpoint maps", err)
	}
	ep := &datapath.Endpoint{
		HostIfIndex: veth.Host.Attrs().Index,
		HostMAC:     veth.Host.Attrs().HardwareAddr,
		MAC:         veth.Container.Attrs().HardwareAddr,
		ContainerID: args.ContainerID,
		IfName:      args.IfName,
		NetID:       maps.NetID(c.Name),
		IPs:         podIPs,
		Flags:       c.BW.Flags(),
	}
	if len(ports) > 0 {
		ep.Flags |= datapath.EndpointFlagHostPort
	}
	if c.Mode == datapath.ModeTC {
		ep.Flags |= datapath.EndpointFlagClsact
	}
	// The buckets before the endpoint entries: a flag never points at a
	// missing bucket (a missing one would only mean no limit).
	if c.BW.Any() {
		if err := putBuckets(c, veth.Host); err != nil {
			return err
		}
		undo = append(undo, func() { _ = deleteBuckets(c.BPFRoot, ep.HostIfIndex) })
	}
	undo = append(undo, func() { _ = em.Delete(ep.HostIfIndex, ep.HostMAC, ep.IPs) })
	if err := em.Put(ep); err != nil {
		if errors.Is(err, datapath.ErrEndpointConflict) {
			return cniError(ErrEndpointConflict, "adding the endpoint", err)
		}
		return cniError(ErrBPFFS, "adding the endpoint", err)
	}

	if err := pace(c, podNS, ep.HostIfIndex, progs, &undo, lock); err != nil {
		return err
	}
	if len(ports) > 0 {
		if err := publish(c, ports, em, progs, &undo, lock); err != nil {
			return err
		}
	}

	rec := &datapath.Record{
		ContainerID: args.ContainerID,
		IfName:      args.IfName,
		Network:     c.Name,
		NetNS:       args.Netns,
		HostIfName:  hostName,
		HostIfIndex: ep.HostIfIndex,
		HostMAC:     ep.HostMAC.String(),
		MAC:         ep.MAC.String(),
		HostPorts:   ports,
	}
	for _, ipc := range res.IPs {
		rec.IPs = append(rec.IPs, ipc.Address.String())
	}
	undo = append(undo, func() { _ = os.RemoveAll(datapath.LinkDir(c.BPFRoot, hostName)) })
	for _, h := range datapath.Hooks {
		a, err := datapath.Attach(c.Mode, veth.Host, h, progs.ByHook[h.Name], datapath.LinkDir(c.BPFRoot, hostName))
		if err != nil {
			return cniError(ErrAttach, "attaching the datapath", err)
		}
		rec.Attachments = append(rec.Attachments, a)
		if a.Mode == datapath.ModeTC && ep.Flags&datapath.EndpointFlagClsact == 0 {
			// attachMode auto fell back to tc: the clsact qdisc is ours.
			ep.Flags |= datapath.EndpointFlagClsact
			if err := em.Put(ep); err != nil {
				return cniError(ErrBPFFS, "updating the endpoint", err)
			}
		}
	}
	undo = append(undo, func() { _ = datapath.RemoveRecord(c.StateDir, hostName) })
	if err := datapath.WriteRecord(c.StateDir, rec); err != nil {
		return cniError(types.ErrIOFailure, "writing the endpoint record", err)
	}

	out := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: hostName, Mac: ep.HostMAC.String()},
			{Name: args.IfName, Mac: ep.MAC.String(), Sandbox: args.Netns, Mtu: mtu},
		},
		Routes: routes,
		DNS:    res.DNS,
	}
	out.Interfaces[0].Mtu = mtu
	for _, ipc := range res.IPs {
		ipc.Interface = current.Int(1)
		out.IPs = append(out.IPs, ipc)
	}
	if len(out.DNS.Nameservers) == 0 && len(out.DNS.Search) == 0 && len(out.DNS.Options) == 0 && out.DNS.Domain == "" {
		out.DNS = c.DNS
	}
	return types.PrintResult(out, c.CNIVersion)
}

// ipamError passes the IPAM plugin's own CNI error through (it names the
// bad key), and wraps anything else.
func ipamError(verb string, err error) error {
	var te *types.Error
	if errors.As(err, &te) {
		return te
	}
	return cniError(ErrIPAM, "IPAM "+verb, err)
}

// putBuckets writes the pod's token buckets, full. An ingress limit first
// tries fq on the host veth for departure-time pacing of the stack path.
func putBuckets(c *Config, host netlink.Link) error {
	edt := c.BW.Ingress.Rate > 0 && bandwidth.EnableEDT(host)
	t, err := bandwidth.OpenTable(c.BPFRoot)
	if err != nil {
		return bandwidthError(err)
	}
	defer t.Close()
	if err := t.Put(host.Attrs().Index, c.BW, edt); err != nil {
		return bandwidthError(err)
	}
	return nil
}

// pace records the pod's netns as one of the node's (its TCP senders may
// be paced to a limited pod's rate), and with limits of its own attaches
// the pacing hook to the cgroup unless it is there.
func pace(c *Config, podNS ns.NetNS, ifindex int, progs *datapath.Programs, undo *[]func(), lock *datapath.Lock) error {
	n, err := bandwidth.OpenNetns(c.BPFRoot)
	if err != nil {
		return bandwidthError(err)
	}
	defer n.Close()
	// The node's last endpoint takes the node's entry and the hook with
	// it; so does a failed first ADD.
	*undo = append(*undo, func() { releaseNode(c, lock) }, func() { _ = forgetNetns(c.BPFRoot, ifindex) })
	if err := n.Register(podNS, ifindex); err != nil {
		return bandwidthError(err)
	}
	if !c.BW.Any() {
		return nil
	}
	if err := bandwidth.StartPacing(c.BPFRoot, c.StateDir, c.HostPorts.Cgroup, progs); err != nil {
		return bandwidthError(err)
	}
	return nil
}

// forgetNetns removes the netns entry of the pod behind ifindex.
func forgetNetns(bpfRoot string, ifindex int) error {
	n, err := bandwidth.OpenNetns(bpfRoot)
	if err != nil {
		return err
	}
	defer n.Close()
	return n.Forget(func(i int) bool { return i == ifindex })
}

// deleteBuckets removes the pod's buckets; gone already is success.
func deleteBuckets(bpfRoot string, ifindex int) error {
	t, err := bandwidth.OpenTable(bpfRoot)
	if err != nil {
		return err
	}
	defer t.Close()
	return t.Delete(ifindex)
}

// publish serves the pod's port mappings: the uplinks and the socket hooks
// ready, then the ports claimed (refused when another pod holds one).
func publish(c *Config, ports []datapath.HostPort, em *datapath.EndpointMaps, progs *datapath.Programs, undo *[]func(), lock *datapath.Lock) error {
	if !c.Masq.Enabled {
		// The node's last endpoint takes hostPort with it; so does a
		// failed first ADD. (With ipMasq this undo step exists already.)
		*undo = append(*undo, func() { releaseNode(c, lock) })
	}
	if err := nat.EnsureUplinks(c.BPFRoot, c.StateDir, c.Masq.Uplinks, c.Mode, progs); err != nil {
		return hostPortError(err)
	}
	if err := portmap.Ready(c.BPFRoot, c.StateDir, c.HostPorts.Cgroup, progs); err != nil {
		return hostPortError(err)
	}
	if err := portmap.Publish(c.BPFRoot, c.StateDir, ports, em.Owner); err != nil {
		return hostPortError(err)
	}
	*undo = append(*undo, func() { _ = portmap.Unpublish(c.BPFRoot, c.StateDir, ports) })
	return nil
}
