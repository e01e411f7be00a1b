package plugin

import (
	"errors"
	"fmt"
	"net"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// The node ends its responsibility for the pod ranges it hands addresses
// of (docs/datapath.md): an unreachable route per range, the
// pods' host routes more specific, added with the range's first pod and
// removed with its last. The check "no pod left in the range" and the add
// run under one lock, so a DEL never removes the route of a range an ADD
// has just put a pod in.
const rangesLock = "ranges"

// ensureRanges adds the unreachable routes of the pod's ranges; its host
// routes must exist already. If the ADD fails later, the undo removes the
// host veth first, then every range that has no pod left.
func ensureRanges(n *node.Node, undo *feature.Undo, hostName string, ips []*current.IPConfig) error {
	ranges := veth.PodRanges(ips)
	if len(ranges) == 0 {
		return nil
	}
	l, err := n.Lock(rangesLock)
	if err != nil {
		return cniError(errcode.LinkSetup, "locking the pod ranges", err)
	}
	defer l.Unlock()
	undo.Push(func() error {
		return errors.Join(veth.DeleteHost(hostName), releaseRanges(n, ranges))
	})
	if err := veth.EnsureRanges(ranges); err != nil {
		return cniError(errcode.LinkSetup, "routing the pod ranges", err)
	}
	return nil
}

// releaseRanges removes the unreachable routes of ranges in which no pod
// is left (after the host veth of the endpoint that held them is gone).
func releaseRanges(n *node.Node, ranges []*net.IPNet) error {
	if len(ranges) == 0 {
		return nil
	}
	l, err := n.Lock(rangesLock)
	if err != nil {
		return err
	}
	defer l.Unlock()
	return veth.ReleaseRanges(ranges)
}

// releaseRecordRanges is releaseRanges of an endpoint record's addresses
// (Teardown); a record without addresses has none.
func releaseRecordRanges(n *node.Node, rec *node.Record) error {
	if rec == nil {
		return nil
	}
	return releaseRanges(n, veth.RecordRanges(rec.IPs))
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

// gcRanges finds, and unless dryRun removes, the unreachable routes of
// ranges no live endpoint has an address in; one line each.
func gcRanges(live *feature.Live, dryRun bool) ([]string, error) {
	rs, err := veth.RangeRoutes()
	if err != nil {
		return nil, err
	}
	var inUse []net.IP
	for _, rec := range live.Records {
		inUse = append(inUse, rec.Addrs()...)
	}
	sw := &feature.Sweep{DryRun: dryRun}
	for _, r := range rs {
		used := false
		for _, ip := range inUse {
			if r.Contains(ip) {
				used = true
				break
			}
		}
		if !used {
			sw.Remove(fmt.Sprintf("unreachable route %s (no pod of the node in it)", r), func() error { return veth.RemoveRange(r) })
		}
	}
	return sw.Result()
}
