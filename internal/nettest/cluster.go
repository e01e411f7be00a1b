package nettest

import (
	"fmt"
	"net"

	"github.com/containernetworking/plugins/pkg/ns"
)

// A simulated cluster: nodes on one L2 segment (a bridge in a namespace of
// its own), a router joining that segment to the world and to a subnet of
// its own with one more node (reached only through the router: for the
// overlay), and a world host behind the router. Every node has a pod range
// of the cluster's ranges; nothing routes to them until a test says so.
//
//	node1 ─┐                                 ┌─ world (203.0.113.10)
//	node2 ─┼─ lan (bridge) ── router (.1) ───┤
//	node3 ─┘  192.0.2.0/24                    └─ far node (198.51.100.14)
//
// Addresses only from the documentation and private ranges.
var (
	// ClusterCIDR4 and ClusterCIDR6 are the cluster's pod ranges.
	ClusterCIDR4 = mustCIDR("10.244.0.0/16")
	ClusterCIDR6 = mustCIDR("fd00:244::/48")
	// ClusterWorld4 and ClusterWorld6 are the world host beyond the router.
	ClusterWorld4 = net.ParseIP("203.0.113.10")
	ClusterWorld6 = net.ParseIP("2001:db8:3::10")
	routerLAN4    = net.ParseIP("192.0.2.1")
	routerLAN6    = net.ParseIP("2001:db8:1::1")
	routerFar4    = net.ParseIP("198.51.100.1")
	routerFar6    = net.ParseIP("2001:db8:2::1")
	routerWAN4    = net.ParseIP("203.0.113.1")
	routerWAN6    = net.ParseIP("2001:db8:3::1")
)

func mustCIDR(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}

// ClusterNode is one node of a Cluster. Its embedded Node has the node's
// netns and the cluster's world, so a CNI made for it works as for a
// single node (but it is closed with the cluster, never on its own).
type ClusterNode struct {
	*Node
	Name     string
	IP4, IP6 net.IP // the node's underlay addresses, on "uplink"
	// PodCIDR4 and PodCIDR6 are the node's pod ranges (its IPAM's subnets).
	PodCIDR4, PodCIDR6 *net.IPNet
	// Far: the node is behind the router, not on the shared segment.
	Far bool
}

// Cluster is the simulated cluster: LAN nodes, then the far node, last.
type Cluster struct {
	LAN, Router, World ns.NetNS
	Nodes              []*ClusterNode
	all                []ns.NetNS
}

// NewCluster builds lan nodes on the shared segment (at most 9) and, with
// far, one more node behind the router.
func NewCluster(lan int, far bool) (*Cluster, error) {
	c := &Cluster{}
	ok := false
	defer func() {
		if !ok {
			c.Close()
		}
	}()
	var err error
	for _, p := range []*ns.NetNS{&c.LAN, &c.Router, &c.World} {
		if *p, err = c.netns(); err != nil {
			return nil, err
		}
	}
	if err := c.wireCore(); err != nil {
		return nil, err
	}
	for i := 1; i <= lan; i++ {
		n := &ClusterNode{Name: fmt.Sprintf("node%d", i),
			IP4: net.ParseIP(fmt.Sprintf("192.0.2.%d", 10+i)), IP6: net.ParseIP(fmt.Sprintf("2001:db8:1::%d", 10+i))}
		if err := c.addNode(n, i); err != nil {
			return nil, err
		}
	}
	if far {
		i := lan + 1
		n := &ClusterNode{Name: fmt.Sprintf("node%d", i), Far: true,
			IP4: net.ParseIP(fmt.Sprintf("198.51.100.%d", 10+i)), IP6: net.ParseIP(fmt.Sprintf("2001:db8:2::%d", 10+i))}
		if err := c.addNode(n, i); err != nil {
			return nil, err
		}
	}
	ok = true
	return c, nil
}

func (c *Cluster) netns() (ns.NetNS, error) {
	n, err := NewNetNS()
	if err != nil {
		return nil, err
	}
	c.all = append(c.all, n)
	return n, nil
}

// Close removes every namespace of the cluster, and with them every device.
func (c *Cluster) Close() {
	for _, n := range c.all {
		CloseNetNS(n)
	}
	c.all = nil
}

// run is Run that fails with the command's output.
func run(n ns.NetNS, args ...string) error {
	_, err := Run(n, args[0], args[1:]...)
	return err
}

func runAll(n ns.NetNS, cmds ...[]string) error {
	for _, cmd := range cmds {
		if err := run(n, cmd...); err != nil {
			return err
		}
	}
	return nil
}

// wireCore makes the bridge and the router's three links: to the bridge,
// to the world, and the far subnet's (whose node comes later).
func (c *Cluster) wireCore() error {
	if err := runAll(c.LAN,
		[]string{"ip", "link", "add", "br0", "type", "bridge"},
		[]string{"ip", "link", "set", "br0", "up"},
		[]string{"ip", "link", "add", "router", "type", "veth", "peer", "name", "lan0", "netns", c.Router.Path()},
		[]string{"ip", "link", "set", "router", "master", "br0", "up"},
	); err != nil {
		return err
	}
	if err := runAll(c.Router,
		[]string{"sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1", "net.ipv6.conf.default.accept_dad=0"},
		[]string{"ip", "link", "add", "wan0", "type", "veth", "peer", "name", "eth0", "netns", c.World.Path()},
		[]string{"ip", "link", "set", "lan0", "up"},
		[]string{"ip", "link", "set", "wan0", "up"},
		[]string{"ip", "addr", "add", routerLAN4.String() + "/24", "dev", "lan0"},
		[]string{"ip", "addr", "add", routerLAN6.String() + "/64", "dev", "lan0", "nodad"},
		[]string{"ip", "addr", "add", routerWAN4.String() + "/24", "dev", "wan0"},
		[]string{"ip", "addr", "add", routerWAN6.String() + "/64", "dev", "wan0", "nodad"},
	); err != nil {
		return err
	}
	return runAll(c.World,
		[]string{"sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.eth0.accept_dad=0"},
		[]string{"ip", "link", "set", "eth0", "up"},
		[]string{"ip", "addr", "add", ClusterWorld4.String() + "/24", "dev", "eth0"},
		[]string{"ip", "addr", "add", ClusterWorld6.String() + "/64", "dev", "eth0", "nodad"},
		[]string{"ip", "route", "add", "default", "via", routerWAN4.String()},
		[]string{"ip", "-6", "route", "add", "default", "via", routerWAN6.String()},
	)
}

// addNode makes node i: on the bridge, or (Far) on a link of its own to
// the router, with its uplink's addresses and default routes.
func (c *Cluster) addNode(n *ClusterNode, i int) error {
	nodeNS, err := c.netns()
	if err != nil {
		return err
	}
	n.Node = &Node{NS: nodeNS, World: c.World}
	n.PodCIDR4 = mustCIDR(fmt.Sprintf("10.244.%d.0/24", i))
	n.PodCIDR6 = mustCIDR(fmt.Sprintf("fd00:244:0:%d::/64", i))
	gw4, gw6 := routerLAN4, routerLAN6
	if n.Far {
		gw4, gw6 = routerFar4, routerFar6
		if err := runAll(c.Router,
			[]string{"ip", "link", "add", "far0", "type", "veth", "peer", "name", "uplink", "netns", nodeNS.Path()},
			[]string{"ip", "link", "set", "far0", "up"},
			[]string{"ip", "addr", "add", routerFar4.String() + "/24", "dev", "far0"},
			[]string{"ip", "addr", "add", routerFar6.String() + "/64", "dev", "far0", "nodad"},
		); err != nil {
			return err
		}
	} else {
		port := fmt.Sprintf("port%d", i)
		if err := runAll(c.LAN,
			[]string{"ip", "link", "add", port, "type", "veth", "peer", "name", "uplink", "netns", nodeNS.Path()},
			[]string{"ip", "link", "set", port, "master", "br0", "up"},
		); err != nil {
			return err
		}
	}
	if err := runAll(nodeNS,
		[]string{"sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.uplink.accept_dad=0"},
		[]string{"ip", "link", "set", "uplink", "up"},
		[]string{"ip", "addr", "add", n.IP4.String() + "/24", "dev", "uplink"},
		[]string{"ip", "addr", "add", n.IP6.String() + "/64", "dev", "uplink", "nodad"},
		[]string{"ip", "route", "add", "default", "via", gw4.String()},
		[]string{"ip", "-6", "route", "add", "default", "via", gw6.String()},
	); err != nil {
		return err
	}
	c.Nodes = append(c.Nodes, n)
	return nil
}

// RouteDirect installs on every LAN node the routes to every other LAN
// node's pod ranges via that node, as the node agent does in direct mode
// (or a cloud's route table would): pods reach each other by bpf_fib_lookup.
func (c *Cluster) RouteDirect() error {
	for _, a := range c.Nodes {
		for _, b := range c.Nodes {
			if a == b || a.Far || b.Far {
				continue
			}
			if err := runAll(a.NS,
				[]string{"ip", "route", "replace", b.PodCIDR4.String(), "via", b.IP4.String()},
				[]string{"ip", "-6", "route", "replace", b.PodCIDR6.String(), "via", b.IP6.String()},
			); err != nil {
				return err
			}
		}
	}
	return nil
}

// RouteFromRouter gives the router (and so the world) a route to node n's
// pod ranges: an outside host that reaches pods by their addresses.
func (c *Cluster) RouteFromRouter(n *ClusterNode) error {
	return runAll(c.Router,
		[]string{"ip", "route", "replace", n.PodCIDR4.String(), "via", n.IP4.String()},
		[]string{"ip", "-6", "route", "replace", n.PodCIDR6.String(), "via", n.IP6.String()},
	)
}

// RouteToRouter sends traffic for addrs (e.g. a Service's externalIPs) from
// the router to node n, as an external load balancer or a BGP route would.
func (c *Cluster) RouteToRouter(n *ClusterNode, addrs ...net.IP) error {
	for _, a := range addrs {
		via, cmd := n.IP4, []string{"ip", "route", "replace"}
		if a.To4() == nil {
			via, cmd = n.IP6, []string{"ip", "-6", "route", "replace"}
			cmd = append(cmd, a.String()+"/128")
		} else {
			cmd = append(cmd, a.String()+"/32")
		}
		if err := run(c.Router, append(cmd, "via", via.String())...); err != nil {
			return err
		}
	}
	return nil
}

// IPAM is an ebpf-ipam section for node n's pod ranges, both families.
func (n *ClusterNode) IPAM() map[string]any {
	return map[string]any{"type": "ebpf-ipam", "ranges": []any{
		[]any{map[string]any{"subnet": n.PodCIDR4.String()}},
		[]any{map[string]any{"subnet": n.PodCIDR6.String()}},
	}}
}

// Addr is the node's underlay address of a family (4 or 6).
func (n *ClusterNode) Addr(family int) net.IP {
	if family == 4 {
		return n.IP4
	}
	return n.IP6
}
