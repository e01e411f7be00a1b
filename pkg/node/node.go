// Package node is the handle of one call on this node: its state
// locations, the node lock, the pinned maps (opened once per call), the
// programs (loaded once per node and build, opened once per call), the
// endpoint records and the records of every other attachment. Every verb
// opens it once and hands it to every feature; it names no feature.
package node

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
	"github.com/ebpf-cni/ebpf-cni/pkg/rtnl"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// LockMode is how a call holds the node lock.
type LockMode int

const (
	// Shared: ADD, DEL, CHECK, STATUS.
	Shared LockMode = iota
	// Exclusive: GC and the operator's gc: no ADD is half-way.
	Exclusive
	// Unlocked: readers that change nothing (the operator CLI's views).
	Unlocked
)

// Options open a node.
type Options struct {
	BPFRoot, StateDir string
	// Objects are the program objects of every registered feature: the
	// programs a call loads when no call did yet.
	Objects []programs.Object
	// Tag is programs.Tag(Objects) when the caller knows it (features.Tag:
	// generated); empty, the node computes it.
	Tag  string
	Lock LockMode
	// Phases the caller timed before it opened the node (process start,
	// configuration), and Since, when the first of the node's own phases
	// ("open": the node lock) began; zero: the node starts timing at Open.
	Phases []Phase
	Since  time.Time
}

// Node is the node as one call sees it. Not safe for concurrent use. Its
// state locations are its own: callers ask it for what lives there.
type Node struct {
	bpfRoot, stateDir string

	objects   []programs.Object
	lock      *Lock
	exclusive bool
	maps      map[string]*ebpf.Map
	progs     *programs.Set
	loaded    bool
	fresh     bool // loaded with no program of any build pinned before
	tag       string
	onBPFFS   bool // CheckBPFFS passed in this call

	// Rescued are the maps this call pinned again after a bpffs remount
	// (Programs).
	Rescued []string

	phase      string
	phaseStart time.Time
	phases     []Phase

	batches []batch // work gathered for Settle
}

// batch is work a building block gathered in this call (Batch).
type batch struct {
	key   any
	state any
	run   func() error
}

// Batch returns the state gathered under key in this call, made by mk
// (the state and the work that uses it) the first time: a building block
// collects what several features ask of it (each feature's per-pod
// flushes of the conntrack table) and does it once, at Settle, instead
// of once per feature (a walk of the whole table each).
func (n *Node) Batch(key any, mk func() (state any, run func() error)) any {
	for _, b := range n.batches {
		if b.key == key {
			return b.state
		}
	}
	state, run := mk()
	n.batches = append(n.batches, batch{key: key, state: state, run: run})
	return state
}

// Settle does the work gathered by Batch, in the order first asked for,
// and forgets it. The verbs call it when a teardown's steps are done;
// Close calls it for what is left.
func (n *Node) Settle() error {
	bs := n.batches
	n.batches = nil
	var errs []error
	for _, b := range bs {
		if err := b.run(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Open takes the node lock as o says and moves state an older build left
// in an older layout.
func Open(o Options) (*Node, error) {
	n := &Node{bpfRoot: o.BPFRoot, stateDir: o.StateDir, objects: o.Objects, tag: o.Tag, maps: map[string]*ebpf.Map{}, phases: o.Phases}
	if !o.Since.IsZero() {
		n.phase, n.phaseStart = "open", o.Since
	}
	if o.Lock != Unlocked {
		l, err := NodeLock(o.StateDir, o.Lock == Exclusive)
		if err != nil {
			return nil, err
		}
		n.lock, n.exclusive = l, o.Lock == Exclusive
		if err := migrate(o.StateDir); err != nil {
			l.Unlock()
			return nil, err
		}
		if err := n.rescue(); err != nil {
			l.Unlock()
			return nil, err
		}
	}
	return n, nil
}

// rescue pins again the maps of the programs that run on the node's
// devices when bpfRoot has no program pinned: a bpffs remounted under live
// pods lost every pin, but their maps live on in the kernel (maps.Rescue).
// Every call does it first thing, before any of them opens (and so
// creates) an empty map of the same name. On a node in order it costs one
// directory listing.
func (n *Node) rescue() error {
	if n.CheckBPFFS() != nil {
		return nil // no bpffs: the verbs say so
	}
	if tags, err := programs.Installed(n.bpfRoot); err != nil || len(tags) > 0 {
		return err
	}
	ids := attachedPrograms(programs.Hooks(n.objects))
	if len(ids) == 0 {
		return nil
	}
	var err error
	n.Rescued, err = maps.Rescue(n.bpfRoot, ids)
	return err
}

// Close releases the maps, the programs and the lock; nil-safe.
func (n *Node) Close() {
	if n == nil {
		return
	}
	_ = n.Settle() // best effort: the verbs settle (and report) first
	n.closeOpened()
	n.lock.Unlock()
}

// CheckBPFFS verifies that bpfRoot lies on bpffs (creating nothing). Once
// it has, the rest of the call takes it as said: a call asks 20-30 times
// (each step, each map it opens), and it lasts milliseconds.
func (n *Node) CheckBPFFS() error {
	if n.onBPFFS {
		return nil
	}
	err := maps.CheckBPFFS(n.bpfRoot)
	n.onBPFFS = err == nil
	return err
}

// Map is the pinned map name, created on first use; opened once per call.
func (n *Node) Map(name string) (*ebpf.Map, error) {
	if m, ok := n.maps[name]; ok {
		return m, nil
	}
	if err := n.CheckBPFFS(); err != nil {
		return nil, err
	}
	ms, err := maps.OpenPinnedChecked(n.bpfRoot, name)
	if err != nil {
		return nil, err
	}
	n.maps[name] = ms[name]
	return ms[name], nil
}

// PinnedMap is Map for callers that must not create it (DEL, teardown):
// nil when it is not pinned.
func (n *Node) PinnedMap(name string) (*ebpf.Map, error) {
	if m, ok := n.maps[name]; ok {
		return m, nil
	}
	if _, err := os.Stat(filepath.Join(maps.Dir(n.bpfRoot), name)); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return n.Map(name)
}

// Objects are the program objects of the registered features.
func (n *Node) Objects() []programs.Object { return n.objects }

// Tag is this build's program tag: Options.Tag, or a digest of every
// object computed once per call.
func (n *Node) Tag() string {
	if n.tag == "" {
		n.tag = programs.Tag(n.objects)
	}
	return n.tag
}

// PinnedPrograms are this build's programs as some call pinned them,
// opened once per call (the node closes them); it never loads them, so
// what only looks (CHECK, reports) leaves a node without them as it is:
// programs.ErrNotFound then.
func (n *Node) PinnedPrograms() (*programs.Set, error) {
	if n.progs != nil {
		return n.progs, nil
	}
	p, err := programs.Open(n.bpfRoot, n.Tag(), n.objects)
	if err != nil {
		return nil, err
	}
	n.progs = p
	return p, nil
}

// Programs are this build's programs. If no call loaded them yet, this one
// loads, verifies and pins them under the exclusive node lock and moves
// every recorded attachment to them (an upgrade); call it before making
// anything, since a shared lock is dropped for that moment.
func (n *Node) Programs() (*programs.Set, error) {
	if n.progs != nil {
		return n.progs, nil
	}
	tag := n.Tag()
	p, err := programs.Open(n.bpfRoot, tag, n.objects)
	if err == nil || !errors.Is(err, programs.ErrNotFound) {
		n.progs = p
		return p, err
	}
	switch {
	case n.lock == nil:
		l, err := NodeLock(n.stateDir, true)
		if err != nil {
			return nil, err
		}
		defer l.Unlock()
	case !n.exclusive:
		if err := n.lock.Upgrade(); err != nil {
			return nil, fmt.Errorf("locking the node: %w", err)
		}
		defer func() { _ = n.lock.Downgrade() }()
	}
	if p, err := programs.Open(n.bpfRoot, tag, n.objects); err == nil || !errors.Is(err, programs.ErrNotFound) {
		n.progs = p
		return p, err // another call loaded them while we waited
	}
	// No program of any build was pinned: a fresh node, or a bpffs
	// remounted under live pods (Open pinned their maps again): every
	// recorded attachment moves to the programs loaded now, and what lost
	// its pinned link is attached again.
	tags, err := programs.Installed(n.bpfRoot)
	if err != nil {
		return nil, err
	}
	if p, err = programs.Load(n.bpfRoot, tag, n.objects); err != nil {
		return nil, err
	}
	n.fresh = len(tags) == 0
	if err := n.upgrade(p, n.fresh); err != nil {
		p.Close()
		return nil, err
	}
	n.progs, n.loaded = p, true
	return p, nil
}

// attachedPrograms lists the programs attached at hooks on every device
// of the current network namespace (tcx or tc).
func attachedPrograms(hooks []attach.Hook) []ebpf.ProgramID {
	links, err := rtnl.H().LinkList()
	if err != nil {
		return nil
	}
	var out []ebpf.ProgramID
	for _, l := range links {
		for _, h := range hooks {
			if h.TCParent == 0 && h.Netkit == 0 {
				continue // a cgroup hook: its pinned link went with the bpffs
			}
			if h.Netkit != 0 && !attach.IsNetkit(l) {
				continue
			}
			ids, _ := attach.AttachedIDs(l, h)
			out = append(out, ids...)
		}
	}
	return out
}

// LoadedFresh reports whether this call loaded the programs where none of
// any build was pinned: a new node, or a bpffs remounted under live pods,
// whose maps no surviving program kept are empty (an upgrade finds the
// older build's programs and the maps as they were).
func (n *Node) LoadedFresh() bool { return n.loaded && n.fresh }

// Loaded reports whether this call loaded the programs.
func (n *Node) Loaded() bool { return n.loaded }

// Lock takes the feature lock name (stateDir/<name>.lock) exclusively: for
// a read-modify-write that calls holding the node lock shared must not
// interleave.
func (n *Node) Lock(name string) (*Lock, error) {
	return FileLock(filepath.Join(n.stateDir, name+".lock"), true)
}

// ReleaseIfEmpty runs release once the node has no endpoint left, and
// reports whether it did. It takes the node lock exclusively first (and
// keeps it), so no ADD is half-way, and checks again. The records are a
// cache: no record is the cheap first answer, but only the kernel proves
// the node empty: no host veth of ours is left (records lost with a wiped
// stateDir must not take masquerade and hostPorts away from live pods).
// Callers hold no attachment lock (AttachmentLock): the upgrade waits for
// every other call's shared hold.
func (n *Node) ReleaseIfEmpty(release func()) bool {
	if has, err := HasEndpoints(n.stateDir); err != nil || has {
		return false
	}
	if n.Exclusive() != nil {
		return false
	}
	if has, err := HasEndpoints(n.stateDir); err != nil || has {
		return false
	}
	if links, err := veth.HostLinks(); err != nil || len(links) > 0 {
		return false
	}
	release()
	return true
}

// Exclusive takes the node lock exclusively, if the call holds it shared,
// and keeps it so for the rest of the call: no other call is half-way
// then. The upgrade is not atomic (flock): what was read under the shared
// lock must be read again. A call without the node lock (Unlocked) gets
// nothing. Callers hold no attachment lock (see ReleaseIfEmpty).
func (n *Node) Exclusive() error {
	if n.lock == nil || n.exclusive {
		return nil
	}
	if err := n.lock.Upgrade(); err != nil {
		return fmt.Errorf("locking the node exclusively: %w", err)
	}
	n.exclusive = true
	return nil
}

// AttachmentLock takes the lock of one attachment (by its host veth's
// name) exclusively, for the whole of an ADD, DEL or CHECK of it, and for
// a repair or reclaim of it: calls of the same container never interleave
// (runtimes retry after timeouts, which the spec forbids but happens), so
// one call's undo never frees what another made. 256 lock files, by the
// last two hex digits of the name, so none is left per container. Take it
// after Programs and release it before ReleaseIfEmpty: both upgrade the
// node lock, which waits for every shared holder, some of which may wait
// for this lock.
func (n *Node) AttachmentLock(hostIfName string) (*Lock, error) {
	return FileLock(attachmentLockPath(n.stateDir, hostIfName), true)
}

// TryAttachmentLock is AttachmentLock without waiting: nil, nil when a
// call holds it (that call is working on the attachment).
func (n *Node) TryAttachmentLock(hostIfName string) (*Lock, error) {
	return TryFileLock(attachmentLockPath(n.stateDir, hostIfName))
}

func attachmentLockPath(stateDir, hostIfName string) string {
	stripe := hostIfName
	if len(stripe) > 2 {
		stripe = stripe[len(stripe)-2:]
	}
	return filepath.Join(stateDir, "locks", "attachment-"+stripe+".lock")
}

// Records lists every endpoint record of the node.
func (n *Node) Records() ([]*Record, error) { return Records(n.stateDir) }

// Record loads the record of a host veth; ErrNotFound if there is none.
func (n *Node) Record(hostIfName string) (*Record, error) { return ReadRecord(n.stateDir, hostIfName) }

// WriteRecord stores an endpoint record.
func (n *Node) WriteRecord(r *Record) error { return WriteRecord(n.stateDir, r) }

// RemoveRecord deletes an endpoint record; a missing one is fine.
func (n *Node) RemoveRecord(hostIfName string) error { return RemoveRecord(n.stateDir, hostIfName) }

// AttachmentSets lists the attachment sets of owner ("" for all).
func (n *Node) AttachmentSets(owner string) ([]*AttachmentSet, error) {
	return AttachmentSets(n.stateDir, owner)
}

// SaveAttachments records an attachment set.
func (n *Node) SaveAttachments(s *AttachmentSet) error { return SaveAttachments(n.stateDir, s) }

// RemoveAttachments deletes an attachment set's record.
func (n *Node) RemoveAttachments(owner, name string) error {
	return RemoveAttachments(n.stateDir, owner, name)
}

// Phase is one timed step of a call.
type Phase struct {
	Name string
	Took time.Duration
}

// Phase ends the running phase of the call and starts name: the verbs mark
// their steps, so what a call spends is measurable per step.
func (n *Node) Phase(name string) {
	now := time.Now()
	if n.phase != "" {
		n.phases = append(n.phases, Phase{n.phase, now.Sub(n.phaseStart)})
	}
	n.phase, n.phaseStart = name, now
}

// Phases ends the running phase and returns every phase of the call.
func (n *Node) Phases() []Phase {
	n.Phase("")
	return n.phases
}
