package maps

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/cilium/ebpf"
)

// NetID is a network's key in the BPF maps: FNV-1a of its name. The
// network registry (ipam_nets) catches a clash between two names.
func NetID(network string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(network))
	return h.Sum32()
}

// Fit is s as a C string field of size bytes holds it: s itself, or when
// s does not fit, "sha256:" and its digest, so a long container ID or
// network name still identifies its owner exactly.
func Fit(s string, size int) string {
	if len(s) < size {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// NetworkClash is a network whose NetID another network already holds.
type NetworkClash struct {
	Network, Other string // Other as the registry holds it (Fit)
	ID             uint32
}

func (e *NetworkClash) Error() string {
	return fmt.Sprintf("network name %q has the same network ID (%#x) as network %q; rename one of them", e.Network, e.ID, e.Other)
}

// RegisterNetwork claims the NetID of network in the registry m
// (ipam_nets), so that two names with one hash are refused instead of
// merged: the one writer of that map, for ebpf-ipam and masquerade alike.
// A registered name is kept; *NetworkClash when another holds the ID.
func RegisterNetwork(m *ebpf.Map, network string) (uint32, error) {
	id := NetID(network)
	name := Fit(network, CniNetNameLen)
	var v CniIpamNet
	err := m.Lookup(id, &v)
	if err == nil {
		if other := GoString(v.Name[:]); other != name {
			return id, &NetworkClash{Network: network, Other: other, ID: id}
		}
		return id, nil
	}
	if !errors.Is(err, ebpf.ErrKeyNotExist) {
		return id, fmt.Errorf("reading %s: %w", CniMapIpamNets, err)
	}
	CString(v.Name[:], name)
	switch err := m.Update(id, &v, ebpf.UpdateNoExist); {
	case errors.Is(err, ebpf.ErrKeyExist):
		// Another call registered the ID meanwhile: this name, or a clash.
		return RegisterNetwork(m, network)
	case err != nil:
		return id, fmt.Errorf("registering network %s: %w", network, err)
	}
	return id, nil
}

// NetworkName is the name the registry m (ipam_nets) holds for the
// network of NetID id, as registered (Fit); "" when none is.
func NetworkName(m *ebpf.Map, id uint32) string {
	var v CniIpamNet
	if m == nil || m.Lookup(id, &v) != nil {
		return ""
	}
	return GoString(v.Name[:])
}
