package repair

import (
	"errors"
	"fmt"
	"net"
	"sort"

	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

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
		errs = append(errs, Release(n))
	}
	sort.Strings(found)
	return found, errors.Join(errs...)
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
