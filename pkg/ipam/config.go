package ipam

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
)

// NetConf is the part of a network configuration ebpf-ipam reads. It
// names its few keys of the CNI's own rather than embed types.NetConf: the
// first decoding of a struct type in a process builds its field list by
// reflection, nested types and all, and a call decodes this type once (in
// ebpf-cni's process too, where the configuration was decoded already as
// the plugin's): 40-50 µs less per call in a fresh process.
type NetConf struct {
	CNIVersion string `json:"cniVersion,omitempty"`
	Name       string `json:"name,omitempty"`
	// RawPrevResult is CHECK's prevResult, decoded then (prevResult).
	RawPrevResult map[string]any `json:"prevResult,omitempty"`
	// ValidAttachments is GC's list of what to keep.
	ValidAttachments []types.GCAttachment `json:"cni.dev/valid-attachments,omitempty"`
	IPAM             *IPAMConf            `json:"ipam"`
	RuntimeConfig    struct {
		IPs      []string      `json:"ips,omitempty"`
		IPRanges []rawRangeSet `json:"ipRanges,omitempty"`
	} `json:"runtimeConfig,omitempty"`
	Args *struct {
		CNI *struct {
			IPs []string `json:"ips,omitempty"`
		} `json:"cni,omitempty"`
	} `json:"args,omitempty"`
}

// IPAMConf is the ipam section, compatible with host-local.
type IPAMConf struct {
	Type       string        `json:"type"`
	Ranges     []rawRangeSet `json:"ranges,omitempty"`
	Routes     []rawRoute    `json:"routes,omitempty"`
	ResolvConf string        `json:"resolvConf,omitempty"`
	BPFRoot    string        `json:"bpfRoot,omitempty"`
	StateDir   string        `json:"stateDir,omitempty"`

	// The single-range shorthand of host-local.
	rawRange
}

type rawRangeSet []rawRange

type rawRange struct {
	Subnet     string `json:"subnet,omitempty"`
	RangeStart string `json:"rangeStart,omitempty"`
	RangeEnd   string `json:"rangeEnd,omitempty"`
	Gateway    string `json:"gateway,omitempty"`
}

type rawRoute struct {
	Dst      string `json:"dst"`
	GW       string `json:"gw,omitempty"`
	MTU      int    `json:"mtu,omitempty"`
	AdvMSS   int    `json:"advmss,omitempty"`
	Priority int    `json:"priority,omitempty"`
	Table    *int   `json:"table,omitempty"`
	Scope    *int   `json:"scope,omitempty"`
}

// Config is a validated, canonical IPAM configuration for one request.
type Config struct {
	Network    string
	CNIVersion string
	BPFRoot    string
	StateDir   string
	RangeSets  []RangeSet
	// RangesKey is the key RangeSets came from: "ipam.ranges",
	// "runtimeConfig.ipRanges", or "ipam" (the subnet shorthand).
	RangesKey string
	Routes    []*types.Route
	DNS       types.DNS
	// Requested maps a requested address to the index of its range set.
	Requested map[int]net.IP
}

// ParseDelConfig reads only what DEL, GC and STATUS need to find state:
// the network name and the state locations. DEL must work even when the
// ranges of a network have since become invalid.
func ParseDelConfig(stdin []byte) (*Config, *NetConf, error) {
	n := &NetConf{}
	if err := json.Unmarshal(stdin, n); err != nil {
		return nil, nil, types.NewError(types.ErrDecodingFailure, "decoding network configuration", err.Error())
	}
	if n.IPAM == nil {
		return nil, nil, invalidConfig("ipam", "missing ipam section")
	}
	if err := checkNetworkName(n.Name); err != nil {
		return nil, nil, err
	}
	c := &Config{Network: n.Name, CNIVersion: n.CNIVersion, BPFRoot: n.IPAM.BPFRoot, StateDir: n.IPAM.StateDir}
	if c.BPFRoot == "" {
		c.BPFRoot = config.DefaultBPFRoot
	}
	if c.StateDir == "" {
		c.StateDir = config.DefaultStateDir
	}
	if !filepath.IsAbs(c.BPFRoot) {
		return nil, nil, invalidConfig("ipam.bpfRoot", fmt.Sprintf("%q is not an absolute path", c.BPFRoot))
	}
	if !filepath.IsAbs(c.StateDir) {
		return nil, nil, invalidConfig("ipam.stateDir", fmt.Sprintf("%q is not an absolute path", c.StateDir))
	}
	return c, n, nil
}

// ParseConfig validates a full configuration plus the CNI_ARGS of the call.
func ParseConfig(stdin []byte, cniArgs string) (*Config, *NetConf, error) {
	c, n, err := ParseDelConfig(stdin)
	if err != nil {
		return nil, nil, err
	}

	raw, key := n.IPAM.Ranges, "ipam.ranges"
	if n.IPAM.Subnet != "" {
		if len(raw) > 0 {
			return nil, nil, invalidConfig("ipam.subnet", "give either ipam.subnet or ipam.ranges, not both")
		}
		raw, key = []rawRangeSet{{n.IPAM.rawRange}}, "ipam"
	}
	if len(n.RuntimeConfig.IPRanges) > 0 {
		raw, key = n.RuntimeConfig.IPRanges, "runtimeConfig.ipRanges"
	}
	if len(raw) == 0 {
		return nil, nil, invalidConfig("ipam.ranges", "no address ranges configured (set ipam.ranges or ipam.subnet)")
	}
	node, err := nodeNets()
	if err != nil {
		return nil, nil, types.NewError(types.ErrIOFailure, "reading the node's addresses", err.Error())
	}
	c.RangesKey = key
	if c.RangeSets, err = parseRangeSets(raw, key, node); err != nil {
		return nil, nil, err
	}
	if err := checkFamiliesForVersion(c.RangeSets, n.CNIVersion); err != nil {
		return nil, nil, err
	}

	for i, r := range n.IPAM.Routes {
		route, err := r.parse(fmt.Sprintf("ipam.routes[%d]", i))
		if err != nil {
			return nil, nil, err
		}
		c.Routes = append(c.Routes, route)
	}
	if n.IPAM.ResolvConf != "" {
		b, err := readResolvConf(n.IPAM.ResolvConf)
		if ce, ok := config.AsCNI(err); ok {
			return nil, nil, ce
		}
		var dns *types.DNS
		if err == nil {
			dns, err = parseResolvConf(b)
		}
		if err != nil {
			return nil, nil, types.NewError(types.ErrIOFailure, fmt.Sprintf("reading ipam.resolvConf %q", n.IPAM.ResolvConf), err.Error())
		}
		c.DNS = *dns
	}

	if c.Requested, err = requestedIPs(n, cniArgs, c.RangeSets, node); err != nil {
		return nil, nil, err
	}
	return c, n, nil
}

// checkFamiliesForVersion enforces that results before 0.3.0 carry one
// address per family (ip4 and ip6).
func checkFamiliesForVersion(sets []RangeSet, cniVersion string) error {
	ok, err := version.GreaterThanOrEqualTo(cniVersion, "0.3.0")
	if err != nil || ok {
		return nil
	}
	seen := map[int]bool{}
	for _, s := range sets {
		if seen[s.Family()] {
			return invalidConfig("ipam.ranges", fmt.Sprintf("cniVersion %s carries one address per family; configure at most one IPv%d range set", cniVersion, s.Family()))
		}
		seen[s.Family()] = true
	}
	return nil
}

func (r rawRoute) parse(key string) (*types.Route, error) {
	_, dst, err := net.ParseCIDR(r.Dst)
	if err != nil {
		return nil, invalidConfig(key+".dst", fmt.Sprintf("%q is not a CIDR", r.Dst))
	}
	route := &types.Route{Dst: *dst, MTU: r.MTU, AdvMSS: r.AdvMSS, Priority: r.Priority, Table: r.Table, Scope: r.Scope}
	if r.GW != "" {
		if route.GW = net.ParseIP(r.GW); route.GW == nil {
			return nil, invalidConfig(key+".gw", fmt.Sprintf("%q is not an IP address", r.GW))
		}
	}
	return route, nil
}

// requestedIPs gathers the addresses asked for through CNI_ARGS IP=,
// args.cni.ips and runtimeConfig.ips, and maps each to its range set.
// args.cni.ips, when given, replaces CNI_ARGS IP (CONVENTIONS.md: a plugin
// that understands the args key must ignore the equivalent CNI_ARGS field).
func requestedIPs(n *NetConf, cniArgs string, sets []RangeSet, node []NodeNet) (map[int]net.IP, error) {
	type source struct {
		key  string
		code uint
		ips  []string
	}
	env, err := parseEnvArgs(cniArgs)
	if err != nil {
		return nil, err
	}
	var sources []source
	if n.Args != nil && n.Args.CNI != nil && len(n.Args.CNI.IPs) > 0 {
		sources = append(sources, source{"args.cni.ips", types.ErrInvalidNetworkConfig, n.Args.CNI.IPs})
	} else if env.IP != "" {
		sources = append(sources, source{"CNI_ARGS IP", types.ErrInvalidEnvironmentVariables, strings.Split(env.IP, ",")})
	}
	sources = append(sources, source{"runtimeConfig.ips", types.ErrInvalidNetworkConfig, n.RuntimeConfig.IPs})

	out := map[int]net.IP{}
	for _, src := range sources {
		for _, s := range src.ips {
			s = strings.TrimSpace(s)
			if i := strings.IndexByte(s, '/'); i >= 0 {
				s = s[:i] // a prefix length is accepted and ignored, as host-local does
			}
			ip := net.ParseIP(s)
			if ip == nil {
				return nil, types.NewError(src.code, fmt.Sprintf("invalid address %q in %s", s, src.key), "")
			}
			// net.ParseIP reads ::ffff:a.b.c.d as the IPv4 address: handed
			// out as such, the pod would not get what was asked for. Refused
			// as a v4-mapped range is (parseRangeSets).
			if ip.To4() != nil && strings.Contains(s, ":") {
				return nil, invalidConfig(src.key, fmt.Sprintf("requested address %s is an IPv4-mapped IPv6 address: write the IPv4 address %s", s, ip.To4()))
			}
			if why := forbiddenRequest(ip, sets, node); why != "" {
				return nil, invalidConfig(src.key, fmt.Sprintf("requested address %s: %s; no pod may have it", ip, why))
			}
			idx := -1
			for i := range sets {
				if sets[i].Contains(ip) {
					idx = i
					break
				}
			}
			if idx < 0 {
				return nil, types.NewError(errcode.AddressNotInRange, fmt.Sprintf("requested address %s (%s) is outside every configured range", ip, src.key), "")
			}
			if prev, dup := out[idx]; dup && !prev.Equal(ip) {
				return nil, types.NewError(src.code, fmt.Sprintf("requested addresses %s and %s (%s) fall in the same range set; one address per range set", prev, ip, src.key), "")
			}
			out[idx] = canonicalIP(ip)
		}
	}
	return out, nil
}

func invalidConfig(key, msg string) error { return config.Invalid(key, "%s", msg).CNI() }

// MaxNetworkName is the longest network name, in bytes: the name is the
// name of the network's state directory, and a file name holds 255 bytes.
const MaxNetworkName = 255

// ValidNetworkName reports whether name can name a network's state: not
// empty, at most MaxNetworkName bytes, and one path element.
func ValidNetworkName(name string) bool { return checkNetworkName(name) == nil }

func checkNetworkName(name string) error {
	switch {
	case name == "":
		return invalidConfig("name", "missing network name")
	case len(name) > MaxNetworkName:
		return invalidConfig("name", fmt.Sprintf("network name of %d bytes; at most %d", len(name), MaxNetworkName))
	case name == "." || name == ".." || strings.ContainsAny(name, "/\x00"):
		return invalidConfig("name", fmt.Sprintf("network name %q is not a file name (no \"/\", NUL, \".\" or \"..\")", name))
	}
	return nil
}

// forbiddenRequest says why a requested address may not be handed out:
// reserved, the node's, or the network address, broadcast address or
// gateway of a range whose subnet holds it.
func forbiddenRequest(ip net.IP, sets []RangeSet, node []NodeNet) string {
	if why := forbidden(ip, nil, nil, node); why != "" {
		return why
	}
	for _, set := range sets {
		for j := range set {
			r := &set[j]
			if r.Subnet.Contains(ip) {
				if why := forbidden(ip, &r.Subnet, r.Gateway, nil); why != "" {
					return why
				}
			}
		}
	}
	return ""
}
