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
	HostPorts   []HostPort   `json:"hostPorts,omitempty"`
}

// HostPort is one published port of an endpoint, for one address family.
type HostPort struct {
	Proto         string `json:"protocol"`         // tcp, udp or sctp
	HostIP        string `json:"hostIP,omitempty"` // empty: every node address of PodIP's family
	HostPort      uint16 `json:"hostPort"`
	PodIP         string `json:"podIP"`
	ContainerPort uint16 `json:"containerPort"`
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
	return writeJSON(recordPath(stateDir, r.HostIfName), r)
}

// writeJSON stores v at path atomically (write, then rename).
func writeJSON(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(path), err)
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding %s: %w", path, err)
	}
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

// readJSON loads path into v; ErrNotFound if there is no such file.
func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s: %w", path, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decoding %s: %w", path, err)
	}
	return nil
}

// ReadRecord loads the record of a host veth; ErrNotFound if there is none.
func ReadRecord(stateDir, hostIfName string) (*Record, error) {
	r := &Record{}
	if err := readJSON(recordPath(stateDir, hostIfName), r); err != nil {
		return nil, err
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

// UplinkRecord is what masquerade attached to one uplink of the node (and
// the overlay to its device: TunnelRecords).
type UplinkRecord struct {
	Name        string       `json:"name"`
	IfIndex     int          `json:"ifindex"`
	Attachments []Attachment `json:"attachments"`
}

func uplinkRecordPath(stateDir, name string) string {
	return filepath.Join(stateDir, "uplinks", name+".json")
}

func tunnelRecordPath(stateDir, name string) string {
	return filepath.Join(stateDir, "tunnels", name+".json")
}

// WriteTunnelRecord stores what the overlay attached to its device.
func WriteTunnelRecord(stateDir string, r *UplinkRecord) error {
	return writeJSON(tunnelRecordPath(stateDir, r.Name), r)
}

// RemoveTunnelRecord deletes an overlay device's record; a missing one is fine.
func RemoveTunnelRecord(stateDir, name string) error {
	err := os.Remove(tunnelRecordPath(stateDir, name))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing tunnel record of %s: %w", name, err)
	}
	return nil
}

// TunnelRecords lists the overlay devices that carry programs.
func TunnelRecords(stateDir string) ([]*UplinkRecord, error) {
	return deviceRecords(filepath.Dir(tunnelRecordPath(stateDir, "x")))
}

// WriteUplinkRecord stores r atomically.
func WriteUplinkRecord(stateDir string, r *UplinkRecord) error {
	return writeJSON(uplinkRecordPath(stateDir, r.Name), r)
}

// RemoveUplinkRecord deletes an uplink's record; a missing one is fine.
func RemoveUplinkRecord(stateDir, name string) error {
	err := os.Remove(uplinkRecordPath(stateDir, name))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing uplink record of %s: %w", name, err)
	}
	return nil
}

// UplinkRecords lists the uplinks that carry programs.
func UplinkRecords(stateDir string) ([]*UplinkRecord, error) {
	return deviceRecords(filepath.Dir(uplinkRecordPath(stateDir, "x")))
}

func deviceRecords(dir string) ([]*UplinkRecord, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", dir, err)
	}
	var out []*UplinkRecord
	for _, e := range ents {
		if _, ok := strings.CutSuffix(e.Name(), ".json"); !ok {
			continue
		}
		r := &UplinkRecord{}
		if err := readJSON(filepath.Join(dir, e.Name()), r); err != nil {
			if errors.Is(err, ErrNotFound) {
				continue
			}
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// HasEndpoints reports whether any endpoint record exists (names only: no
// record is read).
func HasEndpoints(stateDir string) (bool, error) {
	ents, err := os.ReadDir(recordDir(stateDir))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("listing %s: %w", recordDir(stateDir), err)
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".json") {
			return true, nil
		}
	}
	return false, nil
}
