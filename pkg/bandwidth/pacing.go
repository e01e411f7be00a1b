package bandwidth

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// Source pacing (bpf/sock_pacing.c): TCP sockets of the node and its pods
// that send from a pod with an egress limit, or to a pod with an ingress
// limit, pace themselves to it. local_netns says which network namespaces
// are the node's (ifindex 0) and its pods' (their host veth's ifindex):
// sockets anywhere else are left alone.

// Netns is the pinned local_netns map.
type Netns struct{ m *ebpf.Map }

// OpenNetns opens (creating on first use) the local_netns map.
func OpenNetns(bpfRoot string) (*Netns, error) {
	m, err := maps.OpenPinned(bpfRoot, maps.CniMapLocalNetns)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", maps.CniMapLocalNetns, err)
	}
	return &Netns{m[maps.CniMapLocalNetns]}, nil
}

// Close releases the handle.
func (n *Netns) Close() {
	if n != nil {
		n.m.Close()
	}
}

// Register records the caller's netns as the node's and podNS as the pod
// behind host veth ifindex.
func (n *Netns) Register(podNS ns.NetNS, ifindex int) error {
	node, err := datapath.NetnsCookie()
	if err != nil {
		return err
	}
	var pod uint64
	if err := podNS.Do(func(ns.NetNS) error {
		pod, err = datapath.NetnsCookie()
		return err
	}); err != nil {
		return err
	}
	if err := n.m.Put(node, uint32(0)); err != nil {
		return fmt.Errorf("writing %s: %w", maps.CniMapLocalNetns, err)
	}
	if pod == node {
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
func StartPacing(bpfRoot, stateDir, cgroup string, progs *datapath.Programs) error {
	l, err := datapath.FileLock(filepath.Join(stateDir, "pacing.lock"), true)
	if err != nil {
		return err
	}
	defer l.Unlock()
	if datapath.SockAttached(bpfRoot, progs, datapath.PacingHooks) {
		return nil
	}
	return datapath.AttachSock(bpfRoot, cgroup, progs, datapath.PacingHooks)
}

// Pacing reports whether the sock_ops hook is attached.
func Pacing(bpfRoot string, progs *datapath.Programs) bool {
	return datapath.SockAttached(bpfRoot, progs, datapath.PacingHooks)
}

// Teardown takes pacing off the node once it has no endpoint left: the
// hook off the cgroup, local_netns empty. Idempotent.
func Teardown(bpfRoot string) error {
	errs := []error{datapath.DetachSock(bpfRoot, datapath.PacingHooks)}
	if maps.CheckBPFFS(bpfRoot) != nil {
		return errors.Join(errs...)
	}
	n, err := OpenNetns(bpfRoot)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	defer n.Close()
	return errors.Join(append(errs, maps.Clear(n.m))...)
}
