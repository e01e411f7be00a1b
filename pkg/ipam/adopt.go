package ipam

import (
	"net"
)

// Adopt makes the network's state hold ips for the attachment, where it
// holds them for nobody: the records of ebpf-ipam (its files and its map)
// are a cache of what the node's pods hold, and a node that lost both (a
// wiped stateDir and a remounted bpffs) must not hand a live pod's address
// to the next one. ebpf-cni's healing calls it with the addresses the
// kernel's endpoint maps give a live pod. An address held by another
// attachment, or in none of the ranges, is left as it is.
func Adopt(stdin []byte, cniArgs, containerID, ifname string, ips []net.IP) (adopted []net.IP, err error) {
	c, _, err := ParseConfig(stdin, cniArgs)
	if err != nil {
		return nil, err
	}
	c.Requested = nil
	s, err := Open(c)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	att, err := s.Attachment(containerID, ifname)
	if err != nil {
		return nil, err
	}
	if att == nil {
		att = &Attachment{ContainerID: containerID, IfName: ifname}
	}
	for _, ip := range ips {
		set := -1
		for i, rs := range c.RangeSets {
			if rs.Contains(ip) {
				set = i
			}
		}
		if set < 0 {
			continue
		}
		o, err := s.Owner(ip)
		if err != nil {
			return adopted, err
		}
		if o != nil && !owns(o, containerID, ifname) {
			continue
		}
		if o == nil {
			if err := s.Reserve(ip, containerID, ifname, set); err != nil {
				return adopted, err
			}
			adopted = append(adopted, ip)
		}
		if !att.holds(ip) {
			att.IPs = append(att.IPs, Allocation{Address: canonicalIP(ip), RangeSet: set})
		}
	}
	if len(att.IPs) == 0 {
		_, err := s.Forget() // nothing of it in this network: Open must leave no network behind
		return adopted, err
	}
	return adopted, s.SaveAttachment(att)
}
