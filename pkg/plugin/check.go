package plugin

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ipam"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/bandwidth"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/nat"
	"github.com/ebpf-cni/ebpf-cni/pkg/portmap"
)

// CmdCheck verifies the attachment against prevResult and against what ADD
// made (host veth, host routes, attached programs, map entries), then asks
// the IPAM plugin. The error names every difference found.
func CmdCheck(args *skel.CmdArgs) error {
	c, err := ParseConfig(args.StdinData, args.Args, true)
	if err != nil {
		return err
	}
	if c.RawPrevResult == nil {
		return invalidConfig("prevResult", "CHECK needs the result of ADD")
	}
	if err := version.ParsePrevResult(&c.NetConf.NetConf); err != nil {
		return types.NewError(types.ErrDecodingFailure, "decoding prevResult", err.Error())
	}
	prev, err := current.NewResultFromResult(c.PrevResult)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "converting prevResult", err.Error())
	}
	podNS, err := openNetNS(args.Netns)
	if err != nil {
		return err
	}
	defer podNS.Close()
	if err := maps.CheckBPFFS(c.BPFRoot); err != nil {
		return cniError(ErrBPFFS, "invalid bpfRoot", err)
	}
	lock, err := datapath.NodeLock(c.StateDir, false)
	if err != nil {
		return cniError(types.ErrIOFailure, "invalid stateDir", err)
	}
	defer lock.Unlock()

	hostName := datapath.HostVethName(args.ContainerID, args.IfName)
	var problems []string
	bad := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }

	// What prevResult says.
	var hostIf, contIf *current.Interface
	contIdx := -1
	for i, iface := range prev.Interfaces {
		switch {
		case iface.Name == args.IfName && iface.Sandbox == args.Netns:
			contIf, contIdx = iface, i
		case iface.Name == hostName && iface.Sandbox == "":
			hostIf = iface
		}
	}
	if contIf == nil {
		bad("prevResult lists no interface %s in sandbox %s", args.IfName, args.Netns)
	}
	if hostIf == nil {
		bad("prevResult lists no host interface %s", hostName)
	}
	var ips []*current.IPConfig
	for _, ipc := range prev.IPs {
		if ipc.Interface == nil || *ipc.Interface == contIdx {
			ips = append(ips, ipc)
		}
	}

	rec, err := datapath.ReadRecord(c.StateDir, hostName)
	if err != nil {
		bad("%v", err)
	}

	// Pod side.
	var contMAC net.HardwareAddr
	err = podNS.Do(func(ns.NetNS) error {
		l, err := netlinksafe.LinkByName(args.IfName)
		if err != nil {
			bad("interface %s missing in %s", args.IfName, args.Netns)
			return nil
		}
		contMAC = l.Attrs().HardwareAddr
		if l.Type() != "veth" {
			bad("%s is a %s, not a veth", args.IfName, l.Type())
		}
		if contIf != nil && contIf.Mac != "" && !strings.EqualFold(contIf.Mac, contMAC.String()) {
			bad("%s has MAC %s, prevResult says %s", args.IfName, contMAC, contIf.Mac)
		}
		if l.Attrs().Flags&net.FlagUp == 0 {
			bad("%s is down", args.IfName)
		}
		addrs, err := netlinksafe.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("listing addresses of %s: %w", args.IfName, err)
		}
		for _, ipc := range ips {
			found := false
			for _, a := range addrs {
				if a.IPNet.IP.Equal(ipc.Address.IP) && bytes.Equal(a.IPNet.Mask, ipc.Address.Mask) {
					found = true
				}
			}
			if !found {
				bad("address %s missing on %s", ipc.Address.String(), args.IfName)
			}
		}
		for _, r := range prev.Routes {
			ok, err := datapath.RoutePresent(l, r)
			if err != nil {
				return err
			}
			if !ok {
				bad("route %s via %s missing in the pod", r.Dst.String(), r.GW)
			}
		}
		return nil
	})
	if err != nil {
		return cniError(ErrCheckFailed, "inspecting the pod", err)
	}

	// Host side.
	host, err := netlinksafe.LinkByName(hostName)
	if err != nil {
		bad("host veth %s missing", hostName)
	} else {
		if !datapath.IsOurs(host) {
			bad("host veth %s was not made by ebpf-cni (alias %q)", hostName, host.Attrs().Alias)
		}
		if host.Attrs().Flags&net.FlagUp == 0 {
			bad("host veth %s is down", hostName)
		}
		if hostIf != nil && hostIf.Mac != "" && !strings.EqualFold(hostIf.Mac, host.Attrs().HardwareAddr.String()) {
			bad("host veth %s has MAC %s, prevResult says %s", hostName, host.Attrs().HardwareAddr, hostIf.Mac)
		}
		for _, hr := range datapath.HostRoutes(host.Attrs().Index, ips) {
			ok, err := datapath.RoutePresent(host, &types.Route{Dst: *hr.Dst})
			if err == nil && !ok {
				bad("host route %s dev %s missing", hr.Dst, hostName)
			}
		}
		problems = append(problems, checkPrograms(c, host, rec)...)
		if c.Masq.Enabled || c.Cluster.Enabled() || (rec != nil && len(rec.HostPorts) > 0) {
			problems = append(problems, checkMasquerade(c)...)
		}
		problems = append(problems, clusterCheck(c)...)
		if rec != nil && len(rec.HostPorts) > 0 {
			problems = append(problems, checkHostPorts(c, rec)...)
		}
		if rec != nil {
			problems = append(problems, samePorts(c, rec, ips)...)
		}
		if contMAC != nil {
			problems = append(problems, checkMaps(c, host, contMAC, ips, args)...)
		}
		problems = append(problems, checkBandwidth(c, host)...)
	}

	if len(problems) > 0 {
		return types.NewError(ErrCheckFailed, fmt.Sprintf("check of %s/%s failed: %s", args.ContainerID, args.IfName, strings.Join(problems, "; ")), "")
	}
	if err := ipam.ExecCheck(c.IPAMType, c.IPAMConf); err != nil {
		return ipamError("CHECK", err)
	}
	return nil
}

// checkPrograms verifies that the pinned programs run on the host veth.
func checkPrograms(c *Config, host netlink.Link, rec *datapath.Record) []string {
	var problems []string
	tags, err := datapath.InstalledTags(c.BPFRoot)
	if err != nil || len(tags) == 0 {
		return []string{fmt.Sprintf("no programs pinned under %s", datapath.ProgramsDir(c.BPFRoot))}
	}
	want := map[string]ebpf.ProgramID{}
	for _, t := range tags {
		p, err := datapath.OpenPrograms(c.BPFRoot, t)
		if err != nil {
			continue
		}
		for id, hook := range p.IDs() {
			if _, ok := want[hook]; !ok || datapath.Tag() == t {
				want[hook] = id
			}
		}
		p.Close()
	}
	for _, h := range datapath.Hooks {
		ids, err := datapath.AttachedIDs(host, h)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		found := false
		for _, id := range ids {
			if id == want[h.Name] {
				found = true
			}
		}
		if !found {
			problems = append(problems, fmt.Sprintf("program %s (id %d) not attached to %s (attached: %v)", h.Name, want[h.Name], host.Attrs().Name, ids))
		}
	}
	if rec != nil {
		for _, a := range rec.Attachments {
			if a.Mode == datapath.ModeTCX {
				if _, err := os.Stat(a.Pin); err != nil {
					problems = append(problems, fmt.Sprintf("pinned link %s missing", a.Pin))
				}
			}
		}
	}
	return problems
}

// checkMasquerade verifies that the uplinks carry this binary's masquerade
// programs.
func checkMasquerade(c *Config) []string {
	p, err := datapath.OpenPrograms(c.BPFRoot, datapath.Tag())
	if err != nil {
		return []string{err.Error()}
	}
	defer p.Close()
	return nat.UplinkProblems(c.StateDir, p)
}

// checkHostPorts verifies that the pod's ports are published and the
// node serves them.
func checkHostPorts(c *Config, rec *datapath.Record) []string {
	p, err := datapath.OpenPrograms(c.BPFRoot, datapath.Tag())
	if err != nil {
		return []string{err.Error()}
	}
	defer p.Close()
	return portmap.Problems(c.BPFRoot, rec.HostPorts, p)
}

// samePorts compares the port mappings of this call with those ADD
// published.
func samePorts(c *Config, rec *datapath.Record, ips []*current.IPConfig) []string {
	var podIPs []net.IP
	for _, ipc := range ips {
		podIPs = append(podIPs, ipc.Address.IP)
	}
	want, err := c.HostPorts.Ports(podIPs)
	if err != nil {
		return []string{err.Error()}
	}
	have := map[datapath.HostPort]bool{}
	for _, hp := range rec.HostPorts {
		have[hp] = true
	}
	var out []string
	for _, hp := range want {
		if !have[hp] {
			out = append(out, fmt.Sprintf("port mapping %s %d -> %s:%d was not published by ADD", hp.Proto, hp.HostPort, hp.PodIP, hp.ContainerPort))
		}
		delete(have, hp)
	}
	for hp := range have {
		out = append(out, fmt.Sprintf("port mapping %s %d -> %s:%d is published but not asked for", hp.Proto, hp.HostPort, hp.PodIP, hp.ContainerPort))
	}
	return out
}

func checkMaps(c *Config, host netlink.Link, contMAC net.HardwareAddr, ips []*current.IPConfig, args *skel.CmdArgs) []string {
	em, err := datapath.OpenEndpointMaps(c.BPFRoot)
	if err != nil {
		return []string{err.Error()}
	}
	defer em.Close()
	ep := &datapath.Endpoint{HostIfIndex: host.Attrs().Index, HostMAC: host.Attrs().HardwareAddr, MAC: contMAC, ContainerID: args.ContainerID, IfName: args.IfName}
	for _, ipc := range ips {
		ep.IPs = append(ep.IPs, ipc.Address.IP)
	}
	return em.Check(ep)
}

// checkBandwidth verifies the pod's buckets and the endpoint flags that
// make the programs use them against the configured limits and, with
// limits, the pod's netns entry and the pacing hook.
func checkBandwidth(c *Config, host netlink.Link) []string {
	t, err := bandwidth.OpenTable(c.BPFRoot)
	if err != nil {
		return []string{err.Error()}
	}
	defer t.Close()
	problems := t.Check(host.Attrs().Index, c.BW)
	em, err := datapath.OpenEndpointMaps(c.BPFRoot)
	if err != nil {
		return append(problems, err.Error())
	}
	defer em.Close()
	if c.BW.Any() {
		// (A pod without limits that is missing there only sends its TCP
		// to limited pods unpaced: policed, as before pacing existed.)
		n, err := bandwidth.OpenNetns(c.BPFRoot)
		if err != nil {
			return append(problems, err.Error())
		}
		defer n.Close()
		if ok, err := n.Registered(host.Attrs().Index); err != nil {
			problems = append(problems, err.Error())
		} else if !ok {
			problems = append(problems, fmt.Sprintf("the pod's netns is not in %s: its TCP is not paced", maps.CniMapLocalNetns))
		}
		p, err := datapath.OpenPrograms(c.BPFRoot, datapath.Tag())
		if err != nil {
			return append(problems, err.Error())
		}
		defer p.Close()
		if !bandwidth.Pacing(c.BPFRoot, p) {
			problems = append(problems, "the pacing hook is not attached to the cgroup: TCP is policed, not paced")
		}
	}
	var d maps.CniEndpointDev
	if em.Devs.Lookup(uint32(host.Attrs().Index), &d) == nil {
		const bw = datapath.EndpointFlagBWEgress | datapath.EndpointFlagBWIngress
		if got, want := uint32(d.Flags)&bw, c.BW.Flags(); got != want {
			problems = append(problems, fmt.Sprintf("endpoint_devs[%d] has bandwidth flags %#x, want %#x", host.Attrs().Index, got, want))
		}
	}
	return problems
}
