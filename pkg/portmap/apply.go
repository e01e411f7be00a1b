package portmap

import (
	"errors"
	"fmt"
	"net"
	"sort"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
	"github.com/ebpf-cni/ebpf-cni/pkg/rtnl"
	"github.com/ebpf-cni/ebpf-cni/pkg/uplink"
)

// ErrConflict means a published port is held by another pod.
var ErrConflict = errors.New("hostPort is held by another pod")

// tables are the maps hostPort writes.
type tables struct {
	ports, addrs, config *ebpf.Map
}

// tablesOf opens the maps through the call's node (which closes them).
func tablesOf(n *node.Node) (*tables, error) {
	t := &tables{}
	for _, x := range []struct {
		m    **ebpf.Map
		name string
	}{{&t.ports, maps.CniMapHostports}, {&t.addrs, maps.CniMapNodeAddrs}, {&t.config, maps.CniMapHostportConfig}} {
		m, err := n.Map(x.name)
		if err != nil {
			return nil, fmt.Errorf("opening the hostPort maps: %w", err)
		}
		*x.m = m
	}
	return t, nil
}

// lock serialises the read-modify-write of hostports entries between ADDs
// and DELs (the node lock is shared among them).
func lock(n *node.Node) (func(), error) {
	l, err := n.Lock("hostports")
	if err != nil {
		return nil, err
	}
	return l.Unlock, nil
}

func be16(p uint16) uint16 { return p>>8 | p<<8 } // network byte order as the map holds it

func key(hp HostPort) maps.CniHostportKey {
	return maps.CniHostportKey{Family: maps.Family(net.ParseIP(hp.PodIP)), Proto: protocols[hp.Proto], Port: be16(hp.HostPort)}
}

func target(hp HostPort) maps.CniHostportTarget {
	return maps.CniHostportTarget{Addr: maps.Addr16(net.ParseIP(hp.PodIP)), Port: be16(hp.ContainerPort)}
}

// Owner names the pod behind a pod address, for clash messages.
type Owner func(podIP net.IP) string

// claim adds hp to the entry e; the error says who holds the port.
func claim(e *maps.CniHostportEntry, hp HostPort, owner Owner) error {
	t := target(hp)
	held := func(i int) error {
		if e.To[i].Addr == t.Addr {
			return nil // this pod's address: a retried ADD, or a stale entry of a gone pod
		}
		ip := maps.IP(maps.Family(net.ParseIP(hp.PodIP)), e.To[i].Addr)
		return fmt.Errorf("%w: %s port %d%s is published by %s (%s:%d)", ErrConflict, hp.Proto, hp.HostPort, on(e, i, hp),
			owner(ip), ip, be16(e.To[i].Port))
	}
	if hp.HostIP == "" {
		for i := 0; i < int(e.N); i++ {
			if err := held(i); err != nil {
				return err
			}
		}
		*e = maps.CniHostportEntry{Any: 1, N: 1}
		e.To[0] = t
		return nil
	}
	h := maps.Addr16(net.ParseIP(hp.HostIP))
	if e.Any == 1 {
		if err := held(0); err != nil {
			return err
		}
		*e = maps.CniHostportEntry{}
	}
	for i := 0; i < int(e.N); i++ {
		if e.HostIp[i] == h {
			if err := held(i); err != nil {
				return err
			}
			e.To[i] = t
			return nil
		}
	}
	if int(e.N) == len(e.To) {
		return fmt.Errorf("%w: %s port %d is already published on %d host IPs, the most one port can have", ErrConflict, hp.Proto, hp.HostPort, len(e.To))
	}
	e.HostIp[e.N] = h
	e.To[e.N] = t
	e.N++
	return nil
}

func on(e *maps.CniHostportEntry, i int, hp HostPort) string {
	if e.Any == 1 {
		return " (every node address)"
	}
	return " on " + maps.IP(maps.Family(net.ParseIP(hp.PodIP)), e.HostIp[i]).String()
}

// release removes hp's target from e; it reports whether e is empty now.
func release(e *maps.CniHostportEntry, hp HostPort) bool {
	t := target(hp)
	var h [16]uint8
	if hp.HostIP != "" {
		h = maps.Addr16(net.ParseIP(hp.HostIP))
	}
	out := maps.CniHostportEntry{Any: e.Any}
	for i := 0; i < int(e.N) && i < len(e.To); i++ {
		if e.To[i] == t && (e.Any == 1 || e.HostIp[i] == h) {
			continue
		}
		out.HostIp[out.N] = e.HostIp[i]
		out.To[out.N] = e.To[i]
		out.N++
	}
	if out.N == 0 {
		out.Any = 0
	}
	*e = out
	return out.N == 0
}

// Publish writes the pod's ports into hostports, refusing every port held
// by another pod; all or nothing.
func Publish(n *node.Node, ports []HostPort, owner Owner) error {
	unlock, err := lock(n)
	if err != nil {
		return err
	}
	defer unlock()
	t, err := tablesOf(n)
	if err != nil {
		return err
	}
	var done []HostPort
	for _, hp := range ports {
		k := key(hp)
		var e maps.CniHostportEntry
		if err := t.ports.Lookup(&k, &e); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			err = fmt.Errorf("reading hostports: %w", err)
			return errors.Join(err, unpublish(t, done))
		}
		if err := claim(&e, hp, owner); err != nil {
			return errors.Join(err, unpublish(t, done))
		}
		if err := t.ports.Put(&k, &e); err != nil {
			err = fmt.Errorf("writing hostports: %w", err)
			return errors.Join(err, unpublish(t, done))
		}
		done = append(done, hp)
	}
	return nil
}

// Unpublish removes the pod's ports from hostports; idempotent.
func Unpublish(n *node.Node, ports []HostPort) error {
	if len(ports) == 0 {
		return nil
	}
	unlock, err := lock(n)
	if err != nil {
		return err
	}
	defer unlock()
	t, err := tablesOf(n)
	if err != nil {
		return err
	}
	return unpublish(t, ports)
}

func unpublish(t *tables, ports []HostPort) error {
	var errs []error
	for _, hp := range ports {
		k := key(hp)
		var e maps.CniHostportEntry
		if err := t.ports.Lookup(&k, &e); err != nil {
			if !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		if release(&e, hp) {
			if err := t.ports.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, err)
			}
		} else if err := t.ports.Put(&k, &e); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Ready makes the node serve published ports: its addresses and netns in
// the maps, the socket hooks on the cgroup. The uplinks are the caller's
// (uplink.Ensure). Idempotent; every ADD with port mappings calls it, so
// address changes apply.
func Ready(n *node.Node, cgroup string) error {
	t, err := tablesOf(n)
	if err != nil {
		return err
	}
	if err := syncNodeAddrs(t.addrs); err != nil {
		return err
	}
	cookie, err := node.NetnsCookie()
	if err != nil {
		return err
	}
	if err := t.config.Put(uint32(0), &maps.CniHostportSettings{NetnsCookie: cookie, Active: 1}); err != nil {
		return fmt.Errorf("writing hostport_config: %w", err)
	}
	unlock, err := lock(n)
	if err != nil {
		return err
	}
	defer unlock()
	return feature.AttachCgroup(n, cgroupSet, cgroup, SockHooks)
}

// syncNodeAddrs makes node_addrs exactly the node's global addresses.
func syncNodeAddrs(m *ebpf.Map) error {
	addrs, err := rtnl.GlobalAddrs(unix.AF_UNSPEC)
	if err != nil {
		return err
	}
	want := map[maps.CniEndpointKey]uint32{}
	for _, a := range addrs {
		if a.IP.IsLoopback() {
			continue
		}
		want[maps.EndpointKey(a.IP)] = uint32(a.LinkIndex)
	}
	for k, v := range want {
		if err := m.Put(&k, &v); err != nil {
			return fmt.Errorf("writing node_addrs: %w", err)
		}
	}
	if err := maps.DeleteWhere[maps.CniEndpointKey, uint32](m, func(k maps.CniEndpointKey) bool { _, ok := want[k]; return !ok }); err != nil {
		return fmt.Errorf("deleting stale node_addrs: %w", err)
	}
	return nil
}

// Teardown takes hostPort off the node once it has no endpoint left: the
// socket hooks off the cgroup, the maps empty, the uplinks released.
// Idempotent.
func Teardown(n *node.Node) error {
	errs := []error{feature.DetachCgroup(n, cgroupSet, SockHooks), uplink.Release(n)}
	if n.CheckBPFFS() != nil {
		return errors.Join(errs...)
	}
	if m, err := n.PinnedMap(maps.CniMapHostportConfig); err != nil || m != nil {
		if err == nil {
			err = m.Put(uint32(0), &maps.CniHostportSettings{})
		}
		errs = append(errs, err)
	}
	for _, name := range []string{maps.CniMapHostports, maps.CniMapNodeAddrs} {
		m, err := n.PinnedMap(name)
		if err == nil && m != nil {
			err = maps.Clear(m)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Problems names what is wrong with the pod's published ports, for CHECK.
func Problems(n *node.Node, ports []HostPort, progs *programs.Set) []string {
	t, err := tablesOf(n)
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, hp := range ports {
		k := key(hp)
		var e maps.CniHostportEntry
		if err := t.ports.Lookup(&k, &e); err != nil {
			out = append(out, fmt.Sprintf("%s port %d is not published", hp.Proto, hp.HostPort))
			continue
		}
		if !published(&e, hp) {
			out = append(out, fmt.Sprintf("%s port %d does not lead to %s:%d", hp.Proto, hp.HostPort, hp.PodIP, hp.ContainerPort))
		}
	}
	var c maps.CniHostportSettings
	if err := t.config.Lookup(uint32(0), &c); err != nil || c.Active == 0 {
		out = append(out, "hostPort is not active on the node (hostport_config)")
	}
	if !feature.CgroupAttached(n, progs, SockHooks) {
		out = append(out, "the hostPort socket hooks are not attached to the cgroup: the node cannot reach published ports")
	}
	return out
}

func published(e *maps.CniHostportEntry, hp HostPort) bool {
	t := target(hp)
	if hp.HostIP == "" {
		return e.Any == 1 && e.To[0] == t
	}
	h := maps.Addr16(net.ParseIP(hp.HostIP))
	for i := 0; i < int(e.N) && i < len(e.To); i++ {
		if e.Any == 0 && e.HostIp[i] == h && e.To[i] == t {
			return true
		}
	}
	return false
}

// Published is one row of the hostports map, for people.
type Published struct {
	Proto         string `json:"protocol"`
	HostIP        string `json:"hostIP"` // "*" for every node address
	HostPort      uint16 `json:"hostPort"`
	PodIP         string `json:"podIP"`
	ContainerPort uint16 `json:"containerPort"`
}

var protoNames = map[uint8]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp", unix.IPPROTO_SCTP: "sctp"}

// List reads every published port from the map m (hostports).
func List(m *ebpf.Map) ([]Published, error) {
	var out []Published
	var k maps.CniHostportKey
	var e maps.CniHostportEntry
	it := m.Iterate()
	for it.Next(&k, &e) {
		for i := 0; i < int(e.N) && i < len(e.To); i++ {
			ip := func(a [16]uint8) string { return maps.IP(k.Family, a).String() }
			p := Published{Proto: protoNames[k.Proto], HostIP: "*", HostPort: be16(k.Port), PodIP: ip(e.To[i].Addr), ContainerPort: be16(e.To[i].Port)}
			if e.Any == 0 {
				p.HostIP = ip(e.HostIp[i])
			}
			out = append(out, p)
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading hostports: %w", err)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].HostPort != out[j].HostPort {
			return out[i].HostPort < out[j].HostPort
		}
		if out[i].Proto != out[j].Proto {
			return out[i].Proto < out[j].Proto
		}
		return out[i].HostIP < out[j].HostIP
	})
	return out, nil
}

// GC removes published ports whose pod address is not live; with dryRun
// it only lists them.
func GC(n *node.Node, live func(net.IP) bool, dryRun bool) ([]string, error) {
	m, err := n.PinnedMap(maps.CniMapHostports)
	if err != nil || m == nil {
		return nil, err
	}
	unlock, err := lock(n)
	if err != nil {
		return nil, err
	}
	defer unlock()
	t, err := tablesOf(n)
	if err != nil {
		return nil, err
	}
	all, err := List(t.ports)
	if err != nil {
		return nil, err
	}
	var dead []HostPort
	var found []string
	for _, p := range all {
		if !live(net.ParseIP(p.PodIP)) {
			hp := HostPort{Proto: p.Proto, HostPort: p.HostPort, PodIP: p.PodIP, ContainerPort: p.ContainerPort}
			if p.HostIP != "*" {
				hp.HostIP = p.HostIP
			}
			dead = append(dead, hp)
			found = append(found, fmt.Sprintf("%s[%s %s:%d] (pod %s:%d)", maps.CniMapHostports, p.Proto, p.HostIP, p.HostPort, p.PodIP, p.ContainerPort))
		}
	}
	if dryRun {
		return found, nil
	}
	return found, unpublish(t, dead)
}
