package plugin

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// CmdDel removes everything the attachment has; what is already gone is
// success. It needs neither the pod's netns nor a valid full configuration.
func CmdDel(args *skel.CmdArgs) (err error) {
	w := newWatch()
	cl := startCall("DEL", args, w)
	defer func() { cl.end(err) }()
	noSkelNetNSCheck(args)
	c, err := ParseConfig(args.StdinData, args.Args, false)
	if err != nil {
		return err
	}
	w.lap("parse")
	n, err := openNode(c, node.Shared, w)
	if err != nil {
		return err
	}
	cl.opened(n)
	defer n.Close()
	defer func() { logTiming("DEL", args, n, err) }()

	hostName := veth.HostName(args.ContainerID, args.IfName)
	al, err := n.AttachmentLock(hostName)
	if err != nil {
		return cniError(types.ErrIOFailure, "locking the attachment (stateDir)", err)
	}
	defer al.Unlock()
	var errs []error
	if rec, err := n.Record(hostName); err == nil && rec.OwnTable && args.Netns != "" {
		// A second interface's source rules (veth.ownTable) live in the pod.
		if err := veth.RemoveOwnRules(args.Netns, rec.Addrs()); err != nil {
			errs = append(errs, err)
		}
	}
	n.Phase("teardown")
	if err := Teardown(n, hostName); err != nil {
		errs = append(errs, err)
	}
	n.Phase("ipam")
	if err := c.ipam().Del(args, c); err != nil {
		if len(errs) == 0 {
			return ipamError("DEL", err) // IPAM's own error, as it gave it
		}
		errs = append(errs, fmt.Errorf("IPAM DEL: %w", err))
	}
	if len(errs) > 0 {
		return cniError(types.ErrIOFailure, fmt.Sprintf("deleting %s/%s", args.ContainerID, args.IfName), errors.Join(errs...))
	}
	n.Phase("release")
	al.Unlock()
	n.ReleaseIfEmpty(func() { _ = release(n) })
	return nil
}

// Teardown removes the state of the endpoint whose host veth is hostName,
// as DEL does, without calling IPAM (the operator CLI's gc calls it, with
// the node lock held exclusively): each feature in reverse order, then the
// endpoint (found through its host veth when it has no record) at its
// place among them, the host veth, its per-device counters, what the
// steps queued for the building blocks (node.Settle), the ranges' routes
// and the record. Every step runs even if one fails; the record
// goes only when all succeeded, so a retry finds what is left.
func Teardown(n *node.Node, hostName string) error {
	var errs []error
	rec, err := n.Record(hostName)
	if err != nil && !errors.Is(err, node.ErrNotFound) {
		errs = append(errs, err)
	}
	ep := &feature.Endpoint{Record: rec, Recorded: rec != nil}
	if rec == nil {
		ep.Record = &node.Record{HostIfName: hostName}
	}
	endpoint.Resolve(n, ep)
	if err := inReverse(func() error {
		// The pair dies whole with its host side, and its tc filters with
		// it; the device's counters go after it: no program counts on a
		// device that is gone.
		var errs []error
		if err := endpoint.DelEntries(n, ep); err != nil {
			errs = append(errs, fmt.Errorf("endpoint: %w", err))
		}
		vethErr := veth.DeleteHost(hostName)
		if vethErr != nil {
			errs = append(errs, vethErr)
		}
		if err := endpoint.Detach(n, ep, vethErr == nil); err != nil {
			errs = append(errs, fmt.Errorf("endpoint: %w", err))
		}
		if err := endpoint.ForgetDevice(n, ep); err != nil {
			errs = append(errs, fmt.Errorf("endpoint: %w", err))
		}
		return errors.Join(errs...)
	}, func(f feature.Feature) error {
		if err := f.Del(n, ep); err != nil {
			return fmt.Errorf("%s: %w", f.Name(), err)
		}
		return nil
	}); err != nil {
		errs = append(errs, err)
	}
	// What the steps queued for the building blocks (the conntrack table's
	// per-pod flushes), done once now that the pod can make no new state.
	if err := n.Settle(); err != nil {
		errs = append(errs, err)
	}
	if err := releaseRecordRanges(n, rec); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		if err := n.RemoveRecord(hostName); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
