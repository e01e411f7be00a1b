package nat

import (
	"errors"
	"fmt"
	"net"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/uplink"
)

func skipKey(netID uint32, n *net.IPNet) maps.CniMasqSkipKey {
	ones, _ := n.Mask.Size()
	return maps.CniMasqSkipKey{Prefixlen: uint32(40 + ones), NetId: netID, Family: maps.Family(n.IP), Addr: maps.Addr16(n.IP.Mask(n.Mask))}
}

// Apply makes masquerade ready for a pod of network netName whose addresses
// lie in podNets: the uplinks carry the programs and know their addresses,
// and the network's settings are in the maps. It is idempotent; Restore
// calls it with what a record holds. An ADD goes through admit instead.
func Apply(n *node.Node, netName string, s *Settings, podNets []*net.IPNet, mode attach.Mode) error {
	return apply(n, netName, s, podNets, mode, nil)
}

// apply is Apply, with an ADD's admission (nil: none). Every ADD of a
// network with ipMasq calls it, so uplink address changes and the
// network's other settings apply (last ADD wins for those); its
// masquerade address must agree with the one in force (admission.agree).
func apply(n *node.Node, netName string, s *Settings, podNets []*net.IPNet, mode attach.Mode, a *admission) error {
	ups, err := uplink.Find(s.Uplinks)
	if err != nil {
		return err
	}
	if a != nil {
		if err := nodeAddress(s.MasqueradeIP); err != nil {
			return err
		}
	}
	lo, hi, err := s.portRange()
	if err != nil {
		return err
	}
	registry, err := n.Map(maps.CniMapIpamNets)
	if err != nil {
		return err
	}
	netID, err := maps.RegisterNetwork(registry, netName)
	if err != nil {
		return err
	}
	if err := uplink.Ensure(n, ups, mode); err != nil {
		return err
	}
	timeouts, err := n.Map(maps.CniMapNatTimeouts)
	if err != nil {
		return err
	}
	if err := timeouts.Put(uint32(0), &s.Timeouts); err != nil {
		return fmt.Errorf("writing nat_timeouts: %w", err)
	}
	if err := writeNets(n, netID, netName, s, podNets, lo, hi, a); err != nil {
		return err
	}
	skip := s.Skip
	if skip == nil {
		skip = podNets
	}
	m, err := n.Map(maps.CniMapMasqSkip)
	if err != nil {
		return err
	}
	return syncSkip(m, netID, append(append([]*net.IPNet{}, skip...), s.Cluster...))
}

// writeNets writes the network's masq_nets entry of each family of
// podNets: the masquerade address (zero: the uplink's) and port range,
// once the ADD's admission agrees. An ADD whose addresses are those in
// force writes without the masquerade lock: no other ADD replaces them
// while this one's pod lives (admission.livePod sees its host veth).
func writeNets(n *node.Node, netID uint32, netName string, s *Settings, podNets []*net.IPNet, lo, hi uint16, a *admission) error {
	nets, err := n.Map(maps.CniMapMasqNets)
	if err != nil {
		return err
	}
	want := map[uint8][16]uint8{}
	for _, p := range podNets {
		fam := maps.Family(p.IP)
		want[fam] = [16]uint8{}
		if s.MasqueradeIP != nil && maps.Family(s.MasqueradeIP) == fam {
			want[fam] = maps.Addr16(s.MasqueradeIP)
		}
	}
	if a != nil && !inForce(nets, netID, want) {
		l, err := n.Lock(name)
		if err != nil {
			return err
		}
		defer l.Unlock()
		if err := a.agree(nets, netID, netName, want); err != nil {
			return err
		}
	}
	for fam, addr := range want {
		v := maps.CniMasqNet{Addr: addr, PortMin: lo, PortMax: hi}
		k := maps.CniMasqNetKey{NetId: netID, Family: fam}
		if err := nets.Put(&k, &v); err != nil {
			return fmt.Errorf("writing masq_nets: %w", err)
		}
	}
	return nil
}

// syncSkip makes the network's masq_skip entries exactly want.
func syncSkip(m *ebpf.Map, netID uint32, want []*net.IPNet) error {
	keep := map[maps.CniMasqSkipKey]bool{}
	one := uint32(1)
	for _, n := range want {
		k := skipKey(netID, n)
		keep[k] = true
		if err := m.Put(&k, &one); err != nil {
			return fmt.Errorf("writing masq_skip %s: %w", n, err)
		}
	}
	if err := maps.DeleteWhere[maps.CniMasqSkipKey, uint32](m, func(k maps.CniMasqSkipKey) bool { return k.NetId == netID && !keep[k] }); err != nil {
		return fmt.Errorf("deleting stale masq_skip entries: %w", err)
	}
	return nil
}

// Teardown undoes masquerade on the node once it has no endpoint left:
// programs off the uplinks, settings out of the maps. Idempotent.
func Teardown(n *node.Node) error {
	errs := []error{uplink.Release(n)}
	if n.CheckBPFFS() != nil {
		return errors.Join(errs...)
	}
	for _, name := range []string{maps.CniMapMasqNets, maps.CniMapMasqSkip} {
		m, err := n.PinnedMap(name)
		if err == nil && m != nil {
			err = maps.Clear(m)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ForgetNetworks finds the settings of networks without a live endpoint
// and, unless dryRun, removes them; one line each.
func ForgetNetworks(n *node.Node, live func(netID uint32) bool, dryRun bool) ([]string, error) {
	sw := &feature.Sweep{DryRun: dryRun}
	err1 := forget[maps.CniMasqNetKey, maps.CniMasqNet](n, maps.CniMapMasqNets, sw, func(k maps.CniMasqNetKey) (uint32, string) {
		return k.NetId, fmt.Sprintf("IPv%d", k.Family)
	}, live)
	err2 := forget[maps.CniMasqSkipKey, uint32](n, maps.CniMapMasqSkip, sw, func(k maps.CniMasqSkipKey) (uint32, string) {
		ip := maps.IP(k.Family, k.Addr)
		return k.NetId, (&net.IPNet{IP: ip, Mask: net.CIDRMask(int(k.Prefixlen)-40, 8*len(ip))}).String()
	}, live)
	found, err := sw.Result()
	return found, errors.Join(err1, err2, err)
}

// forget notes on sw, for removal, the entries of the pinned map name
// whose network (of) is not live.
func forget[K, V any](n *node.Node, name string, sw *feature.Sweep, of func(K) (uint32, string), live func(uint32) bool) error {
	m, err := n.PinnedMap(name)
	if err != nil || m == nil {
		return err
	}
	var k K
	var v V
	var dead []K
	it := m.Iterate()
	for it.Next(&k, &v) {
		if id, _ := of(k); !live(id) {
			dead = append(dead, k)
		}
	}
	for _, k := range dead {
		id, what := of(k)
		sw.Remove(fmt.Sprintf("%s[network %#x, %s] (no pod of the network left)", name, id, what), func() error {
			if err := m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("deleting from %s: %w", name, err)
			}
			return nil
		})
	}
	return it.Err()
}
