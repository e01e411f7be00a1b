package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// ErrNotFound is the sentinel for state that is not there.
var ErrNotFound = errors.New("not found")

// Record is what one attachment made, kept under stateDir so DEL and GC can
// undo it even when the pod's netns (and with it the veth) is gone.
type Record struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
	Network     string `json:"network"`
	// NetID is the network's key in the maps (maps.NetID), for a record
	// rebuilt from the kernel that knows the network by it alone (Network
	// is then empty until a call of that network names it).
	NetID uint32 `json:"netID,omitempty"`
	// Rebuilt: the record was rebuilt from the kernel after its file was
	// lost; features that keep state only in records fill in what the maps
	// still tell (feature.Repair.Rebuilt).
	Rebuilt     bool     `json:"rebuilt,omitempty"`
	NetNS       string   `json:"netns,omitempty"`
	HostIfName  string   `json:"hostIfname"`
	HostIfIndex int      `json:"hostIfindex"`
	HostMAC     string   `json:"hostMAC"`
	MAC         string   `json:"mac"`
	IPs         []string `json:"ips"` // CIDR
	// OwnTable: the pod's interface got a routing table and source rules
	// of its own (a second interface, veth.ConfigurePod): DEL removes the
	// rules in the pod.
	OwnTable bool `json:"ownTable,omitempty"`
	// Pod is the pod's Kubernetes identity from CNI_ARGS (nil when the
	// runtime passed none), so its endpoint_pods entry can be written
	// again after the maps were lost.
	Pod *Pod `json:"pod,omitempty"`
	// Flags are the endpoint's flags in the maps (enum endpoint_flags), so
	// its entries can be written again after the maps were lost.
	Flags uint32 `json:"flags,omitempty"`
	// Attachments are the programs on the host veth: an upgrade re-points
	// them, DEL detaches them.
	Attachments []attach.Attachment `json:"attachments"`
	// Features holds each feature's own state of the endpoint, by feature
	// name; only the feature reads its entry.
	Features map[string]json.RawMessage `json:"features,omitempty"`
	// Legacy holds the top-level fields of a record written by an older
	// build that this one does not know: feature state from before
	// Features existed (e.g. "hostPorts"), which the feature that wrote it
	// reads there. Kept when the record is written again.
	Legacy map[string]json.RawMessage `json:"-"`
}

// Pod is who a pod is in Kubernetes, as the runtime says in CNI_ARGS
// (K8S_POD_NAMESPACE, K8S_POD_NAME, K8S_POD_UID: containerd, CRI-O and
// kubelet's dockershim pass them; podman passes K8S_POD_NAME alone).
type Pod struct {
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	UID       string `json:"uid,omitempty"`
}

// String is namespace/name, or the name alone.
func (p Pod) String() string {
	if p.Namespace == "" {
		return p.Name
	}
	return p.Namespace + "/" + p.Name
}

// PodFromArgs reads the pod's identity from CNI_ARGS ("K1=V1;K2=V2"); nil
// without K8S_POD_NAME. Only for people and metrics: never an error.
func PodFromArgs(envArgs string) *Pod {
	var p Pod
	for _, kv := range strings.Split(envArgs, ";") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "K8S_POD_NAMESPACE":
			p.Namespace = v
		case "K8S_POD_NAME":
			p.Name = v
		case "K8S_POD_UID":
			p.UID = v
		}
	}
	if p.Name == "" {
		return nil
	}
	return &p
}

// recordKeys are the JSON names of Record's own fields.
var recordKeys = func() map[string]bool {
	out := map[string]bool{}
	t := reflect.TypeOf(Record{})
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out[name] = true
		}
	}
	return out
}()

// UnmarshalJSON decodes a record and keeps the fields it does not know in
// Legacy.
func (r *Record) UnmarshalJSON(b []byte) error {
	type plain Record
	if err := json.Unmarshal(b, (*plain)(r)); err != nil {
		return err
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(b, &all); err != nil {
		return err
	}
	for k, v := range all {
		if !recordKeys[k] {
			if r.Legacy == nil {
				r.Legacy = map[string]json.RawMessage{}
			}
			r.Legacy[k] = v
		}
	}
	return nil
}

// MarshalJSON encodes a record with its Legacy fields.
func (r *Record) MarshalJSON() ([]byte, error) {
	type plain Record
	b, err := json.Marshal((*plain)(r))
	if err != nil || len(r.Legacy) == 0 {
		return b, err
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(b, &all); err != nil {
		return nil, err
	}
	for k, v := range r.Legacy {
		if !recordKeys[k] {
			all[k] = v
		}
	}
	return json.Marshal(all)
}

// SetFeature stores feature's state of the endpoint (nil removes it).
func (r *Record) SetFeature(feature string, v any) error {
	if v == nil {
		delete(r.Features, feature)
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding the %s state: %w", feature, err)
	}
	if r.Features == nil {
		r.Features = map[string]json.RawMessage{}
	}
	r.Features[feature] = b
	return nil
}

// Feature decodes feature's state of the endpoint into v; false when the
// record has none.
func (r *Record) Feature(feature string, v any) (bool, error) {
	b, ok := r.Features[feature]
	if !ok {
		return false, nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return true, fmt.Errorf("decoding the %s state of %s: %w", feature, r.HostIfName, err)
	}
	return true, nil
}

// InNetwork reports whether the record's attachment belongs to the network
// name (by its name, or by its key for a rebuilt record).
func (r *Record) InNetwork(name string) bool {
	if r.Network != "" {
		return r.Network == name
	}
	return r.NetID != 0 && r.NetID == maps.NetID(name)
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

// Nets are the record's addresses with their prefixes (the pod's subnets).
func (r *Record) Nets() []*net.IPNet {
	var out []*net.IPNet
	for _, s := range r.IPs {
		if ip, n, err := net.ParseCIDR(s); err == nil {
			n.IP = ip.Mask(n.Mask)
			out = append(out, n)
		}
	}
	return out
}

func recordDir(stateDir string) string { return filepath.Join(stateDir, "endpoints") }

// LinkDir is where the pinned links of an endpoint's host veth live.
func LinkDir(bpfRoot, hostIfName string) string {
	return filepath.Join(bpfRoot, "links", hostIfName)
}

func recordPath(stateDir, hostIfName string) string {
	return filepath.Join(recordDir(stateDir), hostIfName+".json")
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

// readDir reads every *.json of dir into a new T; a file removed meanwhile
// is skipped, a missing dir is empty.
func readDir[T any](dir string) ([]*T, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", dir, err)
	}
	var out []*T
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		v := new(T)
		if err := readJSON(filepath.Join(dir, e.Name()), v); err != nil {
			if errors.Is(err, ErrNotFound) {
				continue // removed meanwhile
			}
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// ReadRecord loads the record of a host veth; ErrNotFound if there is none.
func ReadRecord(stateDir, hostIfName string) (*Record, error) {
	r := &Record{}
	if err := readJSON(recordPath(stateDir, hostIfName), r); err != nil {
		return nil, err
	}
	return r, nil
}

// RemoveRecord deletes a record, and its marks; a missing one is fine.
func RemoveRecord(stateDir, hostIfName string) error {
	err := os.Remove(recordPath(stateDir, hostIfName))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing record of %s: %w", hostIfName, err)
	}
	for _, m := range []Mark{MarkPending, MarkLossy} {
		_ = Unmark(stateDir, m, hostIfName)
	}
	return nil
}

// Mark is a fact about a record rebuilt from the kernel, kept beside it as
// an empty file, so a STATUS finds the records that need it without
// reading every record.
type Mark string

const (
	// MarkPending: rebuilt without its network's configuration (the
	// operator's repair); the next call of its network completes it.
	MarkPending Mark = "pending"
	// MarkLossy: rebuilt with neither its file nor the maps: what only
	// they held (published ports, bandwidth limits) is lost.
	MarkLossy Mark = "lossy"
)

func markPath(stateDir string, m Mark, hostIfName string) string {
	return filepath.Join(stateDir, "marks", string(m), hostIfName)
}

// SetMark marks the record of hostIfName.
func SetMark(stateDir string, m Mark, hostIfName string) error {
	p := markPath(stateDir, m, hostIfName)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(p), err)
	}
	return os.WriteFile(p, nil, 0o600)
}

// Unmark removes a mark; a missing one is fine.
func Unmark(stateDir string, m Mark, hostIfName string) error {
	if err := os.Remove(markPath(stateDir, m, hostIfName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Marked lists the host veths whose records carry m.
func Marked(stateDir string, m Mark) []string {
	ents, err := os.ReadDir(filepath.Dir(markPath(stateDir, m, "x")))
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// HealStamp is the file under the stateDir whose time says when a call
// last healed the node (pkg/plugin; the agent's metrics report it).
const HealStamp = "healed"

// Records lists every endpoint record of the node.
func Records(stateDir string) ([]*Record, error) { return readDir[Record](recordDir(stateDir)) }

// RecordNames lists the host veths that have a record (names only: no
// record is read).
func RecordNames(stateDir string) ([]string, error) {
	ents, err := os.ReadDir(recordDir(stateDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", recordDir(stateDir), err)
	}
	var out []string
	for _, e := range ents {
		if name, ok := strings.CutSuffix(e.Name(), ".json"); ok {
			out = append(out, name)
		}
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
