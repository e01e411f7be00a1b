package node

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
	"github.com/ebpf-cni/ebpf-cni/pkg/rtnl"
)

// upgrade points every attachment of the node at p's programs and unpins
// the programs of other tags, then the maps no build uses any more
// (maps.Retired). Each swap is atomic (link update, tc filter
// replace): traffic keeps flowing and the maps stay as they are. It knows
// no feature: it re-points what the records hold (the endpoints' host veth
// attachments, every attachment set), then any pinned link named after one
// of p's hooks that no record accounts for (builds before attachment sets
// kept their cgroup links without a record).
//
// force (after a bpffs remount, see Programs) re-points even when p's are
// the only programs pinned, and attaches again what lost its pinned link
// (tcx and cgroup links die with their pins).
func (n *Node) upgrade(p *programs.Set, force bool) error {
	tags, err := programs.Installed(n.bpfRoot)
	if err != nil {
		return err
	}
	if len(tags) <= 1 && !force {
		return nil
	}
	done := map[string]bool{}
	// repoint swaps the program of a. A device that is gone (a pod gone
	// without DEL) has nothing to upgrade: DEL or GC removes its record.
	// Anything else must not be half-done silently.
	repoint := func(a attach.Attachment, ifindex int, device, cgroup, what string) error {
		h, ok := p.Hook(a.Hook)
		if !ok {
			return nil
		}
		prog, err := p.Prog(a.Hook)
		if err != nil {
			return err
		}
		err = attach.Replace(a, ifindex, h, prog)
		if errors.Is(err, os.ErrNotExist) && force && a.Pin != "" {
			err = reattach(a, ifindex, device, cgroup, h, prog)
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			if _, lerr := linkByIndexName(ifindex, device); ifindex != 0 && lerr != nil {
				return nil
			}
			return fmt.Errorf("upgrading %s of %s: %w", a.Hook, what, err)
		}
		if a.Pin != "" {
			done[a.Pin] = true
		}
		return nil
	}
	recs, err := Records(n.stateDir)
	if err != nil {
		return err
	}
	for _, r := range recs {
		for _, a := range r.Attachments {
			if err := repoint(a, r.HostIfIndex, r.HostIfName, "", r.HostIfName); err != nil {
				return err
			}
		}
	}
	sets, err := AttachmentSets(n.stateDir, "")
	if err != nil {
		return err
	}
	for _, s := range sets {
		for _, a := range s.Attachments {
			if err := repoint(a, s.IfIndex, s.Name, s.Cgroup, s.Owner+"/"+s.Name); err != nil {
				return err
			}
		}
	}
	if err := n.upgradeUnrecorded(p, done); err != nil {
		return err
	}
	for _, t := range tags {
		if t != p.Tag {
			if err := programs.Remove(n.bpfRoot, t); err != nil {
				return err
			}
		}
	}
	return maps.UnpinRetired(n.bpfRoot)
}

// reattach attaches prog at h again where the pinned link of a was lost:
// on the device ifindex (if it still is device), or on the cgroup.
func reattach(a attach.Attachment, ifindex int, device, cgroup string, h attach.Hook, prog *ebpf.Program) error {
	switch {
	case a.Mode == attach.ModeCgroup && cgroup != "":
		_, err := attach.AttachCgroup(cgroup, h, prog, filepath.Dir(a.Pin))
		return err
	case (a.Mode == attach.ModeTCX || a.Mode == attach.ModeNetkit) && ifindex != 0:
		l, err := linkByIndexName(ifindex, device)
		if err != nil {
			return os.ErrNotExist // gone: GC or healing removes its record
		}
		_, err = attach.Attach(a.Mode, l, h, prog, filepath.Dir(a.Pin))
		return err
	}
	return os.ErrNotExist
}

// upgradeUnrecorded re-points the pinned links under bpfRoot that done
// does not hold, by their pin name.
func (n *Node) upgradeUnrecorded(p *programs.Set, done map[string]bool) error {
	skip := map[string]bool{programs.Dir(n.bpfRoot): true, maps.Dir(n.bpfRoot): true}
	return filepath.WalkDir(n.bpfRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // removed meanwhile
		}
		if d.IsDir() {
			if skip[path] {
				return filepath.SkipDir
			}
			return nil
		}
		_, known := p.Hook(d.Name())
		if !known || done[path] {
			return nil
		}
		prog, err := p.Prog(d.Name())
		if err != nil {
			return err
		}
		if _, err := attach.PinnedProgram(path); err != nil {
			return nil // not a link
		}
		// ENOLINK: the link's device or cgroup is gone; GC unpins it.
		if err := attach.UpdatePinned(path, prog); err != nil && !errors.Is(err, unix.ENOLINK) {
			return fmt.Errorf("upgrading %s: %w", path, err)
		}
		return nil
	})
}

// linkByIndexName finds the link with ifindex, provided it still has the
// recorded name (ifindexes are reused).
func linkByIndexName(ifindex int, name string) (netlink.Link, error) {
	l, err := rtnl.H().LinkByIndex(ifindex)
	if err != nil {
		return nil, fmt.Errorf("link %d: %w", ifindex, ErrNotFound)
	}
	if l.Attrs().Name != name {
		return nil, fmt.Errorf("link %d is %s, not %s: %w", ifindex, l.Attrs().Name, name, ErrNotFound)
	}
	return l, nil
}
