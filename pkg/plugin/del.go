package plugin

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ipam"

	"github.com/ebpf-cni/ebpf-cni/pkg/bandwidth"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/nat"
	"github.com/ebpf-cni/ebpf-cni/pkg/portmap"
)

// CmdDel removes everything the attachment has; what is already gone is
// success. It needs neither the pod's netns nor a valid full configuration.
func CmdDel(args *skel.CmdArgs) error {
	c, err := ParseConfig(args.StdinData, args.Args, false)
	if err != nil {
		return err
	}
	lock, err := datapath.NodeLock(c.StateDir, false)
	if err != nil {
		return cniError(types.ErrIOFailure, "invalid stateDir", err)
	}
	defer lock.Unlock()

	hostName := datapath.HostVethName(args.ContainerID, args.IfName)
	var errs []error
	if err := teardown(c, hostName); err != nil {
		errs = append(errs, err)
	}
	if err := ipam.ExecDel(c.IPAMType, c.IPAMConf); err != nil {
		errs = append(errs, fmt.Errorf("IPAM DEL: %w", err))
	}
	if len(errs) == 0 {
		releaseNode(c, lock)
	}
	if len(errs) > 0 {
		return cniError(types.ErrIOFailure, fmt.Sprintf("deleting %s/%s", args.ContainerID, args.IfName), errors.Join(errs...))
	}
	return nil
}

// Teardown removes the state of the endpoint whose host veth is hostName,
// as DEL does, without calling IPAM: for the operator CLI's gc, which holds
// the node lock exclusively.
func Teardown(bpfRoot, stateDir, hostName string) error {
	return teardown(&Config{NetConf: &NetConf{BPFRoot: bpfRoot, StateDir: stateDir}}, hostName)
}

// teardown removes an endpoint's map entries, program attachments, veth,
// per-device counters and record; every step runs even if one fails.
func teardown(c *Config, hostName string) error {
	var errs []error
	rec, err := datapath.ReadRecord(c.StateDir, hostName)
	if err != nil && !errors.Is(err, datapath.ErrNotFound) {
		errs = append(errs, err)
	}
	ifindex := 0
	if rec != nil {
		ifindex = rec.HostIfIndex
	} else if l, err := netlinkLinkByName(hostName); err == nil && datapath.IsOurs(l) {
		ifindex = l.Attrs().Index
	}
	bpffs := maps.CheckBPFFS(c.BPFRoot) == nil
	if bpffs {
		if rec != nil {
			// Unpublished before the endpoint goes: no packet is sent to a
			// pod that is no longer there.
			if err := portmap.Unpublish(c.BPFRoot, c.StateDir, rec.HostPorts); err != nil {
				errs = append(errs, err)
			}
		}
		ips, err := deleteEntries(c.BPFRoot, hostName, rec)
		if err != nil {
			errs = append(errs, err)
		}
		if err := flushFlows(c.BPFRoot, ips); err != nil {
			errs = append(errs, err)
		}
		if err := flowsFlush(c.BPFRoot, ips); err != nil {
			errs = append(errs, err)
		}
		if rec != nil {
			for _, a := range rec.Attachments {
				if err := datapath.Detach(a, rec.HostIfIndex); err != nil {
					errs = append(errs, err)
				}
			}
		}
		if err := os.RemoveAll(datapath.LinkDir(c.BPFRoot, hostName)); err != nil {
			errs = append(errs, fmt.Errorf("unpinning links of %s: %w", hostName, err))
		}
	}
	if err := datapath.DeleteHostVeth(hostName); err != nil {
		errs = append(errs, err)
	}
	// After the veth is gone no program counts on it, so nothing recreates
	// the entry.
	if bpffs && ifindex != 0 {
		if err := datapath.DeleteDeviceCounters(c.BPFRoot, ifindex); err != nil {
			errs = append(errs, err)
		}
		if err := deleteBuckets(c.BPFRoot, ifindex); err != nil {
			errs = append(errs, err)
		}
		if err := forgetNetns(c.BPFRoot, ifindex); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		if err := datapath.RemoveRecord(c.StateDir, hostName); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// flushFlows removes the pod's conntrack/NAT entries: a pod that gets the
// same address later inherits no state.
func flushFlows(bpfRoot string, ips []net.IP) error {
	if len(ips) == 0 {
		return nil
	}
	t, err := nat.OpenTable(bpfRoot)
	if err != nil {
		return err
	}
	defer t.Close()
	_, err = t.FlushPod(ips)
	return err
}

// releaseNode takes masquerade and hostPort off the uplinks (and the
// socket and pacing hooks off the cgroup) once the node has no endpoint
// left. It upgrades the caller's node lock to exclusive first, so
// no ADD is half-way (between setting masquerade up and writing its
// record). Best effort: GC retries what fails here.
func releaseNode(c *Config, lock *datapath.Lock) {
	if has, err := datapath.HasEndpoints(c.StateDir); err != nil || has {
		return
	}
	if err := lock.Upgrade(); err != nil {
		return
	}
	if has, err := datapath.HasEndpoints(c.StateDir); err == nil && !has {
		_ = nat.Teardown(c.BPFRoot, c.StateDir)
		_ = portmap.Teardown(c.BPFRoot, c.StateDir)
		_ = bandwidth.Teardown(c.BPFRoot)
		_ = clusterRelease(c)
	}
}

// deleteEntries removes the endpoint's map entries, found through its record
// or, without one, through the host veth's device entry; it returns the
// endpoint's addresses.
func deleteEntries(bpfRoot, hostName string, rec *datapath.Record) ([]net.IP, error) {
	em, err := datapath.OpenEndpointMaps(bpfRoot)
	if err != nil {
		return nil, err
	}
	defer em.Close()
	if rec != nil {
		mac, _ := net.ParseMAC(rec.HostMAC)
		return rec.Addrs(), em.Delete(rec.HostIfIndex, mac, rec.Addrs())
	}
	l, err := netlinkLinkByName(hostName)
	if err != nil || !datapath.IsOurs(l) {
		return nil, nil
	}
	var d maps.CniEndpointDev
	if em.Devs.Lookup(uint32(l.Attrs().Index), &d) != nil {
		return nil, nil
	}
	ips := datapath.DevIPs(&d)
	return ips, em.Delete(l.Attrs().Index, l.Attrs().HardwareAddr, ips)
}
