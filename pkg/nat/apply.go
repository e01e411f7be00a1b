package nat

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// Uplink is a device pod traffic leaves the node through, and the addresses
// it masquerades with.
type Uplink struct {
	Link     netlink.Link
	IP4, IP6 net.IP
}

// FindUplinks resolves the configured names or, without any, the devices of
// the node's default routes.
func FindUplinks(names []string) ([]Uplink, error) {
	var links []netlink.Link
	for i, n := range names {
		l, err := netlinksafe.LinkByName(n)
		if err != nil {
			return nil, &ConfigError{fmt.Sprintf("uplinks[%d]", i), fmt.Sprintf("no interface %q on the node: %v", n, err)}
		}
		links = append(links, l)
	}
	if len(names) == 0 {
		seen := map[int]bool{}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			routes, err := netlinksafe.RouteList(nil, fam)
			if err != nil {
				return nil, fmt.Errorf("listing routes: %w", err)
			}
			for _, r := range routes {
				if r.Dst != nil {
					if ones, _ := r.Dst.Mask.Size(); ones != 0 {
						continue
					}
				}
				idx := []int{r.LinkIndex}
				for _, nh := range r.MultiPath {
					idx = append(idx, nh.LinkIndex)
				}
				for _, i := range idx {
					if i == 0 || seen[i] {
						continue
					}
					seen[i] = true
					l, err := netlink.LinkByIndex(i)
					if err != nil {
						return nil, fmt.Errorf("default route device %d: %w", i, err)
					}
					links = append(links, l)
				}
			}
		}
		if len(links) == 0 {
			return nil, &ConfigError{"uplinks", "the node has no default route to find its uplink by: name the uplinks"}
		}
	}
	out := make([]Uplink, 0, len(links))
	for _, l := range links {
		u := Uplink{Link: l}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			addrs, err := netlink.AddrList(l, fam)
			if err != nil {
				return nil, fmt.Errorf("listing addresses of %s: %w", l.Attrs().Name, err)
			}
			for _, a := range addrs {
				if a.Scope != unix.RT_SCOPE_UNIVERSE || a.Flags&(unix.IFA_F_SECONDARY|unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED|unix.IFA_F_DEPRECATED) != 0 {
					continue
				}
				if fam == netlink.FAMILY_V4 && u.IP4 == nil {
					u.IP4 = a.IP.To4()
				} else if fam == netlink.FAMILY_V6 && u.IP6 == nil {
					u.IP6 = a.IP.To16()
				}
			}
		}
		out = append(out, u)
	}
	return out, nil
}

// tables are the maps masquerade writes.
type tables struct {
	timeouts, nets, skip, uplinks, netNames *ebpf.Map
}

func openTables(bpfRoot string) (*tables, error) {
	m, err := maps.OpenPinned(bpfRoot, maps.CniMapNatTimeouts, maps.CniMapMasqNets, maps.CniMapMasqSkip, maps.CniMapUplinks, maps.CniMapIpamNets)
	if err != nil {
		return nil, fmt.Errorf("opening the masquerade maps: %w", err)
	}
	return &tables{m[maps.CniMapNatTimeouts], m[maps.CniMapMasqNets], m[maps.CniMapMasqSkip], m[maps.CniMapUplinks], m[maps.CniMapIpamNets]}, nil
}

func (t *tables) Close() {
	for _, m := range []*ebpf.Map{t.timeouts, t.nets, t.skip, t.uplinks, t.netNames} {
		m.Close()
	}
}

func skipKey(netID uint32, n *net.IPNet) maps.CniMasqSkipKey {
	ones, _ := n.Mask.Size()
	return maps.CniMasqSkipKey{Prefixlen: uint32(40 + ones), NetId: netID, Family: maps.Family(n.IP), Addr: maps.Addr16(n.IP.Mask(n.Mask))}
}

// uplinkLock serialises attaching programs to the uplinks: two ADDs must not
// both attach (tcx would run both programs).
func uplinkLock(stateDir string) (func(), error) {
	l, err := datapath.FileLock(filepath.Join(stateDir, "uplinks.lock"), true)
	if err != nil {
		return nil, err
	}
	return l.Unlock, nil
}

// Apply makes masquerade ready for a pod of network netName whose addresses
// lie in podNets: the uplinks carry the programs and know their addresses,
// and the network's settings are in the maps. It is idempotent; every ADD
// of a network with ipMasq calls it, so address or config changes apply.
func Apply(bpfRoot, stateDir, netName string, s *Settings, podNets []*net.IPNet, mode datapath.Mode, progs *datapath.Programs) error {
	ups, err := FindUplinks(s.Uplinks)
	if err != nil {
		return err
	}
	lo, hi, err := s.portRange()
	if err != nil {
		return err
	}
	t, err := openTables(bpfRoot)
	if err != nil {
		return err
	}
	defer t.Close()
	netID := maps.NetID(netName)
	if err := registerNet(t.netNames, netID, netName); err != nil {
		return err
	}

	if err := ensureUplinks(bpfRoot, stateDir, ups, t.uplinks, mode, progs); err != nil {
		return err
	}

	if err := t.timeouts.Put(uint32(0), &s.Timeouts); err != nil {
		return fmt.Errorf("writing nat_timeouts: %w", err)
	}
	fams := map[uint8]bool{}
	for _, n := range podNets {
		fams[maps.Family(n.IP)] = true
	}
	for fam := range fams {
		v := maps.CniMasqNet{PortMin: lo, PortMax: hi}
		if s.MasqueradeIP != nil && maps.Family(s.MasqueradeIP) == fam {
			v.Addr = maps.Addr16(s.MasqueradeIP)
		}
		k := maps.CniMasqNetKey{NetId: netID, Family: fam}
		if err := t.nets.Put(&k, &v); err != nil {
			return fmt.Errorf("writing masq_nets: %w", err)
		}
	}
	skip := s.Skip
	if skip == nil {
		skip = podNets
	}
	return syncSkip(t.skip, netID, append(append([]*net.IPNet{}, skip...), s.Cluster...))
}

// EnsureUplinks gives the uplinks (the named devices, or those of the
// default routes) their programs and addresses, as masquerade does: for
// hostPort, whose outside clients arrive there. Idempotent.
func EnsureUplinks(bpfRoot, stateDir string, names []string, mode datapath.Mode, progs *datapath.Programs) error {
	ups, err := FindUplinks(names)
	if err != nil {
		return err
	}
	t, err := openTables(bpfRoot)
	if err != nil {
		return err
	}
	defer t.Close()
	return ensureUplinks(bpfRoot, stateDir, ups, t.uplinks, mode, progs)
}

func ensureUplinks(bpfRoot, stateDir string, ups []Uplink, m *ebpf.Map, mode datapath.Mode, progs *datapath.Programs) error {
	unlock, err := uplinkLock(stateDir)
	if err != nil {
		return err
	}
	defer unlock()
	for _, u := range ups {
		if err := ensureUplink(bpfRoot, stateDir, u, mode, progs); err != nil {
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

// registerNet claims netID for netName in ipam_nets (shared with ebpf-ipam),
// so two network names with one hash are refused instead of merged.
func registerNet(m *ebpf.Map, netID uint32, netName string) error {
	var v maps.CniIpamNet
	name := netName
	if len(name) >= maps.CniNetNameLen {
		name = name[:maps.CniNetNameLen-1]
	}
	if err := m.Lookup(netID, &v); err == nil {
		if got := maps.GoString(v.Name[:]); got != name {
			return fmt.Errorf("network %q has the same map key as network %q: rename one", netName, got)
		}
		return nil
	}
	maps.CString(v.Name[:], name)
	if err := m.Update(netID, &v, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return fmt.Errorf("registering network %s: %w", netName, err)
	}
	return nil
}

// syncSkip makes the network's masq_skip entries exactly want.
func syncSkip(m *ebpf.Map, netID uint32, want []*net.IPNet) error {
	keep := map[maps.CniMasqSkipKey]bool{}
	one := uint32(1)
	for _, n := range want {
		k := skipKey(netID, n)
		keep[k] = true
		if err := m.Put(&k, &one); err != nil {
			return fmt.Errorf("writing masq_skip %s: %w", n, err)
		}
	}
	var stale []maps.CniMasqSkipKey
	var k maps.CniMasqSkipKey
	var v uint32
	it := m.Iterate()
	for it.Next(&k, &v) {
		if k.NetId == netID && !keep[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading masq_skip: %w", err)
	}
	for _, k := range stale {
		if err := m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting from masq_skip: %w", err)
		}
	}
	return nil
}

// ensureUplink attaches the uplink programs unless they already run there.
func ensureUplink(bpfRoot, stateDir string, u Uplink, mode datapath.Mode, progs *datapath.Programs) error {
	name := u.Link.Attrs().Name
	if uplinkAttached(u.Link, progs) {
		return nil
	}
	// Whatever an earlier attach left (the device was recreated, or a link
	// was removed by hand) goes first.
	if err := detachUplink(bpfRoot, stateDir, name); err != nil {
		return err
	}
	rec := &datapath.UplinkRecord{Name: name, IfIndex: u.Link.Attrs().Index}
	for _, h := range datapath.UplinkHooks {
		a, err := datapath.Attach(mode, u.Link, h, progs.ByHook[h.Name], datapath.UplinkDir(bpfRoot, name))
		if err != nil {
			for _, done := range rec.Attachments {
				_ = datapath.DetachNow(done, rec.IfIndex)
			}
			_ = os.RemoveAll(datapath.UplinkDir(bpfRoot, name))
			return fmt.Errorf("attaching %s to uplink %s: %w", h.Name, name, err)
		}
		rec.Attachments = append(rec.Attachments, a)
	}
	return datapath.WriteUplinkRecord(stateDir, rec)
}

// uplinkAttached reports whether every uplink program of progs runs on l.
func uplinkAttached(l netlink.Link, progs *datapath.Programs) bool {
	return datapath.HooksAttached(l, datapath.UplinkHooks, progs)
}

// UplinkProblems names what is missing for masquerade on the node, for CHECK.
func UplinkProblems(stateDir string, progs *datapath.Programs) []string {
	recs, err := datapath.UplinkRecords(stateDir)
	if err != nil {
		return []string{err.Error()}
	}
	if len(recs) == 0 {
		return []string{"ipMasq is on but no uplink carries the masquerade programs"}
	}
	var out []string
	for _, r := range recs {
		l, err := netlink.LinkByIndex(r.IfIndex)
		if err != nil || l.Attrs().Name != r.Name {
			out = append(out, fmt.Sprintf("uplink %s (ifindex %d) is gone", r.Name, r.IfIndex))
			continue
		}
		if !uplinkAttached(l, progs) {
			out = append(out, fmt.Sprintf("the masquerade programs are not attached to uplink %s", r.Name))
		}
	}
	return out
}

// detachUplink removes the programs recorded for an uplink; idempotent.
func detachUplink(bpfRoot, stateDir, name string) error {
	recs, err := datapath.UplinkRecords(stateDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range recs {
		if r.Name != name {
			continue
		}
		for _, a := range r.Attachments {
			if err := datapath.DetachNow(a, r.IfIndex); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	if err := os.RemoveAll(datapath.UplinkDir(bpfRoot, name)); err != nil {
		errs = append(errs, fmt.Errorf("unpinning links of uplink %s: %w", name, err))
	}
	if len(errs) == 0 {
		errs = append(errs, datapath.RemoveUplinkRecord(stateDir, name))
	}
	return errors.Join(errs...)
}

// Teardown undoes masquerade on the node once it has no endpoint left:
// programs off the uplinks, settings out of the maps. Idempotent.
func Teardown(bpfRoot, stateDir string) error {
	unlock, err := uplinkLock(stateDir)
	if err != nil {
		return err
	}
	defer unlock()
	recs, err := datapath.UplinkRecords(stateDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range recs {
		errs = append(errs, detachUplink(bpfRoot, stateDir, r.Name))
	}
	if maps.CheckBPFFS(bpfRoot) != nil {
		return errors.Join(errs...)
	}
	t, err := openTables(bpfRoot)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	defer t.Close()
	for _, m := range []*ebpf.Map{t.uplinks, t.nets, t.skip} {
		errs = append(errs, maps.Clear(m))
	}
	return errors.Join(errs...)
}

// ForgetNetworks removes the settings of networks not in live (by NetID).
func ForgetNetworks(bpfRoot string, live map[uint32]bool) error {
	t, err := openTables(bpfRoot)
	if err != nil {
		return err
	}
	defer t.Close()
	var errs []error
	var nk maps.CniMasqNetKey
	var nv maps.CniMasqNet
	var dead []maps.CniMasqNetKey
	it := t.nets.Iterate()
	for it.Next(&nk, &nv) {
		if !live[nk.NetId] {
			dead = append(dead, nk)
		}
	}
	errs = append(errs, it.Err())
	for _, k := range dead {
		errs = append(errs, ignoreMissing(t.nets.Delete(&k)))
	}
	var sk maps.CniMasqSkipKey
	var sv uint32
	var deadSkip []maps.CniMasqSkipKey
	it = t.skip.Iterate()
	for it.Next(&sk, &sv) {
		if !live[sk.NetId] {
			deadSkip = append(deadSkip, sk)
		}
	}
	errs = append(errs, it.Err())
	for _, k := range deadSkip {
		errs = append(errs, ignoreMissing(t.skip.Delete(&k)))
	}
	return errors.Join(errs...)
}

func ignoreMissing(err error) error {
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	}
	return err
}
