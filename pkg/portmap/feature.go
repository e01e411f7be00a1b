package portmap

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/conntrack"
	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
	"github.com/ebpf-cni/ebpf-cni/pkg/uplink"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

// SockHooks are the socket-address hooks of the node's cgroup: hostPort
// from the node's own sockets (bpf/sock_hostport.c).
var SockHooks = []attach.Hook{
	attach.CgroupHook("hostport_connect4", ebpf.AttachCGroupInet4Connect),
	attach.CgroupHook("hostport_connect6", ebpf.AttachCGroupInet6Connect),
	attach.CgroupHook("hostport_sendmsg4", ebpf.AttachCGroupUDP4Sendmsg),
	attach.CgroupHook("hostport_sendmsg6", ebpf.AttachCGroupUDP6Sendmsg),
	attach.CgroupHook("hostport_recvmsg4", ebpf.AttachCGroupUDP4Recvmsg),
	attach.CgroupHook("hostport_recvmsg6", ebpf.AttachCGroupUDP6Recvmsg),
	attach.CgroupHook("hostport_peername4", ebpf.AttachCgroupInet4GetPeername),
	attach.CgroupHook("hostport_peername6", ebpf.AttachCgroupInet6GetPeername),
}

// cgroupSet names the socket hooks' attachment set.
const cgroupSet = "hostport"

// name keys the feature's state in endpoint records.
const name = "hostPort"

// legacyKey is where records of builds before feature state kept the ports.
const legacyKey = "hostPorts"

// Feature is hostPort.
type Feature struct{ feature.Base }

var _ feature.Feature = Feature{}

// Name is the feature's name.
func (Feature) Name() string { return name }

// Programs are the socket hooks and the uplinks'.
func (Feature) Programs() []programs.Object {
	return append([]programs.Object{{Name: "sock_hostport", Bytes: _SockHostportBytes, Load: LoadSockHostport, Hooks: SockHooks}}, uplink.Objects()...)
}

// Parse reads runtimeConfig.portMappings, cgroupPath and uplinks.
func (Feature) Parse(conf []byte) (feature.Pod, error) {
	var c Config
	if err := feature.Decode(conf, &c); err != nil {
		return nil, err
	}
	s, err := Validate(c, c.RuntimeConfig.PortMappings)
	if err != nil {
		return nil, fail(err) // a bad key stays code 7
	}
	return pod{s}, nil
}

// Ports are the ports a record says its endpoint published.
func Ports(r *node.Record) ([]HostPort, error) {
	var ports []HostPort
	ok, err := r.Feature(name, &ports)
	if !ok && err == nil && r.Legacy[legacyKey] != nil {
		err = json.Unmarshal(r.Legacy[legacyKey], &ports)
	}
	return ports, err
}

type pod struct{ s *Settings }

func (p pod) Needs() feature.Needs {
	if len(p.s.Mappings) > 0 {
		return feature.Needs{Flags: maps.CniEndpointFlagsEP_F_HOSTPORT}
	}
	return feature.Needs{}
}

// fail turns an error of hostPort into a CNI error.
func fail(err error) error {
	if errors.Is(err, ErrConflict) {
		return types.NewError(errcode.HostPortConflict, err.Error(), "")
	}
	return feature.Fail(errcode.HostPort, "setting up port mappings", err)
}

// Add serves the pod's port mappings: the uplinks and the socket hooks
// ready, then the ports claimed (refused when another pod holds one).
func (p pod) Add(n *node.Node, ep *feature.Endpoint, undo *feature.Undo) error {
	ports, err := p.s.Ports(ep.Addrs())
	if err != nil || len(ports) == 0 {
		return fail(err)
	}
	ups, err := uplink.Find(p.s.Uplinks)
	if err != nil {
		return fail(err)
	}
	if err := uplink.Ensure(n, ups, ep.DeviceMode); err != nil {
		return fail(err)
	}
	if err := Ready(n, p.s.Cgroup); err != nil {
		return fail(err)
	}
	owner, err := ownerOf(n)
	if err != nil {
		return fail(err)
	}
	if err := Publish(n, ports, owner); err != nil {
		return fail(err)
	}
	undo.Push(func() error { return Unpublish(n, ports) })
	return ep.SetFeature(name, ports)
}

// ownerOf names the pod behind a pod address from the node's endpoint
// maps, for the message of a port held by another pod.
func ownerOf(n *node.Node) (Owner, error) {
	e, err := n.Map(maps.CniMapEndpoints)
	if err != nil {
		return nil, err
	}
	d, err := n.Map(maps.CniMapEndpointDevs)
	if err != nil {
		return nil, err
	}
	return func(ip net.IP) string { return maps.OwnerOf(e, d, ip) }, nil
}

// Check compares the mappings asked for with those ADD published, and
// verifies that the node serves them.
func (p pod) Check(n *node.Node, ep *feature.Endpoint) []string {
	if !ep.Recorded {
		return nil
	}
	ports, err := Ports(ep.Record)
	if err != nil {
		return []string{err.Error()}
	}
	out := samePorts(p.s, ports, ep.Addrs())
	if len(ports) == 0 {
		return out
	}
	out = append(out, uplink.Problems(n, "hostPort")...)
	progs, err := n.PinnedPrograms()
	if err != nil {
		return append(out, err.Error())
	}
	return append(out, Problems(n, ports, progs)...)
}

// samePorts compares the port mappings of this call with those ADD
// published.
func samePorts(s *Settings, published []HostPort, podIPs []net.IP) []string {
	want, err := s.Ports(podIPs)
	if err != nil {
		return []string{err.Error()}
	}
	have := map[HostPort]bool{}
	for _, hp := range published {
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

// Del unpublishes the pod's ports (DEL runs it before the endpoint's
// entries go: no packet is sent to a pod that is no longer there), then
// flushes its hostPort flows (also of an endpoint without a record, whose
// addresses DEL found through its host veth).
func (Feature) Del(n *node.Node, ep *feature.Endpoint) error {
	if n.CheckBPFFS() != nil {
		return nil
	}
	var err error
	if ep.Recorded {
		var ports []HostPort
		if ports, err = Ports(ep.Record); err == nil {
			err = Unpublish(n, ports)
		}
	}
	// The pod's hostPort flows leave the conntrack/NAT table (a pod that
	// gets the same address later inherits no state), also when
	// unpublishing failed; queued, the teardown does it with masquerade's
	// in one walk of the table, after the ports and the endpoint are gone.
	conntrack.FlushPodLater(n, conntrack.HostPort, ep.Addrs())
	return err
}

// GC removes published ports whose pod is gone, and the hostPort flows of
// pods that are gone and expired ones.
func (Feature) GC(n *node.Node, live *feature.Live, dryRun bool) ([]string, error) {
	found, err := GC(n, live.IP, dryRun)
	t, terr := conntrack.Pinned(n)
	if terr == nil && t != nil {
		var flows []string
		flows, terr = t.GC(conntrack.HostPort, live.IP, dryRun)
		found = append(found, flows...)
	}
	return found, errors.Join(err, terr)
}

// Release takes hostPort off the node.
func (Feature) Release(n *node.Node) error { return Teardown(n) }

// Commands: ports.
func (Feature) Commands() []*view.Command { return []*view.Command{command} }

// Repair, for the node, records the uplinks' programs again from the
// kernel (hostPort shares them with masquerade: uplink.Rebuild); for an
// endpoint whose record was rebuilt it first finds the ports published to
// its addresses (its DEL unpublishes them), then publishes the record's
// ports again and makes the node serve them (socket hooks on the recorded
// cgroup), after the bpffs lost them. It tells nothing: publishing an
// existing port changes nothing.
func (Feature) Repair(n *node.Node, rp *feature.Repair) ([]string, error) {
	ep := rp.Endpoint
	if ep == nil {
		if rp.DryRun {
			return nil, nil
		}
		return nil, uplink.Rebuild(n)
	}
	if rp.Rebuilt {
		if err := learn(n, ep); err != nil {
			return nil, err
		}
	}
	ports, err := Ports(ep.Record)
	if err != nil || len(ports) == 0 || rp.DryRun {
		return nil, err
	}
	return nil, restore(n, ports)
}

// learn puts in a record rebuilt from the kernel the ports the hostports
// map publishes to its addresses.
func learn(n *node.Node, ep *feature.Endpoint) error {
	m, err := n.PinnedMap(maps.CniMapHostports)
	if err != nil || m == nil {
		return err
	}
	all, err := List(m)
	if err != nil {
		return err
	}
	own := map[string]bool{}
	for _, ip := range ep.Addrs() {
		own[ip.String()] = true
	}
	var ports []HostPort
	for _, p := range all {
		if !own[p.PodIP] {
			continue
		}
		hp := HostPort{Proto: p.Proto, HostIP: p.HostIP, HostPort: p.HostPort, PodIP: p.PodIP, ContainerPort: p.ContainerPort}
		if hp.HostIP == "*" {
			hp.HostIP = ""
		}
		ports = append(ports, hp)
	}
	if len(ports) == 0 {
		return nil
	}
	ep.Record.Flags |= uint32(maps.CniEndpointFlagsEP_F_HOSTPORT) // its replies need reverse DNAT
	return ep.SetFeature(name, ports)
}

func restore(n *node.Node, ports []HostPort) error {
	owner, err := ownerOf(n)
	if err != nil {
		return err
	}
	if err := Publish(n, ports, owner); err != nil {
		return err
	}
	cgroup := ""
	if sets, err := n.AttachmentSets("cgroup"); err == nil {
		for _, s := range sets {
			if s.Name == cgroupSet {
				cgroup = s.Cgroup
			}
		}
	}
	if cgroup == "" {
		if cgroup, err = attach.ResolveCgroup("", n.StateDir()); err != nil {
			return err
		}
	}
	return Ready(n, cgroup)
}
