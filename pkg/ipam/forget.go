package ipam

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// isMapFull: an update failed because the hash map holds max_entries
// (the kernel says E2BIG).
func isMapFull(err error) bool { return err != nil && errors.Is(err, unix.E2BIG) }

// mapFullError is the error of an ADD that found a node-wide map full: it
// names the map, its size and what to do.
func mapFullError(name string, m *ebpf.Map, what string) error {
	size := ""
	if m != nil {
		size = fmt.Sprintf(" (%d entries; %s)", m.MaxEntries(), what)
	}
	return types.NewError(errcode.MapFull, fmt.Sprintf("ebpf-ipam map %s is full%s: free room by removing what is no longer used: DEL the attachments of gone containers, `ebpf-cni gc`, or a CNI GC of each network (ebpf-ipam GC also forgets the networks without addresses); `ebpf-cni ipam` lists what is held", name, size), "")
}

// Forget removes the network's bookkeeping once it holds no address: its
// cursors and its registry entry (ipam_cursors, ipam_nets) and its state
// directory. DEL and GC call it with the lock held, so the bookkeeping of
// the node grows with its live networks, not with every network it has
// seen. A network with an attachment record or an address in the map is
// kept. It reports whether it forgot the network; the Store is Stateless
// afterwards.
//
// The order makes every crash safe: map-id goes first, so a later call
// re-registers and resynchronises; the lock file goes last but one, so a
// call waiting on it finds it unlinked and starts over (lockOnce).
func (s *Store) Forget() (bool, error) {
	if s.Stateless() {
		return false, nil
	}
	// Names only: every DEL asks, and reading each of a busy network's
	// records cost 1.7 ms of a DEL with 100 pods.
	if held, err := s.holds(); err != nil || held {
		return false, err
	}
	if ents, err := os.ReadDir(s.releasedDir()); err == nil && len(ents) > 0 {
		return false, nil // for the next Open with bpffs (ReleaseWithoutMaps)
	}
	held, err := s.Entries()
	if err != nil || len(held) > 0 {
		return false, err
	}
	if err := removeIfThere(filepath.Join(s.dir, "map-id")); err != nil {
		return false, err
	}
	// Holding nothing, the network shares no address with another.
	for _, f := range []string{rangesFile, rangesFile + ".tmp"} {
		if err := removeIfThere(filepath.Join(s.dir, f)); err != nil {
			return false, err
		}
	}
	if err := s.openCursors(); err != nil {
		return false, err
	}
	cursors, err := maps.Entries[maps.CniIpamCursorKey, maps.CniIpamCursor](s.cursors)
	if err != nil {
		return false, err
	}
	if _, err := maps.DeleteEntries(s.cursors, cursors, func(e *maps.Entry[maps.CniIpamCursorKey, maps.CniIpamCursor]) bool {
		return e.Key.NetId == s.NetID
	}); err != nil {
		return false, err
	}
	if s.nets == nil {
		if s.nets, err = s.openMap(maps.CniMapIpamNets); err != nil {
			return false, err
		}
	}
	if err := unregister(s.nets, s.Network); err != nil {
		return false, err
	}
	// owners/ and released/ hold no record now, at most a crashed write's
	// .tmp file.
	for _, p := range []string{s.releasedDir(), filepath.Join(s.dir, "owners")} {
		if err := os.RemoveAll(p); err != nil {
			return false, err
		}
	}
	if err := removeIfThere(filepath.Join(s.dir, "lock")); err != nil {
		return false, err
	}
	// A call that created a new lock file meanwhile keeps the directory.
	if err := os.Remove(s.dir); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOTEMPTY) {
		return false, err
	}
	s.lock.Close()
	s.lock, s.dir = nil, ""
	return true, nil
}

// unregister deletes the registry entry of network, if the registry gives
// its ID to this name (not to another network's).
func unregister(m *ebpf.Map, network string) error {
	id := NetID(network)
	var v maps.CniIpamNet
	err := m.Lookup(id, &v)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", maps.CniMapIpamNets, err)
	}
	if maps.GoString(v.Name[:]) != maps.Fit(network, maps.CniNetNameLen) {
		return nil
	}
	if err := m.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("deleting %s from %s: %w", network, maps.CniMapIpamNets, err)
	}
	return nil
}

func removeIfThere(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Sweep forgets every network of the node that holds no address (see
// Forget): the directories under <stateDir>/ipam, the registry entries
// (ipam_nets) and the cursors (ipam_cursors) of networks without one,
// whether an older version left them or a network was only ever
// registered (masquerade registers the networks it serves). A network
// whose lock is held is busy, and skipped. It returns the networks it
// forgot. GC calls it: runtimes never DEL a network, only its attachments.
func Sweep(bpfRoot, stateDir string) ([]string, error) {
	if err := maps.CheckBPFFS(bpfRoot); err != nil {
		return nil, stateError("bpfRoot", err)
	}
	ms, err := maps.OpenPinnedChecked(bpfRoot, maps.CniMapIpamAllocs, maps.CniMapIpamNets, maps.CniMapIpamCursors)
	if err != nil {
		return nil, stateError("bpfRoot", err)
	}
	for _, m := range ms {
		defer m.Close()
	}
	sw := &sweep{bpfRoot: bpfRoot, stateDir: stateDir, allocs: ms[maps.CniMapIpamAllocs], nets: ms[maps.CniMapIpamNets]}
	dirs, err := sw.directories()
	if err != nil {
		return nil, err
	}
	held := map[uint32]bool{}
	as, err := maps.Entries[maps.CniIpamKey, maps.CniIpamOwner](sw.allocs)
	if err != nil {
		return sw.forgot, err
	}
	for _, a := range as {
		held[a.Key.NetId] = true
	}
	registered, err := sw.registry(held, dirs)
	if err != nil {
		return sw.forgot, err
	}
	cursors := ms[maps.CniMapIpamCursors]
	cs, err := maps.Entries[maps.CniIpamCursorKey, maps.CniIpamCursor](cursors)
	if err != nil {
		return sw.forgot, err
	}
	if _, err := maps.DeleteEntries(cursors, cs, func(e *maps.Entry[maps.CniIpamCursorKey, maps.CniIpamCursor]) bool {
		return !registered[e.Key.NetId] && !held[e.Key.NetId] && !dirs[e.Key.NetId]
	}); err != nil {
		sw.errs = append(sw.errs, err)
	}
	return sw.forgot, errors.Join(sw.errs...)
}

// sweep is one Sweep: the maps it holds open, the networks it forgot and
// the errors of those it could not.
type sweep struct {
	bpfRoot, stateDir string
	allocs, nets      *ebpf.Map
	forgot            []string
	errs              []error
}

// try forgets network under its lock, unless the lock is busy or stale,
// and reports whether it did.
func (sw *sweep) try(network string) bool {
	if !ValidNetworkName(network) {
		return false
	}
	s := newStore(&Config{Network: network, BPFRoot: sw.bpfRoot, StateDir: sw.stateDir})
	s.allocs = sw.allocs
	defer func() {
		s.allocs = nil // the sweep's handle, closed by the sweep
		s.Close()
	}()
	if err := s.lockOnce(true, 0); err != nil {
		if err != errBusy && err != errStaleLock {
			sw.errs = append(sw.errs, fmt.Errorf("network %s: %w", network, err))
		}
		return false
	}
	done, err := s.Forget()
	if err != nil {
		sw.errs = append(sw.errs, fmt.Errorf("network %s: %w", network, err))
	}
	if done {
		sw.forgot = append(sw.forgot, network)
	}
	return done
}

// directories tries each network directory under <stateDir>/ipam and
// returns the IDs of those it kept.
func (sw *sweep) directories() (map[uint32]bool, error) {
	dirs := map[uint32]bool{}
	ents, err := os.ReadDir(filepath.Join(sw.stateDir, "ipam"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, stateError("stateDir", err)
	}
	for _, e := range ents {
		if e.IsDir() && !sw.try(e.Name()) {
			dirs[NetID(e.Name())] = true
		}
	}
	return dirs, nil
}

// registry tries each registered network that neither holds an address
// (held) nor kept its directory (dirs), and returns the IDs of those that
// stay registered.
func (sw *sweep) registry(held, dirs map[uint32]bool) (map[uint32]bool, error) {
	registry, err := maps.Entries[uint32, maps.CniIpamNet](sw.nets)
	if err != nil {
		return nil, err
	}
	registered := map[uint32]bool{}
	for _, r := range registry {
		name := maps.GoString(r.Value.Name[:])
		switch {
		case held[r.Key] || dirs[r.Key]:
			registered[r.Key] = true
		case ValidNetworkName(name) && NetID(name) == r.Key:
			if !sw.try(name) {
				registered[r.Key] = true
			}
		default:
			// A name the registry keeps as its digest (sha256:...): no
			// directory to lock, and no address, so nothing to protect.
			if err := sw.nets.Delete(r.Key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				sw.errs = append(sw.errs, err)
			} else {
				sw.forgot = append(sw.forgot, name)
			}
		}
	}
	return registered, nil
}

// Room reports, for STATUS, the first node-wide map an ADD on this network
// would find full (nil when there is room): ipam_allocs always, ipam_nets
// when the network is not registered, ipam_cursors when it has no cursor.
func (s *Store) Room() error {
	allocs, err := s.allEntries()
	if err != nil {
		return err
	}
	return s.room(len(allocs))
}

// allEntries reads the whole allocation map, every network's: one walk of
// its 262,144 buckets (0.4 ms), which STATUS makes once for Room and Usage.
func (s *Store) allEntries() ([]maps.Entry[maps.CniIpamKey, maps.CniIpamOwner], error) {
	return maps.Entries[maps.CniIpamKey, maps.CniIpamOwner](s.allocs)
}

// room is Room with the allocation map's entries counted already.
func (s *Store) room(allocs int) error {
	if err := s.openCursors(); err != nil {
		return err
	}
	if s.nets == nil {
		var err error
		if s.nets, err = s.openMap(maps.CniMapIpamNets); err != nil {
			return err
		}
	}
	if uint32(allocs) >= s.allocs.MaxEntries() {
		return mapFullError(maps.CniMapIpamAllocs, s.allocs, "one per address held on this node")
	}
	var v maps.CniIpamNet
	if err := s.nets.Lookup(s.NetID, &v); errors.Is(err, ebpf.ErrKeyNotExist) {
		nets, err := maps.Entries[uint32, maps.CniIpamNet](s.nets)
		if err != nil {
			return err
		}
		if uint32(len(nets)) >= s.nets.MaxEntries() {
			return mapFullError(maps.CniMapIpamNets, s.nets, "every network with an address on this node has one")
		}
	}
	cursors, err := maps.Entries[maps.CniIpamCursorKey, maps.CniIpamCursor](s.cursors)
	if err != nil {
		return err
	}
	mine := false
	for _, c := range cursors {
		mine = mine || c.Key.NetId == s.NetID
	}
	if !mine && uint32(len(cursors)) >= s.cursors.MaxEntries() {
		return mapFullError(maps.CniMapIpamCursors, s.cursors, "one per range set of every network with an address on this node")
	}
	return nil
}
