package plugin

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	"github.com/ebpf-cni/ebpf-cni/pkg/kernel"
	"github.com/ebpf-cni/ebpf-cni/pkg/rtnl"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

const (
	// DefaultIPAM is the IPAM plugin of a configuration that names none.
	DefaultIPAM = "ebpf-ipam"
	fallbackMTU = 1500
)

// NetConf is the network configuration ebpf-cni reads for its core steps;
// each feature reads its own keys (feature.Feature.Parse).
type NetConf struct {
	types.NetConf
	MTU        int    `json:"mtu,omitempty"`
	BPFRoot    string `json:"bpfRoot,omitempty"`
	StateDir   string `json:"stateDir,omitempty"`
	AttachMode string `json:"attachMode,omitempty"`
	// DeviceType is the pods' pair: auto (the default: netkit where the
	// kernel has it, else veth), netkit or veth.
	DeviceType string `json:"deviceType,omitempty"`

	RuntimeConfig struct {
		MAC string `json:"mac,omitempty"`
	} `json:"runtimeConfig,omitempty"`
	Args *struct {
		CNI *struct {
			MAC string `json:"mac,omitempty"`
		} `json:"cni,omitempty"`
	} `json:"args,omitempty"`

	ValidAttachments []types.GCAttachment `json:"cni.dev/valid-attachments,omitempty"`
}

// Config is a validated configuration for one call.
type Config struct {
	*NetConf
	Mode     attach.Mode
	MAC      net.HardwareAddr
	IPAMType string
	// IPAMConf is the configuration handed to the IPAM plugin: stdin, with
	// ebpf-ipam's bpfRoot and stateDir defaulted to ebpf-cni's.
	IPAMConf []byte
	// Pods are the registered features configured for the call (ADD,
	// CHECK), in the order of features.All.
	Pods []feature.Pod
	// IPAM is the call's IPAM step; nil (what ParseConfig leaves) is the
	// default: ebpf-ipam in this process, or the plugin ipam.type names.
	IPAM IPAM
}

// ParseConfig validates stdin and the CNI_ARGS of a call; every error names
// the key that is wrong. full is false for DEL, GC and STATUS, which must
// work with the least configuration (a later config change must not strand
// state): they read no feature's keys.
func ParseConfig(stdin []byte, envArgs string, full bool) (*Config, error) {
	n := &NetConf{}
	if err := json.Unmarshal(stdin, n); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "decoding network configuration", err.Error())
	}
	c := &Config{NetConf: n}
	if n.BPFRoot == "" {
		n.BPFRoot = config.DefaultBPFRoot
	}
	if n.StateDir == "" {
		n.StateDir = config.DefaultStateDir
	}
	if !filepath.IsAbs(n.BPFRoot) {
		return nil, invalidConfig("bpfRoot", fmt.Sprintf("%q is not an absolute path", n.BPFRoot))
	}
	if !filepath.IsAbs(n.StateDir) {
		return nil, invalidConfig("stateDir", fmt.Sprintf("%q is not an absolute path", n.StateDir))
	}
	var err error
	if c.IPAMConf, c.IPAMType, err = ipamConf(stdin, n); err != nil {
		return nil, err
	}
	if !full {
		return c, nil
	}
	if n.Name == "" {
		return nil, invalidConfig("name", "missing network name")
	}
	if _, err := version.GreaterThanOrEqualTo(n.CNIVersion, "0.1.0"); err != nil {
		return nil, types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("invalid cniVersion %q", n.CNIVersion), err.Error())
	}
	if c.Mode, err = attach.ParseMode(n.AttachMode); err != nil {
		return nil, invalidConfig("attachMode", err.Error())
	}
	if n.MTU != 0 && (n.MTU < 68 || n.MTU > 65535) {
		return nil, invalidConfig("mtu", fmt.Sprintf("%d is outside 68..65535", n.MTU))
	}
	if c.MAC, err = requestedMAC(n, envArgs); err != nil {
		return nil, err
	}
	if err := checkDeviceType(n.DeviceType, c.MAC); err != nil {
		return nil, err
	}
	for _, f := range features.All {
		p, err := f.Parse(stdin)
		if err != nil {
			return nil, feature.Fail(types.ErrInvalidNetworkConfig, "invalid "+f.Name()+" configuration", err)
		}
		c.Pods = append(c.Pods, p)
	}
	return c, nil
}

// Device types of the deviceType key.
const (
	DeviceAuto   = "auto"
	DeviceNetkit = string(veth.KindNetkit)
	DeviceVeth   = string(veth.KindVeth)
)

// checkDeviceType refuses a deviceType this plugin or this kernel cannot
// make: an unknown one, netkit on a kernel without it, netkit for a pod
// that asks for a MAC (a netkit pod in L3 mode has none).
func checkDeviceType(t string, mac net.HardwareAddr) error {
	switch t {
	case "", DeviceAuto, DeviceVeth:
		return nil
	case DeviceNetkit:
	default:
		return invalidConfig("deviceType", fmt.Sprintf("unknown device type %q (want auto, netkit or veth)", t))
	}
	if f := kernel.HaveNetkit(); !f.Available {
		return invalidConfig("deviceType", fmt.Sprintf("netkit: kernel %s cannot make a netkit pair (%s): use deviceType auto or veth", kernel.Release(), f.Detail))
	}
	if mac != nil {
		return invalidConfig("deviceType", fmt.Sprintf("netkit: the pod asks for MAC %s, and a netkit pod (L3 mode) has none: use deviceType auto or veth for it", mac))
	}
	return nil
}

// ipamConf checks the ipam section and prepares the delegate's stdin.
func ipamConf(stdin []byte, n *NetConf) ([]byte, string, error) {
	var raw map[string]any
	if err := json.Unmarshal(stdin, &raw); err != nil {
		return nil, "", types.NewError(types.ErrDecodingFailure, "decoding network configuration", err.Error())
	}
	sec, ok := raw["ipam"].(map[string]any)
	if !ok {
		return nil, "", invalidConfig("ipam", "missing ipam section (e.g. {\"type\": \"ebpf-ipam\", \"subnet\": \"10.244.0.0/24\"})")
	}
	typ, _ := sec["type"].(string)
	if typ == "" {
		typ = DefaultIPAM
		sec["type"] = typ
	}
	if strings.ContainsAny(typ, "/\\") {
		return nil, "", invalidConfig("ipam.type", fmt.Sprintf("%q is not a plugin name", typ))
	}
	if typ == DefaultIPAM {
		if _, ok := sec["bpfRoot"]; !ok {
			sec["bpfRoot"] = n.BPFRoot
		}
		if _, ok := sec["stateDir"]; !ok {
			sec["stateDir"] = n.StateDir
		}
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return nil, "", fmt.Errorf("encoding ipam configuration: %w", err)
	}
	return b, typ, nil
}

// requestedMAC is the container MAC from runtimeConfig.mac (the `mac`
// capability), args.cni.mac or CNI_ARGS MAC=, in that order of precedence.
func requestedMAC(n *NetConf, envArgs string) (net.HardwareAddr, error) {
	key, s := "", ""
	for _, kv := range strings.Split(envArgs, ";") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == "MAC" {
			key, s = "CNI_ARGS MAC", v
		}
	}
	if n.Args != nil && n.Args.CNI != nil && n.Args.CNI.MAC != "" {
		key, s = "args.cni.mac", n.Args.CNI.MAC
	}
	if n.RuntimeConfig.MAC != "" {
		key, s = "runtimeConfig.mac", n.RuntimeConfig.MAC
	}
	if s == "" {
		return nil, nil
	}
	mac, err := net.ParseMAC(s)
	if err != nil || len(mac) != 6 {
		return nil, bad(key, fmt.Sprintf("%q is not an Ethernet MAC address", s))
	}
	if mac[0]&1 == 1 {
		return nil, bad(key, fmt.Sprintf("%s is a multicast address", s))
	}
	if mac.String() == "00:00:00:00:00:00" {
		return nil, bad(key, "the all-zero address is not usable")
	}
	return mac, nil
}

func bad(key, msg string) error {
	if key == "CNI_ARGS MAC" {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("invalid %s: %s", key, msg), "")
	}
	return invalidConfig(key, msg)
}

// defaultMTU is the MTU of the device of the node's default route (the
// uplink), or 1500 when there is none.
func defaultMTU() int {
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		routes, err := rtnl.DefaultRoutes(fam)
		if err != nil {
			continue
		}
		for _, r := range routes {
			for _, i := range r.Links {
				if l, err := rtnl.H().LinkByIndex(i); err == nil && l.Attrs().MTU > 0 {
					return l.Attrs().MTU
				}
			}
		}
	}
	return fallbackMTU
}
