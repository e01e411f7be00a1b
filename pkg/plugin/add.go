// Package plugin implements the CNI verbs of ebpf-cni: the core steps of a
// call (IPAM, the veth pair with its addresses and routes, the endpoint
// record) and a loop over the registered features (pkg/features), each of
// which does its own part.
package plugin

import (
	"errors"
	"fmt"
	"os"
	"strings"

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
	"github.com/ebpf-cni/ebpf-cni/pkg/kernel"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/repair"
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

// CmdAdd creates the attachment: IPAM, veth, pod addresses and routes, host
// routes, then each feature in order, then the record. Any failure undoes
// every step already done, in reverse.
func CmdAdd(args *skel.CmdArgs) (err error) {
	w := newWatch()
	cl := startCall("ADD", args, w)
	defer func() { cl.end(err) }()
	c, prev, err := parseAdd(args)
	if err != nil {
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
	a := &adding{args: args, c: c, n: n, podNS: podNS, hostName: veth.HostName(args.ContainerID, args.IfName)}
	cl.healed, _ = repair.IfDue(n, c.Network(), a.hostName) // STATUS reports what it cannot mend; this pod is added anyway
	// The same container's calls never interleave: a second ADD waits and
	// finds the first one's record (or its veth), a DEL waits for the ADD.
	al, err := n.AttachmentLock(a.hostName)
	if err != nil {
		return cniError(types.ErrIOFailure, "locking the attachment (stateDir)", err)
	}
	defer al.Unlock()
	if _, err := n.Record(a.hostName); err == nil {
		return types.NewError(errcode.InterfaceExists, fmt.Sprintf("attachment %s/%s already exists (host veth %s); DEL it first", args.ContainerID, args.IfName, a.hostName), "")
	}
	// CNI_IFNAME taken in the pod is found by veth.Create (the kernel
	// refuses the pair), after IPAM, whose allocation the undo releases:
	// looking first would cost every ADD a trip into the pod's netns.
	defer func() {
		if err != nil {
			err = rolledBack(err, a.undo.Run())
			al.Unlock()
			// The node's last endpoint takes the features' node-wide state
			// with it; so does a failed first ADD.
			n.ReleaseIfEmpty(func() { _ = features.Release(n) })
		}
	}()
	n.Phase("ipam")
	if err := a.allocate(); err != nil {
		return err
	}
	n.Phase("veth")
	if err := a.pair(); err != nil {
		return err
	}
	if err := features.InOrder(func() error {
		n.Phase("endpoint")
		return feature.Fail(types.ErrInternal, "setting up endpoint", endpoint.Add(n, a.ep, &a.undo))
	}, func(i int, f feature.Feature) error {
		n.Phase(f.Name())
		return feature.Fail(types.ErrInternal, "setting up "+f.Name(), c.Pods[i].Add(n, a.ep, &a.undo))
	}); err != nil {
		return err
	}
	n.Phase("record")
	a.undo.Push(func() error { return n.RemoveRecord(a.hostName) })
	if err := n.WriteRecord(a.ep.Record); err != nil {
		return cniError(types.ErrIOFailure, "writing the endpoint record", err)
	}
	n.Phase("print")
	out := chainResult(prev, a.result())
	forVersion(out, c.CNIVersion)
	return types.PrintResult(out, c.CNIVersion)
}

// parseAdd is ADD's configuration and what it must refuse before it opens
// anything: a kernel without the attach mode, a bad prevResult or
// CNI_IFNAME, the node's own netns as the pod's.
func parseAdd(args *skel.CmdArgs) (*Config, *current.Result, error) {
	c, err := ParseConfig(args.StdinData, args.Args, true)
	if err != nil {
		return nil, nil, err
	}
	if err := kernelSupports(c.Mode); err != nil {
		return nil, nil, kernelError(err)
	}
	prev, err := prevResult(c)
	if err != nil {
		return nil, nil, err
	}
	if err := checkIfName(args.IfName); err != nil {
		return nil, nil, err
	}
	if err := refuseNodeNetNS(args); err != nil {
		return nil, nil, err
	}
	return c, prev, nil
}

// rolledBack is a failed ADD's error with what its undo could not take
// back said too (in the details of a CNI error, the message otherwise):
// a leftover the runtime's DEL or the next repair must still remove.
func rolledBack(err, undoErr error) error {
	if undoErr == nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "ebpf-cni: ADD failed and its rollback left something behind: %v\n", undoErr)
	var te *types.Error
	if errors.As(err, &te) {
		out := *te
		out.Details = strings.TrimPrefix(out.Details+"; rolling back: "+undoErr.Error(), "; ")
		return &out
	}
	return fmt.Errorf("%w (rolling back: %v)", err, undoErr)
}

// adding is one ADD's attachment as its steps make it.
type adding struct {
	args     *skel.CmdArgs
	c        *Config
	n        *node.Node
	podNS    ns.NetNS
	hostName string
	undo     feature.Undo
	keepIPAM bool            // the host veth was there already: its addresses are another call's
	res      *current.Result // IPAM's
	routes   []*types.Route  // the pod's
	mtu      int
	ep       *feature.Endpoint
}

// allocate is the IPAM step: the pod's addresses, checked, with their
// gateways and routes.
func (a *adding) allocate() error {
	c := a.c
	r, err := c.ipam().Add(a.args, c)
	if err != nil {
		// The IPAM plugin may have allocated before it failed (or printed
		// something that is not a result): release whatever it holds.
		_ = c.ipam().Del(a.args, c)
		return ipamError("ADD", err)
	}
	// An attachment whose host veth exists already (its record lost) holds
	// the addresses IPAM just handed back again: this ADD's undo must not
	// release them under it.
	a.undo.Push(func() error {
		if a.keepIPAM {
			return nil
		}
		return c.ipam().Del(a.args, c)
	})
	if a.res, err = current.NewResultFromResult(r); err != nil {
		return cniError(errcode.IPAM, "converting the IPAM result", err)
	}
	if len(a.res.IPs) == 0 {
		return types.NewError(errcode.IPAM, fmt.Sprintf("IPAM plugin %s returned no address", c.IPAMType), "")
	}
	// Another IPAM plugin (host-local, dhcp) may hand out what a pod must
	// never have (an address of the node, a reserved one, its subnet's
	// gateway); ebpf-ipam refuses those by construction.
	if c.IPAMType != DefaultIPAM {
		if err := ebpfipam.CheckResult(a.res.IPs); err != nil {
			return err
		}
	}
	veth.Gateways(a.res.IPs)
	a.routes = veth.PodRoutes(a.res.IPs, a.res.Routes)
	return nil
}

// pair makes the veth pair and configures both ends (addresses, routes,
// the pod ranges' routes); the endpoint's record gets what it is.
func (a *adding) pair() error {
	args, c, res := a.args, a.c, a.res
	needs := gather(c.Pods)
	a.mtu = c.MTU
	if a.mtu == 0 {
		a.mtu = defaultMTU() - needs.Overhead
	}
	host, err := veth.Create(deviceKind(c, a.n), a.hostName, a.podNS, args.IfName, a.mtu, c.MAC, veth.Alias(args.ContainerID, args.IfName, c.Name))
	if err != nil {
		if errors.Is(err, veth.ErrInterfaceExists) {
			a.keepIPAM = veth.Exists(a.hostName)
			return cniError(errcode.InterfaceExists, "creating the veth pair", err)
		}
		return cniError(errcode.LinkSetup, "creating the veth pair", err)
	}
	a.undo.Push(func() error { return veth.DeleteHost(a.hostName) })
	asked := len(a.routes)
	podLink, routes, err := veth.ConfigurePod(a.podNS, args.IfName, res.IPs, a.routes)
	if err != nil {
		return cniError(errcode.LinkSetup, "configuring "+args.IfName+" in the pod", err)
	}
	a.routes = routes
	if err := veth.ConfigureHost(host, res.IPs); err != nil {
		return cniError(errcode.LinkSetup, "configuring host veth "+a.hostName, err)
	}
	if err := ensureRanges(a.n, &a.undo, a.hostName, res.IPs); err != nil {
		return err
	}
	rec := &node.Record{
		ContainerID: args.ContainerID,
		IfName:      args.IfName,
		Network:     c.Name,
		NetNS:       args.Netns,
		HostIfName:  a.hostName,
		HostIfIndex: host.Attrs().Index,
		HostMAC:     veth.MAC(host),
		MAC:         veth.MAC(podLink),
		Pod:         node.PodFromArgs(args.Args),
		// Routes another interface had: this one got a table and source
		// rules of its own, which its DEL removes in the pod.
		OwnTable: len(routes) < asked,
	}
	for _, ipc := range res.IPs {
		rec.IPs = append(rec.IPs, ipc.Address.String())
	}
	a.ep = &feature.Endpoint{Record: rec, Mode: c.Mode, DeviceMode: attach.DeviceMode(c.AttachMode), PodNS: a.podNS, Host: host, Flags: needs.Flags}
	return nil
}

// deviceKind is the pair a new pod gets: the configured deviceType, or
// with auto (the default) the node's choice (veth.AutoKind); a pod that
// asks for a MAC gets a veth, since a netkit pod in L3 mode has none.
func deviceKind(c *Config, n *node.Node) veth.Kind {
	switch c.DeviceType {
	case DeviceNetkit:
		return veth.KindNetkit
	case DeviceVeth:
		return veth.KindVeth
	}
	if c.MAC != nil {
		return veth.KindVeth
	}
	return veth.AutoKind(n.StateDir(), func() bool { return kernel.HaveNetkit().Available })
}

// result is the attachment as ADD prints it (before chaining).
func (a *adding) result() *current.Result {
	rec := a.ep.Record
	hostMAC, mac := rec.HostMAC, rec.MAC
	if attach.IsNetkit(a.ep.Host) {
		hostMAC, mac = "", "" // L3 mode: no hardware address
	}
	out := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: a.hostName, Mac: hostMAC, Mtu: a.mtu},
			{Name: a.args.IfName, Mac: mac, Sandbox: a.args.Netns, Mtu: a.mtu},
		},
		Routes: a.routes,
		DNS:    a.res.DNS,
	}
	for _, ipc := range a.res.IPs {
		ipc.Interface = current.Int(1)
		out.IPs = append(out.IPs, ipc)
	}
	if dnsEmpty(out.DNS) {
		out.DNS = a.c.DNS
	}
	return out
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
