package nat

import (
	"errors"
	"fmt"
	"net"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/rtnl"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// What an ADD's masquerade settings must agree with before they are
// written. masq_nets holds one masquerade address per network and family,
// which every pod of the network on the node leaves with: an ADD that
// wrote another (last ADD wins) would move them all, and an address the
// node does not hold would send their replies nowhere, also after that
// ADD's DEL (the entry stays while the network has a pod, or until GC).
// Restore and Rebuild write what records hold, without admission.

// admission is an ADD's: self is its own host veth, which exists already.
type admission struct{ self string }

// nodeAddress refuses a masqueradeIP that is no address of the node: one
// of global scope on any device of the node's network namespace. Not only
// an uplink's: a node may answer for an address it holds on a dummy device
// or lo (announced to its routers), and the uplink programs translate the
// replies wherever the address is held. Host veths hold none of global scope.
func nodeAddress(ip net.IP) error {
	if ip == nil {
		return nil
	}
	fam := unix.AF_INET6
	if ip.To4() != nil {
		fam = unix.AF_INET
	}
	addrs, err := rtnl.GlobalAddrs(fam)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		if a.IP.Equal(ip) {
			return nil
		}
	}
	return config.Invalid("masqueradeIP", "%s is not an address of the node (none of its devices holds it with global scope): replies to it would not come back; give one of the node's addresses, or leave masqueradeIP out for the uplink's", ip)
}

// agree refuses settings whose masquerade address for a family of the pod
// differs from the one in force for the network (want: the address, zero
// for the uplink's), while a pod of that network lives on the node; with
// none, the entry is a leftover and the ADD's settings replace it. The
// caller holds the masquerade lock: two ADDs that disagree cannot both
// find no entry, or both a leftover.
func (a *admission) agree(m *ebpf.Map, netID uint32, network string, want map[uint8][16]uint8) error {
	if a == nil {
		return nil
	}
	for fam, addr := range want {
		var cur maps.CniMasqNet
		err := m.Lookup(&maps.CniMasqNetKey{NetId: netID, Family: fam}, &cur)
		if errors.Is(err, ebpf.ErrKeyNotExist) || err == nil && cur.Addr == addr {
			continue
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", maps.CniMapMasqNets, err)
		}
		pod, err := a.livePod(network)
		if err != nil || pod == "" {
			return err
		}
		return config.Invalid("masqueradeIP", "network %q masquerades with %s on this node (pod %s, and maybe others); an ADD of the network with %s is refused until none of its pods is left on the node",
			network, masqueradeAddr(fam, cur.Addr), pod, masqueradeAddr(fam, addr))
	}
	return nil
}

// livePod names a pod of network on the node other than the ADD's own, ""
// when there is none. The kernel says: the host veths exist from early in
// an ADD (before any feature) until its DEL, and their alias names the
// network. One whose alias does not (an ADD killed before naming it, an
// older build, a cut alias) may be the network's: it counts.
func (a *admission) livePod(network string) (string, error) {
	links, err := veth.HostLinks()
	if err != nil {
		return "", err
	}
	for _, l := range links {
		if l.Attrs().Name == a.self {
			continue
		}
		o, ok := veth.Owner(l)
		if !ok || o.Network == "" {
			return l.Attrs().Name, nil
		}
		if o.Network == network {
			return o.ContainerID + "/" + o.IfName, nil
		}
	}
	return "", nil
}

// inForce reports whether the network's entry of every family of want
// holds its address already.
func inForce(m *ebpf.Map, netID uint32, want map[uint8][16]uint8) bool {
	for fam, addr := range want {
		var cur maps.CniMasqNet
		if m.Lookup(&maps.CniMasqNetKey{NetId: netID, Family: fam}, &cur) != nil || cur.Addr != addr {
			return false
		}
	}
	return true
}

func masqueradeAddr(fam uint8, a [16]uint8) string {
	if a == ([16]uint8{}) {
		return "the uplink's address (no masqueradeIP)"
	}
	return "masqueradeIP " + maps.IP(fam, a).String()
}
