// Package conflist writes the network configuration list ebpf-cni is
// installed with: `ebpf-cni conflist` (what `make install` writes on one
// node) and the node agent's install step (a Kubernetes node's, from its
// Node object) both go through Build, so every conflist the project writes
// carries the same choices:
//
//   - cniVersion 1.0.0 by default: containerd 1.6 and 1.7 and podman 4's CNI
//     backend take no 1.1.0 result, and every pod fails there ("unsupported
//     CNI result version") while the runtime still reports the network ready;
//     and cniVersions (spec 1.1) naming 1.1.0 too: a runtime with libcni
//     v1.2 or newer takes the highest version it knows from that list, so
//     containerd 2.x calls STATUS (it does only for 1.1.0 lists), while an
//     older libcni ignores the key and reads cniVersion;
//   - `"ips": true` among ebpf-cni's capabilities next to portMappings and
//     bandwidth: on `podman run --ip` and `podman network reload`, podman
//     replaces the first plugin's capabilities with {"ips": true} unless
//     they already hold it, and the published ports silently disappear;
//   - ebpf-ipam with one range set per family of the node's pod ranges.
//   - on a cluster, the plugin's cluster keys: clusterCIDRs (the cluster's
//     pod ranges keep the pods' addresses; nonMasqueradeCIDRs stays at its
//     default, the node's own ranges), and in mode vxlan "overlay": "vxlan"
//     with vxlanPort and vxlanVNI when they are not the defaults.
//   - deviceType only when one is asked for: left out, the plugin's
//     default (auto) applies.
//
// It imports nothing heavier than encoding/json: the plugin binary's CLI
// uses it, and plugin exec time matters.
package conflist

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/pkg/config"
)

// Defaults of what Build writes and where.
const (
	DefaultName    = "ebpf-cni"
	DefaultVersion = "1.0.0"
	// NewestVersion is the newest spec version the plugins speak: every
	// list names it in cniVersions.
	NewestVersion = "1.1.0"
	// DefaultFile sorts before the runtimes' own defaults (containerd's
	// 10-containerd-net, podman's 87-podman) only where those are absent:
	// a runtime takes the first file in lexical order, see docs/deploy.md.
	DefaultFile = "10-ebpf-cni.conflist"
)

// Versions are the cniVersion values Build accepts: configuration lists
// exist since 0.3.0, and results before 0.3.1 carry one address per family.
var Versions = []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// DeviceTypes are the plugin's deviceType values (pkg/plugin, checkDeviceType).
var DeviceTypes = []string{"auto", "netkit", "veth"}

// CheckDeviceType checks a deviceType; empty is unset. Whether the node's
// kernel can make a netkit pair is the plugin's to say, at ADD.
func CheckDeviceType(t string) error {
	if t != "" && !contains(DeviceTypes, t) {
		return &OptionError{Key: "deviceType", Msg: fmt.Sprintf("unknown device type %q (want auto, netkit or veth)", t)}
	}
	return nil
}

// Mode is how pods reach the pods of other nodes.
type Mode string

const (
	// ModeDirect: routes to each other node's pod ranges via its address;
	// the nodes share an L2 segment.
	ModeDirect Mode = "direct"
	// ModeVXLAN: a VXLAN overlay between nodes that do not share one.
	ModeVXLAN Mode = "vxlan"
)

// ParseMode reads a mode; empty is direct.
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "", ModeDirect:
		return ModeDirect, nil
	case ModeVXLAN:
		return ModeVXLAN, nil
	}
	return "", fmt.Errorf("%q is not a mode: want direct or vxlan", s)
}

// Options is what a conflist is made from.
type Options struct {
	Name       string // network name; DefaultName when empty
	CNIVersion string // DefaultVersion when empty
	// PodCIDRs are this node's pod ranges, at most one per family.
	PodCIDRs []netip.Prefix
	// ClusterCIDRs are the pod ranges of every node of the cluster
	// (the plugin's clusterCIDRs): traffic to them keeps the pod's
	// address, and the vxlan overlay carries them.
	ClusterCIDRs []netip.Prefix
	// ServiceCIDRs are the cluster's Service ranges, only checked against
	// the pod ranges: kube-proxy translates them, and the plugin needs no
	// list of them (it asks conntrack which flows were translated).
	ServiceCIDRs []netip.Prefix
	Masquerade   bool
	Mode         Mode // direct when empty
	// VXLANPort and VXLANVNI are the overlay's (mode vxlan); 0: the
	// plugin's defaults, 4789 and 1.
	VXLANPort int
	VXLANVNI  int
	MTU       int // 0: the plugin's default (the uplink's MTU, less the overlay's overhead)
	// DeviceType is the plugin's deviceType (one of DeviceTypes); empty:
	// not written, and the plugin's default, auto, applies.
	DeviceType string
	// BPFRoot and StateDir are written only when set (the plugin's
	// defaults otherwise).
	BPFRoot  string
	StateDir string
}

// OptionError names the option that is wrong: the configuration error
// of every key (a key the plugin's configuration has too is checked by the
// same rule, pkg/config).
type OptionError = config.Error

// ParseCIDRs reads a comma-separated list of ranges (e.g. "10.244.1.0/24,
// fd00:10:244:1::/64"); key names the setting in errors. Each must be a
// network address: "10.244.1.7/24" is a typo more often than an intent.
func ParseCIDRs(key, s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, &OptionError{Key: key, Msg: fmt.Sprintf("%q is not a CIDR (e.g. 10.244.1.0/24)", f)}
		}
		if p.Masked() != p {
			return nil, &OptionError{Key: key, Msg: fmt.Sprintf("%q is not a network address (did you mean %s?)", f, p.Masked())}
		}
		out = append(out, p)
	}
	return out, nil
}

func family(p netip.Prefix) int {
	if p.Addr().Is4() {
		return 4
	}
	return 6
}

// Validate checks every option; the error names the first bad one.
func (o *Options) Validate() error {
	if o.Name != "" && strings.ContainsAny(o.Name, "/\\ ") {
		return &OptionError{Key: "name", Msg: fmt.Sprintf("%q is not a network name", o.Name)}
	}
	if o.CNIVersion != "" && !contains(Versions, o.CNIVersion) {
		return &OptionError{Key: "cniVersion", Msg: fmt.Sprintf("%q: want one of %s", o.CNIVersion, strings.Join(Versions, ", "))}
	}
	if len(o.PodCIDRs) == 0 {
		return &OptionError{Key: "podCIDRs", Msg: "no pod range given: the node's pod range (e.g. 10.244.1.0/24, or 10.244.1.0/24,fd00:10:244:1::/64 for dual stack) is required"}
	}
	seen := map[int]netip.Prefix{}
	for _, p := range o.PodCIDRs {
		if q, dup := seen[family(p)]; dup {
			return &OptionError{Key: "podCIDRs", Msg: fmt.Sprintf("%s and %s are both IPv%d: give at most one range per family", q, p, family(p))}
		}
		seen[family(p)] = p
		if max := map[int]int{4: 30, 6: 126}[family(p)]; p.Bits() > max {
			return &OptionError{Key: "podCIDRs", Msg: fmt.Sprintf("%s holds too few addresses for pods (at most /%d)", p, max)}
		}
	}
	for _, s := range o.ServiceCIDRs {
		for _, p := range append(append([]netip.Prefix{}, o.PodCIDRs...), o.ClusterCIDRs...) {
			if p.Overlaps(s) {
				return &OptionError{Key: "serviceCIDRs", Msg: fmt.Sprintf("%s overlaps the pod range %s", s, p)}
			}
		}
	}
	if _, err := ParseMode(string(o.Mode)); err != nil {
		return &OptionError{Key: "mode", Msg: err.Error()}
	}
	for _, c := range o.ClusterCIDRs {
		if err := config.ClusterCIDR("clusterCIDRs", c.String(), c.Bits()); err != nil {
			return err
		}
	}
	if o.Mode == ModeVXLAN && len(o.ClusterCIDRs) == 0 {
		return &OptionError{Key: "clusterCIDRs", Msg: "mode vxlan needs the cluster's pod ranges: the overlay carries them"}
	}
	if o.Mode != ModeVXLAN && (o.VXLANPort != 0 || o.VXLANVNI != 0) {
		key := "vxlanPort"
		if o.VXLANPort == 0 {
			key = "vxlanVNI"
		}
		return &OptionError{Key: key, Msg: "set without mode vxlan"}
	}
	if err := config.VXLANPort(o.VXLANPort); err != nil {
		return err
	}
	if err := config.VXLANVNI(o.VXLANVNI); err != nil {
		return err
	}
	if o.MTU != 0 && (o.MTU < 68 || o.MTU > 65535) {
		return &OptionError{Key: "mtu", Msg: fmt.Sprintf("%d is outside 68..65535", o.MTU)}
	}
	if err := CheckDeviceType(o.DeviceType); err != nil {
		return err
	}
	for _, d := range []struct{ key, dir string }{{"bpfRoot", o.BPFRoot}, {"stateDir", o.StateDir}} {
		if d.dir != "" && !filepath.IsAbs(d.dir) {
			return &OptionError{Key: d.key, Msg: fmt.Sprintf("%q is not an absolute path", d.dir)}
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// The shapes Build writes: structs, so the keys come out in a fixed order.
type confList struct {
	CNIVersion  string       `json:"cniVersion"`
	CNIVersions []string     `json:"cniVersions"`
	Name        string       `json:"name"`
	Plugins     []pluginConf `json:"plugins"`
}

type pluginConf struct {
	Type       string `json:"type"`
	MTU        int    `json:"mtu,omitempty"`
	DeviceType string `json:"deviceType,omitempty"` // left out when empty: the plugin's default, auto
	BPFRoot    string `json:"bpfRoot,omitempty"`
	StateDir   string `json:"stateDir,omitempty"`
	IPMasq     bool   `json:"ipMasq"`
	// The cluster keys: no nonMasqueradeCIDRs, whose default (the node's
	// own ranges) the plugin keeps next to clusterCIDRs.
	ClusterCIDRs []string        `json:"clusterCIDRs,omitempty"`
	Overlay      string          `json:"overlay,omitempty"`
	VXLANPort    int             `json:"vxlanPort,omitempty"`
	VXLANVNI     int             `json:"vxlanVNI,omitempty"`
	Capabilities map[string]bool `json:"capabilities"`
	IPAM         ipamConf        `json:"ipam"`
}

type ipamConf struct {
	Type   string         `json:"type"`
	Ranges [][]rangeEntry `json:"ranges"`
}

type rangeEntry struct {
	Subnet string `json:"subnet"`
}

// Capabilities are the ones ebpf-cni declares (see the package comment for
// why "ips" is among them); ebpf-cni honours runtimeConfig.mac (`podman run
// --mac-address`), so "mac" is declared too.
var Capabilities = []string{"bandwidth", "ips", "mac", "portMappings"}

// Build returns the conflist for o, indented, with a trailing newline.
func Build(o Options) ([]byte, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Name == "" {
		o.Name = DefaultName
	}
	if o.CNIVersion == "" {
		o.CNIVersion = DefaultVersion
	}
	caps := map[string]bool{}
	for _, c := range Capabilities {
		caps[c] = true
	}
	p := pluginConf{
		Type:         "ebpf-cni",
		MTU:          o.MTU,
		DeviceType:   o.DeviceType,
		BPFRoot:      o.BPFRoot,
		StateDir:     o.StateDir,
		IPMasq:       o.Masquerade,
		Capabilities: caps,
		IPAM:         ipamConf{Type: "ebpf-ipam"},
	}
	for _, c := range o.PodCIDRs {
		p.IPAM.Ranges = append(p.IPAM.Ranges, []rangeEntry{{Subnet: c.String()}})
	}
	for _, c := range o.ClusterCIDRs {
		p.ClusterCIDRs = append(p.ClusterCIDRs, c.String())
	}
	if o.Mode == ModeVXLAN {
		p.Overlay, p.VXLANPort, p.VXLANVNI = string(ModeVXLAN), o.VXLANPort, o.VXLANVNI
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(confList{CNIVersion: o.CNIVersion, CNIVersions: CNIVersions(o.CNIVersion), Name: o.Name, Plugins: []pluginConf{p}}); err != nil {
		return nil, fmt.Errorf("encoding the conflist: %w", err)
	}
	return buf.Bytes(), nil
}

// KeepChained is the conflist built (Build's output) with the plugins
// another installer chained after ebpf-cni's in old, the conflist it
// replaces (istio-cni appends itself to the node's primary conflist):
// they stay, after ebpf-cni's, as they were. A conflist whose first plugin
// is not ebpf-cni's, or that does not parse, gives nothing to keep.
func KeepChained(built, old []byte) ([]byte, error) {
	var prev struct {
		Plugins []json.RawMessage `json:"plugins"`
	}
	if json.Unmarshal(old, &prev) != nil || len(prev.Plugins) < 2 {
		return built, nil
	}
	var first struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(prev.Plugins[0], &first) != nil || first.Type != "ebpf-cni" {
		return built, nil
	}
	list := struct {
		confList
		Plugins []json.RawMessage `json:"plugins"`
	}{}
	if err := json.Unmarshal(built, &list); err != nil {
		return nil, fmt.Errorf("reading the conflist built: %w", err)
	}
	list.Plugins = append(list.Plugins, prev.Plugins[1:]...)
	b, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding the conflist: %w", err)
	}
	return append(b, '\n'), nil
}

// CNIVersions is the cniVersions list of a conflist whose cniVersion is v:
// v, and NewestVersion when v is older. A runtime whose libcni knows
// cniVersions (v1.2 and newer) uses the highest entry it supports, one
// whose libcni does not (v1.1 and older) reads cniVersion alone.
func CNIVersions(v string) []string {
	if v == NewestVersion {
		return []string{v}
	}
	return []string{v, NewestVersion}
}

// ErrExists is returned by Write when the file is there and force is off.
var ErrExists = errors.New("exists")

// Write puts data at dir/file unless the file exists and force is off (then
// an error wrapping ErrExists). It writes a temporary file and renames it:
// runtimes watch the directory and must never read half a conflist (the
// temporary name ends in .tmp, an extension libcni does not load).
func Write(dir, file string, data []byte, force bool) (string, error) {
	path := filepath.Join(dir, file)
	if !force {
		if _, err := os.Lstat(path); err == nil {
			return path, fmt.Errorf("%s %w (not overwritten without force)", path, ErrExists)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return path, fmt.Errorf("creating %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, "."+file+".*.tmp")
	if err != nil {
		return path, fmt.Errorf("writing in %s: %w", dir, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return path, fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return path, fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return path, fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return path, fmt.Errorf("replacing %s: %w", path, err)
	}
	return path, nil
}
