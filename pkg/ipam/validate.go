package ipam

import (
	"fmt"
	"net"

	current "github.com/containernetworking/cni/pkg/types/100"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/rtnl"
)

// What a pod may never be given, wherever its address comes from:
// ebpf-ipam's ranges and requested addresses (ParseConfig), and the result
// of any IPAM plugin ebpf-cni runs (CheckResult). As strict as host-local,
// and stricter where host-local hands out what breaks the node.

// reservedNets are blocks no pod range may touch: an address there is not
// a unicast address of a host on a network (or, 169.254.1.1, is the pods'
// own gateway: see pkg/veth).
var reservedNets = []struct {
	net  *net.IPNet
	what string
}{
	{cidr("0.0.0.0/8"), "the unspecified (\"this host\") block 0.0.0.0/8"},
	{cidr("127.0.0.0/8"), "the loopback block 127.0.0.0/8"},
	{cidr("169.254.0.0/16"), "the link-local block 169.254.0.0/16 (169.254.1.1 is the pods' gateway)"},
	{cidr("224.0.0.0/4"), "the multicast block 224.0.0.0/4"},
	{cidr("240.0.0.0/4"), "the reserved block 240.0.0.0/4 (and the broadcast address 255.255.255.255)"},
	{cidr("::/128"), "the unspecified address ::"},
	{cidr("::1/128"), "the loopback address ::1"},
	{cidr("fe80::/10"), "the link-local block fe80::/10 (fe80::1 is the pods' gateway)"},
	{cidr("ff00::/8"), "the multicast block ff00::/8"},
}

func cidr(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}

// NodeNet is an address of the node and its interface.
type NodeNet struct {
	Net       net.IPNet // the address, with the prefix of its subnet
	LinkIndex int       // its device
	Iface     string    // the device's name when known; iface reads it otherwise
}

// iface names the device of the address for a message: read by index
// only when a message needs it, which a valid configuration never does.
func (n NodeNet) iface() string {
	if n.Iface != "" {
		return n.Iface
	}
	if l, err := rtnl.H().LinkByIndex(n.LinkIndex); err == nil {
		return l.Attrs().Name
	}
	return fmt.Sprintf("ifindex %d", n.LinkIndex)
}

// nodeNets reads the node's addresses: every address in the current
// network namespace (the node's, where runtimes run plugins) but the
// link-local and loopback ones, which no range may touch anyway. Every
// host veth of ebpf-cni carries two IPv6 link-local addresses (fe80::1
// and the kernel's own), so the IPv6 addresses of any other than global
// scope are skipped by their header, without being parsed, in one dump
// of both families (rtnl.Addrs). Tests replace it.
var nodeNets = func() ([]NodeNet, error) {
	addrs, err := rtnl.Addrs(unix.AF_UNSPEC, func(family int, scope uint8) bool {
		return family == unix.AF_INET || scope == unix.RT_SCOPE_UNIVERSE
	})
	if err != nil {
		return nil, err
	}
	var out []NodeNet
	for _, a := range addrs {
		ip := canonicalIP(a.IP)
		if ip == nil || ip.IsLinkLocalUnicast() || ip.IsLoopback() {
			continue
		}
		out = append(out, NodeNet{Net: net.IPNet{IP: ip, Mask: net.CIDRMask(a.PrefixLen, 8*len(ip))}, LinkIndex: a.LinkIndex})
	}
	return out, nil
}

func netsOverlap(a, b *net.IPNet) bool {
	if len(canonicalIP(a.IP)) != len(canonicalIP(b.IP)) {
		return false
	}
	return a.Contains(b.IP) || b.Contains(a.IP)
}

func (n NodeNet) subnet() *net.IPNet {
	return &net.IPNet{IP: n.Net.IP.Mask(n.Net.Mask), Mask: n.Net.Mask}
}

// checkSubnet refuses a pod subnet that touches a reserved block or the
// subnet of an address of the node (the pods would take the node's own
// address, or its router's). The node may hold the range's own gateway
// gw: an interface plugin that routes for its pods through a device of
// the node (bridge with isGateway) puts it there.
func checkSubnet(key string, subnet *net.IPNet, gw net.IP, node []NodeNet) error {
	for _, r := range reservedNets {
		if netsOverlap(subnet, r.net) {
			return invalidConfig(key, fmt.Sprintf("%s overlaps %s: no pod may have such an address", subnet, r.what))
		}
	}
	for _, n := range node {
		if gw != nil && n.Net.IP.Equal(gw) && subnet.Contains(gw) {
			continue
		}
		if netsOverlap(subnet, n.subnet()) {
			return invalidConfig(key, fmt.Sprintf("%s overlaps the node's subnet %s (%s on %s): pods would take the node's addresses or its neighbours'; give the pods a range of their own", subnet, n.subnet(), n.Net.IP, n.iface()))
		}
	}
	return nil
}

// forbidden says why ip may never be a pod's address ("" when it may):
// a reserved address, an address of the node, or, within subnet (nil when
// unknown), its network or broadcast address or its gateway gw.
func forbidden(ip net.IP, subnet *net.IPNet, gw net.IP, node []NodeNet) string {
	ip = canonicalIP(ip)
	for _, r := range reservedNets {
		if r.net.Contains(ip) {
			return fmt.Sprintf("%s is in %s", ip, r.what)
		}
	}
	for _, n := range node {
		if n.Net.IP.Equal(ip) {
			return fmt.Sprintf("%s is the node's address (on %s)", ip, n.iface())
		}
	}
	if subnet != nil && subnet.Contains(ip) {
		ones, bits := subnet.Mask.Size()
		network := canonicalIP(subnet.IP.Mask(subnet.Mask))
		switch {
		case bits-ones >= 2 && ip.Equal(network):
			return fmt.Sprintf("%s is the network address of %s", ip, subnet)
		case bits == 32 && bits-ones >= 2 && ip.Equal(broadcast(subnet)):
			return fmt.Sprintf("%s is the broadcast address of %s", ip, subnet)
		}
	}
	if gw != nil && ip.Equal(canonicalIP(gw)) {
		return fmt.Sprintf("%s is the gateway", ip)
	}
	return ""
}

func broadcast(subnet *net.IPNet) net.IP {
	ip := canonicalIP(subnet.IP)
	out := make(net.IP, len(ip))
	mask := subnet.Mask
	if len(mask) != len(ip) {
		mask = mask[len(mask)-len(ip):]
	}
	for i := range out {
		out[i] = ip[i] | ^mask[i]
	}
	return out
}

// CheckResult checks the addresses an IPAM plugin returned, whichever it
// is (host-local, dhcp, ...), against what a pod may never be given: a
// reserved address (unspecified, loopback, link-local with the pods'
// gateway 169.254.1.1, multicast), an address of the node, the network or
// broadcast address of its subnet, or its own gateway; and a subnet that
// overlaps one of the node's. The error is code 7 naming the result's key
// (`ipam result ips[0].address`). ebpf-ipam's own results pass by
// construction (ParseConfig checks the same).
func CheckResult(ips []*current.IPConfig) error {
	node, err := nodeNets()
	if err != nil {
		return err
	}
	return checkResult(ips, node)
}

func checkResult(ips []*current.IPConfig, node []NodeNet) error {
	for i, c := range ips {
		key := fmt.Sprintf("ipam result ips[%d].address", i)
		sub := &net.IPNet{IP: c.Address.IP.Mask(c.Address.Mask), Mask: c.Address.Mask}
		if why := forbidden(c.Address.IP, sub, c.Gateway, node); why != "" {
			return invalidConfig(key, why+": no pod may have it")
		}
		for _, n := range node {
			if netsOverlap(sub, n.subnet()) {
				return invalidConfig(key, fmt.Sprintf("%s overlaps the node's subnet %s (%s on %s)", &c.Address, n.subnet(), n.Net.IP, n.iface()))
			}
		}
	}
	return nil
}
