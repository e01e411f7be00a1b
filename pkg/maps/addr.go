package maps

import (
	"bytes"
	"errors"
	"net"

	"github.com/cilium/ebpf"
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
