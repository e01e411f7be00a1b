package ipam

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Held is what one attachment holds in one network, as its record says.
type Held struct {
	Network string
	*Attachment
}

// ListHeld reads every attachment record of every network under stateDir,
// without locks (it only reads: a call in flight shows as the half it is).
// It is what the operator CLI compares with the node's endpoints to find
// addresses held for containers that are gone.
func ListHeld(stateDir string) ([]Held, error) {
	nets, err := networkDirs(stateDir)
	if err != nil {
		return nil, err
	}
	var out []Held
	for _, n := range nets {
		dir := filepath.Join(stateDir, "ipam", n, "owners")
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue // forgotten meanwhile, or never had one
		}
		for _, e := range ents {
			if strings.HasSuffix(e.Name(), ".tmp") {
				continue
			}
			a, err := readAttachment(filepath.Join(dir, e.Name()))
			if err != nil || a == nil {
				continue // removed or half-written meanwhile
			}
			out = append(out, Held{Network: n, Attachment: a})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Network != out[j].Network {
			return out[i].Network < out[j].Network
		}
		return out[i].ContainerID+"\x00"+out[i].IfName < out[j].ContainerID+"\x00"+out[j].IfName
	})
	return out, nil
}

// ReleaseHeld releases, with the network's lock held, what the attachment
// holds in the network (only addresses the map still gives it), and
// forgets the network if that was its last. It returns what it released.
func ReleaseHeld(bpfRoot, stateDir, network, containerID, ifname string) ([]net.IP, error) {
	if !ValidNetworkName(network) {
		return nil, fmt.Errorf("invalid network name %q", network)
	}
	s, err := OpenExisting(&Config{Network: network, BPFRoot: bpfRoot, StateDir: stateDir})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	att, err := s.Attachment(containerID, ifname)
	if err != nil || att == nil {
		return nil, err
	}
	var released []net.IP
	if len(att.IPs) == 0 {
		// An ADD killed half-way (Allocate writes the record first): what
		// it reserved is only in the map.
		entries, err := s.Entries()
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if owns(&e.Owner, containerID, ifname) {
				released = append(released, e.IP)
			}
		}
	}
	for _, al := range att.IPs {
		if o, err := s.Owner(al.Address); err == nil && owns(o, containerID, ifname) {
			released = append(released, al.Address)
		}
	}
	if err := ReleaseAttachment(s, containerID, ifname); err != nil {
		return nil, err
	}
	_, err = s.Forget()
	return released, err
}

// CountHeld is how many attachments hold addresses in network under
// stateDir (names only: no record is read), for a cheap first look.
func CountHeld(stateDir, network string) int {
	if !ValidNetworkName(network) {
		return 0
	}
	ents, err := os.ReadDir(filepath.Join(stateDir, "ipam", network, "owners"))
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".tmp") {
			n++
		}
	}
	return n
}

// networkDirs names the networks ebpf-ipam keeps a directory of under
// stateDir (none when it kept nothing yet).
func networkDirs(stateDir string) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(stateDir, "ipam"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && ValidNetworkName(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}
