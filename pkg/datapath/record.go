package datapath

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// Record is what one attachment made, kept under stateDir so DEL and GC can
// undo it even when the pod's netns (and with it the veth) is gone.
type Record struct {
	ContainerID string       `json:"containerID"`
	IfName      string       `json:"ifname"`
	Network     string       `json:"network"`
	NetNS       string       `json:"netns,omitempty"`
	HostIfName  string       `json:"hostIfname"`
	HostIfIndex int          `json:"hostIfindex"`
	HostMAC     string       `json:"hostMAC"`
	MAC         string       `json:"mac"`
	IPs         []string     `json:"ips"` // CIDR
	Attachments []Attachment `json:"attachments"`
}

func recordDir(stateDir string) string { return filepath.Join(stateDir, "endpoints") }

func recordPath(stateDir, hostIfName string) string {
	return filepath.Join(recordDir(stateDir), hostIfName+".json")
}

// Addrs parses the record's addresses.
func (r *Record) Addrs() []net.IP {
	var out []net.IP
	for _, s := range r.IPs {
		if ip, _, err := net.ParseCIDR(s); err == nil {
			out = append(out, ip)
		}
	}
	return out
}

// WriteRecord stores r atomically (write, then rename).
func WriteRecord(stateDir string, r *Record) error {
	if err := os.MkdirAll(recordDir(stateDir), 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", recordDir(stateDir), err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding record of %s: %w", r.HostIfName, err)
	}
	path := recordPath(stateDir, r.HostIfName)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("renaming %s: %w", tmp, err)
	}
	return nil
}

// ReadRecord loads the record of a host veth; ErrNotFound if there is none.
func ReadRecord(stateDir, hostIfName string) (*Record, error) {
	b, err := os.ReadFile(recordPath(stateDir, hostIfName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("record of %s: %w", hostIfName, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("reading record of %s: %w", hostIfName, err)
	}
	r := &Record{}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("decoding record of %s: %w", hostIfName, err)
	}
	return r, nil
}

// RemoveRecord deletes a record; a missing one is fine.
func RemoveRecord(stateDir, hostIfName string) error {
	err := os.Remove(recordPath(stateDir, hostIfName))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing record of %s: %w", hostIfName, err)
	}
	return nil
}

// Records lists every endpoint record of the node.
func Records(stateDir string) ([]*Record, error) {
	ents, err := os.ReadDir(recordDir(stateDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", recordDir(stateDir), err)
	}
	var out []*Record
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		r, err := ReadRecord(stateDir, name)
		if err != nil {
			if errors.Is(err, ErrNotFound) {
				continue // removed meanwhile
			}
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}
