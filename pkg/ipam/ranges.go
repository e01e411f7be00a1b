package ipam

import (
	"bytes"
	"fmt"
	"math/big"
	"net"
	"sort"
	"strings"
)

// Range is one canonical address range inside a subnet.
type Range struct {
	Subnet  net.IPNet
	Start   net.IP // first address handed out
	End     net.IP // last address handed out
	Gateway net.IP // never handed out
}

// RangeSet is a list of ranges of one family; an attachment gets one address
// per range set.
type RangeSet []Range

// Family is 4 or 6.
func (s RangeSet) Family() int { return family(s[0].Subnet.IP) }

// Contains reports whether ip is inside one of the set's ranges.
func (s RangeSet) Contains(ip net.IP) bool { return s.rangeOf(ip) >= 0 }

func (s RangeSet) rangeOf(ip net.IP) int {
	for i := range s {
		if s[i].Contains(ip) {
			return i
		}
	}
	return -1
}

// Contains reports whether ip lies between Start and End.
func (r *Range) Contains(ip net.IP) bool {
	ip = canonicalIP(ip)
	if len(ip) != len(r.Start) {
		return false
	}
	return bytes.Compare(ip, r.Start) >= 0 && bytes.Compare(ip, r.End) <= 0
}

// Size is the number of addresses the range can hand out (the gateway
// excluded), capped at maxUint64 for huge IPv6 ranges.
func (r *Range) Size() uint64 {
	n := new(big.Int).Sub(new(big.Int).SetBytes(r.End), new(big.Int).SetBytes(r.Start))
	n.Add(n, big.NewInt(1))
	if r.Contains(r.Gateway) {
		n.Sub(n, big.NewInt(1))
	}
	if !n.IsUint64() {
		return ^uint64(0)
	}
	return n.Uint64()
}

func (r *Range) String() string {
	return fmt.Sprintf("%s-%s", r.Start, r.End)
}

func parseRangeSets(raw []rawRangeSet, key string, node []NodeNet) ([]RangeSet, error) {
	var sets []RangeSet
	for i, rs := range raw {
		setKey := fmt.Sprintf("%s[%d]", key, i)
		if key == "ipam" { // the single-range shorthand names its own keys
			setKey = "ipam"
		}
		if len(rs) == 0 {
			return nil, invalidConfig(setKey, "empty range set")
		}
		var set RangeSet
		for j, rr := range rs {
			rKey := fmt.Sprintf("%s[%d]", setKey, j)
			if setKey == "ipam" {
				rKey = "ipam"
			}
			r, err := rr.parse(rKey)
			if err != nil {
				return nil, err
			}
			if err := checkSubnet(rKey+".subnet", &r.Subnet, r.Gateway, node); err != nil {
				return nil, err
			}
			if len(set) > 0 && family(r.Subnet.IP) != set.Family() {
				return nil, invalidConfig(rKey+".subnet", fmt.Sprintf("%s mixes address families within one range set", &r.Subnet))
			}
			set = append(set, *r)
		}
		sets = append(sets, set)
	}
	if err := checkOverlaps(sets, key); err != nil {
		return nil, err
	}
	return sets, nil
}

// checkOverlaps refuses an address in two ranges, in one set or across
// sets. Sorted by first address, a range can only overlap one that starts
// before it and ends at or after its start: O(n log n), so a configuration
// of 65,536 ranges is checked in milliseconds (comparing every pair took a
// minute). The later range of a pair, in configuration order, is named.
func checkOverlaps(sets []RangeSet, key string) error {
	type at struct{ set, idx int }
	var all []at
	for i := range sets {
		for j := range sets[i] {
			all = append(all, at{i, j})
		}
	}
	r := func(a at) *Range { return &sets[a.set][a.idx] }
	sort.Slice(all, func(x, y int) bool {
		a, b := r(all[x]), r(all[y])
		if len(a.Start) != len(b.Start) {
			return len(a.Start) < len(b.Start)
		}
		return bytes.Compare(a.Start, b.Start) < 0
	})
	var reach at // among the ranges so far of this family, the one ending last
	for n, cur := range all {
		if n > 0 && len(r(reach).Start) == len(r(cur).Start) && bytes.Compare(r(cur).Start, r(reach).End) <= 0 {
			first, later := reach, cur
			if later.set < first.set || (later.set == first.set && later.idx < first.idx) {
				first, later = later, first
			}
			return invalidConfig(fmt.Sprintf("%s[%d][%d]", key, later.set, later.idx),
				fmt.Sprintf("range %s overlaps range %s of %s[%d][%d]", r(later), r(first), key, first.set, first.idx))
		}
		if n == 0 || len(r(reach).Start) != len(r(cur).Start) || bytes.Compare(r(cur).End, r(reach).End) > 0 {
			reach = cur
		}
	}
	return nil
}

func (rr rawRange) parse(key string) (*Range, error) {
	if rr.Subnet == "" {
		return nil, invalidConfig(key+".subnet", "missing")
	}
	ip, subnet, err := net.ParseCIDR(rr.Subnet)
	if err != nil {
		return nil, invalidConfig(key+".subnet", fmt.Sprintf("%q is not a CIDR", rr.Subnet))
	}
	if ip.To4() != nil && strings.Contains(rr.Subnet, ":") {
		return nil, invalidConfig(key+".subnet", fmt.Sprintf("%q is an IPv4-mapped IPv6 subnet: write the IPv4 subnet", rr.Subnet))
	}
	subnet.IP = canonicalIP(subnet.IP)
	ones, bits := subnet.Mask.Size()
	if !ip.Equal(subnet.IP) {
		return nil, invalidConfig(key+".subnet", fmt.Sprintf("%q has host bits set; the network address is %s/%d", rr.Subnet, subnet.IP, ones))
	}
	if ones > bits-2 {
		return nil, invalidConfig(key+".subnet", fmt.Sprintf("%q is too small to allocate from (at most /%d)", rr.Subnet, bits-2))
	}
	r := &Range{Subnet: *subnet}

	parseIn := func(field, s string) (net.IP, error) {
		a := net.ParseIP(s)
		if a == nil {
			return nil, invalidConfig(key+"."+field, fmt.Sprintf("%q is not an IP address", s))
		}
		a = canonicalIP(a)
		if !subnet.Contains(a) {
			return nil, invalidConfig(key+"."+field, fmt.Sprintf("%s is outside subnet %s", a, subnet))
		}
		return a, nil
	}

	first := nextIP(subnet.IP) // never the network address
	last := lastIP(subnet)     // never the IPv4 broadcast address
	if rr.Gateway != "" {
		if r.Gateway, err = parseIn("gateway", rr.Gateway); err != nil {
			return nil, err
		}
	} else {
		r.Gateway = first
	}
	r.Start, r.End = first, last
	if rr.RangeStart != "" {
		if r.Start, err = parseIn("rangeStart", rr.RangeStart); err != nil {
			return nil, err
		}
		if bytes.Compare(r.Start, first) < 0 {
			return nil, invalidConfig(key+".rangeStart", fmt.Sprintf("%s is the network address of %s", r.Start, subnet))
		}
	}
	if rr.RangeEnd != "" {
		if r.End, err = parseIn("rangeEnd", rr.RangeEnd); err != nil {
			return nil, err
		}
		if bytes.Compare(r.End, last) > 0 {
			return nil, invalidConfig(key+".rangeEnd", fmt.Sprintf("%s is the broadcast address of %s", r.End, subnet))
		}
	}
	if bytes.Compare(r.Start, r.End) > 0 {
		return nil, invalidConfig(key+".rangeEnd", fmt.Sprintf("%s comes before rangeStart %s", r.End, r.Start))
	}
	return r, nil
}

// canonicalIP returns 4 bytes for IPv4, 16 for IPv6.
func canonicalIP(ip net.IP) net.IP {
	if v4 := ip.To4(); v4 != nil {
		return v4
	}
	return ip.To16()
}

func family(ip net.IP) int {
	if ip.To4() != nil {
		return 4
	}
	return 6
}

func nextIP(ip net.IP) net.IP {
	out := append(net.IP(nil), ip...)
	for i := len(out) - 1; i >= 0; i-- {
		out[i]++
		if out[i] != 0 {
			break
		}
	}
	return out
}

// lastIP is the broadcast address minus one for IPv4, the last address for
// IPv6 (which has no broadcast), as host-local does.
func lastIP(subnet *net.IPNet) net.IP {
	out := make(net.IP, len(subnet.IP))
	for i := range out {
		out[i] = subnet.IP[i] | ^subnet.Mask[i]
	}
	if len(out) == net.IPv4len {
		out[3]--
	}
	return out
}
