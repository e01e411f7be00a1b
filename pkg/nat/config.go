// Package nat is the masquerade feature of ebpf-cni: its configuration,
// the maps the uplink programs read (masq_nets, masq_skip, nat_timeouts),
// the flows in the conntrack/NAT table, and its CLI view. The uplinks and
// their programs are pkg/uplink's.
package nat

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/conntrack"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/uplink"
)

// Config is the masquerade part of an ebpf-cni network configuration.
type Config struct {
	IPMasq             bool              `json:"ipMasq,omitempty"`
	NonMasqueradeCIDRs []string          `json:"nonMasqueradeCIDRs,omitempty"`
	MasqueradeIP       string            `json:"masqueradeIP,omitempty"`
	Uplinks            []string          `json:"uplinks,omitempty"`
	PortRange          string            `json:"masqueradePortRange,omitempty"`
	Timeouts           map[string]string `json:"natTimeouts,omitempty"`
}

// Settings is a validated Config.
type Settings struct {
	Enabled bool
	// Skip are the nonMasqueradeCIDRs; nil means the network's own ranges.
	Skip []*net.IPNet
	// Cluster are the cluster's pod ranges (clusterCIDRs): never
	// masqueraded, whatever Skip says.
	Cluster      []*net.IPNet
	MasqueradeIP net.IP
	Uplinks      []string
	// PortMin..PortMax is the range a clashing source port moves to; zero
	// means the default, above the node's ephemeral ports.
	PortMin, PortMax uint16
	Timeouts         maps.CniNatLifetimes
}

// maxTimeout bounds a lifetime: a week is longer than any idle flow a NAT
// should remember, and it keeps the seconds far from overflowing.
const maxTimeout = 7 * 24 * time.Hour

// Validate checks every key; the error names the first bad one.
func (c *Config) Validate() (*Settings, error) {
	s := &Settings{Enabled: c.IPMasq, Uplinks: c.Uplinks, Timeouts: conntrack.DefaultTimeouts}
	if c.NonMasqueradeCIDRs != nil {
		s.Skip = []*net.IPNet{}
	}
	for i, cidr := range c.NonMasqueradeCIDRs {
		_, n, err := net.ParseCIDR(cidr)
		if err != nil {
			return nil, config.Invalid(fmt.Sprintf("nonMasqueradeCIDRs[%d]", i), "%q is not a CIDR", cidr)
		}
		s.Skip = append(s.Skip, n)
	}
	if c.MasqueradeIP != "" {
		ip := net.ParseIP(c.MasqueradeIP)
		if ip == nil || ip.IsUnspecified() || ip.IsMulticast() || ip.IsLoopback() {
			return nil, config.Invalid("masqueradeIP", "%q is not a unicast address", c.MasqueradeIP)
		}
		s.MasqueradeIP = ip
	}
	if err := (&uplink.Config{Uplinks: c.Uplinks}).Validate(); err != nil {
		return nil, err
	}
	if c.PortRange != "" {
		lo, hi, err := parseRange(c.PortRange)
		if err != nil || lo < 1024 {
			return nil, config.Invalid("masqueradePortRange", "%q is not a range like 61000-65535 within 1024-65535", c.PortRange)
		}
		s.PortMin, s.PortMax = lo, hi
	}
	fields := map[string]*uint32{
		"tcpSyn": &s.Timeouts.TcpSyn, "tcpEstablished": &s.Timeouts.TcpEstablished,
		"tcpClosing": &s.Timeouts.TcpClosing, "udp": &s.Timeouts.Udp, "icmp": &s.Timeouts.Icmp,
	}
	for k, v := range c.Timeouts {
		f, ok := fields[k]
		if !ok {
			return nil, config.Invalid("natTimeouts."+k, "unknown key (want tcpSyn, tcpEstablished, tcpClosing, udp or icmp)")
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second || d > maxTimeout {
			return nil, config.Invalid("natTimeouts."+k, "%q is not a duration between 1s and %s", v, maxTimeout)
		}
		*f = uint32(d / time.Second)
	}
	return s, nil
}

func parseRange(s string) (uint16, uint16, error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, fmt.Errorf("no dash")
	}
	lo, err := strconv.ParseUint(strings.TrimSpace(a), 10, 16)
	if err != nil {
		return 0, 0, err
	}
	hi, err := strconv.ParseUint(strings.TrimSpace(b), 10, 16)
	if err != nil || hi < lo {
		return 0, 0, fmt.Errorf("bad upper bound")
	}
	return uint16(lo), uint16(hi), nil
}

// ephemeralPorts is the node's ip_local_port_range: the ports its own
// connections get.
func ephemeralPorts() (uint16, uint16, error) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("ip_local_port_range: unexpected %q", b)
	}
	return parseRange(f[0] + "-" + f[1])
}

// portRange is the configured range, or the default: the ports above the
// node's ephemeral range (61000-65535 with Linux defaults), else below it.
// A configured range must not overlap the ephemeral one: the node's own
// connections would then compete with the pods' for the same ports.
func (s *Settings) portRange() (uint16, uint16, error) {
	elo, ehi, err := ephemeralPorts()
	if err != nil {
		return 0, 0, fmt.Errorf("reading the node's ephemeral port range: %w", err)
	}
	if s.PortMin != 0 {
		if s.PortMin <= ehi && s.PortMax >= elo {
			return 0, 0, config.Invalid("masqueradePortRange", "%d-%d overlaps the node's ephemeral ports %d-%d (net.ipv4.ip_local_port_range)", s.PortMin, s.PortMax, elo, ehi)
		}
		return s.PortMin, s.PortMax, nil
	}
	const minSize = 1024
	if 65535-int(ehi) >= minSize {
		return ehi + 1, 65535, nil
	}
	if int(elo)-1024 >= minSize {
		return 1024, elo - 1, nil
	}
	return 0, 0, config.Invalid("masqueradePortRange", "the node's ephemeral ports %d-%d leave no default range of %d ports: set one, or narrow net.ipv4.ip_local_port_range", elo, ehi, minSize)
}
