package datapath

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/buildinfo"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// Programs are the datapath's programs, loaded and verified once per node
// and binary version, pinned under bpfRoot/programs/<tag>/<hook>.
type Programs struct {
	Tag    string
	ByHook map[string]*ebpf.Program
}

// Close releases the handles (the pins keep the programs loaded).
func (p *Programs) Close() {
	if p == nil {
		return
	}
	for _, prog := range p.ByHook {
		prog.Close()
	}
}

// IDs are the kernel IDs of the programs.
func (p *Programs) IDs() map[ebpf.ProgramID]string {
	out := map[ebpf.ProgramID]string{}
	for name, prog := range p.ByHook {
		// One syscall; prog.Info() would also parse /proc/self/fdinfo, on
		// every ADD with masquerade.
		if id, err := maps.ObjectID(prog.FD()); err == nil {
			out[ebpf.ProgramID(id)] = name
		}
	}
	return out
}

var unsafeTag = regexp.MustCompile(`[^A-Za-z0-9._-]`)

// Tag names one build of the programs: the binary version and a digest of
// the object, so a rebuild with other programs, or a new release, is a new
// tag and ADD upgrades the node to it.
func Tag() string {
	h := sha256.New()
	for _, o := range objects {
		h.Write(o.bytes)
	}
	return unsafeTag.ReplaceAllString(buildinfo.Version, "_") + "-" + hex.EncodeToString(h.Sum(nil))[:12]
}

// object is one compiled program file and the hooks its programs serve.
type object struct {
	bytes []byte
	load  func() (*ebpf.CollectionSpec, error)
	hooks []Hook
}

// objects are every program file of the datapath (bpf/*.c but maps.c).
var objects = []object{
	{_FromContainerBytes, LoadFromContainer, []Hook{HookFromContainer}},
	{_ToContainerBytes, LoadToContainer, []Hook{HookToContainer}},
	{_FromNetdevBytes, LoadFromNetdev, []Hook{HookFromNetdev}},
	{_FromTunnelBytes, LoadFromTunnel, []Hook{HookFromTunnel}},
	{_ToTunnelBytes, LoadToTunnel, []Hook{HookToTunnel}},
	{_ToNetdevBytes, LoadToNetdev, []Hook{HookToNetdev}},
	{_SockHostportBytes, LoadSockHostport, SockHooks},
	{_SockPacingBytes, LoadSockPacing, PacingHooks},
}

// ProgramsDir holds one directory per tag.
func ProgramsDir(bpfRoot string) string { return filepath.Join(bpfRoot, "programs") }

// OpenPrograms opens the pinned programs of tag without loading anything;
// ErrNotFound when they are not all pinned.
func OpenPrograms(bpfRoot, tag string) (*Programs, error) {
	dir := filepath.Join(ProgramsDir(bpfRoot), tag)
	p := &Programs{Tag: tag, ByHook: map[string]*ebpf.Program{}}
	for _, h := range allHooks() {
		prog, err := ebpf.LoadPinnedProgram(filepath.Join(dir, h.Name), nil)
		if err != nil {
			p.Close()
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("program %s of %s: %w", h.Name, tag, ErrNotFound)
			}
			return nil, fmt.Errorf("opening pinned program %s: %w", h.Name, err)
		}
		p.ByHook[h.Name] = prog
	}
	return p, nil
}

// InstalledTags lists the tags pinned under bpfRoot.
func InstalledTags(bpfRoot string) ([]string, error) {
	ents, err := os.ReadDir(ProgramsDir(bpfRoot))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", ProgramsDir(bpfRoot), err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// mapNames are the maps every program shares, pinned by pkg/maps.
var mapNames = []string{maps.CniMapPktCounters, maps.CniMapEndpointCounters, maps.CniMapEndpoints, maps.CniMapEndpointDevs,
	maps.CniMapIpamAllocs, maps.CniMapIpamCursors, maps.CniMapIpamNets,
	maps.CniMapNat, maps.CniMapNatTimeouts, maps.CniMapMasqNets, maps.CniMapMasqSkip, maps.CniMapUplinks,
	maps.CniMapHostports, maps.CniMapNodeAddrs, maps.CniMapHostportConfig, maps.CniMapSockRevnat,
	maps.CniMapBwBuckets, maps.CniMapLocalNetns, maps.CniMapFlows, maps.CniMapClusterRoutes, maps.CniMapClusterConfig}

// EnsurePrograms returns this binary's pinned programs, loading, verifying
// and pinning them first if no call did yet (under the exclusive node lock,
// so exactly one caller loads). When it loads, it also moves every existing
// endpoint from older tags to the new programs and unpins the old ones.
// loaded reports whether this call did the load.
func EnsurePrograms(bpfRoot, stateDir string) (p *Programs, loaded bool, err error) {
	tag := Tag()
	if p, err := OpenPrograms(bpfRoot, tag); err == nil || !errors.Is(err, ErrNotFound) {
		return p, false, err
	}
	lock, err := NodeLock(stateDir, true)
	if err != nil {
		return nil, false, err
	}
	defer lock.Unlock()
	if p, err := OpenPrograms(bpfRoot, tag); err == nil || !errors.Is(err, ErrNotFound) {
		return p, false, err // another call loaded them while we waited
	}
	if p, err = loadAndPin(bpfRoot, tag); err != nil {
		return nil, false, err
	}
	if err := upgrade(bpfRoot, stateDir, p); err != nil {
		p.Close()
		return nil, false, err
	}
	return p, true, nil
}

func loadAndPin(bpfRoot, tag string) (*Programs, error) {
	shared, err := maps.OpenPinned(bpfRoot, mapNames...)
	if err != nil {
		return nil, fmt.Errorf("opening pinned maps: %w", err)
	}
	defer func() {
		for _, m := range shared {
			m.Close()
		}
	}()
	dir := filepath.Join(ProgramsDir(bpfRoot), tag)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	p := &Programs{Tag: tag, ByHook: map[string]*ebpf.Program{}}
	fail := func(err error) (*Programs, error) {
		p.Close()
		_ = os.RemoveAll(dir)
		return nil, err
	}
	for _, o := range objects {
		if err := loadObject(o, shared, dir, p); err != nil {
			return fail(err)
		}
	}
	return p, nil
}

// loadObject loads one program file against the shared pinned maps (its
// unpinned maps, such as scratch space, are its own), pins its programs in
// dir and adds them to p.
func loadObject(o object, shared map[string]*ebpf.Map, dir string, p *Programs) error {
	spec, err := o.load()
	if err != nil {
		return fmt.Errorf("loading program spec: %w", err)
	}
	if err := setKernelFeatures(spec); err != nil {
		return err
	}
	repl := map[string]*ebpf.Map{}
	for name, ms := range spec.Maps {
		if ms.Pinning == ebpf.PinNone {
			continue
		}
		m, ok := shared[name]
		if !ok {
			return fmt.Errorf("program object declares map %s that pkg/maps does not pin", name)
		}
		repl[name] = m
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: repl})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return fmt.Errorf("verifying programs: %+v", ve)
		}
		return fmt.Errorf("loading programs: %w", err)
	}
	defer coll.Close()
	for _, h := range o.hooks {
		prog, ok := coll.Programs[h.Name]
		if !ok {
			return fmt.Errorf("no program %s in the object", h.Name)
		}
		if err := prog.Pin(filepath.Join(dir, h.Name)); err != nil {
			return fmt.Errorf("pinning %s: %w", h.Name, err)
		}
		clone, err := prog.Clone()
		if err != nil {
			return fmt.Errorf("cloning %s: %w", h.Name, err)
		}
		p.ByHook[h.Name] = clone
	}
	return nil
}

// upgrade points every recorded endpoint at p's programs and unpins the
// programs of other tags. Each swap is atomic (tcx link update, tc filter
// replace): traffic keeps flowing and the maps stay as they are.
func upgrade(bpfRoot, stateDir string, p *Programs) error {
	tags, err := InstalledTags(bpfRoot)
	if err != nil {
		return err
	}
	if len(tags) <= 1 {
		return nil
	}
	recs, err := Records(stateDir)
	if err != nil {
		return err
	}
	for _, r := range recs {
		for _, a := range r.Attachments {
			prog, ok := p.ByHook[a.Hook]
			if !ok {
				continue
			}
			if err := Replace(a, r.HostIfIndex, prog); err != nil && !errors.Is(err, os.ErrNotExist) {
				// An endpoint whose pod is gone has nothing to upgrade; DEL or
				// GC removes it. Anything else must not be half-done silently.
				if _, lerr := linkByIndexName(r.HostIfIndex, r.HostIfName); lerr != nil {
					continue
				}
				return fmt.Errorf("upgrading %s of %s: %w", a.Hook, r.HostIfName, err)
			}
		}
	}
	ups, err := UplinkRecords(stateDir)
	if err != nil {
		return err
	}
	tuns, err := TunnelRecords(stateDir)
	if err != nil {
		return err
	}
	for _, u := range append(ups, tuns...) {
		for _, a := range u.Attachments {
			if prog, ok := p.ByHook[a.Hook]; ok {
				if err := Replace(a, u.IfIndex, prog); err != nil {
					return fmt.Errorf("upgrading %s of uplink %s: %w", a.Hook, u.Name, err)
				}
			}
		}
	}
	if err := upgradeSock(bpfRoot, p); err != nil {
		return err
	}
	for _, t := range tags {
		if t != p.Tag {
			if err := os.RemoveAll(filepath.Join(ProgramsDir(bpfRoot), t)); err != nil {
				return fmt.Errorf("unpinning programs of %s: %w", t, err)
			}
		}
	}
	return nil
}

// setKernelFeatures tells a program object what the kernel offers, through
// its read-only globals: the verifier sees them as constants and drops the
// code of what is missing (the conntrack kfuncs, bpf/lib/flow.h).
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
