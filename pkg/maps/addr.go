package maps

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The one converter between addresses and the maps' form of them: an
// enum addr_family and 16 bytes, IPv4 in the first 4 (endpoint_key,
// ipam_key, nat_key, hostport entries, masq_net, masq_skip_key...).

// Family is the enum addr_family of an address: 4 or 6.
func Family(ip net.IP) uint8 {
	if ip.To4() != nil {
		return uint8(CniAddrFamilyADDR_FAMILY_V4)
	}
	return uint8(CniAddrFamilyADDR_FAMILY_V6)
}

// Addr16 is an address as the maps hold it: IPv4 in the first 4 bytes.
func Addr16(ip net.IP) (a [16]uint8) {
	if v4 := ip.To4(); v4 != nil {
		copy(a[:], v4)
	} else {
		copy(a[:], ip.To16())
	}
	return a
}

// IP is the address of a family and 16 bytes as the maps hold them (a
// copy: 4 bytes for IPv4, 16 for IPv6).
func IP(family uint8, a [16]uint8) net.IP {
	if family == uint8(CniAddrFamilyADDR_FAMILY_V4) {
		return net.IP(bytes.Clone(a[:4]))
	}
	return net.IP(bytes.Clone(a[:]))
}

// EndpointKey is the key of an address in endpoints and node_addrs.
func EndpointKey(ip net.IP) CniEndpointKey {
	return CniEndpointKey{Family: Family(ip), Addr: Addr16(ip)}
}

// EndpointIPs are the addresses of an endpoint_devs entry.
func EndpointIPs(d *CniEndpointDev) []net.IP {
	var out []net.IP
	for i := 0; i < int(d.N_ip4) && i < len(d.Ip4); i++ {
		var a [16]uint8
		// ip4 holds network byte order in memory, as a __u32 read natively.
		binary.NativeEndian.PutUint32(a[:4], d.Ip4[i])
		out = append(out, IP(uint8(CniAddrFamilyADDR_FAMILY_V4), a))
	}
	for i := 0; i < int(d.N_ip6) && i < len(d.Ip6); i++ {
		out = append(out, IP(uint8(CniAddrFamilyADDR_FAMILY_V6), d.Ip6[i]))
	}
	return out
}

// Port is a port the maps hold in network byte order, as bpf2go reads it
// on a little-endian host.
func Port(p uint16) uint16 { return p>>8 | p<<8 }

// Monotonic is bpf_ktime_get_ns's clock: the programs' timestamps.
func Monotonic() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// Clear deletes every entry of a hash or LPM map (one that a program may
// be changing meanwhile: an entry already gone is no error).
func Clear(m *ebpf.Map) error {
	var keys [][]byte
	k := make([]byte, m.KeySize())
	v := make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, bytes.Clone(k))
	}
	if err := it.Err(); err != nil {
		return err
	}
	var errs []error
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// DeleteWhere deletes the entries of m whose key dead picks (an entry
// already gone is no error). K and V are the map's key and value types.
func DeleteWhere[K comparable, V any](m *ebpf.Map, dead func(K) bool) error {
	_, err := DeleteMatching(m, func(k *K, _ *V) bool { return dead(*k) })
	return err
}

// EndpointOf is the endpoint_devs entry of the pod that has address ip
// (endpoints, then endpoint_devs at its host veth's index): who is behind
// a pod address, for the messages and views of every part that maps to
// pods. False when no endpoint has it.
func EndpointOf(endpoints, devs *ebpf.Map, ip net.IP) (CniEndpointDev, bool) {
	var info CniEndpointInfo
	var d CniEndpointDev
	k := EndpointKey(ip)
	if endpoints == nil || devs == nil || endpoints.Lookup(&k, &info) != nil || devs.Lookup(info.Ifindex, &d) != nil {
		return d, false
	}
	return d, true
}

// OwnerOf names the pod behind a pod address ("container <id> <ifname>"),
// for messages; "an unknown pod" when no endpoint has it.
func OwnerOf(endpoints, devs *ebpf.Map, ip net.IP) string {
	d, ok := EndpointOf(endpoints, devs, ip)
	if !ok {
		return "an unknown pod"
	}
	return fmt.Sprintf("container %s %s", GoString(d.ContainerId[:]), GoString(d.Ifname[:]))
}
