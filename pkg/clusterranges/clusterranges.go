// Package clusterranges is the cluster's pod ranges (clusterCIDRs: every
// node's, IPv4 and IPv6): a fact of the network that features share, a
// building block below them like pkg/uplink. The cluster feature marks
// them in the datapath (cluster_routes) and carries them over the overlay;
// masquerade never translates traffic between them. One key, one parser:
// the features read it here rather than from each other.
package clusterranges

import (
	"fmt"
	"net"

	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
)

// Config is the key of a network configuration that names the ranges.
type Config struct {
	// ClusterCIDRs are the cluster's pod ranges, every node's, IPv4 and
	// IPv6: traffic between them is never masqueraded.
	ClusterCIDRs []string `json:"clusterCIDRs,omitempty"`
}

// Validate parses the ranges; the error names the first bad one.
func (c *Config) Validate() ([]*net.IPNet, error) {
	var out []*net.IPNet
	for i, cidr := range c.ClusterCIDRs {
		key := fmt.Sprintf("clusterCIDRs[%d]", i)
		_, n, err := net.ParseCIDR(cidr)
		if err != nil {
			return nil, config.Invalid(key, "%q is not a CIDR", cidr)
		}
		ones, bits := n.Mask.Size()
		if err := config.ClusterCIDR(key, cidr, ones); err != nil {
			return nil, err
		}
		if bits == 32 && n.IP.To4() == nil {
			return nil, config.Invalid(key, "%q is not a CIDR", cidr)
		}
		out = append(out, n)
	}
	return out, nil
}

// Of are the ranges a network configuration names; nil when it names none
// or they are invalid (the cluster feature's Parse reports that, and the
// call fails).
func Of(conf []byte) []*net.IPNet {
	var c Config
	if feature.Decode(conf, &c) != nil {
		return nil
	}
	ranges, err := c.Validate()
	if err != nil {
		return nil
	}
	return ranges
}
