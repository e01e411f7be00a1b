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
	"net"

	"github.com/ebpf-cni/ebpf-cni/pkg/clusterranges"
	"github.com/ebpf-cni/ebpf-cni/pkg/config"
)

// Config is the cluster part of an ebpf-cni network configuration.
type Config struct {
	// clusterCIDRs: the cluster's pod ranges (a building block: masquerade
	// reads them too).
	clusterranges.Config
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
	ranges, err := c.Config.Validate()
	if err != nil {
		return nil, err
	}
	s := &Settings{Ranges: ranges}
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
	if err := config.VXLANPort(c.VXLANPort); err != nil {
		return nil, err
	}
	if err := config.VXLANVNI(c.VXLANVNI); err != nil {
		return nil, err
	}
	s.Port, s.VNI = DefaultVXLANPort, DefaultVXLANVNI
	if c.VXLANPort != 0 {
		s.Port = uint16(c.VXLANPort)
	}
	if c.VXLANVNI != 0 {
		s.VNI = uint32(c.VXLANVNI)
	}
	return s, nil
}
