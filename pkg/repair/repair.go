// Package repair is the reconciliation of the kernel and the plugin's
// caches, below the verbs: the kernel is the truth, the records under the
// stateDir and the pins under bpfRoot are caches of it. It rebuilds
// records from the kernel, reclaims attachments whose pod is gone (and
// endpoints nothing accounts for), restores what a bpffs loss took, and
// collects leftovers; every feature takes part through one method of its
// contract (feature.Feature.Repair). A CNI STATUS, GC and ADD (when no
// STATUS ran for Period), the operator's repair and gc call it; so does
// DEL's teardown of one endpoint (Teardown); the node agent runs it dry
// for its metrics.
package repair

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	ebpfipam "github.com/ebpf-cni/ebpf-cni/pkg/ipam"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
	"github.com/ebpf-cni/ebpf-cni/pkg/rtnl"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// The kernel is the truth, the records are a cache. Heal compares the two
// and mends the cache:
//
//   - a host veth of ours without a record (the stateDir was wiped or
//     remounted, a call was killed between the veth and its record) gets
//     its record rebuilt from the kernel: the pair's name and alias (or
//     group), the endpoint maps, the routes and programs on the veth;
//   - a pair whose owner cannot be told (killed before the alias and the
//     map entries, so its ADD never succeeded) is removed;
//   - a record whose host veth is gone (the pod's netns was destroyed
//     without a DEL: the kernel removed the pair) is reclaimed: its
//     features' state, its record and, for the calling network, its IPAM
//     addresses; never while its pod's interface is alive somewhere.
//
// Every attachment is handled under its attachment lock, taken without
// waiting: one that a call holds is that call's business.

// Report is what Run found, one line per item.
type Report struct {
	Rebuilt   []string `json:"rebuilt"`
	Reclaimed []string `json:"reclaimed"`
	Removed   []string `json:"removed"`
	// Restored is the features' state of live endpoints written again
	// (feature.Feature.Repair): what a bpffs loss took.
	Restored []string `json:"restored"`
	Problems []string `json:"problems"`
	// Lost are the host veths whose records were rebuilt with neither
	// their file nor the maps (node.MarkLossy): STATUS fails until their
	// pods are deleted or the operator accepts the loss.
	Lost []string `json:"lost"`
	// Released are the addresses IPAM let go for the reclaimed
	// attachments (a dry run: those they hold).
	Released []string `json:"released"`
}

// Options say what Run may do.
type Options struct {
	// Network is the calling network (STATUS, ADD, GC): its attachments'
	// IPAM addresses are released through its IPAM when reclaimed, and
	// rebuilt records of its network get its name and what its
	// configuration tells. Nil for the operator's repair, which releases
	// ebpf-ipam's addresses itself.
	Network *Network
	// DryRun lists what would be done and changes nothing.
	DryRun bool
	// Skip is an attachment (host veth) the caller is working on.
	Skip string
	// Restore: every live endpoint's features restore what is missing
	// (the operator's repair), not only after this call loaded the
	// programs afresh or rebuilt records.
	Restore bool
}

// Network is the calling network of a CNI verb, as the repair needs it.
type Network struct {
	Name string
	// Conf is the network's configuration (a call's stdin): the features
	// configured from it (no runtimeConfig) tell a rebuilt record what
	// ADD would have.
	Conf []byte
	// Mode and DeviceMode are its attach modes (host veths, the node's
	// devices).
	Mode, DeviceMode attach.Mode
	// Release releases what the network's IPAM holds for an attachment of
	// it that is gone (netns: the one its ADD was given, "" unknown).
	Release func(containerID, ifName, netns string) error
	// EbpfIPAM is the configuration ebpf-ipam's calls get (stdin) when the
	// network's IPAM is ebpf-ipam, else nil: its addresses of attachments
	// no record accounts for are released, and a rebuilt record's kept.
	EbpfIPAM []byte

	pods []feature.Pod // parsed from Conf once asked for
}

// Pods are the registered features configured from the network's
// configuration, in the order of features.All; nil where a feature cannot
// parse it.
func (c *Network) Pods() []feature.Pod {
	if c.pods == nil {
		c.pods = make([]feature.Pod, len(features.All))
		for i, f := range features.All {
			if p, err := f.Parse(c.Conf); err == nil {
				c.pods[i] = p
			}
		}
	}
	return c.pods
}

// Run mends the records from the kernel and reclaims attachments whose
// pod is gone. It runs in the node's network namespace; the caller holds
// the node lock (shared or exclusive) or none.
func Run(n *node.Node, o Options) (*Report, error) {
	r := &run{n: n, o: o, h: &Report{Rebuilt: []string{}, Reclaimed: []string{}, Removed: []string{}, Restored: []string{}, Released: []string{}, Problems: []string{}, Lost: []string{}},
		recorded: map[string]bool{}, present: map[string]bool{}, rebuilt: map[string]bool{}}
	// Names first: a node in order costs a read of /proc's device list and
	// one directory listing (STATUS runs every 5 s); links and records are
	// read only for what differs.
	var err error
	if r.links, err = veth.Candidates(); err != nil {
		return r.h, err
	}
	if r.names, err = n.RecordNames(); err != nil {
		return r.h, err
	}
	for _, name := range r.names {
		r.recorded[name] = true
	}
	for _, name := range r.links {
		r.present[name] = true
	}
	r.rebuildRecords()
	r.reclaimGone()
	if o.DryRun {
		return r.h, errors.Join(r.errs...)
	}
	r.adoptPending()
	for _, name := range n.Marked(node.MarkLossy) {
		if r.present[name] {
			r.h.Lost = append(r.h.Lost, name)
		}
	}
	r.restore()
	sort.Strings(r.h.Rebuilt)
	sort.Strings(r.h.Reclaimed)
	return r.h, errors.Join(r.errs...)
}

// run is one Run: what it read of the node, what it found and did.
type run struct {
	n     *node.Node
	o     Options
	h     *Report
	errs  []error
	links []string // host veths of ebpf-cni in this netns (names)
	names []string // records (names)
	// recorded, present and rebuilt are sets of host veth names: with a
	// record, here, with a record rebuilt by this run.
	recorded, present, rebuilt map[string]bool
}

// each runs f for every name but the caller's own attachment and those
// in done, under the name's lock (lockAttachment). done is looked at
// before the lock: on a node in order every name is in it, and STATUS
// (every 5 s, 100 pods) takes no lock at all.
func (r *run) each(names []string, done map[string]bool, f func(name string) error) {
	for _, name := range names {
		if name == r.o.Skip || done[name] {
			continue
		}
		r.errs = append(r.errs, lockAttachment(r.n, name, func() error { return f(name) }))
	}
}

// rebuildRecords gives every host veth of ours without a record its record
// back from the kernel, or removes a pair nobody can own.
func (r *run) rebuildRecords() {
	r.each(r.links, r.recorded, func(name string) error {
		l, err := rtnl.H().LinkByName(name)
		if err != nil || !veth.IsOurs(l) {
			return nil // gone meanwhile (the next call reclaims what is left), or not ours
		}
		ok, err := healLink(r.n, l, r.o, r.h)
		r.rebuilt[name] = ok
		return err
	})
	if len(r.h.Rebuilt) > 0 && !r.o.DryRun {
		// The node-wide records went with the endpoints' (one stateDir).
		for _, f := range features.All {
			_, err := f.Repair(r.n, &feature.Repair{})
			r.errs = append(r.errs, err)
		}
	}
}

// reclaimGone reclaims the attachments whose pod is gone: recorded ones
// whose host veth is not here, endpoints with neither record nor veth,
// and the calling network's ebpf-ipam addresses no attachment accounts
// for.
func (r *run) reclaimGone() {
	r.each(r.names, r.present, func(name string) error {
		return reclaim(r.n, name, r.o, r.h)
	})
	r.errs = append(r.errs, reclaimOrphans(r.n, r.o, r.present, r.h))
	if r.o.Network != nil && r.o.Network.EbpfIPAM != nil {
		r.errs = append(r.errs, releaseStray(r.n, r.o, r.names, r.present, r.h))
	}
}

// adoptPending completes the records rebuilt by a call without this
// network's configuration.
func (r *run) adoptPending() {
	if r.o.Network == nil {
		return
	}
	var pending []string
	for _, name := range r.n.Marked(node.MarkPending) {
		if r.present[name] && !r.rebuilt[name] {
			pending = append(pending, name)
		}
	}
	r.each(pending, nil, func(name string) error {
		rec, err := r.n.Record(name)
		if err != nil || !rec.InNetwork(r.o.Network.Name) {
			return nil
		}
		r.rebuilt[name] = true
		return adopt(r.n, rec, r.o.Network)
	})
}

// restore writes again what every live endpoint lacks when this call
// loaded the programs where none were pinned (after a bpffs remount, the
// maps that no surviving program kept are empty), or records were rebuilt
// (their programs and entries may be gone with them), or the caller asks.
// An upgrade is not such a load: the older build's maps are the node's.
func (r *run) restore() {
	if !r.n.LoadedFresh() && len(r.rebuilt) == 0 && !r.o.Restore {
		return
	}
	var live []string
	for _, name := range r.links {
		if r.recorded[name] || r.rebuilt[name] {
			live = append(live, name)
		}
	}
	r.each(live, nil, func(name string) error {
		l, err := rtnl.H().LinkByName(name)
		if err != nil {
			return nil
		}
		lines, err := restoreEndpoint(r.n, l, r.rebuilt[name], r.o)
		r.h.Restored = append(r.h.Restored, lines...)
		return err
	})
}

// Period is how often an ADD repairs the node when no STATUS did (a
// runtime that does not call STATUS: containerd before 2.0, CRI-O,
// podman).
var Period = 5 * time.Second

// IfDue is Verb when it is due (Due): what an ADD runs, so that a node
// whose runtime never calls STATUS (containerd before 2.0, CRI-O, podman)
// mends itself too.
func IfDue(n *node.Node, net *Network, skip string) (int, error) {
	if !Due(n) {
		return 0, nil
	}
	n.Phase("heal")
	return Verb(n, net, skip)
}

// Due reports whether a verb should repair the node: no call did for
// Period, or this one loaded the programs where none were pinned.
func Due(n *node.Node) bool {
	if n.LoadedFresh() {
		return true
	}
	ago, err := n.SinceRepaired()
	return err != nil || ago > Period
}

// Verb is Run as a CNI verb runs it: with the call's network, then the
// node-wide state released if that took the node's last endpoint. skip is
// the caller's own attachment. It returns how many things it mended, and
// ErrLost (wrapped) for pods that lost what only the stateDir and the
// bpffs held.
func Verb(n *node.Node, net *Network, skip string) (int, error) {
	h, err := Run(n, Options{Network: net, Skip: skip})
	_ = n.Repaired()
	if len(h.Reclaimed) > 0 {
		n.ReleaseIfEmpty(func() { _ = Release(n) })
	}
	mended := slices.Concat(h.Rebuilt, h.Reclaimed, h.Removed, h.Restored)
	for _, line := range mended {
		fmt.Fprintln(os.Stderr, "ebpf-cni: healed: "+line)
	}
	if err == nil && len(h.Lost) > 0 {
		err = fmt.Errorf("%w: host veths %s: delete and recreate their pods (their published ports and bandwidth limits, if they had any, were lost with both the stateDir and the bpffs); ebpf-cni repair --accept-loss keeps them as they are",
			ErrLost, strings.Join(h.Lost, ", "))
	}
	return len(mended), err
}

// ErrLost: pods whose records were rebuilt with neither the files nor the
// maps.
var ErrLost = errors.New("pods lost what only the stateDir and the bpffs held")

// releaseStray releases the calling network's ebpf-ipam addresses held for
// a network namespace that is gone by an attachment no record or veth of
// the node accounts for: an ADD killed between IPAM and the veth. The
// records of ebpf-ipam are read only when it holds more attachments than
// the node has records (names only: on a node in order that is two
// directory listings).
func releaseStray(n *node.Node, o Options, recordNames []string, present map[string]bool, h *Report) error {
	ic, _, err := ebpfipam.ParseDelConfig(o.Network.EbpfIPAM)
	if err != nil || ebpfipam.CountHeld(ic.StateDir, ic.Network) <= len(recordNames) {
		return nil
	}
	held, err := ebpfipam.ListHeld(ic.StateDir)
	if err != nil {
		return err
	}
	recorded := map[string]bool{}
	for _, name := range recordNames {
		recorded[name] = true
	}
	var errs []error
	for _, a := range held {
		host := veth.HostName(a.ContainerID, a.IfName)
		if a.Network != ic.Network || a.NetNS == "" || recorded[host] || present[host] || host == o.Skip || node.IsNetNS(a.NetNS) {
			continue
		}
		h.Reclaimed = append(h.Reclaimed, fmt.Sprintf("%s/%s: addresses held in ebpf-ipam for netns %s, which is gone, by no attachment of the node (a call killed half-way); released", a.ContainerID, a.IfName, a.NetNS))
		if o.DryRun {
			continue
		}
		errs = append(errs, withAttachment(n, host, func() error {
			if _, err := n.Record(host); err == nil || veth.Exists(host) {
				return nil // its ADD went on meanwhile
			}
			return o.Network.Release(a.ContainerID, a.IfName, "")
		}))
	}
	return errors.Join(errs...)
}

// lockAttachment is withAttachment; a test counts its calls.
var lockAttachment = withAttachment

// withAttachment runs f under the attachment's lock if no call holds it.
func withAttachment(n *node.Node, hostIfName string, f func() error) error {
	l, err := n.TryAttachmentLock(hostIfName)
	if err != nil || l == nil {
		return err
	}
	defer l.Unlock()
	return f()
}

// restoreEndpoint has every feature mend what the live endpoint behind l
// lacks, in ADD order with the endpoint's own entries and programs at
// their place (feature.Feature.Repair): a record rebuilt in this repair
// first gets what the features' maps tell and, in the calling network,
// what its configuration does. The record is written again.
func restoreEndpoint(n *node.Node, l netlink.Link, rebuilt bool, o Options) ([]string, error) {
	r, err := n.Record(l.Attrs().Name)
	if err != nil || r.HostIfIndex != l.Attrs().Index {
		return nil, nil
	}
	ep := &feature.Endpoint{Record: r, Recorded: true, Host: l, Mode: attach.DefaultMode}
	var pods []feature.Pod
	if o.Network != nil {
		ep.Mode = o.Network.Mode
		if rebuilt && r.Network == o.Network.Name {
			ep.DeviceMode, pods = o.Network.DeviceMode, o.Network.Pods()
		}
	}
	var lines []string
	var errs []error
	_ = features.InOrder(func() error {
		if err := endpoint.Restore(n, ep); err != nil {
			errs = append(errs, fmt.Errorf("restoring endpoint of %s: %w", r.HostIfName, err))
		}
		return nil
	}, func(i int, f feature.Feature) error {
		rp := &feature.Repair{Endpoint: ep, Rebuilt: rebuilt}
		if i < len(pods) {
			rp.Pod = pods[i]
		}
		got, err := repairEndpoint(n, f, rp)
		lines = append(lines, got...)
		errs = append(errs, err)
		return nil
	})
	// The range's unreachable route: nodes whose pods predate it, or lost it.
	errs = append(errs, veth.EnsureRanges(veth.RecordRanges(r.IPs)))
	return lines, errors.Join(append(errs, n.WriteRecord(r))...)
}

// repairEndpoint runs f's Repair for rp's endpoint; its lines name the
// endpoint and the feature.
func repairEndpoint(n *node.Node, f feature.Feature, rp *feature.Repair) ([]string, error) {
	ep := rp.Endpoint
	got, err := f.Repair(n, rp)
	lines := make([]string, 0, len(got))
	for _, l := range got {
		lines = append(lines, fmt.Sprintf("%s/%s (host veth %s): %s: %s", ep.ContainerID, ep.IfName, ep.HostIfName, f.Name(), l))
	}
	if err != nil {
		err = fmt.Errorf("repairing %s of %s: %w", f.Name(), ep.HostIfName, err)
	}
	return lines, err
}

// Unrestored is what the features would mend for the node's live recorded
// endpoints (a dry run of their Repair): state a bpffs loss took that no
// call has restored yet. It changes nothing, and takes no lock (the
// operator's status).
func Unrestored(n *node.Node) ([]string, error) {
	recs, err := n.Records()
	if err != nil {
		return nil, err
	}
	var lines []string
	var errs []error
	for _, r := range recs {
		l, err := rtnl.H().LinkByName(r.HostIfName)
		if err != nil || l.Attrs().Index != r.HostIfIndex {
			continue // gone: reclaimed, and reported, otherwise
		}
		ep := &feature.Endpoint{Record: r, Recorded: true, Host: l}
		for _, f := range features.All {
			got, err := repairEndpoint(n, f, &feature.Repair{Endpoint: ep, DryRun: true})
			lines = append(lines, got...)
			errs = append(errs, err)
		}
	}
	return lines, errors.Join(errs...)
}

// healLink rebuilds the record of a live host veth (true), or removes a
// pair nobody can own.
func healLink(n *node.Node, l netlink.Link, o Options, h *Report) (bool, error) {
	name := l.Attrs().Name
	if _, err := n.Record(name); err == nil {
		return false, nil // its call wrote it meanwhile
	}
	r, lossy, ok := Rebuild(n, l)
	if !ok {
		h.Removed = append(h.Removed, fmt.Sprintf("host veth %s: no owner (a call killed before it was named); removed", name))
		if o.DryRun {
			return false, nil
		}
		return false, veth.DeleteHost(name)
	}
	if o.Network != nil && r.InNetwork(o.Network.Name) {
		r.Network = o.Network.Name
	}
	h.Rebuilt = append(h.Rebuilt, fmt.Sprintf("record of %s/%s (host veth %s) rebuilt from the kernel", r.ContainerID, r.IfName, name))
	if o.DryRun {
		return false, nil
	}
	if _, named := veth.Owner(l); !named {
		if err := veth.SetAlias(l, r.ContainerID, r.IfName, r.Network); err != nil {
			return false, err
		}
	}
	if err := n.WriteRecord(r); err != nil {
		return false, err
	}
	if lossy {
		if err := n.SetMark(node.MarkLossy, name); err != nil {
			return true, err
		}
	}
	if o.Network == nil || !r.InNetwork(o.Network.Name) {
		// Its network's next call completes it (adopt).
		return true, n.SetMark(node.MarkPending, name)
	}
	return true, adopt(n, r, o.Network)
}

// adopt completes a rebuilt record with what its network's configuration
// tells: its name, and, where ebpf-ipam keeps the addresses, the pod's
// addresses kept taken (ebpf-ipam's own state may be lost too: its files
// with the stateDir, its map with the bpffs).
func adopt(n *node.Node, r *node.Record, c *Network) error {
	if r.Network == "" {
		r.Network = c.Name
		if err := n.WriteRecord(r); err != nil {
			return err
		}
	}
	if c.EbpfIPAM != nil {
		if _, err := ebpfipam.Adopt(c.EbpfIPAM, "", r.ContainerID, r.IfName, r.Addrs()); err != nil {
			return fmt.Errorf("keeping the addresses of %s/%s in ebpf-ipam: %w", r.ContainerID, r.IfName, err)
		}
	}
	return n.Unmark(node.MarkPending, r.HostIfName)
}

// Rebuild is the record of the live host veth l as the kernel tells it;
// ok is false when nothing tells whose it is, lossy true when the maps
// were lost with it. The owner comes from the veth's
// alias, or from its endpoint_devs entry (a call killed before the alias
// had written it); the name must be that owner's (veth.HostName). The
// addresses come from endpoint_devs, or from the host routes to the pod;
// the network from the endpoint entries' key; the attachments from the
// veth's hooks. The features' state is learned when the repair restores
// the endpoint (feature.Repair.Rebuilt).
func Rebuild(n *node.Node, l netlink.Link) (r *node.Record, lossy, ok bool) {
	a := l.Attrs()
	r = &node.Record{HostIfName: a.Name, HostIfIndex: a.Index, HostMAC: veth.MAC(l), Rebuilt: true}
	owned, named := veth.Owner(l)
	cid, ifName := owned.ContainerID, owned.IfName
	var dev maps.CniEndpointDev
	haveDev := false
	if m, err := n.PinnedMap(maps.CniMapEndpointDevs); err == nil && m != nil {
		haveDev = m.Lookup(uint32(a.Index), &dev) == nil && net.HardwareAddr(dev.HostMac[:]).String() == r.HostMAC
	}
	if !named && haveDev {
		cid, ifName = maps.GoString(dev.ContainerId[:]), maps.GoString(dev.Ifname[:])
	}
	if cid == "" || veth.HostName(cid, ifName) != a.Name {
		return nil, false, false
	}
	r.ContainerID, r.IfName = cid, ifName
	var ips []net.IP
	if haveDev {
		r.MAC = net.HardwareAddr(dev.Mac[:]).String()
		r.Flags = uint32(dev.Flags)
		ips = maps.EndpointIPs(&dev)
	} else {
		r.MAC = veth.PeerMAC(l)
		ips = hostRouteIPs(l)
	}
	// The pod's netns where a runtime bound it (its /proc path would not
	// outlive the process): podAlive and the features' restore use it.
	if p := veth.PeerNetNS(l); stableNetNS(p) {
		r.NetNS = p
	}
	for _, ip := range ips {
		bits := 8 * len(ip)
		if ip.To4() != nil {
			ip, bits = ip.To4(), 32
		}
		r.IPs = append(r.IPs, (&net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)}).String())
	}
	if m, err := n.PinnedMap(maps.CniMapEndpoints); err == nil && m != nil && len(ips) > 0 {
		var info maps.CniEndpointInfo
		k := maps.EndpointKey(ips[0])
		if m.Lookup(&k, &info) == nil && int(info.Ifindex) == a.Index {
			r.NetID = info.NetId
		}
	}
	if owned.Network != "" {
		r.Network, r.NetID = owned.Network, maps.NetID(owned.Network)
	}
	dir := n.LinkDir(a.Name)
	for _, hook := range endpointHooks(l) {
		if at, ok := attach.Observed(l, hook, dir); ok {
			r.Attachments = append(r.Attachments, at)
		}
	}
	// The features tell their state from their maps when the repair
	// restores the endpoint (feature.Repair.Rebuilt). Without the endpoint maps the features' per-pod state (published
	// ports, bandwidth limits) is known to neither the files nor the
	// kernel: lost.
	return r, !haveDev, true
}

// stableNetNS reports whether a netns path is a runtime's bind mount.
func stableNetNS(path string) bool {
	for _, dir := range veth.NetNSDirs {
		if filepath.Dir(path) == dir {
			return true
		}
	}
	return false
}

// endpointHooks are the hooks the features put on the host end l of a
// pod's pair (a veth's or a netkit device's).
func endpointHooks(l netlink.Link) []attach.Hook {
	return attach.EndpointHooksOf(programs.Hooks(features.Objects()), l)
}

// hostRouteIPs are the pod addresses the node routes to through l (the
// host routes ADD adds: one per address, full length).
func hostRouteIPs(l netlink.Link) []net.IP {
	routes, err := rtnl.H().RouteList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil
	}
	var out []net.IP
	for _, rt := range routes {
		if rt.Dst == nil {
			continue
		}
		if ones, bits := rt.Dst.Mask.Size(); ones == bits && !rt.Dst.IP.IsLinkLocalUnicast() {
			out = append(out, rt.Dst.IP)
		}
	}
	return out
}

// reclaim removes an attachment whose host veth is gone: its pod is gone
// (a veth pair dies whole, with the pod's netns). Never one whose pod's
// interface is alive in the netns the record names: then the caller runs
// in the wrong netns.
func reclaim(n *node.Node, name string, o Options, h *Report) error {
	r, err := n.Record(name)
	if errors.Is(err, node.ErrNotFound) {
		return nil // its DEL finished meanwhile
	}
	if err != nil {
		return err
	}
	if veth.Exists(name) {
		return nil // its ADD made it meanwhile
	}
	what := fmt.Sprintf("%s/%s (host veth %s, %s)", r.ContainerID, r.IfName, r.HostIfName, strings.Join(r.IPs, ","))
	if podAlive(r) {
		h.Problems = append(h.Problems, fmt.Sprintf("%s: host veth not in this network namespace, but the pod's %s is alive in %s: run in the node's network namespace", what, r.IfName, r.NetNS))
		return nil
	}
	h.Reclaimed = append(h.Reclaimed, what+": pod gone without DEL; reclaimed")
	if o.DryRun {
		h.Released = append(h.Released, r.IPs...)
		return nil
	}
	if err := Teardown(n, r.HostIfName); err != nil {
		return err
	}
	network := r.Network
	if o.Network != nil && r.InNetwork(o.Network.Name) {
		network = o.Network.Name // a rebuilt record names its network by key only
	}
	released, err := release(n, o.Network, network, r.ContainerID, r.IfName, r.NetNS, r.Addrs())
	for _, ip := range released {
		h.Released = append(h.Released, ip.String())
	}
	return err
}

// podAlive reports whether the pod's interface still lives in the netns
// the record names (a bind mount that a runtime keeps).
func podAlive(r *node.Record) bool {
	if r.NetNS == "" || r.MAC == "" {
		return false
	}
	if !node.IsNetNS(r.NetNS) {
		return false
	}
	alive := false
	_ = ns.WithNetNSPath(r.NetNS, func(ns.NetNS) error {
		l, err := rtnl.H().LinkByName(r.IfName)
		alive = err == nil && attach.PodDevice(l) && strings.EqualFold(veth.MAC(l), r.MAC)
		return nil
	})
	return alive
}
