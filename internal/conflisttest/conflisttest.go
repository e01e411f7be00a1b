// Package conflisttest writes the ebpf-cni network configuration lists the
// integration tests, the benchmark and the demo run with: the one place
// that spells the conflist, so a key added or renamed changes here only.
package conflisttest

import (
	"encoding/json"
	"maps"
	"os"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

// Defaults of Options.
const (
	DefaultName    = "ebpfnet"
	DefaultVersion = "1.1.0"
)

// DefaultSubnets are the range sets of the default ebpf-ipam section: one
// IPv4 and one IPv6 (dual-stack pods).
var DefaultSubnets = []string{"10.244.1.0/24", "fd00:244:1::/64"}

// Options shape one network of ebpf-cni.
type Options struct {
	Name    string // network name; DefaultName when empty
	Version string // cniVersion; DefaultVersion when empty
	// BPFRoot and StateDir are the plugin's (and ebpf-ipam's) state: a
	// private bpffs and directory of the test.
	BPFRoot, StateDir string
	// AttachMode is the attachMode key; empty leaves it out (auto).
	AttachMode string
	// Subnets are ebpf-ipam's range sets, one subnet each; DefaultSubnets
	// when empty. IPAM, when set, is the whole ipam section instead.
	Subnets []string
	IPAM    map[string]any
	// Capabilities the runtime may fill in (mac, portMappings, bandwidth).
	Capabilities []string
	// Keys are more keys of the ebpf-cni plugin (ipMasq, cgroupPath,
	// mtu...); they win over everything above.
	Keys map[string]any
	// Chained are the plugins after ebpf-cni in the list.
	Chained []map[string]any
}

// Plugin is the ebpf-cni entry of the list.
func Plugin(o Options) map[string]any {
	p := map[string]any{"type": "ebpf-cni", "bpfRoot": o.BPFRoot, "stateDir": o.StateDir, "ipam": o.IPAM}
	if o.IPAM == nil {
		subnets := o.Subnets
		if len(subnets) == 0 {
			subnets = DefaultSubnets
		}
		sets := []any{}
		for _, s := range subnets {
			sets = append(sets, []any{map[string]any{"subnet": s}})
		}
		p["ipam"] = map[string]any{"type": "ebpf-ipam", "ranges": sets}
	}
	if o.AttachMode != "" {
		p["attachMode"] = o.AttachMode
	}
	if len(o.Capabilities) > 0 {
		caps := map[string]any{}
		for _, c := range o.Capabilities {
			caps[c] = true
		}
		p["capabilities"] = caps
	}
	// The tests' device type on a kernel that can make both: netkit pods
	// by default (auto), veth pods with EBPF_CNI_TEST_DEVICE_TYPE=veth.
	if d := os.Getenv("EBPF_CNI_TEST_DEVICE_TYPE"); d != "" {
		p["deviceType"] = d
	}
	maps.Copy(p, o.Keys)
	return p
}

// Bytes is the configuration list as JSON.
func Bytes(o Options) ([]byte, error) {
	if o.Name == "" {
		o.Name = DefaultName
	}
	if o.Version == "" {
		o.Version = DefaultVersion
	}
	plugins := []any{Plugin(o)}
	for _, c := range o.Chained {
		plugins = append(plugins, c)
	}
	return json.Marshal(map[string]any{"cniVersion": o.Version, "name": o.Name, "plugins": plugins})
}

// List is the configuration list as libcni reads it; it fails the test on
// an error.
func List(t testing.TB, o Options) *libcni.NetworkConfigList {
	t.Helper()
	b, err := Bytes(o)
	if err != nil {
		t.Fatal(err)
	}
	list, err := libcni.ConfListFromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	return list
}
