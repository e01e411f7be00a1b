package bandwidth

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

// Source pacing (bpf/sock_pacing.c): TCP sockets of the node and its pods
// that send from a pod with an egress limit, or to a pod with an ingress
// limit, pace themselves to it. local_netns says which network namespaces
// are the node's (ifindex 0) and its pods' (their host veth's ifindex):
// sockets anywhere else are left alone.

// PacingHooks are the sock_ops hook of the node's cgroup: TCP senders of
// the node and its pods paced to the bandwidth limits (bpf/sock_pacing.c).
// They attach with the first limited pod.
var PacingHooks = []attach.Hook{attach.CgroupHook("bw_pacing", ebpf.AttachCGroupSockOps)}

// cgroupSet names the pacing hook's attachment set.
const cgroupSet = "pacing"

// Netns is the pinned local_netns map.
type Netns struct{ m *ebpf.Map }

// NetnsOf is the local_netns map of the call's node (which closes it).
func NetnsOf(n *node.Node) (*Netns, error) {
	m, err := n.Map(maps.CniMapLocalNetns)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", maps.CniMapLocalNetns, err)
	}
	return &Netns{m: m}, nil
}

// Register records the caller's netns as the node's and podNS as the pod
// behind host veth ifindex.
func (n *Netns) Register(podNS ns.NetNS, ifindex int) error {
	self, err := node.NetnsCookie()
	if err != nil {
		return err
	}
	var pod uint64
	if err := podNS.Do(func(ns.NetNS) error {
		pod, err = node.NetnsCookie()
		return err
	}); err != nil {
		return err
	}
	if err := n.m.Put(self, uint32(0)); err != nil {
		return fmt.Errorf("writing %s: %w", maps.CniMapLocalNetns, err)
	}
	if pod == self {
		return nil // a "pod" in the node's netns: its sockets are the node's
	}
	if err := n.m.Put(pod, uint32(ifindex)); err != nil {
		return fmt.Errorf("writing %s: %w", maps.CniMapLocalNetns, err)
	}
	return nil
}

// Entries returns every entry: netns cookie -> host veth ifindex (0: the
// node).
func (n *Netns) Entries() (map[uint64]int, error) {
	out := map[uint64]int{}
	var k uint64
	var v uint32
	it := n.m.Iterate()
	for it.Next(&k, &v) {
		out[k] = int(v)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterating %s: %w", maps.CniMapLocalNetns, err)
	}
	return out, nil
}

// Forget removes the entries of the pods behind the ifindexes gone says
// are gone; the node's stays.
func (n *Netns) Forget(gone func(ifindex int) bool) error {
	all, err := n.Entries()
	if err != nil {
		return err
	}
	var errs []error
	for k, v := range all {
		if v != 0 && gone(v) {
			errs = append(errs, n.Delete(k))
		}
	}
	return errors.Join(errs...)
}

// Delete removes the entry of one netns; gone already is success.
func (n *Netns) Delete(cookie uint64) error {
	if err := n.m.Delete(cookie); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("deleting %s[%#x]: %w", maps.CniMapLocalNetns, cookie, err)
	}
	return nil
}

// Registered reports whether the pod behind ifindex has its netns entry.
func (n *Netns) Registered(ifindex int) (bool, error) {
	all, err := n.Entries()
	if err != nil {
		return false, err
	}
	for _, v := range all {
		if v == ifindex {
			return true, nil
		}
	}
	return false, nil
}

// StartPacing attaches the sock_ops hook to the cgroup unless it is there.
func StartPacing(n *node.Node, cgroup string) error {
	l, err := n.Lock("pacing")
	if err != nil {
		return err
	}
	defer l.Unlock()
	return feature.AttachCgroup(n, cgroupSet, cgroup, PacingHooks)
}

// Pacing reports whether the sock_ops hook of this build is attached.
func Pacing(n *node.Node) bool {
	progs, err := n.PinnedPrograms()
	if err != nil {
		return false
	}
	return feature.CgroupAttached(n, progs, PacingHooks)
}

// Teardown takes pacing off the node once it has no endpoint left: the
// hook off the cgroup, local_netns empty. Idempotent.
func Teardown(n *node.Node) error {
	errs := []error{feature.DetachCgroup(n, cgroupSet, PacingHooks)}
	if n.CheckBPFFS() != nil {
		return errors.Join(errs...)
	}
	m, err := n.PinnedMap(maps.CniMapLocalNetns)
	if err == nil && m != nil {
		err = maps.Clear(m)
	}
	return errors.Join(append(errs, err)...)
}
