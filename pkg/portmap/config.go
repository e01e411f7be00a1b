// Package portmap is the hostPort feature (the portMappings capability):
// published ports in the hostports map, which the uplink and host veth
// programs translate (no iptables rule exists), the socket hooks that let
// the node's own sockets reach them, and the CLI's ports view.
package portmap

import (
	"fmt"
	"net"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/uplink"
)

// Mapping is one entry of runtimeConfig.portMappings, as runtimes send it.
type Mapping struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol,omitempty"`
	HostIP        string `json:"hostIP,omitempty"`
}

// Config is the plugin configuration's hostPort keys.
type Config struct {
	// The cgroup whose sockets reach hostPorts through the node's
	// addresses and localhost (socketCgroupPath).
	feature.CgroupKeys
	// Uplinks are where outside clients arrive (shared with masquerade).
	uplink.Config
	RuntimeConfig struct {
		PortMappings []Mapping `json:"portMappings,omitempty"`
	} `json:"runtimeConfig,omitempty"`
}

// HostPort is one published port of an endpoint, for one address family:
// the feature's state in the endpoint record.
type HostPort struct {
	Proto         string `json:"protocol"`         // tcp, udp or sctp
	HostIP        string `json:"hostIP,omitempty"` // empty: every node address of PodIP's family
	HostPort      uint16 `json:"hostPort"`
	PodIP         string `json:"podIP"`
	ContainerPort uint16 `json:"containerPort"`
}

// Settings are the validated port mappings of one ADD.
type Settings struct {
	Mappings []Mapping // normalised: protocol lower case, hostIP canonical
	Cgroup   string
	Uplinks  []string
}

var protocols = map[string]uint8{"tcp": unix.IPPROTO_TCP, "udp": unix.IPPROTO_UDP, "sctp": unix.IPPROTO_SCTP}

// Validate checks the mappings and the config; the error names the first bad
// key. Identical mappings are merged; two that publish the same port
// differently clash.
func Validate(c Config, ms []Mapping) (*Settings, error) {
	s := &Settings{Uplinks: c.Uplinks}
	if len(ms) == 0 {
		return s, nil
	}
	if err := c.Config.Validate(); err != nil {
		return nil, err
	}
	seen := map[string]int{}
	for i, m := range ms {
		key := func(f string) string { return fmt.Sprintf("runtimeConfig.portMappings[%d].%s", i, f) }
		if m.HostPort < 1 || m.HostPort > 65535 {
			return nil, config.Invalid(key("hostPort"), "%d is outside 1..65535", m.HostPort)
		}
		if m.ContainerPort < 1 || m.ContainerPort > 65535 {
			return nil, config.Invalid(key("containerPort"), "%d is outside 1..65535", m.ContainerPort)
		}
		m.Protocol = strings.ToLower(m.Protocol)
		if m.Protocol == "" {
			m.Protocol = "tcp"
		}
		if _, ok := protocols[m.Protocol]; !ok {
			return nil, config.Invalid(key("protocol"), "%q is not tcp, udp or sctp", ms[i].Protocol)
		}
		// SCTP's checksum (CRC32c) covers the ports but not the addresses:
		// an address-only translation keeps it right, a port change would
		// need the whole packet summed again.
		if m.Protocol == "sctp" && m.HostPort != m.ContainerPort {
			return nil, config.Invalid(key("containerPort"), "sctp hostPort %d must equal containerPort %d: ebpf-cni translates SCTP addresses only (its CRC32c checksum covers the ports)", m.HostPort, m.ContainerPort)
		}
		if m.HostIP != "" {
			ip := net.ParseIP(m.HostIP)
			if ip == nil || ip.IsMulticast() {
				return nil, config.Invalid(key("hostIP"), "%q is not a unicast address", m.HostIP)
			}
			if ip.IsUnspecified() {
				m.HostIP = "" // 0.0.0.0 and :: mean every address, as for bind
				if ip.To4() != nil {
					m.HostIP = "0.0.0.0"
				} else {
					m.HostIP = "::"
				}
			} else {
				m.HostIP = ip.String()
			}
		}
		id := fmt.Sprintf("%s/%d/%s", m.Protocol, m.HostPort, m.HostIP)
		if j, ok := seen[id]; ok {
			if s.Mappings[j] == m {
				continue
			}
			return nil, config.Invalid(key("hostPort"), "%s port %d is already published by portMappings[%d]", m.Protocol, m.HostPort, j)
		}
		seen[id] = len(s.Mappings)
		s.Mappings = append(s.Mappings, m)
	}
	cg, err := c.CgroupKeys.Resolve()
	if _, bad := config.AsCNI(err); bad {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("finding the cgroup v2 hierarchy for the hostPort socket hooks: %w", err)
	}
	s.Cgroup = cg
	return s, nil
}

// Ports expands the mappings over the pod's addresses: a mapping without
// hostIP is published for each family the pod has an address of, one with
// hostIP for that address's family only.
func (s *Settings) Ports(podIPs []net.IP) ([]HostPort, error) {
	var v4, v6 net.IP
	for _, ip := range podIPs {
		if ip.To4() != nil && v4 == nil {
			v4 = ip.To4()
		} else if ip.To4() == nil && v6 == nil {
			v6 = ip
		}
	}
	var out []HostPort
	for i, m := range s.Mappings {
		hp := HostPort{Proto: m.Protocol, HostPort: uint16(m.HostPort), ContainerPort: uint16(m.ContainerPort)}
		if m.HostIP == "" {
			for _, ip := range []net.IP{v4, v6} {
				if ip != nil {
					hp.PodIP = ip.String()
					out = append(out, hp)
				}
			}
			continue
		}
		host := net.ParseIP(m.HostIP)
		pod := v6
		fam := "IPv6"
		if host.To4() != nil {
			pod, fam = v4, "IPv4"
		}
		if pod == nil {
			return nil, config.Invalid(fmt.Sprintf("runtimeConfig.portMappings[%d].hostIP", i), "%s is %s but the pod has no %s address", m.HostIP, fam, fam)
		}
		if !host.IsUnspecified() {
			hp.HostIP = m.HostIP
		}
		hp.PodIP = pod.String()
		out = append(out, hp)
	}
	return out, nil
}
