package ipam

import (
	"errors"
	"fmt"
	"net"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// Allocate gives (containerID, ifname) one address per range set. A repeated
// ADD returns what the attachment already holds. If any range set fails,
// every address this call took is released again.
func Allocate(s *Store, c *Config, containerID, ifname string) ([]*current.IPConfig, error) {
	return AllocateIn(s, c, containerID, ifname, "")
}

// AllocateIn is Allocate recording the attachment's network namespace
// (CNI_NETNS), so that a leak is told from a live attachment later.
func AllocateIn(s *Store, c *Config, containerID, ifname, netns string) (_ []*current.IPConfig, err error) {
	prev, err := s.Attachment(containerID, ifname)
	if err != nil {
		return nil, types.NewError(types.ErrIOFailure, "reading attachment record", err.Error())
	}
	var taken []net.IP
	defer func() {
		if err != nil {
			for _, ip := range taken {
				_ = s.Release(ip)
			}
			if prev == nil {
				_ = s.RemoveAttachment(containerID, ifname)
			}
		}
	}()

	att := &Attachment{ContainerID: containerID, IfName: ifname, NetNS: netns}
	if prev == nil {
		// The record first, empty: a call killed between reserving in the
		// map and writing the record leaves one that says so, and DEL
		// then finds the reservations in the map (ReleaseAttachment).
		if err := s.SaveAttachment(att); err != nil {
			return nil, types.NewError(types.ErrIOFailure, "writing attachment record", err.Error())
		}
	}
	var out []*current.IPConfig
	for i, set := range c.RangeSets {
		ip, fresh, err := allocateInSet(s, c, i, set, prev, containerID, ifname)
		if err != nil {
			return nil, err
		}
		if fresh {
			taken = append(taken, ip)
		}
		att.IPs = append(att.IPs, Allocation{Address: ip, RangeSet: i})
		r := set[set.rangeOf(ip)]
		out = append(out, &current.IPConfig{
			Address: net.IPNet{IP: ip, Mask: r.Subnet.Mask},
			Gateway: r.Gateway,
		})
	}
	// Addresses a previous ADD gave from ranges no longer configured go back.
	if prev != nil {
		for _, al := range prev.IPs {
			if !att.holds(al.Address) {
				if err := s.Release(al.Address); err != nil {
					return nil, types.NewError(types.ErrIOFailure, "releasing a stale address", err.Error())
				}
			}
		}
	}
	save := s.SaveAttachment
	if prev == nil {
		save = s.FillAttachment // over the empty record written above
	}
	if err := save(att); err != nil {
		return nil, types.NewError(types.ErrIOFailure, "writing attachment record", err.Error())
	}
	return out, nil
}

// allocateInSet returns the attachment's address in range set i, and whether
// it was newly reserved by this call.
func allocateInSet(s *Store, c *Config, i int, set RangeSet, prev *Attachment, containerID, ifname string) (net.IP, bool, error) {
	requested := c.Requested[i]
	if prev != nil {
		for _, al := range prev.IPs {
			if al.RangeSet != i || !set.Contains(al.Address) {
				continue
			}
			holder, err := s.Owner(al.Address)
			if err != nil {
				return nil, false, types.NewError(types.ErrIOFailure, "reading allocation map", err.Error())
			}
			if !owns(holder, containerID, ifname) {
				break // the record is stale; allocate anew
			}
			if requested != nil && !requested.Equal(al.Address) {
				return nil, false, types.NewError(errcode.AddressInUse, fmt.Sprintf("%s/%s already holds %s in range set %d; it cannot also take the requested %s", containerID, ifname, al.Address, i, requested), "")
			}
			return al.Address, false, nil
		}
	}

	if requested != nil {
		err := s.Reserve(requested, containerID, ifname, i)
		if errors.Is(err, ebpf.ErrKeyExist) {
			holder, _ := s.Owner(requested)
			who := "another attachment"
			if holder != nil {
				who = fmt.Sprintf("%s/%s", maps.GoString(holder.ContainerId[:]), maps.GoString(holder.Ifname[:]))
			}
			return nil, false, types.NewError(errcode.AddressInUse, fmt.Sprintf("requested address %s is already held by %s", requested, who), "")
		}
		if isMapFull(err) {
			return nil, false, mapFullError(maps.CniMapIpamAllocs, s.allocs, "one per address held on this node")
		}
		if err != nil {
			return nil, false, types.NewError(types.ErrIOFailure, fmt.Sprintf("reserving %s", requested), err.Error())
		}
		return requested, true, nil
	}

	ip, err := nextFree(s, i, set, containerID, ifname)
	if err != nil {
		return nil, false, err
	}
	return ip, true, nil
}

// nextFree reserves the first free address after the range set's cursor,
// going round all its ranges once (round-robin, as host-local does).
func nextFree(s *Store, i int, set RangeSet, containerID, ifname string) (net.IP, error) {
	ri, ip := 0, set[0].Start
	if cur := s.Cursor(i); cur != nil {
		if r := set.rangeOf(cur); r >= 0 {
			ri, ip = r, nextIP(cur)
			if !set[r].Contains(ip) {
				ri = (r + 1) % len(set)
				ip = set[ri].Start
			}
		}
	}
	first := ip
	for {
		if !ip.Equal(set[ri].Gateway) {
			err := s.Reserve(ip, containerID, ifname, i)
			if err == nil {
				if err := s.SetCursor(i, ip); err != nil {
					_ = s.Release(ip)
					if isMapFull(err) {
						return nil, mapFullError(maps.CniMapIpamCursors, s.cursors, "one per range set of every network with an address on this node")
					}
					return nil, types.NewError(types.ErrIOFailure, "recording allocation cursor", err.Error())
				}
				return ip, nil
			}
			if isMapFull(err) {
				return nil, mapFullError(maps.CniMapIpamAllocs, s.allocs, "one per address held on this node")
			}
			if !errors.Is(err, ebpf.ErrKeyExist) {
				return nil, types.NewError(types.ErrIOFailure, fmt.Sprintf("reserving %s", ip), err.Error())
			}
		}
		ip = nextIP(ip)
		if !set[ri].Contains(ip) {
			ri = (ri + 1) % len(set)
			ip = set[ri].Start
		}
		if ip.Equal(first) {
			return nil, types.NewError(errcode.RangeFull, fmt.Sprintf("no free address left in range set %d (%s) of network %q", i, describeSet(set), s.Network), "")
		}
	}
}

func describeSet(set RangeSet) string {
	out := ""
	for j := range set {
		if j > 0 {
			out += ", "
		}
		out += set[j].String()
	}
	return out
}

// ReleaseAttachment frees everything (containerID, ifname) holds. Releasing
// twice, or what was never allocated, succeeds.
func ReleaseAttachment(s *Store, containerID, ifname string) error {
	att, err := s.Attachment(containerID, ifname)
	if err != nil {
		return err
	}
	if att != nil && len(att.IPs) == 0 {
		// An ADD killed half-way: what it reserved is only in the map.
		entries, err := s.Entries()
		if err != nil {
			return err
		}
		for _, e := range entries {
			if owns(&e.Owner, containerID, ifname) {
				att.IPs = append(att.IPs, Allocation{Address: e.IP})
			}
		}
	}
	if att != nil {
		for _, al := range att.IPs {
			holder, err := s.Owner(al.Address)
			if err != nil {
				return err
			}
			if owns(holder, containerID, ifname) {
				if err := s.Release(al.Address); err != nil {
					return err
				}
			}
		}
	}
	return s.RemoveAttachment(containerID, ifname)
}

// CheckAttachment verifies that (containerID, ifname) holds an address in
// every range set, that the map agrees, and that every address of prev that
// lies in our ranges is one of them.
func CheckAttachment(s *Store, c *Config, containerID, ifname string, prev *current.Result) error {
	att, err := s.Attachment(containerID, ifname)
	if err != nil {
		return types.NewError(types.ErrIOFailure, "reading attachment record", err.Error())
	}
	if att == nil {
		return types.NewError(errcode.AllocationMismatch, fmt.Sprintf("%s/%s holds no address in network %q", containerID, ifname, c.Network), "")
	}
	for i, set := range c.RangeSets {
		found := false
		for _, al := range att.IPs {
			if al.RangeSet == i && set.Contains(al.Address) {
				found = true
			}
		}
		if !found {
			return types.NewError(errcode.AllocationMismatch, fmt.Sprintf("%s/%s holds no address in range set %d (%s)", containerID, ifname, i, describeSet(set)), "")
		}
	}
	for _, al := range att.IPs {
		holder, err := s.Owner(al.Address)
		if err != nil {
			return types.NewError(types.ErrIOFailure, "reading allocation map", err.Error())
		}
		if !owns(holder, containerID, ifname) {
			return types.NewError(errcode.AllocationMismatch, fmt.Sprintf("%s is recorded for %s/%s but the allocation map does not say so", al.Address, containerID, ifname), "")
		}
	}
	if prev != nil {
		for _, ipc := range prev.IPs {
			inRanges := false
			for _, set := range c.RangeSets {
				inRanges = inRanges || set.Contains(ipc.Address.IP)
			}
			if inRanges && !att.holds(canonicalIP(ipc.Address.IP)) {
				return types.NewError(errcode.AllocationMismatch, fmt.Sprintf("prevResult lists %s but %s/%s does not hold it", ipc.Address.IP, containerID, ifname), "")
			}
		}
	}
	return nil
}

// GarbageCollect releases every allocation of the network whose attachment
// is not in valid, both from the records and from the map.
func GarbageCollect(s *Store, valid []types.GCAttachment) (released int, err error) {
	keep := map[string]bool{}
	for _, v := range valid {
		keep[ownerID(v.ContainerID)+"\x00"+v.IfName] = true
	}
	atts, err := s.Attachments()
	if err != nil {
		return 0, err
	}
	for _, a := range atts {
		if !keep[ownerID(a.ContainerID)+"\x00"+a.IfName] {
			if err := ReleaseAttachment(s, a.ContainerID, a.IfName); err != nil {
				return released, err
			}
			released += len(a.IPs)
		}
	}
	entries, err := s.Entries()
	if err != nil {
		return released, err
	}
	for _, e := range entries {
		if !keep[maps.GoString(e.Owner.ContainerId[:])+"\x00"+maps.GoString(e.Owner.Ifname[:])] {
			if err := s.Release(e.IP); err != nil {
				return released, err
			}
			released++
		}
	}
	return released, nil
}

// Usage counts the addresses held in each range set against its size.
func Usage(s *Store, c *Config) (used, size []uint64, err error) {
	entries, err := s.Entries()
	if err != nil {
		return nil, nil, err
	}
	used, size = usage(entries, c)
	return used, size, nil
}

// usage is Usage of the network's entries read already.
func usage(entries []Entry, c *Config) (used, size []uint64) {
	used, size = make([]uint64, len(c.RangeSets)), make([]uint64, len(c.RangeSets))
	for i, set := range c.RangeSets {
		for j := range set {
			if size[i] += set[j].Size(); size[i] < set[j].Size() {
				size[i] = ^uint64(0) // saturate for huge IPv6 sets
			}
		}
		for _, e := range entries {
			if set.Contains(e.IP) && !e.IP.Equal(set[set.rangeOf(e.IP)].Gateway) {
				used[i]++
			}
		}
	}
	return used, size
}
