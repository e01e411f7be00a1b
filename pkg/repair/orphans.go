package repair

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	ebpfipam "github.com/ebpf-cni/ebpf-cni/pkg/ipam"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/rtnl"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// Orphaned is an orphan ReclaimOrphans reclaimed (or would).
type Orphaned struct {
	endpoint.Orphan
	// Network is its network's name as the registry holds it ("" when
	// unknown); Released the addresses its IPAM let go.
	Network  string
	Released []net.IP
}

// reclaimOrphans is ReclaimOrphans as Heal reports it.
func reclaimOrphans(n *node.Node, o Options, present map[string]bool, h *Report) error {
	done, problem, err := ReclaimOrphans(n, o.Network, present, o.DryRun)
	if problem != "" {
		h.Problems = append(h.Problems, problem)
	}
	for _, or := range done {
		h.Reclaimed = append(h.Reclaimed, or.String())
	}
	return err
}

// ReclaimOrphans removes the state of endpoints that neither a record nor
// a host veth accounts for: pods gone without DEL while the stateDir was
// lost (or whose maps a bpffs remount brought back). Their entries in
// endpoint_devs are all that is left of them, and nothing else would ever
// reclaim them: on a node with no pod left no veth is there to tell this
// network namespace from another. So it is done only where the kernel says
// this is the node's (node.InNodeNetns; problem says why not otherwise),
// under the node lock held exclusively (no ADD or DEL half-way): the
// features' state of every endpoint that is neither recorded nor alive
// goes, as a CNI GC does (Leftovers), with the node-wide state when no
// endpoint stays, and the dead pods' addresses (c: the calling network's
// IPAM; nil: ebpf-ipam's). present names the host veths of this netns
// (veth.Candidates), nil to list them.
func ReclaimOrphans(n *node.Node, c *Network, present map[string]bool, dryRun bool) (done []Orphaned, problem string, err error) {
	if present == nil {
		if present, err = presentVeths(); err != nil {
			return nil, "", err
		}
	}
	orphans, err := unrecordedOrphans(n, present)
	// Maps this call pinned again after a bpffs remount hold what the
	// programs kept: also the state of pods gone before (their flows,
	// published ports, counters), which no endpoint entry may tell.
	rescued := len(n.Rescued) > 0
	if err != nil || (len(orphans) == 0 && !rescued) {
		return nil, "", err
	}
	if ok, why := n.InNodeNetns(); !ok {
		return nil, fmt.Sprintf("endpoint entries of %d host veth(s) not in this network namespace, with no record (%s): run ebpf-cni in the node's network namespace", len(orphans), why), nil
	}
	registry, _ := n.PinnedMap(maps.CniMapIpamNets)
	if dryRun {
		for _, or := range orphans {
			done = append(done, Orphaned{Orphan: or, Network: maps.NetworkName(registry, or.NetID)})
		}
		return done, "", nil
	}
	if err := n.Exclusive(); err != nil {
		return nil, "", err
	}
	// Again, now that no call is half-way.
	if present, err = presentVeths(); err != nil {
		return nil, "", err
	}
	if orphans, err = unrecordedOrphans(n, present); err != nil || (len(orphans) == 0 && !rescued) {
		return nil, "", err
	}
	kept, err := keptEndpoints(n, present)
	if err != nil {
		return nil, "", err
	}
	var errs []error
	if _, err := Leftovers(n, kept, false); err != nil {
		errs = append(errs, err)
	}
	for _, or := range orphans {
		o := Orphaned{Orphan: or, Network: maps.NetworkName(registry, or.NetID)}
		o.Released, err = releaseOrphan(n, c, or, o.Network)
		errs = append(errs, err)
		done = append(done, o)
	}
	return done, "", errors.Join(errs...)
}

// unrecordedOrphans are the orphans (endpoint.Orphans) that no record
// names: a recorded endpoint whose veth is gone is reclaimed from its
// record (reclaim, the operator's gc), or kept for the reason given there.
func unrecordedOrphans(n *node.Node, present map[string]bool) ([]endpoint.Orphan, error) {
	orphans, err := endpoint.Orphans(n, present)
	if err != nil || len(orphans) == 0 {
		return nil, err
	}
	recs, err := n.Records()
	if err != nil {
		return nil, err
	}
	recorded := map[int]bool{}
	for _, r := range recs {
		recorded[r.HostIfIndex] = true
	}
	return slices.DeleteFunc(orphans, func(o endpoint.Orphan) bool { return recorded[o.IfIndex] }), nil
}

// presentVeths names the host veths of ebpf-cni in this network namespace.
func presentVeths() (map[string]bool, error) {
	names, err := veth.Candidates()
	if err != nil {
		return nil, err
	}
	present := map[string]bool{}
	for _, name := range names {
		present[name] = true
	}
	return present, nil
}

// keptEndpoints are the endpoints a collection of orphans keeps: every
// record (one whose veth is gone is reclaim's, or kept for the reason it
// gave), and every live host veth without one, as the kernel tells it
// (Rebuild, written nowhere; by its ifindex alone when nothing tells its
// owner): a stateDir that is not the plugin's must not cost live pods
// their state.
func keptEndpoints(n *node.Node, present map[string]bool) (map[string]*node.Record, error) {
	recs, err := n.Records()
	if err != nil {
		return nil, err
	}
	kept := map[string]*node.Record{}
	for _, r := range recs {
		kept[r.HostIfName] = r
	}
	for name := range present {
		if kept[name] != nil {
			continue
		}
		l, err := rtnl.H().LinkByName(name)
		if err != nil || !veth.IsOurs(l) {
			continue
		}
		r, _, ok := Rebuild(n, l)
		if !ok {
			r = &node.Record{HostIfName: name, HostIfIndex: l.Attrs().Index}
		}
		kept[name] = r
	}
	return kept, nil
}

// releaseOrphan releases what IPAM holds for a reclaimed orphan (release);
// a container ID cut to fit the map cannot be told to IPAM.
func releaseOrphan(n *node.Node, c *Network, or endpoint.Orphan, network string) ([]net.IP, error) {
	if or.ContainerID == "" || strings.HasPrefix(or.ContainerID, "sha256:") || network == "" {
		return nil, nil
	}
	return release(n, c, network, or.ContainerID, or.IfName, "", or.IPs)
}

// release releases what IPAM holds for an attachment of network that is
// gone: through the calling network's IPAM plugin when it is that network
// (ips: what it held), else through ebpf-ipam's state beside the plugin's
// (ReleaseEbpfIPAM); another IPAM plugin's addresses of another network
// are left to that network's own STATUS or GC.
func release(n *node.Node, c *Network, network, containerID, ifName, netns string, ips []net.IP) ([]net.IP, error) {
	if c != nil && (network == c.Name || network == maps.Fit(c.Name, maps.CniNetNameLen)) {
		if err := c.Release(containerID, ifName, netns); err != nil {
			return nil, fmt.Errorf("releasing the addresses of %s/%s: %w", containerID, ifName, err)
		}
		return ips, nil
	}
	return ReleaseEbpfIPAM(n, network, containerID, ifName)
}

// ReleaseEbpfIPAM releases the addresses ebpf-ipam holds for an attachment
// of network in its state beside the plugin's (n's bpfRoot and stateDir:
// the default for ebpf-cni's networks), and returns them. Only addresses
// the attachment still holds in the map go, so one handed to a live pod
// since is never touched; a network ebpf-ipam keeps nothing of releases
// nothing. Its records may be lost: ebpf-ipam rebuilds them from its map.
func ReleaseEbpfIPAM(n *node.Node, network, containerID, ifName string) ([]net.IP, error) {
	if !ebpfipam.ValidNetworkName(network) {
		return nil, nil
	}
	released, err := ebpfipam.ReleaseHeld(n.BPFRoot(), n.StateDir(), network, containerID, ifName)
	if err != nil {
		return released, fmt.Errorf("releasing the addresses of %s/%s in network %s: %w", containerID, ifName, network, err)
	}
	return released, nil
}

// String says what was (or would be) reclaimed of an orphan.
func (o Orphaned) String() string {
	line := fmt.Sprintf("%s/%s (host ifindex %d, %s): pod gone without DEL and without a record; its entries reclaimed", o.ContainerID, o.IfName, o.IfIndex, ipList(o.IPs))
	if len(o.Released) > 0 {
		line += ", addresses " + ipList(o.Released) + " released"
	}
	return line
}

func ipList(ips []net.IP) string {
	out := make([]string, 0, len(ips))
	for _, ip := range ips {
		out = append(out, ip.String())
	}
	return strings.Join(out, ",")
}
