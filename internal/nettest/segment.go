package nettest

import (
	"fmt"
	"net"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// Addresses of a Segment's gateway (on its bridge).
var (
	SegmentGW4 = net.ParseIP("192.0.2.1")
	SegmentGW6 = net.ParseIP("2001:db8:ffff::1")
)

// Segment is an L2 segment shared by simulated nodes: a bridge "br0" in a
// netns of its own, holding the nodes' default gateway. That netns does not
// forward (a new netns starts with forwarding off), so a packet the nodes
// do not route to each other goes nowhere: without routes between them,
// pods of different nodes do not reach each other.
type Segment struct {
	NS    ns.NetNS
	Nodes []*Node
}

// NewSegment makes the segment's netns and bridge.
func NewSegment() (*Segment, error) {
	n, err := NewNetNS()
	if err != nil {
		return nil, err
	}
	s := &Segment{NS: n}
	err = n.Do(func(ns.NetNS) error {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = "br0"
		br := &netlink.Bridge{LinkAttrs: attrs}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("creating br0: %w", err)
		}
		return setup(br, SegmentGW4, SegmentGW6, nil, nil)
	})
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// AddNode makes a node netns whose "uplink" is a port of the segment's
// bridge, with addresses ip4/24 and ip6/64 and default routes via the
// segment's gateway. The node's World is nil: Segment.Close removes it.
func (s *Segment) AddNode(ip4, ip6 net.IP) (*Node, error) {
	n, err := NewNetNS()
	if err != nil {
		return nil, err
	}
	node := &Node{NS: n}
	s.Nodes = append(s.Nodes, node)
	port := fmt.Sprintf("port%d", len(s.Nodes))
	return node, n.Do(func(ns.NetNS) error {
		attrs := netlink.NewLinkAttrs()
		attrs.Name = "uplink"
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: port, PeerNamespace: netlink.NsFd(int(s.NS.Fd()))}); err != nil {
			return fmt.Errorf("creating uplink: %w", err)
		}
		up, err := netlink.LinkByName("uplink")
		if err != nil {
			return err
		}
		if err := setup(up, ip4, ip6, SegmentGW4, SegmentGW6); err != nil {
			return err
		}
		return s.NS.Do(func(ns.NetNS) error {
			p, err := netlink.LinkByName(port)
			if err != nil {
				return err
			}
			br, err := netlink.LinkByName("br0")
			if err != nil {
				return err
			}
			if err := netlink.LinkSetMaster(p, br); err != nil {
				return fmt.Errorf("attaching %s to br0: %w", port, err)
			}
			return netlink.LinkSetUp(p)
		})
	})
}

// Close removes every node and the segment.
func (s *Segment) Close() {
	for _, n := range s.Nodes {
		n.Close()
	}
	CloseNetNS(s.NS)
}
