package veth

import (
	"bytes"
	"fmt"
	"net"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/rtnl"
)

// CheckPod compares the pod's side of the pair with what ADD made of it
// (CHECK): ifName in podNS (named netnsPath in messages) is a veth, up,
// with mac when one is given, every address of ips and every route of
// routes. It gives the differences and the interface's MAC (nil when the
// interface is missing); an error when the pod cannot be inspected.
func CheckPod(podNS ns.NetNS, netnsPath, ifName, mac string, ips []*current.IPConfig, routes []*types.Route) ([]string, net.HardwareAddr, error) {
	var problems []string
	bad := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
	var podMAC net.HardwareAddr
	err := podNS.Do(func(ns.NetNS) error {
		l, err := rtnl.H().LinkByName(ifName)
		if err != nil {
			bad("interface %s missing in %s", ifName, netnsPath)
			return nil
		}
		podMAC = l.Attrs().HardwareAddr
		if l.Type() == string(KindNetkit) && len(podMAC) == 0 {
			podMAC = make(net.HardwareAddr, 6) // NoMAC
		}
		if l.Type() != string(KindVeth) && l.Type() != string(KindNetkit) {
			bad("%s is a %s, not a veth or netkit", ifName, l.Type())
		}
		if mac != "" && !strings.EqualFold(mac, podMAC.String()) {
			bad("%s has MAC %s, prevResult says %s", ifName, podMAC, mac)
		}
		if l.Attrs().Flags&net.FlagUp == 0 {
			bad("%s is down", ifName)
		}
		addrs, err := rtnl.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("listing addresses of %s: %w", ifName, err)
		}
		for _, ipc := range ips {
			found := false
			for _, a := range addrs {
				if a.IPNet.IP.Equal(ipc.Address.IP) && bytes.Equal(a.IPNet.Mask, ipc.Address.Mask) {
					found = true
				}
			}
			if !found {
				bad("address %s missing on %s", ipc.Address.String(), ifName)
			}
		}
		for _, r := range routes {
			ok, err := RoutePresent(l, r)
			if err != nil {
				return err
			}
			if !ok {
				bad("route %s via %s missing in the pod", r.Dst.String(), r.GW)
			}
		}
		return nil
	})
	return problems, podMAC, err
}

// CheckHost compares the host side of the pair with what ADD made of it
// (CHECK): hostName exists, is ours, up, has mac when one is given, and
// the host routes to ips. It gives the differences and the host veth (nil
// when it is missing).
func CheckHost(hostName, mac string, ips []*current.IPConfig) ([]string, netlink.Link) {
	host, err := rtnl.H().LinkByName(hostName)
	if err != nil {
		return []string{fmt.Sprintf("host veth %s missing", hostName)}, nil
	}
	var problems []string
	bad := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
	if !IsOurs(host) {
		bad("host veth %s was not made by ebpf-cni (alias %q)", hostName, host.Attrs().Alias)
	}
	if host.Attrs().Flags&net.FlagUp == 0 {
		bad("host veth %s is down", hostName)
	}
	if mac != "" && !strings.EqualFold(mac, host.Attrs().HardwareAddr.String()) {
		bad("host veth %s has MAC %s, prevResult says %s", hostName, host.Attrs().HardwareAddr, mac)
	}
	for _, hr := range HostRoutes(host.Attrs().Index, ips) {
		ok, err := RoutePresent(host, &types.Route{Dst: *hr.Dst})
		if err == nil && !ok {
			bad("host route %s dev %s missing", hr.Dst, hostName)
		}
	}
	return problems, host
}
