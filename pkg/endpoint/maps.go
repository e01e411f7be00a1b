package endpoint

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/rtnl"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// ErrEndpointConflict means an address is already mapped to another live
// endpoint of the node.
var ErrEndpointConflict = errors.New("address belongs to another endpoint")

// Entry is a pod as the programs see it.
type Entry struct {
	HostIfIndex int
	HostMAC     net.HardwareAddr
	MAC         net.HardwareAddr
	IPs         []net.IP
	ContainerID string
	IfName      string
	// NetID is the network's key (maps.NetID): its masquerade settings.
	NetID uint32
	// Flags say which features the pod uses (enum endpoint_flags).
	Flags uint32
	// Pod is its Kubernetes identity (endpoint_pods); nil: none.
	Pod *Pod
}

// Pod is who a pod is in Kubernetes (endpoint_pods).
type Pod = node.Pod

// Maps are the pinned endpoint maps.
type Maps struct {
	Endpoints *ebpf.Map // endpoint_key -> endpoint_info
	Devs      *ebpf.Map // host ifindex -> endpoint_dev
	Pods      *ebpf.Map // host ifindex -> endpoint_pod
}

// MapsOf are the endpoint maps of the call's node (the node closes them).
func MapsOf(n *node.Node) (*Maps, error) {
	e, err := n.Map(maps.CniMapEndpoints)
	if err != nil {
		return nil, fmt.Errorf("opening endpoint maps: %w", err)
	}
	d, err := n.Map(maps.CniMapEndpointDevs)
	if err != nil {
		return nil, fmt.Errorf("opening endpoint maps: %w", err)
	}
	p, err := n.Map(maps.CniMapEndpointPods)
	if err != nil {
		return nil, fmt.Errorf("opening endpoint maps: %w", err)
	}
	return &Maps{Endpoints: e, Devs: d, Pods: p}, nil
}

func podValue(p *Pod) maps.CniEndpointPod {
	var v maps.CniEndpointPod
	maps.CString(v.Namespace[:], p.Namespace)
	maps.CString(v.Name[:], p.Name)
	maps.CString(v.Uid[:], p.UID)
	return v
}

// ReadPods reads endpoint_pods: host ifindex -> the pod behind it. Entries
// deleted while it iterates are left out.
func ReadPods(m *ebpf.Map) (map[uint32]Pod, error) {
	out := map[uint32]Pod{}
	var k uint32
	var v maps.CniEndpointPod
	it := m.Iterate()
	for it.Next(&k, &v) {
		out[k] = Pod{Namespace: maps.GoString(v.Namespace[:]), Name: maps.GoString(v.Name[:]), UID: maps.GoString(v.Uid[:])}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterating %s: %w", maps.CniMapEndpointPods, err)
	}
	return out, nil
}

func (e *Entry) info() maps.CniEndpointInfo {
	v := maps.CniEndpointInfo{Ifindex: uint32(e.HostIfIndex), NetId: e.NetID, Flags: e.Flags}
	copy(v.Mac[:], e.MAC)
	copy(v.HostMac[:], e.HostMAC)
	return v
}

func (e *Entry) dev() (maps.CniEndpointDev, error) {
	d := maps.CniEndpointDev{Flags: uint16(e.Flags)}
	copy(d.Mac[:], e.MAC)
	copy(d.HostMac[:], e.HostMAC)
	for _, ip := range e.IPs {
		if v4 := ip.To4(); v4 != nil {
			if int(d.N_ip4) == len(d.Ip4) {
				return d, fmt.Errorf("more than %d IPv4 addresses", len(d.Ip4))
			}
			d.Ip4[d.N_ip4] = binary.NativeEndian.Uint32(v4) // stays in network byte order in memory
			d.N_ip4++
		} else {
			if int(d.N_ip6) == len(d.Ip6) {
				return d, fmt.Errorf("more than %d IPv6 addresses", len(d.Ip6))
			}
			copy(d.Ip6[d.N_ip6][:], ip.To16())
			d.N_ip6++
		}
	}
	maps.CString(d.ContainerId[:], e.ContainerID)
	maps.CString(d.Ifname[:], e.IfName)
	return d, nil
}

// Put adds the endpoint: its device entry first, then one entry per address,
// so the program never finds an address whose device it cannot check. An
// address held by another live endpoint is a conflict; a stale entry (its
// device has no entry any more) is overwritten.
func (m *Maps) Put(e *Entry) error {
	d, err := e.dev()
	if err != nil {
		return fmt.Errorf("endpoint %s: %w", e.ContainerID, err)
	}
	for _, ip := range e.IPs {
		var cur maps.CniEndpointInfo
		k := maps.EndpointKey(ip)
		if err := m.Endpoints.Lookup(&k, &cur); err == nil && int(cur.Ifindex) != e.HostIfIndex {
			var other maps.CniEndpointDev
			if m.Devs.Lookup(cur.Ifindex, &other) == nil {
				return fmt.Errorf("%s is mapped to ifindex %d (container %s): %w", ip, cur.Ifindex, maps.GoString(other.ContainerId[:]), ErrEndpointConflict)
			}
		}
	}
	if e.Pod != nil {
		v := podValue(e.Pod)
		if err := m.Pods.Put(uint32(e.HostIfIndex), &v); err != nil {
			return fmt.Errorf("writing %s[%d]: %w", maps.CniMapEndpointPods, e.HostIfIndex, err)
		}
	}
	if err := m.Devs.Put(uint32(e.HostIfIndex), &d); err != nil {
		return fmt.Errorf("writing endpoint_devs[%d]: %w", e.HostIfIndex, err)
	}
	v := e.info()
	for _, ip := range e.IPs {
		k := maps.EndpointKey(ip)
		if err := m.Endpoints.Put(&k, &v); err != nil {
			return fmt.Errorf("writing endpoints[%s]: %w", ip, err)
		}
	}
	// Once more after the addresses: from_container keeps in the device
	// entry a copy of the EP_F_QDISC it set on them (bpf/lib/qdisc.h); one
	// set between the two writes goes back to unset with this one, and the
	// pod's next packet sets the address entries' marks again.
	if err := m.Devs.Put(uint32(e.HostIfIndex), &d); err != nil {
		return fmt.Errorf("writing endpoint_devs[%d]: %w", e.HostIfIndex, err)
	}
	return nil
}

// HasAddrs reports whether endpoints maps every one of ips to the host
// end ifindex. A bpffs loss can take endpoints and keep endpoint_devs: the
// maps a surviving program (to_container's tc filter) holds are rescued,
// those only another one held (a netkit pod's from_netkit, whose link died
// with its pin) are new and empty.
func (m *Maps) HasAddrs(ifindex int, ips []net.IP) bool {
	for _, ip := range ips {
		var cur maps.CniEndpointInfo
		k := maps.EndpointKey(ip)
		if m.Endpoints.Lookup(&k, &cur) != nil || int(cur.Ifindex) != ifindex {
			return false
		}
	}
	return true
}

// Delete removes what Put wrote, but only entries that still point at this
// endpoint (ifindex and host MAC): after a first DEL the address may already
// belong to a new pod. Idempotent.
func (m *Maps) Delete(ifindex int, hostMAC net.HardwareAddr, ips []net.IP) error {
	var errs []error
	for _, ip := range ips {
		var cur maps.CniEndpointInfo
		k := maps.EndpointKey(ip)
		if err := m.Endpoints.Lookup(&k, &cur); err != nil {
			continue
		}
		if int(cur.Ifindex) != ifindex || !bytes.Equal(cur.HostMac[:], hostMAC) {
			continue
		}
		if err := m.Endpoints.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("deleting endpoints[%s]: %w", ip, err))
		}
	}
	var d maps.CniEndpointDev
	err := m.Devs.Lookup(uint32(ifindex), &d)
	if err == nil && bytes.Equal(d.HostMac[:], hostMAC) {
		if err := m.Devs.Delete(uint32(ifindex)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("deleting endpoint_devs[%d]: %w", ifindex, err))
		}
	}
	// The pod's identity goes with its device entry, or without one (an
	// ADD that failed between the two writes): a device entry of another
	// host MAC is a new pod's, and so is the identity.
	if (err == nil && bytes.Equal(d.HostMac[:], hostMAC)) || errors.Is(err, ebpf.ErrKeyNotExist) {
		if err := m.DeletePod(ifindex); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// DeletePod removes the endpoint_pods entry of a host ifindex. Idempotent.
func (m *Maps) DeletePod(ifindex int) error {
	if err := m.Pods.Delete(uint32(ifindex)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("deleting %s[%d]: %w", maps.CniMapEndpointPods, ifindex, err)
	}
	return nil
}

// Check names every difference between the maps and e.
func (m *Maps) Check(e *Entry) []string {
	var problems []string
	var d maps.CniEndpointDev
	if err := m.Devs.Lookup(uint32(e.HostIfIndex), &d); err != nil {
		problems = append(problems, fmt.Sprintf("no endpoint_devs entry for ifindex %d", e.HostIfIndex))
	} else {
		if !bytes.Equal(d.Mac[:], e.MAC) {
			problems = append(problems, fmt.Sprintf("endpoint_devs[%d] has MAC %s, want %s", e.HostIfIndex, net.HardwareAddr(d.Mac[:]), e.MAC))
		}
		if !bytes.Equal(d.HostMac[:], e.HostMAC) {
			problems = append(problems, fmt.Sprintf("endpoint_devs[%d] has host MAC %s, want %s", e.HostIfIndex, net.HardwareAddr(d.HostMac[:]), e.HostMAC))
		}
	}
	for _, ip := range e.IPs {
		var cur maps.CniEndpointInfo
		k := maps.EndpointKey(ip)
		if err := m.Endpoints.Lookup(&k, &cur); err != nil {
			problems = append(problems, fmt.Sprintf("no endpoints entry for %s", ip))
			continue
		}
		if int(cur.Ifindex) != e.HostIfIndex || !bytes.Equal(cur.Mac[:], e.MAC) {
			problems = append(problems, fmt.Sprintf("endpoints[%s] points at ifindex %d MAC %s, want %d MAC %s", ip, cur.Ifindex, net.HardwareAddr(cur.Mac[:]), e.HostIfIndex, e.MAC))
		}
	}
	return problems
}

// DevEntry is one device entry, for GC and dumps.
type DevEntry struct {
	IfIndex int
	Dev     maps.CniEndpointDev
}

// Devices lists the device entries.
func (m *Maps) Devices() ([]DevEntry, error) {
	var out []DevEntry
	var k uint32
	var d maps.CniEndpointDev
	it := m.Devs.Iterate()
	for it.Next(&k, &d) {
		out = append(out, DevEntry{IfIndex: int(k), Dev: d})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterating endpoint_devs: %w", err)
	}
	return out, nil
}

// Addresses lists the address entries.
func (m *Maps) Addresses() (map[string]maps.CniEndpointInfo, error) {
	out := map[string]maps.CniEndpointInfo{}
	var k maps.CniEndpointKey
	var v maps.CniEndpointInfo
	it := m.Endpoints.Iterate()
	for it.Next(&k, &v) {
		out[maps.IP(k.Family, k.Addr).String()] = v
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterating endpoints: %w", err)
	}
	return out, nil
}

// Orphan is an endpoint whose entries are in the maps while its host veth
// is not in this network namespace: a pod gone without DEL whose record
// went too (a lost stateDir), or, outside the node's netns, any pod.
type Orphan struct {
	IfIndex     int
	ContainerID string // as endpoint_devs holds it (maps.Fit)
	IfName      string
	NetID       uint32 // from its first address's endpoints entry; 0 when it has none
	IPs         []net.IP
}

// Orphans lists the endpoint_devs entries whose host veth is not in this
// network namespace. present names the host veths of ebpf-cni that are
// (veth.Candidates: names only, as a node in order costs no more); an
// entry whose veth name is not among them is looked up by its ifindex and
// host MAC too, since a container ID cut to fit the map names no veth.
func Orphans(n *node.Node, present map[string]bool) ([]Orphan, error) {
	devs, err := n.PinnedMap(maps.CniMapEndpointDevs)
	if err != nil || devs == nil {
		return nil, err
	}
	var out []Orphan
	known := map[int]int{} // ifindex -> its orphan's index, or -1: alive
	err = maps.Walk(devs, func(k *uint32, d *maps.CniEndpointDev) {
		cid, ifName := maps.GoString(d.ContainerId[:]), maps.GoString(d.Ifname[:])
		known[int(*k)] = -1
		if present[veth.HostName(cid, ifName)] {
			return
		}
		if l, err := rtnl.H().LinkByIndex(int(*k)); err == nil && bytes.Equal(l.Attrs().HardwareAddr, d.HostMac[:]) {
			return
		}
		known[int(*k)] = len(out)
		out = append(out, Orphan{IfIndex: int(*k), ContainerID: cid, IfName: ifName, IPs: maps.EndpointIPs(d)})
	})
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", maps.CniMapEndpointDevs, err)
	}
	eps, err := n.PinnedMap(maps.CniMapEndpoints)
	if err != nil || eps == nil {
		return out, err
	}
	// An address entry whose device has no endpoint_devs entry is an
	// orphan too (a bpffs remount rescues the maps the surviving programs
	// hold, which need not be both); whose it was, only a record could say.
	err = maps.Walk(eps, func(k *maps.CniEndpointKey, v *maps.CniEndpointInfo) {
		i, ok := known[int(v.Ifindex)]
		switch {
		case !ok:
			known[int(v.Ifindex)] = len(out)
			out = append(out, Orphan{IfIndex: int(v.Ifindex), NetID: v.NetId, IPs: []net.IP{maps.IP(k.Family, k.Addr)}})
		case i >= 0:
			if out[i].NetID == 0 {
				out[i].NetID = v.NetId
			}
			if out[i].ContainerID == "" { // known by its addresses alone
				out[i].IPs = append(out[i].IPs, maps.IP(k.Family, k.Addr))
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", maps.CniMapEndpoints, err)
	}
	return out, nil
}
