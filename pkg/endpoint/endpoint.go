// Package endpoint is the core's step that makes a veth pair a pod of the
// datapath: its entries in the endpoint maps (endpoints, endpoint_devs:
// what the programs forward to and what anti-spoofing allows), the
// programs on its host veth (from_container, to_container) and their
// per-device counters. Every pod has it, so it is no feature: the verbs
// (pkg/plugin) call it at its place among the features
// (features.Before, the endpoint, features.After at ADD; the reverse at
// DEL).
package endpoint

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/counters"
	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
	"github.com/ebpf-cni/ebpf-cni/pkg/rtnl"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// The hooks of every host veth.
var (
	// HookFromContainer is the host veth's ingress: packets leaving the pod.
	HookFromContainer = attach.Ingress("from_container", attach.Endpoint)
	// HookToContainer is the host veth's egress: packets the node's stack
	// delivers to the pod (what the programs redirect skips it).
	HookToContainer = attach.Egress("to_container", attach.Endpoint)
	// Hooks is every hook a veth endpoint gets, in attach order.
	Hooks = []attach.Hook{HookFromContainer, HookToContainer}

	// HookFromNetkit is netkit's peer program: what the pod sends, run in
	// the transmit of the pod's end (from_container built for it), instead
	// of from_container on a veth's ingress.
	HookFromNetkit = attach.NetkitHook("from_netkit", ebpf.AttachNetkitPeer, HookFromContainer.Name)
	// NetkitHooks is every hook a netkit endpoint gets, in attach order:
	// what the stack sends to the pod passes to_container on the host
	// end's egress as on a veth's, where the skb still says where it came
	// from and in which netns (netkit's own primary program runs after
	// its transmit scrubbed that).
	NetkitHooks = []attach.Hook{HookFromNetkit, HookToContainer}
)

// HooksFor is the hooks of an endpoint of device type kind ("veth",
// "netkit").
func HooksFor(kind string) []attach.Hook {
	if kind == string(veth.KindNetkit) {
		return NetkitHooks
	}
	return Hooks
}

// HooksOf is the hooks of the endpoint whose host end is l: a netkit
// device's or a veth's.
func HooksOf(l netlink.Link) []attach.Hook {
	if attach.IsNetkit(l) {
		return NetkitHooks
	}
	return Hooks
}

// Objects are the host veth's programs. The endpoint maps stay when the
// node's last endpoint goes (they are empty then): nothing to release.
func Objects() []programs.Object {
	return []programs.Object{
		{Name: "from_container", Bytes: _FromContainerBytes, Load: LoadFromContainer, Hooks: []attach.Hook{HookFromContainer}},
		{Name: "to_container", Bytes: _ToContainerBytes, Load: LoadToContainer, Hooks: []attach.Hook{HookToContainer}},
		{Name: "from_netkit", Bytes: _FromNetkitBytes, Load: LoadFromNetkit, Hooks: []attach.Hook{HookFromNetkit}},
	}
}

// Add writes the endpoint's entries (with the flags every feature asked
// for) and attaches the programs to its host veth.
func Add(n *node.Node, ep *feature.Endpoint, undo *feature.Undo) error {
	em, err := MapsOf(n)
	if err != nil {
		return feature.Fail(errcode.BPFFS, "opening the endpoint maps", err)
	}
	e := entry(ep)
	if ep.Mode == attach.ModeTC {
		e.Flags |= uint32(maps.CniEndpointFlagsEP_F_CLSACT)
	}
	undo.Push(func() error { return em.Delete(e.HostIfIndex, e.HostMAC, e.IPs) })
	if err := em.Put(e); err != nil {
		if errors.Is(err, ErrEndpointConflict) {
			return feature.Fail(errcode.AddressConflict, "adding the endpoint", err)
		}
		return feature.Fail(errcode.BPFFS, "adding the endpoint", err)
	}
	// The host veth lives here: this is the node's network namespace,
	// where a pod's missing veth proves it gone (node.InNodeNetns).
	if err := n.ClaimNetns(); err != nil {
		return feature.Fail(errcode.BPFFS, "recording the node's network namespace", err)
	}
	progs, err := n.Programs()
	if err != nil {
		return feature.Fail(errcode.ProgramLoad, "loading the datapath programs", err)
	}
	dir := n.LinkDir(ep.HostIfName)
	undo.Push(func() error { return os.RemoveAll(dir) })
	for _, h := range HooksOf(ep.Host) {
		prog, err := progs.Prog(h.Name)
		if err != nil {
			return feature.Fail(errcode.ProgramLoad, "opening the datapath programs", err)
		}
		a, err := attach.Attach(ep.Mode, ep.Host, h, prog, dir)
		if err != nil {
			return feature.Fail(errcode.Attach, "attaching the datapath", err)
		}
		ep.Attachments = append(ep.Attachments, a)
		if a.Mode == attach.ModeTC && e.Flags&uint32(maps.CniEndpointFlagsEP_F_CLSACT) == 0 {
			// attachMode auto fell back to tc: the clsact qdisc is ours.
			e.Flags |= uint32(maps.CniEndpointFlagsEP_F_CLSACT)
			if err := em.Put(e); err != nil {
				return feature.Fail(errcode.BPFFS, "updating the endpoint", err)
			}
		}
	}
	ep.Record.Flags = e.Flags
	return nil
}

// Restore writes the endpoint's entries again when endpoint_devs or
// endpoints lacks them (maps lost with the bpffs and not rescued), and makes this build's
// programs run on its host veth (a record rebuilt after the tcx links died
// with their pins has none): the programs forward to the pod and let its
// packets out again. The record's attachments are updated.
func Restore(n *node.Node, ep *feature.Endpoint) error {
	em, err := MapsOf(n)
	if err != nil {
		return err
	}
	var d maps.CniEndpointDev
	if (em.Devs.Lookup(uint32(ep.HostIfIndex), &d) != nil || !em.HasAddrs(ep.HostIfIndex, ep.Addrs())) && ep.MAC != "" {
		e := entry(ep)
		e.Flags = ep.Record.Flags
		if err := em.Put(e); err != nil {
			return err
		}
	}
	progs, err := n.Programs()
	if err != nil {
		return err
	}
	dir := n.LinkDir(ep.HostIfName)
	for _, h := range HooksOf(ep.Host) {
		prog, err := progs.Prog(h.Name)
		if err != nil {
			return err
		}
		if attach.HooksAttached(ep.Host, []attach.Hook{h}, progs.IDsOf([]attach.Hook{h})) {
			continue
		}
		i := slices.IndexFunc(ep.Attachments, func(a attach.Attachment) bool { return a.Hook == h.Name })
		if i >= 0 && attach.Replace(ep.Attachments[i], ep.HostIfIndex, h, prog) == nil {
			continue
		}
		// A tcx link whose pin went with the bpffs runs the old program
		// until it is taken off.
		info, err := prog.Info()
		if err != nil {
			return err
		}
		id, _ := info.ID()
		if err := attach.DetachStale(ep.Host, h, id); err != nil {
			return err
		}
		mode := ep.Mode
		if mode == "" {
			mode = attach.DefaultMode
		}
		if i >= 0 {
			mode = ep.Attachments[i].Mode
			_ = attach.DetachNow(ep.Attachments[i], ep.HostIfIndex, h)
			ep.Attachments = slices.Delete(ep.Attachments, i, i+1)
		}
		a, err := attach.Attach(mode, ep.Host, h, prog, dir)
		if err != nil {
			return err
		}
		ep.Attachments = append(ep.Attachments, a)
		if a.Mode == attach.ModeTC {
			ep.Record.Flags |= uint32(maps.CniEndpointFlagsEP_F_CLSACT)
		}
	}
	return nil
}

// entry is the endpoint as the maps hold it.
func entry(ep *feature.Endpoint) *Entry {
	hostMAC, mac := macOf(ep.HostMAC), macOf(ep.MAC)
	return &Entry{HostIfIndex: ep.HostIfIndex, HostMAC: hostMAC, MAC: mac, IPs: ep.Addrs(), ContainerID: ep.ContainerID,
		IfName: ep.IfName, NetID: maps.NetID(ep.Network), Flags: uint32(ep.Flags), Pod: ep.Pod}
}

// Check verifies that the pinned programs run on the host veth and that
// the maps hold the endpoint.
func Check(n *node.Node, ep *feature.Endpoint) []string {
	problems := checkPrograms(n, ep)
	em, err := MapsOf(n)
	if err != nil {
		return append(problems, err.Error())
	}
	if ep.MAC == "" {
		return problems // the pod's interface is gone: reported already
	}
	return append(problems, em.Check(entry(ep))...)
}

func checkPrograms(n *node.Node, ep *feature.Endpoint) []string {
	var problems []string
	tags, err := programs.Installed(n.BPFRoot())
	if err != nil || len(tags) == 0 {
		return []string{fmt.Sprintf("no programs pinned under %s", programs.Dir(n.BPFRoot()))}
	}
	want := map[string]ebpf.ProgramID{}
	// An endpoint runs this build's programs, or an older build's until
	// an upgrade moves it.
	for _, t := range tags {
		var p *programs.Set
		if t == n.Tag() {
			p, err = n.PinnedPrograms()
		} else {
			p, err = programs.Open(n.BPFRoot(), t, n.Objects())
		}
		if err != nil {
			continue
		}
		for id, hook := range p.IDs() {
			if _, ok := want[hook]; !ok || n.Tag() == t {
				want[hook] = id
			}
		}
		if t != n.Tag() {
			p.Close()
		}
	}
	for _, h := range HooksOf(ep.Host) {
		ids, err := attach.AttachedIDs(ep.Host, h)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		found := false
		for _, id := range ids {
			if id == want[h.Name] {
				found = true
			}
		}
		if !found {
			problems = append(problems, fmt.Sprintf("program %s (id %d) not attached to %s (attached: %v)", h.Name, want[h.Name], ep.Host.Attrs().Name, ids))
		}
	}
	for _, a := range ep.Attachments {
		if a.Mode == attach.ModeTCX || a.Mode == attach.ModeNetkit {
			if _, err := os.Stat(a.Pin); err != nil {
				problems = append(problems, fmt.Sprintf("pinned link %s missing", a.Pin))
			}
		}
	}
	return problems
}

func hookByName(name string) attach.Hook {
	return attach.Find(append(slices.Clone(Hooks), NetkitHooks...), name)
}

// Resolve finds an endpoint that has no record through its host veth
// (ours) and its entry in endpoint_devs: it fills in ep.HostIfIndex,
// ep.HostMAC and ep.IPs, so that DEL's every step (the features' and the
// endpoint's own) finds the pod's state as with a record. DEL calls it
// first.
func Resolve(n *node.Node, ep *feature.Endpoint) {
	if ep.Recorded {
		return
	}
	l, err := rtnl.H().LinkByName(ep.HostIfName)
	if err != nil || !veth.IsOurs(l) {
		return
	}
	ep.HostIfIndex = l.Attrs().Index
	if n.CheckBPFFS() != nil {
		return
	}
	em, err := MapsOf(n)
	if err != nil {
		return
	}
	var d maps.CniEndpointDev
	if em.Devs.Lookup(uint32(ep.HostIfIndex), &d) != nil {
		return
	}
	ep.HostMAC = veth.MAC(l)
	for _, ip := range maps.EndpointIPs(&d) {
		bits := 8 * len(ip)
		ep.IPs = append(ep.IPs, (&net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)}).String())
	}
}

// DelEntries removes the endpoint's map entries (DEL: after the features
// set up once it existed, before the core deletes the host veth; Resolve
// found an endpoint without a record).
func DelEntries(n *node.Node, ep *feature.Endpoint) error {
	if ep.HostIfIndex == 0 || n.CheckBPFFS() != nil {
		return nil
	}
	return deleteEntries(n, ep)
}

// Detach takes the endpoint's programs off its host veth and removes their
// pins (DEL: after the core tried to delete the veth). A tc filter dies
// with its device: when deviceGone, deleting them one by one would only
// take RTNL twice more per DEL (and wait behind every other call holding
// it), so they are deleted only from a veth that is still there.
func Detach(n *node.Node, ep *feature.Endpoint, deviceGone bool) error {
	if n.CheckBPFFS() != nil {
		return nil
	}
	var errs []error
	for _, a := range ep.Attachments {
		if deviceGone && a.Mode == attach.ModeTC {
			continue
		}
		if err := attach.Detach(a, ep.HostIfIndex, hookByName(a.Hook)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(n.LinkDir(ep.HostIfName)); err != nil {
		errs = append(errs, fmt.Errorf("unpinning links of %s: %w", ep.HostIfName, err))
	}
	return errors.Join(errs...)
}

// ForgetDevice removes the per-device counters of the endpoint's host
// veth once the core deleted it: no program counts on a device that is
// gone, so nothing creates the entry again.
func ForgetDevice(n *node.Node, ep *feature.Endpoint) error {
	if ep.HostIfIndex == 0 || n.CheckBPFFS() != nil {
		return nil
	}
	d, err := counters.OpenDevices(n.PinnedMap)
	if err != nil {
		return err
	}
	return d.Delete(ep.HostIfIndex)
}

// deleteEntries removes the endpoint's map entries (those of its host
// veth's index and MAC only).
func deleteEntries(n *node.Node, ep *feature.Endpoint) error {
	em, err := MapsOf(n)
	if err != nil {
		return err
	}
	return em.Delete(ep.HostIfIndex, macOf(ep.HostMAC), ep.Addrs())
}

// macOf is the MAC s names as the maps hold it: a netkit pair in L3 mode
// has none (the kernel reports no address, or zeros), held as zeros.
func macOf(s string) net.HardwareAddr {
	mac, err := net.ParseMAC(s)
	if err != nil || len(mac) != 6 {
		return make(net.HardwareAddr, 6)
	}
	return mac
}

// GC removes what no live endpoint accounts for: pinned links, endpoint
// map entries, per-device counters.
func GC(n *node.Node, live *feature.Live, dryRun bool) ([]string, error) {
	pins, perr := gcPins(n, live, dryRun)
	entries, eerr := gcEntries(n, live, dryRun)
	return append(pins, entries...), errors.Join(perr, eerr)
}

func gcPins(n *node.Node, live *feature.Live, dryRun bool) ([]string, error) {
	dir := filepath.Dir(n.LinkDir("x"))
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil
	}
	sw := &feature.Sweep{DryRun: dryRun}
	for _, e := range ents {
		if p := filepath.Join(dir, e.Name()); !live.Host(e.Name()) {
			sw.Remove("pinned links "+p, func() error { return os.RemoveAll(p) })
		}
	}
	return sw.Result()
}

func gcEntries(n *node.Node, live *feature.Live, dryRun bool) ([]string, error) {
	em, err := MapsOf(n)
	if err != nil {
		return nil, err
	}
	sw := &feature.Sweep{DryRun: dryRun}
	devs, err := em.Devices()
	if err != nil {
		return nil, err
	}
	for _, d := range devs {
		if !live.IfIndex(d.IfIndex) {
			sw.Remove(fmt.Sprintf("%s[%d] (container %s)", maps.CniMapEndpointDevs, d.IfIndex, maps.GoString(d.Dev.ContainerId[:])), func() error {
				return em.Delete(d.IfIndex, d.Dev.HostMac[:], maps.EndpointIPs(&d.Dev))
			})
		}
	}
	addrs, err := em.Addresses()
	if err != nil {
		return nil, err
	}
	for ip, v := range addrs {
		if !live.IfIndex(int(v.Ifindex)) {
			sw.Remove(fmt.Sprintf("%s[%s] (ifindex %d)", maps.CniMapEndpoints, ip, v.Ifindex), func() error {
				return em.Delete(int(v.Ifindex), v.HostMac[:], []net.IP{net.ParseIP(ip)})
			})
		}
	}
	pods, err := ReadPods(em.Pods)
	if err != nil {
		return nil, err
	}
	for i, p := range pods {
		if !live.IfIndex(int(i)) {
			sw.Remove(fmt.Sprintf("%s[%d] (pod %s)", maps.CniMapEndpointPods, i, p), func() error { return em.DeletePod(int(i)) })
		}
	}
	d, err := counters.OpenDevices(n.PinnedMap)
	if err != nil {
		return nil, err
	}
	counted, err := d.Keys()
	if err != nil {
		return nil, err
	}
	attached := attachedDevices(n)
	for _, i := range counted {
		if !live.IfIndex(i) && !attached[i] {
			sw.Remove(fmt.Sprintf("%s[%d]", maps.CniMapDeviceCounters, i), func() error { return d.Delete(i) })
		}
	}
	return sw.Result()
}
