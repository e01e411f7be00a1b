package plugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/nat"
)

// CmdGC removes the endpoints of this network that are not in
// cni.dev/valid-attachments, and whatever no endpoint record accounts for
// (left by a crash): host veths, pinned links, map entries. Then it forwards
// GC to the IPAM plugin.
func CmdGC(args *skel.CmdArgs) error {
	c, err := ParseConfig(args.StdinData, args.Args, false)
	if err != nil {
		return err
	}
	// Exclusive: no ADD is half-way, so an unrecorded veth is garbage.
	lock, err := datapath.NodeLock(c.StateDir, true)
	if err != nil {
		return cniError(types.ErrIOFailure, "invalid stateDir", err)
	}
	defer lock.Unlock()

	valid := map[[2]string]bool{}
	for _, a := range c.ValidAttachments {
		valid[[2]string{a.ContainerID, a.IfName}] = true
	}
	var errs []error
	recs, err := datapath.Records(c.StateDir)
	if err != nil {
		return cniError(types.ErrIOFailure, "listing endpoint records", err)
	}
	kept := map[string]*datapath.Record{}
	for _, r := range recs {
		if r.Network != c.Name || valid[[2]string{r.ContainerID, r.IfName}] {
			kept[r.HostIfName] = r
			continue
		}
		if err := teardown(c, r.HostIfName); err != nil {
			errs = append(errs, err)
		}
	}

	// Orphans: ours, but in no record.
	links, err := datapath.HostLinks()
	if err != nil {
		errs = append(errs, err)
	}
	for _, l := range links {
		if kept[l.Attrs().Name] == nil {
			if err := teardown(c, l.Attrs().Name); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if maps.CheckBPFFS(c.BPFRoot) == nil {
		errs = append(errs, gcPins(c.BPFRoot, kept), gcEntries(c.BPFRoot, kept), gcMasquerade(c, kept))
	}

	if err := invoke.DelegateGC(context.TODO(), c.IPAMType, c.IPAMConf, nil); err != nil {
		errs = append(errs, fmt.Errorf("IPAM GC: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return cniError(types.ErrIOFailure, "garbage-collecting", err)
	}
	return nil
}

func gcPins(bpfRoot string, kept map[string]*datapath.Record) error {
	dir := filepath.Dir(datapath.LinkDir(bpfRoot, "x"))
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var errs []error
	for _, e := range ents {
		if kept[e.Name()] == nil {
			errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
		}
	}
	return errors.Join(errs...)
}

func gcEntries(bpfRoot string, kept map[string]*datapath.Record) error {
	em, err := datapath.OpenEndpointMaps(bpfRoot)
	if err != nil {
		return err
	}
	defer em.Close()
	live := map[int]bool{}
	for _, r := range kept {
		live[r.HostIfIndex] = true
	}
	var errs []error
	devs, err := em.Devices()
	if err != nil {
		return err
	}
	for _, d := range devs {
		if !live[d.IfIndex] {
			errs = append(errs, em.Delete(d.IfIndex, d.Dev.HostMac[:], datapath.DevIPs(&d.Dev)))
		}
	}
	addrs, err := em.Addresses()
	if err != nil {
		return err
	}
	for ip, v := range addrs {
		if !live[int(v.Ifindex)] {
			errs = append(errs, em.Delete(int(v.Ifindex), v.HostMac[:], []net.IP{net.ParseIP(ip)}))
		}
	}
	return errors.Join(errs...)
}

// gcMasquerade removes the flows of pods that are gone and expired flows,
// the settings of networks without endpoints, and masquerade itself when
// the node has no endpoint left.
func gcMasquerade(c *Config, kept map[string]*datapath.Record) error {
	if len(kept) == 0 {
		return nat.Teardown(c.BPFRoot, c.StateDir)
	}
	liveNets := map[uint32]bool{}
	liveIPs := map[string]bool{}
	for _, r := range kept {
		liveNets[maps.NetID(r.Network)] = true
		for _, ip := range r.Addrs() {
			liveIPs[ip.String()] = true
		}
	}
	t, err := nat.OpenTable(c.BPFRoot)
	if err != nil {
		return err
	}
	defer t.Close()
	_, err = t.GC(func(ip net.IP) bool { return liveIPs[ip.String()] })
	return errors.Join(err, nat.ForgetNetworks(c.BPFRoot, liveNets))
}
