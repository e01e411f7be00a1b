// Package plugin implements the CNI verbs of ebpf-cni: the core steps of a
// call (IPAM, the veth pair with its addresses and routes, the endpoint
// record) and a loop over the registered features (pkg/features), each of
// which does its own part.
package plugin

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	ebpfipam "github.com/ebpf-cni/ebpf-cni/pkg/ipam"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/rtnl"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// Funcs are the CNI verbs of ebpf-cni, for skel.PluginMainFuncs.
func Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: span(CmdAdd), Del: span(CmdDel), Check: span(CmdCheck), GC: span(CmdGC), Status: span(CmdStatus)}
}

// span runs a verb with its netlink requests on one socket per network
// namespace (pkg/rtnl), closed when it returns.
func span(verb func(*skel.CmdArgs) error) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) error {
		defer rtnl.Begin()()
		return verb(args)
	}
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
	p, err := newPodNetNS(n)
	if err != nil {
		n.Close()
		return nil, types.NewError(types.ErrInternal, fmt.Sprintf("CNI_NETNS %q", path), err.Error())
	}
	return p, nil
}

func checkIfName(name string) error {
	if name == "" || len(name) > 15 || name == "." || name == ".." {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("invalid CNI_IFNAME %q", name), "")
	}
	return nil
}

// openNode is the call's handle on the node, its lock held as mode.
// w, when the call is timed, hands its phases over to the node's.
func openNode(c *Config, mode node.LockMode, w *watch) (*node.Node, error) {
	o := node.Options{BPFRoot: c.BPFRoot, StateDir: c.StateDir, Objects: features.Objects(), Tag: features.Tag(), Lock: mode}
	if w != nil {
		o.Phases, o.Since = w.phases, w.at
	}
	n, err := node.Open(o)
	if err != nil {
		return nil, cniError(types.ErrIOFailure, "invalid stateDir", err)
	}
	return n, nil
}

// openPod opens the pod's netns and the node (lock shared) for ADD and
// CHECK, which need a usable bpffs.
func openPod(c *Config, netns string, w *watch) (ns.NetNS, *node.Node, error) {
	podNS, err := openNetNS(netns)
	if err != nil {
		return nil, nil, err
	}
	if err := maps.CheckBPFFS(c.BPFRoot); err != nil {
		podNS.Close()
		return nil, nil, cniError(errcode.BPFFS, "invalid bpfRoot", err)
	}
	w.lap("netns")
	n, err := openNode(c, node.Shared, w)
	if err != nil {
		podNS.Close()
		return nil, nil, err
	}
	return podNS, n, nil
}

// ReleaseNode takes every feature's node-wide state away: the node has no
// endpoint left (the caller holds the node lock exclusively:
// node.ReleaseIfEmpty). Best effort: GC retries what fails.
func ReleaseNode(n *node.Node) error { return release(n) }

func release(n *node.Node) error {
	var errs []error
	for _, f := range features.All {
		errs = append(errs, f.Release(n))
	}
	errs = append(errs, removeAllRanges())
	return errors.Join(errs...)
}

// CmdAdd creates the attachment: IPAM, veth, pod addresses and routes, host
// routes, then each feature in order, then the record. Any failure undoes
// every step already done, in reverse.
func CmdAdd(args *skel.CmdArgs) (err error) {
	w := newWatch()
	cl := startCall("ADD", args, w)
	defer func() { cl.end(err) }()
	c, err := ParseConfig(args.StdinData, args.Args, true)
	if err != nil {
		return err
	}
	if err := kernelSupports(c.Mode); err != nil {
		return kernelError(err)
	}
	prev, err := prevResult(c)
	if err != nil {
		return err
	}
	if err := checkIfName(args.IfName); err != nil {
		return err
	}
	if err := refuseNodeNetNS(args); err != nil {
		return err
	}
	w.lap("parse")
	podNS, n, err := openPod(c, args.Netns, w)
	if err != nil {
		return err
	}
	cl.opened(n)
	defer podNS.Close()
	defer n.Close()
	defer func() { logTiming("ADD", args, n, err) }()
	n.Phase("programs")
	if _, err := n.Programs(); err != nil {
		return cniError(errcode.ProgramLoad, "loading the datapath programs", err)
	}

	hostName := veth.HostName(args.ContainerID, args.IfName)
	if healDue(n) || n.LoadedFresh() {
		n.Phase("heal")
		_ = healNode(n, c, hostName, cl) // STATUS reports what it cannot mend; this pod is added anyway
	}
	// The same container's calls never interleave: a second ADD waits and
	// finds the first one's record (or its veth), a DEL waits for the ADD.
	al, err := n.AttachmentLock(hostName)
	if err != nil {
		return cniError(types.ErrIOFailure, "locking the attachment (stateDir)", err)
	}
	defer al.Unlock()
	if _, err := n.Record(hostName); err == nil {
		return types.NewError(errcode.InterfaceExists, fmt.Sprintf("attachment %s/%s already exists (host veth %s); DEL it first", args.ContainerID, args.IfName, hostName), "")
	}
	// CNI_IFNAME taken in the pod is found by veth.Create (the kernel
	// refuses the pair), after IPAM, whose allocation the undo releases:
	// looking first would cost every ADD a trip into the pod's netns.

	var undo feature.Undo
	defer func() {
		if err != nil {
			_ = undo.Run()
			al.Unlock()
			// The node's last endpoint takes the features' node-wide state
			// with it; so does a failed first ADD.
			n.ReleaseIfEmpty(func() { _ = release(n) })
		}
	}()

	n.Phase("ipam")
	r, err := c.ipam().Add(args, c)
	if err != nil {
		// The IPAM plugin may have allocated before it failed (or printed
		// something that is not a result): release whatever it holds.
		_ = c.ipam().Del(args, c)
		return ipamError("ADD", err)
	}
	// An attachment whose host veth exists already (its record lost) holds
	// the addresses IPAM just handed back again: this ADD's undo must not
	// release them under it.
	keepIPAM := false
	undo.Push(func() error {
		if keepIPAM {
			return nil
		}
		return c.ipam().Del(args, c)
	})
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return cniError(errcode.IPAM, "converting the IPAM result", err)
	}
	if len(res.IPs) == 0 {
		return types.NewError(errcode.IPAM, fmt.Sprintf("IPAM plugin %s returned no address", c.IPAMType), "")
	}
	// Another IPAM plugin (host-local, dhcp) may hand out what a pod must
	// never have (an address of the node, a reserved one, its subnet's
	// gateway); ebpf-ipam refuses those by construction.
	if c.IPAMType != DefaultIPAM {
		if err := ebpfipam.CheckResult(res.IPs); err != nil {
			return err
		}
	}
	veth.Gateways(res.IPs)
	routes := veth.PodRoutes(res.IPs, res.Routes)

	n.Phase("veth")
	needs := gather(c.Pods)
	mtu := c.MTU
	if mtu == 0 {
		mtu = defaultMTU() - needs.Overhead
	}
	host, err := veth.Create(hostName, podNS, args.IfName, mtu, c.MAC, veth.Alias(args.ContainerID, args.IfName, c.Name))
	if err != nil {
		if errors.Is(err, veth.ErrInterfaceExists) {
			keepIPAM = veth.Exists(hostName)
			return cniError(errcode.InterfaceExists, "creating the veth pair", err)
		}
		return cniError(errcode.LinkSetup, "creating the veth pair", err)
	}
	undo.Push(func() error { return veth.DeleteHost(hostName) })
	asked := len(routes)
	podLink, routes, err := veth.ConfigurePod(podNS, args.IfName, res.IPs, routes)
	if err != nil {
		return cniError(errcode.LinkSetup, "configuring "+args.IfName+" in the pod", err)
	}
	if err := veth.ConfigureHost(host, res.IPs); err != nil {
		return cniError(errcode.LinkSetup, "configuring host veth "+hostName, err)
	}
	if err := ensureRanges(n, &undo, hostName, res.IPs); err != nil {
		return err
	}

	rec := &node.Record{
		ContainerID: args.ContainerID,
		IfName:      args.IfName,
		Network:     c.Name,
		NetNS:       args.Netns,
		HostIfName:  hostName,
		HostIfIndex: host.Attrs().Index,
		HostMAC:     host.Attrs().HardwareAddr.String(),
		MAC:         podLink.Attrs().HardwareAddr.String(),
		Pod:         node.PodFromArgs(args.Args),
		// Routes another interface had: this one got a table and source
		// rules of its own, which its DEL removes in the pod.
		OwnTable: len(routes) < asked,
	}
	for _, ipc := range res.IPs {
		rec.IPs = append(rec.IPs, ipc.Address.String())
	}
	ep := &feature.Endpoint{Record: rec, Mode: c.Mode, DeviceMode: attach.DeviceMode(c.AttachMode), PodNS: podNS, Host: host, Flags: needs.Flags}
	err = inOrder(func() error {
		n.Phase("endpoint")
		return feature.Fail(types.ErrInternal, "setting up endpoint", endpoint.Add(n, ep, &undo))
	}, func(i int, f feature.Feature) error {
		n.Phase(f.Name())
		return feature.Fail(types.ErrInternal, "setting up "+f.Name(), c.Pods[i].Add(n, ep, &undo))
	})
	if err != nil {
		return err
	}

	n.Phase("record")
	undo.Push(func() error { return n.RemoveRecord(hostName) })
	if err := n.WriteRecord(rec); err != nil {
		return cniError(types.ErrIOFailure, "writing the endpoint record", err)
	}

	out := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: hostName, Mac: rec.HostMAC, Mtu: mtu},
			{Name: args.IfName, Mac: rec.MAC, Sandbox: args.Netns, Mtu: mtu},
		},
		Routes: routes,
		DNS:    res.DNS,
	}
	for _, ipc := range res.IPs {
		ipc.Interface = current.Int(1)
		out.IPs = append(out.IPs, ipc)
	}
	if dnsEmpty(out.DNS) {
		out.DNS = c.DNS
	}
	n.Phase("print")
	out = chainResult(prev, out)
	forVersion(out, c.CNIVersion)
	return types.PrintResult(out, c.CNIVersion)
}

// gather is what every feature needs of the core steps: the endpoint flags
// of all, the largest MTU overhead.
func gather(pods []feature.Pod) feature.Needs {
	var out feature.Needs
	for _, p := range pods {
		n := p.Needs()
		out.Flags |= n.Flags
		out.Overhead = max(out.Overhead, n.Overhead)
	}
	return out
}
