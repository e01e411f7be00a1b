package plugin

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

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	ebpfipam "github.com/ebpf-cni/ebpf-cni/pkg/ipam"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
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

// Healed is what Heal found, one line per item.
type Healed struct {
	Rebuilt   []string `json:"rebuilt"`
	Reclaimed []string `json:"reclaimed"`
	Removed   []string `json:"removed"`
	// Restored is the features' state of live endpoints written again
	// (feature.Restorer): what a bpffs loss took.
	Restored []string `json:"restored"`
	Problems []string `json:"problems"`
	// Lost are the host veths whose records were rebuilt with neither
	// their file nor the maps (node.MarkLossy): STATUS fails until their
	// pods are deleted or the operator accepts the loss.
	Lost []string `json:"lost"`
	// Gone are the records of the reclaimed attachments (the operator's
	// repair releases their ebpf-ipam addresses).
	Gone []*node.Record `json:"-"`
}

// HealOptions say what Heal may do.
type HealOptions struct {
	// Config is the calling network's (STATUS, ADD): its attachments'
	// IPAM addresses are released through its IPAM when reclaimed, and
	// rebuilt records of its network get its name. Nil for the operator's
	// repair, which releases ebpf-ipam's addresses itself.
	Config *Config
	// DryRun lists what would be done and changes nothing.
	DryRun bool
	// Skip is an attachment (host veth) the caller is working on.
	Skip string
	// Restore: every live endpoint's features restore what is missing
	// (the operator's repair), not only after this call loaded the
	// programs afresh or rebuilt records.
	Restore bool
}

// Heal mends the records from the kernel and reclaims attachments whose
// pod is gone. It runs in the node's network namespace; the caller holds
// the node lock (shared or exclusive) or none.
func Heal(n *node.Node, o HealOptions) (*Healed, error) {
	h := &Healed{Rebuilt: []string{}, Reclaimed: []string{}, Removed: []string{}, Restored: []string{}, Problems: []string{}, Lost: []string{}}
	// Names first: a node in order costs a read of /proc's device list and
	// one directory listing (STATUS runs every 5 s); links and records are
	// read only for what differs.
	links, err := veth.Candidates()
	if err != nil {
		return h, err
	}
	names, err := node.RecordNames(n.StateDir)
	if err != nil {
		return h, err
	}
	recorded := map[string]bool{}
	for _, name := range names {
		recorded[name] = true
	}
	present := map[string]bool{}
	var errs []error
	rebuilt := map[string]bool{}
	for _, name := range links {
		present[name] = true
		if recorded[name] || name == o.Skip {
			continue
		}
		errs = append(errs, withAttachment(n, name, func() error {
			l, err := rtnl.H().LinkByName(name)
			if err != nil || !veth.IsOurs(l) {
				return nil // gone meanwhile (the next call reclaims what is left), or not ours
			}
			ok, err := healLink(n, l, o, h)
			rebuilt[name] = ok
			return err
		}))
	}
	for _, name := range names {
		if present[name] || name == o.Skip {
			continue
		}
		errs = append(errs, withAttachment(n, name, func() error { return reclaim(n, name, o, h) }))
	}
	errs = append(errs, reclaimOrphans(n, o, present, h))
	if o.Config != nil && o.Config.IPAMType == DefaultIPAM {
		errs = append(errs, releaseStray(n, o, names, present, h))
	}
	if o.DryRun {
		return h, errors.Join(errs...)
	}
	// Records rebuilt by a call without this network's configuration.
	if o.Config != nil {
		for _, name := range node.Marked(n.StateDir, node.MarkPending) {
			if !present[name] || rebuilt[name] || name == o.Skip {
				continue
			}
			errs = append(errs, withAttachment(n, name, func() error {
				r, err := n.Record(name)
				if err != nil || !r.InNetwork(o.Config.Name) {
					return nil
				}
				rebuilt[name] = true
				return adopt(n, r, o.Config)
			}))
		}
	}
	for _, name := range node.Marked(n.StateDir, node.MarkLossy) {
		if present[name] {
			h.Lost = append(h.Lost, name)
		}
	}
	if len(h.Rebuilt) > 0 {
		// The node-wide records went with the endpoints' (one stateDir).
		for _, f := range features.All {
			if nr, ok := f.(feature.NodeRebuilder); ok {
				errs = append(errs, nr.RebuildNode(n))
			}
		}
	}
	// This call loaded the programs where none were pinned (after a bpffs
	// remount, the maps that no surviving program kept are empty), or
	// records were rebuilt (their programs and entries may be gone with
	// them): every live endpoint gets what it lacks written again. An
	// upgrade is not such a load: the older build's maps are the node's.
	if n.LoadedFresh() || len(rebuilt) > 0 || o.Restore {
		var pods []feature.Pod
		if o.Config != nil {
			pods = configuredPods(o.Config)
		}
		for _, name := range links {
			if name == o.Skip || !(recorded[name] || rebuilt[name]) {
				continue
			}
			errs = append(errs, withAttachment(n, name, func() error {
				l, err := rtnl.H().LinkByName(name)
				if err != nil {
					return nil
				}
				lines, err := restoreEndpoint(n, l, pods, rebuilt[name], o)
				h.Restored = append(h.Restored, lines...)
				return err
			}))
		}
	}
	sort.Strings(h.Rebuilt)
	sort.Strings(h.Reclaimed)
	return h, errors.Join(errs...)
}

// HealPeriod is how often an ADD heals the node when no STATUS did (a
// runtime that does not call STATUS: containerd before 2.0, CRI-O, podman).
var HealPeriod = 5 * time.Second

// healNode is Heal as the verbs run it: with the call's network, then the
// node's node-wide state released if that took its last endpoint. skip is
// the caller's own attachment. cl counts what it mended in the call's
// record.
func healNode(n *node.Node, c *Config, skip string, cl *call) error {
	h, err := Heal(n, HealOptions{Config: c, Skip: skip})
	cl.healed += len(h.Rebuilt) + len(h.Reclaimed) + len(h.Removed) + len(h.Restored)
	_ = os.WriteFile(filepath.Join(n.StateDir, node.HealStamp), nil, 0o600)
	if len(h.Reclaimed) > 0 {
		n.ReleaseIfEmpty(func() { _ = release(n) })
	}
	for _, line := range slices.Concat(h.Rebuilt, h.Reclaimed, h.Removed, h.Restored) {
		fmt.Fprintln(os.Stderr, "ebpf-cni: healed: "+line)
	}
	if err == nil && len(h.Lost) > 0 {
		err = fmt.Errorf("%w: host veths %s: delete and recreate their pods (their published ports and bandwidth limits, if they had any, were lost with both the stateDir and the bpffs); ebpf-cni repair --accept-loss keeps them as they are",
			errLost, strings.Join(h.Lost, ", "))
	}
	return err
}

// errLost: pods whose records were rebuilt with neither the files nor the
// maps.
var errLost = errors.New("pods lost what only the stateDir and the bpffs held")

// healDue reports whether no call healed the node for HealPeriod.
func healDue(n *node.Node) bool {
	fi, err := os.Stat(filepath.Join(n.StateDir, node.HealStamp))
	return err != nil || time.Since(fi.ModTime()) > HealPeriod
}

// releaseStray releases the calling network's ebpf-ipam addresses held for
// a network namespace that is gone by an attachment no record or veth of
// the node accounts for: an ADD killed between IPAM and the veth. The
// records of ebpf-ipam are read only when it holds more attachments than
// the node has records (names only: on a node in order that is two
// directory listings).
func releaseStray(n *node.Node, o HealOptions, recordNames []string, present map[string]bool, h *Healed) error {
	ic, _, err := ebpfipam.ParseDelConfig(o.Config.IPAMConf)
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
			return o.Config.ipam().Del(otherAttachment(a.ContainerID, a.IfName, ""), o.Config)
		}))
	}
	return errors.Join(errs...)
}

// withAttachment runs f under the attachment's lock if no call holds it.
func withAttachment(n *node.Node, hostIfName string, f func() error) error {
	l, err := n.TryAttachmentLock(hostIfName)
	if err != nil || l == nil {
		return err
	}
	defer l.Unlock()
	return f()
}

// configuredPods are the features configured from the calling network's
// configuration, as far as it configures them (STATUS has no runtime
// configuration); a feature that cannot parse it is left out.
func configuredPods(c *Config) []feature.Pod {
	pods := make([]feature.Pod, len(features.All))
	for i, f := range features.All {
		if p, err := f.Parse(c.IPAMConf); err == nil {
			pods[i] = p
		}
	}
	return pods
}

// restoreEndpoint writes the features' map entries of a recorded endpoint
// again where they are missing (feature.Restorer); a record rebuilt in the
// calling network first gets the state its features can tell from the
// network's configuration (feature.PodRebuilder).
func restoreEndpoint(n *node.Node, l netlink.Link, pods []feature.Pod, rebuilt bool, o HealOptions) ([]string, error) {
	r, err := n.Record(l.Attrs().Name)
	if err != nil || r.HostIfIndex != l.Attrs().Index {
		return nil, nil
	}
	mode := attach.DefaultMode
	if o.Config != nil {
		mode = o.Config.Mode
	}
	ep := &feature.Endpoint{Record: r, Recorded: true, Host: l, Mode: mode}
	var errs []error
	if rebuilt && o.Config != nil && r.Network == o.Config.Name {
		ep.DeviceMode = attach.DeviceMode(o.Config.AttachMode)
		for i, p := range pods {
			if pr, ok := p.(feature.PodRebuilder); ok {
				if err := pr.Rebuild(n, ep); err != nil {
					errs = append(errs, fmt.Errorf("rebuilding %s of %s: %w", features.All[i].Name(), r.HostIfName, err))
				}
			}
		}
	}
	var lines []string
	_ = inOrder(func() error {
		if err := endpoint.Restore(n, ep); err != nil {
			errs = append(errs, fmt.Errorf("restoring endpoint of %s: %w", r.HostIfName, err))
		}
		return nil
	}, func(_ int, f feature.Feature) error {
		got, err := restoreFeature(n, f, ep, false)
		lines = append(lines, got...)
		errs = append(errs, err)
		return nil
	})
	// The range's unreachable route: nodes whose pods predate it, or lost it.
	errs = append(errs, veth.EnsureRanges(veth.RecordRanges(r.IPs)))
	return lines, errors.Join(append(errs, n.WriteRecord(r))...)
}

// restoreFeature runs f's Restore for ep, if f has one; its lines name the
// endpoint and the feature.
func restoreFeature(n *node.Node, f feature.Feature, ep *feature.Endpoint, dryRun bool) ([]string, error) {
	rs, ok := f.(feature.Restorer)
	if !ok {
		return nil, nil
	}
	got, err := rs.Restore(n, ep, dryRun)
	lines := make([]string, 0, len(got))
	for _, l := range got {
		lines = append(lines, fmt.Sprintf("%s/%s (host veth %s): %s: %s", ep.ContainerID, ep.IfName, ep.HostIfName, f.Name(), l))
	}
	if err != nil {
		err = fmt.Errorf("restoring %s of %s: %w", f.Name(), ep.HostIfName, err)
	}
	return lines, err
}

// Unrestored is what the features' Restore would write again for the
// node's live recorded endpoints (feature.Restorer, dry run): state a
// bpffs loss took that no call has restored yet. It changes nothing, and
// takes no lock (the operator's status).
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
			got, err := restoreFeature(n, f, ep, true)
			lines = append(lines, got...)
			errs = append(errs, err)
		}
	}
	return lines, errors.Join(errs...)
}

// healLink rebuilds the record of a live host veth (true), or removes a
// pair nobody can own.
func healLink(n *node.Node, l netlink.Link, o HealOptions, h *Healed) (bool, error) {
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
	if o.Config != nil && r.InNetwork(o.Config.Name) {
		r.Network = o.Config.Name
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
		if err := node.SetMark(n.StateDir, node.MarkLossy, name); err != nil {
			return true, err
		}
	}
	if o.Config == nil || !r.InNetwork(o.Config.Name) {
		// Its network's next call completes it (adopt).
		return true, node.SetMark(n.StateDir, node.MarkPending, name)
	}
	return true, adopt(n, r, o.Config)
}

// adopt completes a rebuilt record with what its network's configuration
// tells: its name, and, where ebpf-ipam keeps the addresses, the pod's
// addresses kept taken (ebpf-ipam's own state may be lost too: its files
// with the stateDir, its map with the bpffs).
func adopt(n *node.Node, r *node.Record, c *Config) error {
	if r.Network == "" {
		r.Network = c.Name
		if err := n.WriteRecord(r); err != nil {
			return err
		}
	}
	if c.IPAMType == DefaultIPAM {
		if _, err := ebpfipam.Adopt(c.IPAMConf, "", r.ContainerID, r.IfName, r.Addrs()); err != nil {
			return fmt.Errorf("keeping the addresses of %s/%s in ebpf-ipam: %w", r.ContainerID, r.IfName, err)
		}
	}
	return node.Unmark(n.StateDir, node.MarkPending, r.HostIfName)
}

// Rebuild is the record of the live host veth l as the kernel tells it;
// ok is false when nothing tells whose it is, lossy true when the maps
// were lost with it. The owner comes from the veth's
// alias, or from its endpoint_devs entry (a call killed before the alias
// had written it); the name must be that owner's (veth.HostName). The
// addresses come from endpoint_devs, or from the host routes to the pod;
// the network from the endpoint entries' key; the attachments from the
// veth's hooks; each feature fills in what its maps tell
// (feature.Rebuilder).
func Rebuild(n *node.Node, l netlink.Link) (r *node.Record, lossy, ok bool) {
	a := l.Attrs()
	r = &node.Record{HostIfName: a.Name, HostIfIndex: a.Index, HostMAC: a.HardwareAddr.String(), Rebuilt: true}
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
	dir := node.LinkDir(n.BPFRoot, a.Name)
	for _, hook := range endpointHooks() {
		if at, ok := attach.Observed(l, hook, dir); ok {
			r.Attachments = append(r.Attachments, at)
		}
	}
	ep := &feature.Endpoint{Record: r, Recorded: true, Host: l}
	for _, f := range features.All {
		if rb, ok := f.(feature.Rebuilder); ok {
			_ = rb.Rebuild(n, ep) // what a feature cannot tell stays out of the record; GC sweeps it
		}
	}
	// Without the endpoint maps the features' per-pod state (published
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

// endpointHooks are the hooks the features put on host veths.
func endpointHooks() []attach.Hook {
	var out []attach.Hook
	for _, o := range features.Objects() {
		for _, h := range o.Hooks {
			if h.Target == attach.Endpoint {
				out = append(out, h)
			}
		}
	}
	return out
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
func reclaim(n *node.Node, name string, o HealOptions, h *Healed) error {
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
	ipam := o.Config != nil && r.InNetwork(o.Config.Name)
	line := what + ": pod gone without DEL; reclaimed"
	if ipam {
		line += " with its addresses"
	}
	h.Reclaimed = append(h.Reclaimed, line)
	h.Gone = append(h.Gone, r)
	if o.DryRun {
		return nil
	}
	if err := Teardown(n, r.HostIfName); err != nil {
		return err
	}
	if !ipam {
		return nil // another network's: its own STATUS or ADD, or ebpf-cni gc, releases its addresses
	}
	return o.Config.ipam().Del(otherAttachment(r.ContainerID, r.IfName, r.NetNS), o.Config)
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
		alive = err == nil && l.Type() == "veth" && strings.EqualFold(l.Attrs().HardwareAddr.String(), r.MAC)
		return nil
	})
	return alive
}

// otherAttachment are the IPAM arguments of an attachment that is not the
// call's (healing releases its addresses): its identity, no CNI_ARGS, and
// this process's CNI_PATH (the calling verb's, which skel read from there,
// or the operator's).
func otherAttachment(containerID, ifName, netns string) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: containerID, IfName: ifName, Netns: netns, Path: os.Getenv("CNI_PATH")}
}
