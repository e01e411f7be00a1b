package plugin

import (
	"errors"
	"fmt"
	"sort"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// CmdGC removes the endpoints of this network that are not in
// cni.dev/valid-attachments, and whatever no endpoint record accounts for
// (left by a crash): host veths, pinned links, map entries. Then it forwards
// GC to the IPAM plugin.
func CmdGC(args *skel.CmdArgs) (err error) {
	cl := startCall("GC", args, nil)
	defer func() { cl.end(err) }()
	c, err := ParseConfig(args.StdinData, args.Args, false)
	if err != nil {
		return err
	}
	// Exclusive: no ADD is half-way, so an unrecorded veth is garbage.
	n, err := openNode(c, node.Exclusive, nil)
	if err != nil {
		return err
	}
	cl.opened(n)
	defer n.Close()

	valid := map[[2]string]bool{}
	for _, a := range c.ValidAttachments {
		valid[[2]string{a.ContainerID, a.IfName}] = true
	}
	var errs []error
	// Programs lost with a remounted bpffs are loaded again first, so the
	// live pods' attachments move to them and their entries are restored.
	if n.CheckBPFFS() == nil {
		if _, err := n.Programs(); err != nil {
			errs = append(errs, err)
		}
	}
	// The kernel first: live veths whose records were lost get them back
	// (so the valid attachments below keep them), pairs nobody owns and
	// attachments whose pod is gone go.
	if _, err := Heal(n, HealOptions{Config: c}); err != nil {
		errs = append(errs, err)
	}
	recs, err := n.Records()
	if err != nil {
		return cniError(types.ErrIOFailure, "listing endpoint records", err)
	}
	kept := map[string]*node.Record{}
	for _, r := range recs {
		if !r.InNetwork(c.Name) || valid[[2]string{r.ContainerID, r.IfName}] {
			kept[r.HostIfName] = r
			continue
		}
		if err := Teardown(n, r.HostIfName); err != nil {
			errs = append(errs, err)
		}
	}

	// Orphans: ours, in no record, and no owner to rebuild one for (Heal
	// could not mend them).
	links, err := veth.HostLinks()
	if err != nil {
		errs = append(errs, err)
	}
	for _, l := range links {
		if _, named := veth.Owner(l); !named && kept[l.Attrs().Name] == nil {
			if err := Teardown(n, l.Attrs().Name); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if n.CheckBPFFS() == nil {
		_, err := Leftovers(n, kept, false)
		errs = append(errs, err)
	}

	if err := c.ipam().GC(args, c); err != nil {
		if errors.Join(errs...) == nil {
			return ipamError("GC", err) // IPAM's own error, as it gave it
		}
		errs = append(errs, fmt.Errorf("IPAM GC: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return cniError(types.ErrIOFailure, "garbage-collecting", err)
	}
	return nil
}

// Leftovers finds, and unless dryRun removes, the state no endpoint in kept
// (keyed by host veth) accounts for: every feature collects its own
// (pinned links, map entries, flows, published ports...). When nothing is
// kept, the features leave the node too. It returns one line per item. The
// caller holds the node lock exclusively, so no ADD is half-way.
func Leftovers(n *node.Node, kept map[string]*node.Record, dryRun bool) ([]string, error) {
	live := feature.NewLive(kept)
	found, err := endpoint.GC(n, live, dryRun)
	var errs []error
	if err != nil {
		errs = append(errs, fmt.Errorf("endpoint: %w", err))
	}
	for _, f := range features.All {
		lines, err := f.GC(n, live, dryRun)
		found = append(found, lines...)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.Name(), err))
		}
	}
	lines, err := gcRanges(live, dryRun)
	found = append(found, lines...)
	errs = append(errs, err)
	if live.Empty() && !dryRun {
		errs = append(errs, release(n))
	}
	sort.Strings(found)
	return found, errors.Join(errs...)
}
