package ipam

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// LockTimeout bounds the wait for another ebpf-ipam call on the same network.
var LockTimeout = 60 * time.Second

// Store is the state of one network, opened with the network's lock held.
//
// Two indexes, each authoritative for one question and each able to rebuild
// the other:
//   - the pinned BPF map ipam_allocs answers "who holds this address?" in
//     O(1), for this plugin and the operator CLI (no program reads it: the
//     datapath checks a pod's addresses in endpoint_devs);
//   - one small file per attachment under stateDir/ipam/<network>/owners
//     answers "what does this attachment hold?" in O(1) (DEL, CHECK).
//
// If bpffs is remounted while the node is up, the map comes back empty while
// the files are still there (and the reverse if only stateDir is wiped).
// Open notices the map changed (its kernel ID is recorded) and merges the two
// before anything is allocated. A DEL while bpffs is not mounted releases
// the records alone (ReleaseWithoutMaps) and leaves what it released for
// the next Open to take out of the map, should the same map come back.
type Store struct {
	Network string
	NetID   uint32

	dir     string
	root    string // bpfRoot
	lock    *os.File
	allocs  *ebpf.Map
	cursors *ebpf.Map
	nets    *ebpf.Map
}

// Attachment is the record of what one (container ID, ifname) holds.
type Attachment struct {
	ContainerID string       `json:"containerID"`
	IfName      string       `json:"ifname"`
	IPs         []Allocation `json:"ips"`
	// NetNS is the CNI_NETNS of the ADD: when that namespace is gone, so
	// is the container, and `ebpf-cni gc` releases what it holds.
	NetNS string `json:"netns,omitempty"`
}

// Allocation is one address and the range set it came from.
type Allocation struct {
	Address  net.IP `json:"address"`
	RangeSet int    `json:"rangeSet"`
}

// NetID is the network's key in the BPF maps.
func NetID(network string) uint32 { return maps.NetID(network) }

func ownerID(containerID string) string { return maps.Fit(containerID, maps.CniContainerIDLen) }

// Open takes the network's lock and opens its state, creating it on first
// use (ADD).
func Open(c *Config) (*Store, error) { return open(c, true) }

// OpenExisting opens the network's state for DEL, GC, CHECK and STATUS:
// a network this node keeps nothing of (no state directory, no address in
// the map) is not created, registered or locked; the Store then holds
// nothing (Stateless) and every release on it is a no-op. A network whose
// directory is gone while the map still holds its addresses (stateDir
// wiped) is rebuilt from the map, as ADD would.
func OpenExisting(c *Config) (*Store, error) { return open(c, false) }

func newStore(c *Config) *Store {
	return &Store{Network: c.Network, NetID: NetID(c.Network), dir: filepath.Join(c.StateDir, "ipam", c.Network), root: c.BPFRoot}
}

func open(c *Config, create bool) (*Store, error) {
	s := newStore(c)
	if err := maps.CheckBPFFS(c.BPFRoot); err != nil {
		return nil, stateError("bpfRoot", err)
	}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	var err error
	if s.allocs, err = s.openMap(maps.CniMapIpamAllocs); err != nil {
		return nil, err
	}
	for !create && s.lock == nil {
		if _, err := os.Stat(s.dir); errors.Is(err, os.ErrNotExist) {
			held, err := s.Entries()
			if err != nil {
				return nil, stateError("bpfRoot", err)
			}
			if len(held) == 0 {
				// Nothing of the network here: create nothing, but a
				// network ID taken by another name is still refused.
				if _, err := s.checkRegistry(); err != nil {
					return nil, err
				}
				s.dir = ""
				ok = true
				return s, nil
			}
			break // rebuild the records from the map
		}
		err := s.lockOnce(false, LockTimeout)
		if err != nil && err != errNoState {
			return nil, err
		}
		if err == errNoState {
			if _, serr := os.Stat(s.dir); serr == nil {
				break // a directory without its lock file (a Forget cut short): lock it anew
			}
			// Forget removed the directory meanwhile: look again.
		}
	}
	if s.lock == nil {
		if err := s.takeLock(); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(filepath.Join(s.dir, "owners"), 0o700); err != nil {
		return nil, stateError("stateDir", err)
	}
	if err := s.reconcile(create); err != nil {
		if create {
			_, _ = s.Forget() // a network this call made holds nothing: leave nothing
		}
		return nil, err
	}
	ok = true
	return s, nil
}

// Stateless reports whether the node keeps nothing of the network (see
// OpenExisting): no lock is held and nothing may be written.
func (s *Store) Stateless() bool { return s.dir == "" }

// openMap opens (creating it) the pinned map name. bpfRoot was checked to
// be on bpffs when the Store was made (open, Sweep; ReleaseWithoutMaps
// opens no map): not again for each map.
func (s *Store) openMap(name string) (*ebpf.Map, error) {
	m, err := maps.OpenPinnedChecked(s.root, name)
	if err != nil {
		return nil, stateError("bpfRoot", err)
	}
	return m[name], nil
}

// Close releases the lock and the map handles.
func (s *Store) Close() {
	for _, m := range []*ebpf.Map{s.allocs, s.cursors, s.nets} {
		if m != nil {
			m.Close()
		}
	}
	if s.lock != nil {
		s.lock.Close() // closing the file drops the flock
	}
}

func stateError(key string, err error) error {
	hint := ""
	if errors.Is(err, maps.ErrNotBPFFS) {
		hint = "; set ipam.bpfRoot to a directory on bpffs"
	}
	return types.NewError(errcode.StateUnavailable, fmt.Sprintf("ebpf-ipam state (%s) unusable: %v%s", key, err, hint), "")
}

// errNoState: the network's directory is not there and the caller does
// not create it.
var errNoState = errors.New("no state of the network")

// errBusy: the network's lock is held and the caller does not wait.
var errBusy = errors.New("network locked by another call")

// takeLock takes the network's lock, creating its directory.
func (s *Store) takeLock() error {
	deadline := time.Now().Add(LockTimeout)
	for {
		// At least a moment: a wait of 0 means "do not wait" (errBusy).
		err := s.lockOnce(true, max(time.Until(deadline), time.Millisecond))
		if err != errStaleLock {
			return err
		}
	}
}

// errStaleLock: the lock file was removed (Forget) while this call waited
// for it; the caller tries again with the file now at the path.
var errStaleLock = errors.New("lock file removed while waiting")

// lockOnce opens the lock file and takes its flock, waiting up to wait
// (not at all when wait <= 0, then errBusy). Forget removes the directory
// with the lock held: a call that waited on the removed file gets the flock
// of an unlinked inode, so the lock only counts if the file at the path is
// still the one locked; otherwise errStaleLock, and the caller tries again.
func (s *Store) lockOnce(create bool, wait time.Duration) error {
	path := filepath.Join(s.dir, "lock")
	if create {
		if err := os.MkdirAll(s.dir, 0o700); err != nil {
			return stateError("stateDir", err)
		}
	}
	flags := os.O_RDWR
	if create {
		flags |= os.O_CREATE
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if errors.Is(err, os.ErrNotExist) {
		if create {
			return errStaleLock // the directory went between MkdirAll and here
		}
		return errNoState
	}
	if err != nil {
		return stateError("stateDir", err)
	}
	// Uncontended, the lock is taken at once without a waiting goroutine.
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		if wait <= 0 {
			f.Close()
			return errBusy
		}
		done := make(chan error, 1)
		go func() { done <- syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }()
		select {
		case err = <-done:
		case <-time.After(wait):
			f.Close() // the waiting flock fails with the file, and ends
			return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("network %q is locked by another ebpf-ipam call for over %s", s.Network, LockTimeout), "")
		}
	}
	if err != nil {
		f.Close()
		return stateError("stateDir", fmt.Errorf("locking %s: %w", f.Name(), err))
	}
	var held, now syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &held); err != nil {
		f.Close()
		return stateError("stateDir", err)
	}
	if err := syscall.Stat(path, &now); err != nil || now.Ino != held.Ino || now.Dev != held.Dev {
		f.Close()
		if !create {
			return errNoState
		}
		return errStaleLock
	}
	s.lock = f
	return nil
}

// register records the network's name under its ID in the network
// registry (maps.RegisterNetwork, shared with masquerade), refusing a hash
// clash with another network.
func (s *Store) register() (err error) {
	if s.nets, err = s.openMap(maps.CniMapIpamNets); err != nil {
		return err
	}
	_, err = maps.RegisterNetwork(s.nets, s.Network)
	var clash *maps.NetworkClash
	if errors.As(err, &clash) {
		return types.NewError(errcode.NetworkIDClash, clash.Error(), "")
	}
	if isMapFull(err) {
		return mapFullError(maps.CniMapIpamNets, s.nets, "every network with an address on this node has one")
	}
	if err != nil {
		return stateError("bpfRoot", err)
	}
	return nil
}

// checkRegistry refuses a network whose ID the registry gives another
// name, without registering it; it reports whether the network is
// registered.
func (s *Store) checkRegistry() (bool, error) {
	var err error
	if s.nets, err = s.openMap(maps.CniMapIpamNets); err != nil {
		return false, err
	}
	var v maps.CniIpamNet
	err = s.nets.Lookup(s.NetID, &v)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return false, nil
	}
	if err != nil {
		return false, stateError("bpfRoot", fmt.Errorf("reading %s: %w", maps.CniMapIpamNets, err))
	}
	if other := maps.GoString(v.Name[:]); other != maps.Fit(s.Network, maps.CniNetNameLen) {
		return false, types.NewError(errcode.NetworkIDClash, (&maps.NetworkClash{Network: s.Network, Other: other, ID: s.NetID}).Error(), "")
	}
	return true, nil
}

func (s *Store) key(ip net.IP) maps.CniIpamKey {
	return maps.CniIpamKey{NetId: s.NetID, Family: maps.Family(ip), Addr: maps.Addr16(ip)}
}

// Owner returns who holds ip, or nil.
func (s *Store) Owner(ip net.IP) (*maps.CniIpamOwner, error) {
	var v maps.CniIpamOwner
	err := s.allocs.Lookup(s.key(ip), &v)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("looking up %s: %w", ip, err)
	}
	return &v, nil
}

func owns(v *maps.CniIpamOwner, containerID, ifname string) bool {
	return v != nil && maps.GoString(v.ContainerId[:]) == ownerID(containerID) && maps.GoString(v.Ifname[:]) == ifname
}

// Reserve marks ip as held; it fails with ebpf.ErrKeyExist if it is taken.
func (s *Store) Reserve(ip net.IP, containerID, ifname string, rangeSet int) error {
	v := maps.CniIpamOwner{RangeSet: uint32(rangeSet), AllocTime: uint64(time.Now().Unix())}
	maps.CString(v.ContainerId[:], ownerID(containerID))
	maps.CString(v.Ifname[:], ifname)
	return s.allocs.Update(s.key(ip), &v, ebpf.UpdateNoExist)
}

// Release frees ip; an address that is already free is not an error.
func (s *Store) Release(ip net.IP) error {
	err := s.allocs.Delete(s.key(ip))
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("releasing %s: %w", ip, err)
	}
	return nil
}

// The cursor map is opened only by calls that allocate round-robin.
func (s *Store) openCursors() (err error) {
	if s.cursors == nil {
		s.cursors, err = s.openMap(maps.CniMapIpamCursors)
	}
	return err
}

// Cursor is the last address reserved in a range set, or nil.
func (s *Store) Cursor(rangeSet int) net.IP {
	if s.openCursors() != nil {
		return nil // allocation starts from the beginning; SetCursor reports the error
	}
	var v maps.CniIpamCursor
	if err := s.cursors.Lookup(maps.CniIpamCursorKey{NetId: s.NetID, RangeSet: uint32(rangeSet)}, &v); err != nil {
		return nil
	}
	return maps.IP(v.Family, v.Addr)
}

// SetCursor records ip as the last address reserved in a range set.
func (s *Store) SetCursor(rangeSet int, ip net.IP) error {
	if err := s.openCursors(); err != nil {
		return err
	}
	v := maps.CniIpamCursor{Family: maps.Family(ip), Addr: maps.Addr16(ip)}
	return s.cursors.Update(maps.CniIpamCursorKey{NetId: s.NetID, RangeSet: uint32(rangeSet)}, &v, ebpf.UpdateAny)
}

// Entry is one address of this network in the allocation map.
type Entry struct {
	IP     net.IP
	Owner  maps.CniIpamOwner
	Family int
}

// Entries lists every address of this network held in the allocation map
// (read in batches: STATUS reads it every 5 s).
func (s *Store) Entries() ([]Entry, error) {
	all, err := s.allEntries()
	if err != nil {
		return nil, err
	}
	return s.entriesOf(all), nil
}

// entriesOf are this network's entries among all of the map's.
func (s *Store) entriesOf(all []maps.Entry[maps.CniIpamKey, maps.CniIpamOwner]) []Entry {
	var out []Entry
	for _, e := range all {
		if e.Key.NetId == s.NetID {
			out = append(out, Entry{IP: maps.IP(e.Key.Family, e.Key.Addr), Owner: e.Value, Family: int(e.Key.Family)})
		}
	}
	return out
}

// attachmentFile names the record of an attachment. Container IDs are
// [A-Za-z0-9_.-] by the spec and interface names cannot hold '/' or ':', but
// the plugin must not trust either with a path: anything else is escaped.
func (s *Store) attachmentFile(containerID, ifname string) string {
	var b strings.Builder
	for _, c := range []byte(ownerID(containerID) + ":" + ifname) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '.', c == '-', c == ':':
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return filepath.Join(s.dir, "owners", b.String())
}

// Attachment returns what (containerID, ifname) holds, or nil.
func (s *Store) Attachment(containerID, ifname string) (*Attachment, error) {
	if s.Stateless() {
		return nil, nil
	}
	return readAttachment(s.attachmentFile(containerID, ifname))
}

func readAttachment(path string) (*Attachment, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	a := &Attachment{}
	if err := json.Unmarshal(b, a); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", path, err)
	}
	return a, nil
}

// SaveAttachment writes the record atomically.
func (s *Store) SaveAttachment(a *Attachment) error {
	if s.Stateless() {
		return errNoState
	}
	path := s.attachmentFile(a.ContainerID, a.IfName)
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// FillAttachment writes a over the record of the same attachment that
// Allocate wrote first, empty, in this call: in place, where SaveAttachment
// creates a file and renames it over the record (on ext4, under the churn
// of pods coming and going, a file creation costs tens to hundreds of µs;
// a write into the page cache, a few). It is one write at offset 0 of at
// most a page and of no fewer bytes than the record holds, so a process
// killed around it leaves the empty record or the full one, never a mix of
// them (the kernel checks for a fatal signal between the pages it copies).
// A longer record, or a shorter one than is there, takes SaveAttachment.
func (s *Store) FillAttachment(a *Attachment) error {
	if s.Stateless() {
		return errNoState
	}
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	if len(b) > os.Getpagesize() {
		return s.SaveAttachment(a)
	}
	f, err := os.OpenFile(s.attachmentFile(a.ContainerID, a.IfName), os.O_WRONLY, 0)
	if err != nil {
		return s.SaveAttachment(a)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || st.Size() > int64(len(b)) {
		return s.SaveAttachment(a)
	}
	_, err = f.WriteAt(b, 0)
	return err
}

// RemoveAttachment deletes the record; a missing one is not an error.
func (s *Store) RemoveAttachment(containerID, ifname string) error {
	if s.Stateless() {
		return nil
	}
	err := os.Remove(s.attachmentFile(containerID, ifname))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// holds reports whether the network has an attachment record (names
// only: no record is read).
func (s *Store) holds() (bool, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, "owners"))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".tmp") {
			return true, nil
		}
	}
	return false, nil
}

// Attachments lists every attachment record of the network.
func (s *Store) Attachments() ([]*Attachment, error) {
	if s.Stateless() {
		return nil, nil
	}
	dir := filepath.Join(s.dir, "owners")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*Attachment
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".tmp") {
			continue
		}
		a, err := readAttachment(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		if a != nil {
			out = append(out, a)
		}
	}
	return out, nil
}

// reconcile merges the attachment records and the allocation map when the
// map is not the one they were last synchronised with (see Store).
// Only ADD registers the network: a DEL, GC, CHECK or STATUS checks the
// registry for a clash but adds nothing to it (so a full registry never
// blocks them), and leaves map-id unwritten so the next ADD registers.
func (s *Store) reconcile(register bool) error {
	id, err := maps.ID(s.allocs)
	if err != nil {
		return stateError("bpfRoot", err)
	}
	idFile := filepath.Join(s.dir, "map-id")
	want := strconv.FormatUint(uint64(id), 10)
	if b, err := os.ReadFile(idFile); err == nil && strings.TrimSpace(string(b)) == want {
		return nil // the network was registered and synchronised with this map
	}
	registered := register
	if register {
		err = s.register()
	} else {
		registered, err = s.checkRegistry()
	}
	if err != nil {
		return err
	}
	if err := s.applyReleased(); err != nil {
		return stateError("stateDir", err)
	}
	if err := s.sync(want); err != nil {
		return stateError("stateDir", err)
	}
	if !registered {
		return nil
	}
	return os.WriteFile(idFile, []byte(want+"\n"), 0o600)
}

// sync is the slow path of reconcile: a union of records and map entries.
func (s *Store) sync(mapID string) error {
	atts, err := s.Attachments()
	if err != nil {
		return err
	}
	restored, recorded := 0, 0
	known := map[string]*Attachment{}
	for _, a := range atts {
		known[ownerID(a.ContainerID)+"\x00"+a.IfName] = a
		for _, al := range a.IPs {
			holder, err := s.Owner(al.Address)
			if err != nil {
				return err
			}
			switch {
			case holder == nil:
				if err := s.Reserve(al.Address, a.ContainerID, a.IfName, al.RangeSet); err != nil {
					return fmt.Errorf("restoring %s: %w", al.Address, err)
				}
				restored++
			case !owns(holder, a.ContainerID, a.IfName):
				fmt.Fprintf(os.Stderr, "ebpf-ipam: network %s: %s is recorded for %s/%s but held by %s/%s in the map; keeping the map's holder\n",
					s.Network, al.Address, a.ContainerID, a.IfName, maps.GoString(holder.ContainerId[:]), maps.GoString(holder.Ifname[:]))
			}
		}
	}
	entries, err := s.Entries()
	if err != nil {
		return err
	}
	for _, e := range entries {
		cid, ifn := maps.GoString(e.Owner.ContainerId[:]), maps.GoString(e.Owner.Ifname[:])
		a := known[cid+"\x00"+ifn]
		if a == nil {
			a = &Attachment{ContainerID: cid, IfName: ifn}
			known[cid+"\x00"+ifn] = a
		}
		if !a.holds(e.IP) {
			a.IPs = append(a.IPs, Allocation{Address: e.IP, RangeSet: int(e.Owner.RangeSet)})
			if err := s.SaveAttachment(a); err != nil {
				return err
			}
			recorded++
		}
	}
	if restored+recorded > 0 {
		fmt.Fprintf(os.Stderr, "ebpf-ipam: network %s: allocation map changed (now id %s); restored %d address(es) into it from %s and recorded %d from it\n",
			s.Network, mapID, restored, s.dir, recorded)
	}
	return nil
}

func (a *Attachment) holds(ip net.IP) bool {
	for _, al := range a.IPs {
		if al.Address.Equal(ip) {
			return true
		}
	}
	return false
}

// releasedDir holds the records DEL released while bpffs was not mounted.
func (s *Store) releasedDir() string { return filepath.Join(s.dir, "released") }

// ReleaseWithoutMaps is DEL while bpfRoot is not on a mounted bpffs: the
// state of a node just rebooted, exactly when runtimes delete their old
// containers, or of a bpffs unmounted while the node is up. The map is out
// of reach, so DEL releases what it can reach, the attachment's record, and
// succeeds (DEL is best effort). The pins went with the unmount, so the
// next bpffs brings a new, empty map into which reconcile restores the
// records left: the released addresses are not among them. In case the same
// map comes back (the bpffs was still mounted elsewhere and is bound here
// again), the record is kept under released/ and map-id removed, so the
// next Open takes those addresses out of the map before anything else.
// Nothing to release (no record, or no state of the network at all, as
// after a reboot) is success, and creates nothing.
func ReleaseWithoutMaps(c *Config, containerID, ifname string) error {
	s := newStore(c)
	err := s.lockOnce(false, LockTimeout)
	if err == errNoState {
		if _, serr := os.Stat(s.dir); serr != nil {
			return nil
		}
		err = s.takeLock() // a directory without its lock file
	}
	if err != nil {
		return err
	}
	defer s.Close()
	a, err := s.Attachment(containerID, ifname)
	if err != nil || a == nil {
		return err
	}
	if err := os.MkdirAll(s.releasedDir(), 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	name := filepath.Join(s.releasedDir(), filepath.Base(s.attachmentFile(containerID, ifname)))
	if err := os.WriteFile(name+".tmp", b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(name+".tmp", name); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(s.dir, "map-id")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return s.RemoveAttachment(containerID, ifname)
}

// applyReleased takes out of the map what DEL released while bpffs was not
// mounted (see ReleaseWithoutMaps): an address still held by the released
// attachment, unless a record says the attachment holds it again.
func (s *Store) applyReleased() error {
	ents, err := os.ReadDir(s.releasedDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := filepath.Join(s.releasedDir(), e.Name())
		if strings.HasSuffix(e.Name(), ".tmp") {
			_ = os.Remove(p)
			continue
		}
		a, err := readAttachment(p)
		if err != nil {
			return err
		}
		if a == nil {
			continue
		}
		live, err := s.Attachment(a.ContainerID, a.IfName)
		if err != nil {
			return err
		}
		for _, al := range a.IPs {
			holder, err := s.Owner(al.Address)
			if err != nil {
				return err
			}
			if owns(holder, a.ContainerID, a.IfName) && (live == nil || !live.holds(al.Address)) {
				if err := s.Release(al.Address); err != nil {
					return err
				}
			}
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return os.Remove(s.releasedDir())
}
