package plugin

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/repair"
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
	if _, err := repair.Run(n, repair.Options{Network: c.Network()}); err != nil {
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
		if err := repair.Teardown(n, r.HostIfName); err != nil {
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
			if err := repair.Teardown(n, l.Attrs().Name); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if n.CheckBPFFS() == nil {
		_, err := repair.Leftovers(n, kept, false)
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
