package maps

import (
	"bytes"
	"errors"
	"net"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Family is the enum addr_family of an address: 4 or 6.
func Family(ip net.IP) uint8 {
	if ip.To4() != nil {
		return 4
	}
	return 6
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

// IP is the address of a map key or value of family (4 or 6): the inverse
// of Addr16.
func IP(family uint8, a [16]uint8) net.IP {
	if family == 4 {
		return net.IP(bytes.Clone(a[:4]))
	}
	return net.IP(bytes.Clone(a[:]))
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
