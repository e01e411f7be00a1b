// Package cluster is what ebpf-cni knows of the cluster beyond its node:
// the cluster's pod ranges (clusterCIDRs: never masqueraded, never
// Services), the pod ranges of other nodes reached through the VXLAN
// overlay (tunnel endpoints, written by the node agent or
// `ebpf-cni tunnels`), and the overlay's device. Direct routing needs
// nothing here but the ranges: routes to other nodes' pod ranges are the
// node agent's or the infrastructure's, and the datapath forwards through
// the FIB. The programs read the maps (bpf/lib/cluster.h).
package cluster

import (
	"fmt"
	"net"

	"github.com/ebpf-cni/ebpf-cni/pkg/config"
)

// Config is the cluster part of an ebpf-cni network configuration.
type Config struct {
	// ClusterCIDRs are the cluster's pod ranges, every node's, IPv4 and
	// IPv6: traffic between them is never masqueraded.
	ClusterCIDRs []string `json:"clusterCIDRs,omitempty"`
	// Overlay is how pods reach other nodes' pods: "" or "none" (direct
	// routing: the node's routes), or "vxlan".
	Overlay   string `json:"overlay,omitempty"`
	VXLANPort int    `json:"vxlanPort,omitempty"`
	VXLANVNI  int    `json:"vxlanVNI,omitempty"`
}

// Defaults of the overlay: the IANA VXLAN port, and one VNI for the cluster.
const (
	DefaultVXLANPort = 4789
	DefaultVXLANVNI  = 1
	maxVNI           = 1<<24 - 1
)

// Settings is a validated Config.
type Settings struct {
	Ranges []*net.IPNet
	VXLAN  bool
	Port   uint16
	VNI    uint32
}

// Enabled reports whether the network names the cluster's ranges.
func (s *Settings) Enabled() bool { return s != nil && len(s.Ranges) > 0 }

// Validate checks every key; the error names the first bad one.
func (c *Config) Validate() (*Settings, error) {
	s := &Settings{}
	for i, cidr := range c.ClusterCIDRs {
		_, n, err := net.ParseCIDR(cidr)
		if err != nil {
			return nil, config.Invalid(fmt.Sprintf("clusterCIDRs[%d]", i), "%q is not a CIDR", cidr)
		}
		if ones, bits := n.Mask.Size(); ones == 0 {
			return nil, config.Invalid(fmt.Sprintf("clusterCIDRs[%d]", i), "%q covers every address: the pod ranges exclude the Service range and the world", cidr)
		} else if bits == 32 && n.IP.To4() == nil {
			return nil, config.Invalid(fmt.Sprintf("clusterCIDRs[%d]", i), "%q is not a CIDR", cidr)
		}
		s.Ranges = append(s.Ranges, n)
	}
	switch c.Overlay {
	case "", "none":
	case "vxlan":
		if len(s.Ranges) == 0 {
			return nil, config.Invalid("overlay", "vxlan needs clusterCIDRs (the ranges the overlay carries)")
		}
		s.VXLAN = true
	default:
		return nil, config.Invalid("overlay", "%q is not an overlay (want vxlan, or none for direct routing)", c.Overlay)
	}
	if (c.VXLANPort != 0 || c.VXLANVNI != 0) && !s.VXLAN {
		key := "vxlanPort"
		if c.VXLANPort == 0 {
			key = "vxlanVNI"
		}
		return nil, config.Invalid(key, "set without overlay vxlan")
	}
	s.Port, s.VNI = DefaultVXLANPort, DefaultVXLANVNI
	if c.VXLANPort != 0 {
		if c.VXLANPort < 1 || c.VXLANPort > 65535 {
			return nil, config.Invalid("vxlanPort", "%d is outside 1..65535", c.VXLANPort)
		}
		s.Port = uint16(c.VXLANPort)
	}
	if c.VXLANVNI != 0 {
		if c.VXLANVNI < 1 || c.VXLANVNI > maxVNI {
			return nil, config.Invalid("vxlanVNI", "%d is outside 1..%d", c.VXLANVNI, maxVNI)
		}
		s.VNI = uint32(c.VXLANVNI)
	}
	return s, nil
}
