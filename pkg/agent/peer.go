// Package agent is ebpf-cni's node agent: it watches the cluster's Node
// objects and keeps, for every other node, what makes its pod ranges
// reachable from this one (NodeRoutes: routes via its InternalIP in direct
// mode; tunnel endpoints in VXLAN mode once the overlay exists). It is never
// on the pod path: the CNI plugin does not wait for it, and what it
// installed stays in place while it is stopped or restarted.
//
// It also installs the plugin on a Kubernetes node (Install: binaries and
// the conflist from the Node's spec.podCIDRs), as the DaemonSet's init
// container.
package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// Peer is what the agent needs of another node.
type Peer struct {
	Name string
	// InternalIPs are the node's InternalIP addresses (one per family on
	// a dual-stack node), in the order the Node lists them.
	InternalIPs []netip.Addr
	// PodCIDRs are the node's pod ranges (spec.podCIDRs).
	PodCIDRs []netip.Prefix
}

// PeerOf reads a Node object. Unparsable addresses and ranges are left out
// and reported: one bad entry must not cost the node its other ranges.
func PeerOf(n *corev1.Node) (Peer, error) {
	p := Peer{Name: n.Name}
	var errs []error
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s: InternalIP %q is not an address", n.Name, a.Address))
			continue
		}
		p.InternalIPs = append(p.InternalIPs, ip.Unmap())
	}
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR} // clusters older than dual stack set only this
	}
	for _, c := range cidrs {
		pre, err := netip.ParsePrefix(c)
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s: pod range %q is not a CIDR", n.Name, c))
			continue
		}
		p.PodCIDRs = append(p.PodCIDRs, pre.Masked())
	}
	return p, errors.Join(errs...)
}

// Equal reports whether two peers need the same entries.
func (p Peer) Equal(q Peer) bool {
	return p.Name == q.Name && slices.Equal(p.InternalIPs, q.InternalIPs) && slices.Equal(p.PodCIDRs, q.PodCIDRs)
}

// AddrOfFamily is the peer's first InternalIP of the family of pre.
func (p Peer) AddrOfFamily(pre netip.Prefix) (netip.Addr, bool) {
	for _, a := range p.InternalIPs {
		if a.Is4() == pre.Addr().Is4() {
			return a, true
		}
	}
	return netip.Addr{}, false
}
