package plugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/bandwidth"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/nat"
	"github.com/ebpf-cni/ebpf-cni/pkg/portmap"
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
		_, err := Leftovers(c.BPFRoot, kept, false)
		errs = append(errs, err, gcMasquerade(c, kept))
	}

	if err := invoke.DelegateGC(context.TODO(), c.IPAMType, c.IPAMConf, nil); err != nil {
		errs = append(errs, fmt.Errorf("IPAM GC: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return cniError(types.ErrIOFailure, "garbage-collecting", err)
	}
	return nil
}

// Leftovers finds, and unless dryRun removes, the state under bpfRoot that
// no record in kept (keyed by host veth) accounts for: pinned links, endpoint
// map entries, per-device counters. It returns one line per item. The caller
// holds the node lock exclusively, so no ADD is half-way.
func Leftovers(bpfRoot string, kept map[string]*datapath.Record, dryRun bool) ([]string, error) {
	pins, perr := gcPins(bpfRoot, kept, dryRun)
	entries, eerr := gcEntries(bpfRoot, kept, dryRun)
	return append(pins, entries...), errors.Join(perr, eerr)
}

func gcPins(bpfRoot string, kept map[string]*datapath.Record, dryRun bool) ([]string, error) {
	dir := filepath.Dir(datapath.LinkDir(bpfRoot, "x"))
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil
	}
	var found []string
	var errs []error
	for _, e := range ents {
		if kept[e.Name()] == nil {
			found = append(found, "pinned links "+filepath.Join(dir, e.Name()))
			if !dryRun {
				errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
			}
		}
	}
	return found, errors.Join(errs...)
}

func gcEntries(bpfRoot string, kept map[string]*datapath.Record, dryRun bool) ([]string, error) {
	em, err := datapath.OpenEndpointMaps(bpfRoot)
	if err != nil {
		return nil, err
	}
	defer em.Close()
	live := map[int]bool{}
	for _, r := range kept {
		live[r.HostIfIndex] = true
	}
	var found []string
	var errs []error
	remove := func(what string, del func() error) {
		found = append(found, what)
		if !dryRun {
			errs = append(errs, del())
		}
	}
	devs, err := em.Devices()
	if err != nil {
		return nil, err
	}
	for _, d := range devs {
		if !live[d.IfIndex] {
			remove(fmt.Sprintf("%s[%d] (container %s)", maps.CniMapEndpointDevs, d.IfIndex, maps.GoString(d.Dev.ContainerId[:])), func() error {
				return em.Delete(d.IfIndex, d.Dev.HostMac[:], datapath.DevIPs(&d.Dev))
			})
		}
	}
	addrs, err := em.Addresses()
	if err != nil {
		return nil, err
	}
	for ip, v := range addrs {
		if !live[int(v.Ifindex)] {
			remove(fmt.Sprintf("%s[%s] (ifindex %d)", maps.CniMapEndpoints, ip, v.Ifindex), func() error {
				return em.Delete(int(v.Ifindex), v.HostMac[:], []net.IP{net.ParseIP(ip)})
			})
		}
	}
	counted, err := datapath.DeviceCounterKeys(bpfRoot)
	if err != nil {
		return nil, err
	}
	for _, i := range counted {
		if !live[i] {
			remove(fmt.Sprintf("%s[%d]", maps.CniMapEndpointCounters, i), func() error {
				return datapath.DeleteDeviceCounters(bpfRoot, i)
			})
		}
	}
	t, err := bandwidth.OpenTable(bpfRoot)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	buckets, err := t.List()
	if err != nil {
		return nil, err
	}
	for _, b := range buckets {
		if !live[b.IfIndex] {
			remove(fmt.Sprintf("%s[%d]", maps.CniMapBwBuckets, b.IfIndex), func() error { return t.Delete(b.IfIndex) })
		}
	}
	n, err := bandwidth.OpenNetns(bpfRoot)
	if err != nil {
		return nil, err
	}
	defer n.Close()
	netns, err := n.Entries()
	if err != nil {
		return nil, err
	}
	for cookie, i := range netns {
		if i != 0 && !live[i] {
			remove(fmt.Sprintf("%s[%#x]", maps.CniMapLocalNetns, cookie), func() error { return n.Delete(cookie) })
		}
	}
	sort.Strings(found)
	return found, errors.Join(errs...)
}

// gcMasquerade removes the flows of pods that are gone and expired flows,
// the settings of networks without endpoints, and masquerade itself when
// the node has no endpoint left.
func gcMasquerade(c *Config, kept map[string]*datapath.Record) error {
	if len(kept) == 0 {
		return errors.Join(nat.Teardown(c.BPFRoot, c.StateDir), portmap.Teardown(c.BPFRoot, c.StateDir), bandwidth.Teardown(c.BPFRoot),
			clusterRelease(c), flowsGC(c.BPFRoot, func(net.IP) bool { return false }))
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
	live := func(ip net.IP) bool { return liveIPs[ip.String()] }
	_, err = t.GC(live)
	return errors.Join(err, nat.ForgetNetworks(c.BPFRoot, liveNets), portmap.GC(c.BPFRoot, c.StateDir, live), flowsGC(c.BPFRoot, live))
}
