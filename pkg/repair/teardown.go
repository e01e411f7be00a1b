package repair

import (
	"errors"
	"fmt"
	"net"

	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// RangesLock is the node's lock of the pod ranges' unreachable routes
// (docs/datapath.md): the check "no pod left in the range" and the add
// run under it, so a DEL never removes the route of a range an ADD has
// just put a pod in.
const RangesLock = "ranges"

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
	if err := features.InReverse(func() error {
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

// Release takes the node's state away once it has no endpoint left (the
// caller holds the node lock exclusively: node.ReleaseIfEmpty): every
// feature's node-wide state (features.Release), and the unreachable routes
// of pod ranges a lost record left. Best effort: GC retries what fails.
func Release(n *node.Node) error {
	return errors.Join(features.Release(n), removeAllRanges())
}

// ReleaseRanges removes the unreachable routes of ranges in which no pod
// is left (after the host veth of the endpoint that held them is gone).
func ReleaseRanges(n *node.Node, ranges []*net.IPNet) error {
	if len(ranges) == 0 {
		return nil
	}
	l, err := n.Lock(RangesLock)
	if err != nil {
		return err
	}
	defer l.Unlock()
	return veth.ReleaseRanges(ranges)
}

// releaseRecordRanges is ReleaseRanges of an endpoint record's addresses
// (Teardown); a record without addresses has none.
func releaseRecordRanges(n *node.Node, rec *node.Record) error {
	if rec == nil {
		return nil
	}
	return ReleaseRanges(n, veth.RecordRanges(rec.IPs))
}

// removeAllRanges takes every unreachable route away: the node has no
// endpoint left (release).
func removeAllRanges() error {
	rs, err := veth.RangeRoutes()
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range rs {
		errs = append(errs, veth.RemoveRange(r))
	}
	return errors.Join(errs...)
}
