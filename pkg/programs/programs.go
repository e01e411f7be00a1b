// Package programs loads, verifies and pins the datapath's programs once
// per node and build, and opens them again: every later call attaches what
// is pinned. Which programs exist is the features' business: each brings
// its program objects (bpf2go output in its own package), and a set of
// programs is always the objects of every registered feature together,
// under one tag.
package programs

import (
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"

	hugeheap "0hugeheap"
	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/buildinfo"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// ErrNotFound means the programs of a tag are not (all) pinned.
var ErrNotFound = errors.New("not found")

// Object is one compiled program file (bpf/<hook>.c) and the hooks its
// programs serve, as a feature declares it.
type Object struct {
	Name  string // the source, for messages: "from_container"
	Bytes []byte // the bpf2go-embedded object
	Load  func() (*ebpf.CollectionSpec, error)
	Hooks []attach.Hook
	// Runs are programs attached nowhere, which callers run themselves
	// (Run): pinned with the hooks' programs, found with Pinned.
	Runs []string
}

// Hooks is every hook of objs, in order.
func Hooks(objs []Object) []attach.Hook {
	var out []attach.Hook
	for _, o := range objs {
		out = append(out, o.Hooks...)
	}
	return out
}

// HooksAt is the hooks of objs that run at target.
func HooksAt(objs []Object, target attach.Target) []attach.Hook {
	var out []attach.Hook
	for _, h := range Hooks(objs) {
		if h.Target == target {
			out = append(out, h)
		}
	}
	return out
}

// Tag names one build of the programs: the binary version and a digest of
// the objects, so a rebuild with other programs, or a new release, is a new
// tag and ADD upgrades the node to it.
//
// The digest is two CRC-32s (Castagnoli and IEEE): it tells builds apart,
// it guards nothing. Even so, reading the 640 KB of objects costs 0.4 ms,
// so the plugin takes the digest make generate wrote (features.Tag).
func Tag(objs []Object) string { return TagOf(Digest(objs)) }

// Digest is the objects' part of their tag.
func Digest(objs []Object) string {
	c, i := crc32.New(crc32.MakeTable(crc32.Castagnoli)), crc32.NewIEEE()
	for _, o := range objs {
		c.Write(o.Bytes)
		i.Write(o.Bytes)
	}
	return fmt.Sprintf("%08x%04x", c.Sum32(), i.Sum32()>>16)
}

// TagOf is the tag of this build's version and an objects' digest.
func TagOf(digest string) string {
	return safeTag(buildinfo.Version) + "-" + digest
}

// safeTag is s with every character but A-Z, a-z, 0-9, '.', '_' and '-'
// replaced by '_', and made a name bpffs takes (maps.PinName: a release
// version's dots): a directory name under bpfRoot. A loop, not a regexp:
// every call names its tag, and compiling one cost a fresh process
// 10-20 µs.
func safeTag(s string) string {
	return maps.PinName(strings.Map(func(r rune) rune {
		switch {
		case r >= 'A' && r <= 'Z', r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		}
		return '_'
	}, s))
}

// Set is the pinned programs of one tag, each opened when first asked for
// (an ADD needs two of the dozen: opening all cost 1.5-8 ms of every call).
type Set struct {
	Tag    string
	dir    string
	byHook map[string]*ebpf.Program
	hooks  map[string]attach.Hook
}

// Prog is the program of hook name, opened from its pin on first use.
func (s *Set) Prog(name string) (*ebpf.Program, error) {
	if p, ok := s.byHook[name]; ok {
		return p, nil
	}
	if _, ok := s.hooks[name]; !ok {
		return nil, fmt.Errorf("no program %s in the set %s", name, s.Tag)
	}
	p, err := loadPinned(filepath.Join(s.dir, name))
	if err != nil {
		return nil, fmt.Errorf("opening pinned program %s: %w", name, err)
	}
	s.byHook[name] = p
	return p, nil
}

// Close releases the handles (the pins keep the programs loaded).
func (s *Set) Close() {
	if s == nil {
		return
	}
	for _, prog := range s.byHook {
		prog.Close()
	}
}

// Hook is the hook of a program of the set.
func (s *Set) Hook(name string) (attach.Hook, bool) {
	h, ok := s.hooks[name]
	return h, ok
}

// IDs are the kernel IDs of the programs, to their hook names.
func (s *Set) IDs() map[ebpf.ProgramID]string {
	var hooks []attach.Hook
	for _, h := range s.hooks {
		hooks = append(hooks, h)
	}
	return s.IDsOf(hooks)
}

// IDsOf are the kernel IDs of the programs of hooks only (opening no other).
func (s *Set) IDsOf(hooks []attach.Hook) map[ebpf.ProgramID]string {
	out := map[ebpf.ProgramID]string{}
	for _, h := range hooks {
		name := h.Name
		prog, err := s.Prog(name)
		if err != nil {
			continue
		}
		// One syscall; prog.Info() would also parse /proc/self/fdinfo.
		if id, err := maps.ObjectID(prog.FD()); err == nil {
			out[ebpf.ProgramID(id)] = name
		}
	}
	return out
}

func newSet(bpfRoot, tag string, objs []Object) *Set {
	s := &Set{Tag: tag, dir: filepath.Join(Dir(bpfRoot), tag), byHook: map[string]*ebpf.Program{}, hooks: map[string]attach.Hook{}}
	for _, h := range Hooks(objs) {
		s.hooks[h.Name] = h
	}
	return s
}

// Pinned opens program name of the programs of tag, as Load pinned it:
// ErrNotFound when that set does not have it (another build's).
func Pinned(bpfRoot, tag, name string) (*ebpf.Program, error) {
	p, err := loadPinned(filepath.Join(Dir(bpfRoot), tag, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("program %s of %s: %w", name, tag, ErrNotFound)
	}
	return p, err
}

// Dir holds one directory per tag.
func Dir(bpfRoot string) string { return filepath.Join(bpfRoot, "programs") }

// Open finds the pinned programs of tag without loading anything (each is
// opened when first used: Prog); ErrNotFound when they are not all pinned,
// Runs included.
func Open(bpfRoot, tag string, objs []Object) (*Set, error) {
	s := newSet(bpfRoot, tag, objs)
	var pins []string
	for _, h := range Hooks(objs) {
		pins = append(pins, h.Name)
	}
	for _, o := range objs {
		pins = append(pins, o.Runs...)
	}
	for _, name := range pins {
		if _, err := os.Stat(filepath.Join(s.dir, name)); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("program %s of %s: %w", name, tag, ErrNotFound)
			}
			return nil, fmt.Errorf("finding pinned program %s: %w", name, err)
		}
	}
	return s, nil
}

// Installed lists the tags pinned under bpfRoot.
func Installed(bpfRoot string) ([]string, error) {
	ents, err := os.ReadDir(Dir(bpfRoot))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", Dir(bpfRoot), err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// Remove unpins the programs of tag (running attachments keep them).
func Remove(bpfRoot, tag string) error {
	if err := os.RemoveAll(filepath.Join(Dir(bpfRoot), tag)); err != nil {
		return fmt.Errorf("unpinning programs of %s: %w", tag, err)
	}
	return nil
}

// Load loads and verifies objs against the pinned maps (opening or
// creating those the objects declare pinned) and pins their programs as
// tag. The caller holds the node lock exclusively, so one call loads.
func Load(bpfRoot, tag string, objs []Object) (*Set, error) {
	// Reading the kernel's BTF allocates hundreds of MB; the plugin runs
	// with the collector off otherwise (pkg/hugeheap).
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	// The timer slack a process normally has, while the collector runs:
	// its stop-the-world phases and its workers sleep on short timers,
	// which a call's wide slack would stretch to 5 ms. Before the change
	// of GOMAXPROCS, which stops the world too (both ways: deferred after
	// it, the slack is widened again last).
	defer hugeheap.Narrow()()
	// A call runs on one P (pkg/hugeheap); the collector's workers want
	// the Ps the runtime had while it runs: 10% of a load's time.
	if n := hugeheap.Procs(); n > 1 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(n))
	}
	specs := make([]*ebpf.CollectionSpec, len(objs))
	var names []string
	seen := map[string]bool{}
	for i, o := range objs {
		spec, err := o.Load()
		if err != nil {
			return nil, fmt.Errorf("loading program spec of %s: %w", o.Name, err)
		}
		specs[i] = spec
		for name, ms := range spec.Maps {
			if ms.Pinning != ebpf.PinNone && !seen[name] {
				seen[name] = true
				names = append(names, name)
			}
		}
	}
	shared, err := maps.OpenPinned(bpfRoot, names...)
	if err != nil {
		return nil, fmt.Errorf("opening pinned maps: %w", err)
	}
	defer func() {
		for _, m := range shared {
			m.Close()
		}
	}()
	dir := filepath.Join(Dir(bpfRoot), tag)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	s := newSet(bpfRoot, tag, objs)
	for i, o := range objs {
		if err := load(o, specs[i], shared, dir, s); err != nil {
			s.Close()
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	return s, nil
}

// load loads one program file against the shared pinned maps (its
// unpinned maps, such as scratch space, are its own), pins its programs in
// dir and adds them to s.
func load(o Object, spec *ebpf.CollectionSpec, shared map[string]*ebpf.Map, dir string, s *Set) error {
	if err := setKernelFeatures(spec); err != nil {
		return err
	}
	repl := map[string]*ebpf.Map{}
	for name, ms := range spec.Maps {
		if ms.Pinning != ebpf.PinNone {
			repl[name] = shared[name]
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: repl})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return fmt.Errorf("verifying %s: %+v", o.Name, ve)
		}
		return fmt.Errorf("loading %s: %w", o.Name, err)
	}
	defer coll.Close()
	for _, h := range o.Hooks {
		prog, ok := coll.Programs[h.Name]
		if !ok {
			return fmt.Errorf("no program %s in %s", h.Name, o.Name)
		}
		if err := prog.Pin(filepath.Join(dir, h.Name)); err != nil {
			return fmt.Errorf("pinning %s: %w", h.Name, err)
		}
		clone, err := prog.Clone()
		if err != nil {
			return fmt.Errorf("cloning %s: %w", h.Name, err)
		}
		s.byHook[h.Name] = clone
	}
	for _, name := range o.Runs {
		prog, ok := coll.Programs[name]
		if !ok {
			return fmt.Errorf("no program %s in %s", name, o.Name)
		}
		if err := prog.Pin(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("pinning %s: %w", name, err)
		}
	}
	return nil
}

// setKernelFeatures tells a program object what the kernel offers, through
// its read-only globals: the verifier sees them as constants and drops the
// code of what is missing (the conntrack kfuncs, bpf/lib/netfilter_ct.h).
func setKernelFeatures(spec *ebpf.CollectionSpec) error {
	v, ok := spec.Variables["have_conntrack"]
	if !ok {
		return nil
	}
	ct := ProbeConntrack()
	if !ct.Available {
		return v.Set(uint32(0))
	}
	if err := v.Set(uint32(1)); err != nil {
		return fmt.Errorf("setting have_conntrack: %w", err)
	}
	if sz, ok := spec.Variables["ct_opts_size"]; ok {
		if err := sz.Set(ct.OptsSize); err != nil {
			return fmt.Errorf("setting ct_opts_size: %w", err)
		}
	}
	return nil
}
