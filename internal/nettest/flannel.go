package nettest

import (
	"fmt"
	"net"
)

// FlannelMTU is the pods' MTU on flannel's VXLAN backend: the uplink's
// 1500 less the 50 bytes of VXLAN over IPv4.
const FlannelMTU = 1450

// FlannelVXLAN makes the LAN nodes what flannel's daemon makes them with its
// `vxlan` backend (IPv4; flannel's vxlan/device.go, vxlan_network.go and
// iptables.go): a kernel VXLAN device flannel.1 (VNI 1, UDP 8472, learning
// off, local address the node's) with the .0 address of the node's pod
// range; for every other node a permanent neighbour entry of its .0 with its
// flannel.1 MAC, an FDB entry sending that MAC to its address, and a route
// of its pod range via its .0 onlink; flannel's POSTROUTING rules (pod to
// pod RETURNs, the rest is masqueraded) and FORWARD accepts; ip_forward.
// The pods come from its CNI plugin's delegate: `bridge` (cni0,
// isDefaultGateway, mtu FlannelMTU) with `host-local`.
func (c *Cluster) FlannelVXLAN() error {
	vtep := func(n *ClusterNode) net.IP { return n.PodCIDR4.IP.To4() } // the range's .0
	mac := func(i int) string { return fmt.Sprintf("0e:fa:00:00:00:%02x", i+1) }
	for i, a := range c.Nodes {
		if a.Far {
			continue
		}
		cluster, own := ClusterCIDR4.String(), a.PodCIDR4.String()
		cmds := [][]string{
			{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
			{"ip", "link", "add", "flannel.1", "address", mac(i), "mtu", fmt.Sprint(FlannelMTU), "type", "vxlan",
				"id", "1", "local", a.IP4.String(), "dev", "uplink", "dstport", "8472", "nolearning"},
			{"ip", "addr", "add", vtep(a).String() + "/32", "dev", "flannel.1"},
			{"ip", "link", "set", "flannel.1", "up"},
			{"iptables", "-t", "nat", "-N", "FLANNEL-POSTRTG"},
			{"iptables", "-t", "nat", "-A", "POSTROUTING", "-m", "comment", "--comment", "flanneld masq", "-j", "FLANNEL-POSTRTG"},
			{"iptables", "-t", "nat", "-A", "FLANNEL-POSTRTG", "-m", "mark", "--mark", "0x4000/0x4000", "-j", "RETURN"},
			{"iptables", "-t", "nat", "-A", "FLANNEL-POSTRTG", "-s", own, "-d", cluster, "-j", "RETURN"},
			{"iptables", "-t", "nat", "-A", "FLANNEL-POSTRTG", "-s", cluster, "-d", own, "-j", "RETURN"},
			{"iptables", "-t", "nat", "-A", "FLANNEL-POSTRTG", "!", "-s", cluster, "-d", own, "-j", "RETURN"},
			{"iptables", "-t", "nat", "-A", "FLANNEL-POSTRTG", "-s", cluster, "!", "-d", "224.0.0.0/4", "-j", "MASQUERADE", "--random-fully"},
			{"iptables", "-t", "nat", "-A", "FLANNEL-POSTRTG", "!", "-s", cluster, "-d", cluster, "-j", "MASQUERADE", "--random-fully"},
			{"iptables", "-N", "FLANNEL-FWD"},
			{"iptables", "-A", "FORWARD", "-m", "comment", "--comment", "flanneld forward", "-j", "FLANNEL-FWD"},
			{"iptables", "-A", "FLANNEL-FWD", "-s", cluster, "-j", "ACCEPT"},
			{"iptables", "-A", "FLANNEL-FWD", "-d", cluster, "-j", "ACCEPT"},
		}
		for j, b := range c.Nodes {
			if b == a || b.Far {
				continue
			}
			cmds = append(cmds,
				[]string{"ip", "neigh", "replace", vtep(b).String(), "lladdr", mac(j), "dev", "flannel.1", "nud", "permanent"},
				[]string{"bridge", "fdb", "replace", mac(j), "dev", "flannel.1", "dst", b.IP4.String(), "self", "permanent"},
				[]string{"ip", "route", "replace", b.PodCIDR4.String(), "via", vtep(b).String(), "dev", "flannel.1", "onlink"},
			)
		}
		if err := runAll(a.NS, cmds...); err != nil {
			return fmt.Errorf("%s: %w", a.Name, err)
		}
	}
	return nil
}
