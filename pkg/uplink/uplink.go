// Package uplink gives the node's uplinks their programs (from_netdev,
// to_netdev) and addresses (the uplinks map): what masquerade and hostPort
// both need, since pod traffic leaves and outside clients arrive there. It
// is a building block of those features, not a feature: they ensure it
// with their pods and release it with the node's last endpoint.
package uplink

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/counters"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
	"github.com/ebpf-cni/ebpf-cni/pkg/rtnl"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// The hooks of an uplink.
var (
	// HookFromNetdev is an uplink's ingress: replies to masqueraded flows,
	// clients of published ports.
	HookFromNetdev = attach.Ingress("from_netdev", attach.Device)
	// HookToNetdev is an uplink's egress: pod traffic leaving the node.
	HookToNetdev = attach.Egress("to_netdev", attach.Device)
	// Hooks is every hook an uplink gets, in attach order.
	Hooks = []attach.Hook{HookFromNetdev, HookToNetdev}
)

// Objects are the uplink programs, for the features that use uplinks.
func Objects() []programs.Object {
	return []programs.Object{
		{Name: "from_netdev", Bytes: _FromNetdevBytes, Load: LoadFromNetdev, Hooks: []attach.Hook{HookFromNetdev}},
		{Name: "to_netdev", Bytes: _ToNetdevBytes, Load: LoadToNetdev, Hooks: []attach.Hook{HookToNetdev}},
	}
}

// owner groups the uplinks' attachment sets (one per device).
const owner = "uplinks"

// Dir is where the pinned links of an uplink live.
func Dir(n *node.Node, ifName string) string { return n.PinPath("uplinks", maps.PinName(ifName)) }

// Config is the uplinks key, which masquerade and hostPort share.
type Config struct {
	Uplinks []string `json:"uplinks,omitempty"`
}

// Validate checks the names; the error names the bad one.
func (c *Config) Validate() error {
	for i, u := range c.Uplinks {
		if u == "" || len(u) > 15 || strings.ContainsAny(u, "/ ") {
			return config.Invalid(fmt.Sprintf("uplinks[%d]", i), "%q is not an interface name", u)
		}
	}
	return nil
}

// Uplink is a device pod traffic leaves the node through, and the addresses
// it masquerades with.
type Uplink struct {
	Link     netlink.Link
	IP4, IP6 net.IP
}

// Find resolves the configured names or, without any, the devices of the
// node's default routes.
func Find(names []string) ([]Uplink, error) {
	var links []netlink.Link
	for i, n := range names {
		key := fmt.Sprintf("uplinks[%d]", i)
		l, err := rtnl.H().LinkByName(n)
		if err != nil {
			return nil, config.Invalid(key, "no interface %q on the node: %v", n, err)
		}
		if what := ours(l); what != "" {
			return nil, config.Invalid(key, "%q is %s, not a device of the node: name the device pod traffic leaves the node through", n, what)
		}
		links = append(links, l)
	}
	if len(names) == 0 {
		seen := map[int]bool{}
		for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
			routes, err := rtnl.DefaultRoutes(fam)
			if err != nil {
				return nil, err
			}
			for _, r := range routes {
				for _, i := range r.Links {
					if seen[i] {
						continue
					}
					seen[i] = true
					l, err := rtnl.H().LinkByIndex(i)
					if err != nil {
						return nil, fmt.Errorf("default route device %d: %w", i, err)
					}
					links = append(links, l)
				}
			}
		}
		if len(links) == 0 {
			return nil, config.Invalid("uplinks", "the node has no default route to find its uplink by: name the uplinks")
		}
	}
	out := make([]Uplink, 0, len(links))
	for _, l := range links {
		u := Uplink{Link: l}
		// Both families in one dump: the kernel lists IPv4's first.
		addrs, err := rtnl.LinkAddrs(l.Attrs().Index, unix.AF_UNSPEC)
		if err != nil {
			return nil, fmt.Errorf("listing addresses of %s: %w", l.Attrs().Name, err)
		}
		for _, a := range addrs {
			if a.Scope != unix.RT_SCOPE_UNIVERSE || a.Flags&(unix.IFA_F_SECONDARY|unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED|unix.IFA_F_DEPRECATED) != 0 {
				continue
			}
			if a.Family == unix.AF_INET && u.IP4 == nil {
				u.IP4 = a.IP.To4()
			} else if a.Family == unix.AF_INET6 && u.IP6 == nil {
				u.IP6 = a.IP.To16()
			}
		}
		out = append(out, u)
	}
	return out, nil
}

// ours says what l is when ebpf-cni made it ("" when it did not): a pod's
// host veth or the cluster's VXLAN device. Neither is an uplink: the
// uplink programs there would translate a pod's own traffic, stay on a
// pod's veth (tcx) after its DEL, or clash with its programs (tc).
func ours(l netlink.Link) string {
	if veth.IsOurs(l) {
		if o, ok := veth.Owner(l); ok {
			return fmt.Sprintf("the host veth of pod %s/%s", o.ContainerID, o.IfName)
		}
		return "a pod's host veth"
	}
	if veth.Marked(l) {
		return fmt.Sprintf("a device of ebpf-cni's own (alias %q)", l.Attrs().Alias)
	}
	return ""
}

// Ensure gives the uplinks their programs unless these already run there,
// and writes their addresses into the uplinks map. Idempotent; every ADD
// that needs uplinks calls it, so address changes apply.
func Ensure(n *node.Node, ups []Uplink, mode attach.Mode) error {
	progs, err := n.Programs()
	if err != nil {
		return err
	}
	m, err := n.Map(maps.CniMapUplinks)
	if err != nil {
		return err
	}
	// Two ADDs must not both attach (tcx would run both programs).
	l, err := n.Lock("uplinks")
	if err != nil {
		return err
	}
	defer l.Unlock()
	for _, u := range ups {
		if err := ensure(n, u, mode, progs); err != nil {
			return err
		}
		info := maps.CniUplinkInfo{}
		if u.IP4 != nil {
			copy(info.Ip4[:], u.IP4)
			info.Has4 = 1
		}
		if u.IP6 != nil {
			copy(info.Ip6[:], u.IP6)
			info.Has6 = 1
		}
		if err := m.Put(uint32(u.Link.Attrs().Index), &info); err != nil {
			return fmt.Errorf("writing uplinks[%s]: %w", u.Link.Attrs().Name, err)
		}
	}
	return nil
}

// ensure attaches the uplink programs unless they already run there.
func ensure(n *node.Node, u Uplink, mode attach.Mode, progs *programs.Set) error {
	name := u.Link.Attrs().Name
	if attached(u.Link, progs) {
		return nil
	}
	// Whatever an earlier attach left (the device was recreated, or a link
	// was removed by hand) goes first.
	if err := detach(n, name); err != nil {
		return err
	}
	set := &node.AttachmentSet{Owner: owner, Name: name, IfIndex: u.Link.Attrs().Index}
	for _, h := range Hooks {
		prog, err := progs.Prog(h.Name)
		var a attach.Attachment
		if err == nil {
			a, err = attach.Attach(mode, u.Link, h, prog, Dir(n, name))
		}
		if err != nil {
			for _, done := range set.Attachments {
				_ = attach.DetachNow(done, set.IfIndex, hook(done.Hook))
			}
			_ = os.RemoveAll(Dir(n, name))
			return fmt.Errorf("attaching %s to uplink %s: %w", h.Name, name, err)
		}
		set.Attachments = append(set.Attachments, a)
	}
	return n.SaveAttachments(set)
}

// attached reports whether every uplink program of progs runs on l.
func attached(l netlink.Link, progs *programs.Set) bool {
	return attach.HooksAttached(l, Hooks, progs.IDsOf(Hooks))
}

// Problems names what is missing for the uplinks on the node, for CHECK;
// what names the feature that needs them.
func Problems(n *node.Node, what string) []string {
	sets, err := n.AttachmentSets(owner)
	if err != nil {
		return []string{err.Error()}
	}
	if len(sets) == 0 {
		return []string{fmt.Sprintf("%s is on but no uplink carries the masquerade programs", what)}
	}
	progs, err := n.PinnedPrograms()
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, s := range sets {
		l, err := rtnl.H().LinkByIndex(s.IfIndex)
		if err != nil || l.Attrs().Name != s.Name {
			out = append(out, fmt.Sprintf("uplink %s (ifindex %d) is gone", s.Name, s.IfIndex))
			continue
		}
		if !attached(l, progs) {
			out = append(out, fmt.Sprintf("the masquerade programs are not attached to uplink %s", s.Name))
		}
	}
	return out
}

// detach removes the programs recorded for an uplink; idempotent.
func detach(n *node.Node, name string) error {
	sets, err := n.AttachmentSets(owner)
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range sets {
		if s.Name != name {
			continue
		}
		for _, a := range s.Attachments {
			if err := attach.DetachNow(a, s.IfIndex, hook(a.Hook)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	if err := os.RemoveAll(Dir(n, name)); err != nil {
		errs = append(errs, fmt.Errorf("unpinning links of uplink %s: %w", name, err))
	}
	if len(errs) == 0 {
		errs = append(errs, n.RemoveAttachments(owner, name))
	}
	return errors.Join(errs...)
}

// Release takes the programs off every uplink and empties the uplinks map,
// once no feature needs them (the node's last endpoint is gone).
// Idempotent.
func Release(n *node.Node) error {
	l, err := n.Lock("uplinks")
	if err != nil {
		return err
	}
	defer l.Unlock()
	sets, err := n.AttachmentSets(owner)
	if err != nil {
		return err
	}
	var errs []error
	done := map[int]bool{}
	for _, s := range sets {
		errs = append(errs, detach(n, s.Name))
		done[s.IfIndex] = true
	}
	if n.CheckBPFFS() != nil {
		return errors.Join(errs...)
	}
	m, err := n.PinnedMap(maps.CniMapUplinks)
	if err == nil && m != nil {
		// The records are a cache: an uplink the map knows and no record
		// does (a wiped stateDir) loses its programs too.
		errs = append(errs, detachUnrecorded(n, m, done))
		err = maps.Clear(m)
	}
	errs = append(errs, err)
	// The programs counted the uplinks' packets per device too: with them
	// gone, so are those counters (nothing counts there any more).
	if d, err := counters.OpenDevices(n.PinnedMap); err != nil {
		errs = append(errs, err)
	} else {
		for _, s := range sets {
			errs = append(errs, d.Delete(s.IfIndex))
		}
	}
	return errors.Join(errs...)
}

// Rebuild records the uplinks that carry our programs but have no
// attachment record (a wiped stateDir): the uplinks map knows them by
// ifindex, the kernel knows what runs there. Idempotent.
func Rebuild(n *node.Node) error {
	m, err := n.PinnedMap(maps.CniMapUplinks)
	if err != nil || m == nil {
		return err
	}
	sets, err := n.AttachmentSets(owner)
	if err != nil {
		return err
	}
	known := map[int]bool{}
	for _, s := range sets {
		known[s.IfIndex] = true
	}
	return unrecorded(n, m, known, func(l netlink.Link, seen []attach.Attachment) error {
		idx := l.Attrs().Index
		var errs []error
		// The programs were loaded again before this record existed (a
		// bpffs remounted too): move the uplink to them.
		if progs, err := n.Programs(); err == nil && !attached(l, progs) {
			for _, a := range seen {
				if prog, err := progs.Prog(a.Hook); err == nil {
					errs = append(errs, attach.Replace(a, idx, hook(a.Hook), prog))
				}
			}
		}
		if len(seen) > 0 {
			errs = append(errs, n.SaveAttachments(&node.AttachmentSet{Owner: owner, Name: l.Attrs().Name, IfIndex: idx, Attachments: seen}))
		}
		return errors.Join(errs...)
	})
}

// detachUnrecorded takes our programs off the uplinks in the uplinks map
// (keyed by ifindex) that no attachment record names.
func detachUnrecorded(n *node.Node, m *ebpf.Map, done map[int]bool) error {
	return unrecorded(n, m, done, func(l netlink.Link, seen []attach.Attachment) error {
		var errs []error
		for _, a := range seen {
			if err := attach.DetachNow(a, l.Attrs().Index, hook(a.Hook)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		return errors.Join(append(errs, os.RemoveAll(Dir(n, l.Attrs().Name)))...)
	})
}

// unrecorded calls f for each device of the uplinks map m that known does
// not name and that still exists, with the attachments of our hooks the
// kernel shows on it.
func unrecorded(n *node.Node, m *ebpf.Map, known map[int]bool, f func(netlink.Link, []attach.Attachment) error) error {
	var idx uint32
	var info maps.CniUplinkInfo
	var errs []error
	it := m.Iterate()
	for it.Next(&idx, &info) {
		if known[int(idx)] {
			continue
		}
		l, err := rtnl.H().LinkByIndex(int(idx))
		if err != nil {
			continue // the device is gone, and its programs with it
		}
		var seen []attach.Attachment
		for _, h := range Hooks {
			if a, ok := attach.Observed(l, h, Dir(n, l.Attrs().Name)); ok {
				seen = append(seen, a)
			}
		}
		errs = append(errs, f(l, seen))
	}
	return errors.Join(append(errs, it.Err())...)
}

func hook(name string) attach.Hook { return attach.Find(Hooks, name) }
