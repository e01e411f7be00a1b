package cli

import (
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/buildinfo"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	"github.com/ebpf-cni/ebpf-cni/pkg/kernel"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
	"github.com/ebpf-cni/ebpf-cni/pkg/repair"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
	"github.com/ebpf-cni/ebpf-cni/pkg/view"
)

func init() {
	register(&Command{
		Name:    "status",
		Summary: "kernel features, programs loaded and their versions, attach modes in use, and what is wrong",
		Help: `Kernel features ebpf-cni uses: bpffs at --bpf-root, BTF, tcx links, the
fq qdisc (probed in a throwaway network namespace of its own, on its
loopback: no real interface is touched), the bpf_cast_to_kern_ctx kfunc
(kern_ctx) and netfilter's conntrack kfuncs (without them Services through
kube-proxy do not work from pods; docs/kernels.md says what each needs). The programs pinned under
<bpfRoot>/programs/<tag> with their build version, kernel ID, age and how
many endpoints run them, and whether they are this binary's. The attach
modes (tcx, tc, netkit) the endpoints use, and the pods' device type
(veth or netkit: deviceType auto decides it once per node). Then every problem found, each saying
what to do: endpoints whose veth is gone, records without map entries (or
the reverse), nothing or a stale program attached, stale program tags,
ebpf-ipam addresses held with no endpoint for a netns that is gone (a note
when it is there: another plugin's pod, or a leak).

A problem must be seen twice, a quarter second apart, to be reported, so
an ADD or DEL in progress is not one. Exit status 3 when there are
problems, 0 when there are none.

JSON: version, programTag (this binary's), kernel, bpfRoot, stateDir,
features {bpffs, btf, tcx, fq, kern_ctx, netkit, conntrack: {available, detail}}, programs [{tag,
version, current, programs [{hook, id, name, loadedSeconds, endpoints}]}],
attachModes {mode: endpoints}, deviceType, devices {veth|netkit: endpoints},
endpoints, maps [{name, entries, capacity}],
problems [], notes [].

MAPS lists the pinned maps that pods and traffic fill (those with an
entry): entries against max_entries. A map that refuses new entries when
full (endpoints, hostports, ipam_allocs, policy_rules...) is a problem from
95% on and a note from 80%; an LRU map (nat, flows, sock_revnat,
policy_flows) evicts its least recently used flows and a counters map
(device_slots, device_counters, policy_drops) only counts elsewhere or
less, a note from 95%.`,
		Flags: func(*flag.FlagSet) func(*Context) error { return runStatus },
	})
}

// Feature is one kernel feature and what was found.
type Feature = kernel.Feature

// ProgramSet is the programs of one pinned tag.
type ProgramSet struct {
	Tag      string    `json:"tag"`
	Version  string    `json:"version"`
	Current  bool      `json:"current"` // this binary's tag
	Programs []Program `json:"programs"`
}

// Program is one pinned program.
type Program struct {
	Hook          string `json:"hook"`
	ID            uint32 `json:"id"`
	Name          string `json:"name"`
	LoadedSeconds uint64 `json:"loadedSeconds"` // how long ago the kernel loaded it
	Endpoints     int    `json:"endpoints"`     // endpoints it is attached to
}

// Status is what status reports.
type Status struct {
	Version     string             `json:"version"`
	ProgramTag  string             `json:"programTag"`
	Kernel      string             `json:"kernel"`
	BPFRoot     string             `json:"bpfRoot"`
	StateDir    string             `json:"stateDir"`
	Features    map[string]Feature `json:"features"`
	Programs    []ProgramSet       `json:"programs"`
	AttachModes map[string]int     `json:"attachModes"`
	// DeviceType is the device type deviceType auto gives the node's new
	// pods, as the node decided it (its first ADD), or as it would
	// ("netkit (not decided yet)").
	DeviceType string `json:"deviceType"`
	// Devices counts the endpoints by their pair's device type.
	Devices   map[string]int `json:"devices"`
	Endpoints int            `json:"endpoints"`
	Maps      []maps.Fill    `json:"maps"`
	Problems  []string       `json:"problems"`
	Notes     []string       `json:"notes"`
}

func runStatus(ctx *Context) error {
	st := collectStatus(ctx)
	if len(st.Problems) > 0 {
		// An ADD or DEL in flight looks like a half-made endpoint: report
		// only what is still wrong a moment later.
		first := st.Problems
		time.Sleep(250 * time.Millisecond)
		st = collectStatus(ctx)
		st.Problems = slices.DeleteFunc(st.Problems, func(p string) bool { return !slices.Contains(first, p) })
	}
	if ctx.JSON {
		if err := writeJSON(ctx.Stdout, st); err != nil {
			return err
		}
	} else if err := printStatus(ctx, st); err != nil {
		return err
	}
	if len(st.Problems) > 0 {
		return errProblems
	}
	return nil
}

func collectStatus(ctx *Context) *Status {
	st := &Status{Version: buildinfo.Version, ProgramTag: features.Tag(), BPFRoot: ctx.BPFRoot, StateDir: ctx.StateDir,
		Features: map[string]Feature{}, Programs: []ProgramSet{}, AttachModes: map[string]int{}, Devices: map[string]int{}, Maps: []maps.Fill{}, Problems: []string{}, Notes: []string{}}
	var uts unix.Utsname
	if unix.Uname(&uts) == nil {
		st.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	st.kernelFeatures()
	st.DeviceType = nodeDeviceType(ctx.StateDir, st.Features[kernel.Netkit].Available)
	if !st.bpffs(ctx) {
		return st
	}
	n, err := loadNode(ctx)
	if err != nil {
		st.problem("reading the node's state: %v", err)
		return st
	}
	usedBy := st.endpoints(ctx, n)
	statusUnrestored(ctx, st.problem)
	statusIPAMLeaks(ctx, n, st.problem, st.note)
	st.Maps = statusMaps(ctx, st.problem, st.note)
	st.programs(ctx, n, usedBy)
	return st
}

func (st *Status) problem(f string, a ...any) {
	st.Problems = append(st.Problems, fmt.Sprintf(f, a...))
}
func (st *Status) note(f string, a ...any) { st.Notes = append(st.Notes, fmt.Sprintf(f, a...)) }

// kernelFeatures probes what the kernel offers ebpf-cni.
func (st *Status) kernelFeatures() {
	for name, f := range kernel.Probe() {
		st.Features[name] = f
	}
	if ct := programs.ProbeConntrack(); ct.Available {
		st.Features["conntrack"] = Feature{Available: true, Detail: ct.Detail}
	} else {
		st.Features["conntrack"] = Feature{Detail: ct.Detail + ": Services through netfilter (kube-proxy) do not work from pods"}
	}
	if !st.Features["btf"].Available {
		st.problem("kernel without BTF (%s): ebpf-cni needs a kernel built with CONFIG_DEBUG_INFO_BTF", st.Features["btf"].Detail)
	}
	if !st.Features["fq"].Available {
		st.note("no fq qdisc: bandwidth limits use token buckets in BPF without EDT; TCP sent by the node and its pods is still paced at its source (sock_ops), outside senders are policed")
	}
}

// bpffs reports whether bpfRoot holds the plugin's state, and what is
// wrong when it does not (then nothing else can be read).
func (st *Status) bpffs(ctx *Context) bool {
	dir, mounted, err := view.BPFFSMount(ctx.BPFRoot)
	switch {
	case err != nil:
		st.Features["bpffs"] = Feature{Available: false, Detail: err.Error()}
	case !mounted:
		st.Features["bpffs"] = Feature{Available: false, Detail: fmt.Sprintf("not mounted at %s: mount -t bpf bpf %s", dir, dir)}
	default:
		st.Features["bpffs"] = Feature{Available: true, Detail: dir + " is on bpffs"}
	}
	if !st.Features["bpffs"].Available {
		st.problem("bpffs: %s (or point --bpf-root at the plugin's bpfRoot)", st.Features["bpffs"].Detail)
		return false
	}
	if dir != filepath.Clean(ctx.BPFRoot) {
		if recs, _ := ctx.Node.RecordNames(); len(recs) > 0 {
			st.problem("%s is gone but %d endpoint(s) are recorded under %s: the bpffs was remounted and lost every pin; the next CNI STATUS or ADD restores them, ebpf-cni repair does it now",
				ctx.BPFRoot, len(recs), ctx.StateDir)
			return false
		}
		if links, _ := veth.HostLinks(); len(links) > 0 {
			st.problem("%s is gone and %s holds no record, yet %d host veth(s) of ebpf-cni live: the bpffs was remounted and the stateDir lost; the next CNI STATUS or ADD rebuilds what the kernel still tells, ebpf-cni repair does it now",
				ctx.BPFRoot, ctx.StateDir, len(links))
			return false
		}
		st.note("nothing under %s yet: no pod was added on this node, or --bpf-root is not the plugin's bpfRoot", ctx.BPFRoot)
		return false
	}
	return true
}

// endpoints reports the endpoints and their problems, and returns how
// many endpoints run each program.
func (st *Status) endpoints(ctx *Context, n *snapshot) map[uint32]int {
	st.Endpoints = len(n.Endpoints)
	for _, name := range ctx.Node.Marked(node.MarkLossy) {
		st.problem("host veth %s: its record was rebuilt with neither the stateDir nor the bpffs: published ports and bandwidth limits it had are lost (CNI STATUS fails with 51 until then): delete and recreate its pod, or ebpf-cni repair --accept-loss", name)
	}
	// The node's last endpoint takes the node-wide attachments with it
	// (DEL, GC, ebpf-cni gc): any left without an endpoint is a leftover.
	if len(n.Endpoints) == 0 {
		sets, err := ctx.Node.AttachmentSets("")
		if err != nil {
			st.problem("reading the node's attachment records: %v", err)
		}
		for _, s := range sets {
			if len(s.Attachments) > 0 {
				st.problem("%s %s: %d program(s) attached with no endpoint on the node: ebpf-cni gc removes them", s.Owner, s.Name, len(s.Attachments))
			}
		}
	}
	usedBy := map[uint32]int{}
	for _, e := range n.Endpoints {
		if e.Device != "" {
			st.Devices[e.Device]++
		}
		for _, a := range e.Attachments {
			if e.VethPresent && a.Mode != "" {
				st.AttachModes[a.Mode]++
			}
			for _, id := range a.ProgramIDs {
				usedBy[id]++
			}
			if a.RecordedMode == string(attach.ModeTCX) && !st.Features["tcx"].Available {
				st.problem("%s: recorded with tcx, which this kernel lacks: use attachMode tc", e.Name())
			}
		}
		for _, p := range e.Problems {
			st.problem("endpoint %s (%s): %s", e.Name(), orDash(e.HostVeth), p)
		}
	}
	return usedBy
}

// programs reports the program sets pinned, and what is wrong with them.
func (st *Status) programs(ctx *Context, n *snapshot, usedBy map[uint32]int) {
	cur := false
	for _, tag := range n.Tags {
		ps := ProgramSet{Tag: tag, Version: tagVersion(tag), Current: tag == st.ProgramTag, Programs: []Program{}}
		cur = cur || ps.Current
		used := 0
		for id, th := range n.programs {
			if th[0] != tag {
				continue
			}
			p := Program{Hook: th[1], ID: uint32(id), Endpoints: usedBy[uint32(id)]}
			programInfo(id, &p)
			ps.Programs = append(ps.Programs, p)
			used += p.Endpoints
		}
		sort.Slice(ps.Programs, func(i, j int) bool { return ps.Programs[i].Hook < ps.Programs[j].Hook })
		if len(ps.Programs) < len(programs.Hooks(features.Objects())) {
			st.problem("programs of %s only partly pinned under %s: remove that directory; the next ADD loads them again",
				tag, filepath.Join(programs.Dir(ctx.BPFRoot), tag))
		}
		st.Programs = append(st.Programs, ps)
		if len(n.Tags) > 1 && !ps.Current && used == 0 {
			st.problem("stale programs of %s pinned, used by no endpoint: rm -r %s", tag, filepath.Join(programs.Dir(ctx.BPFRoot), tag))
		}
	}
	if len(n.Tags) > 1 {
		st.problem("programs of %d builds pinned (%s): an upgrade stopped half-way; endpoints on the older ones keep them until DEL and ADD", len(n.Tags), strings.Join(n.Tags, ", "))
	}
	switch {
	case len(n.Tags) == 0 && st.Endpoints > 0:
		st.problem("no programs pinned under %s, yet there are endpoints: the next ADD, or a CNI STATUS, loads them", programs.Dir(ctx.BPFRoot))
	case len(n.Tags) > 0 && !cur:
		st.note("the node runs programs of another build than this binary's (%s): the first ADD or CNI STATUS of ebpf-cni %s loads its own and moves every endpoint to them",
			st.ProgramTag, st.Version)
	}
}

// statusUnrestored reports what the features keep for live endpoints and
// is missing (a bpffs loss took it): what ebpf-cni repair restores.
func statusUnrestored(ctx *Context, problem func(string, ...any)) {
	lines, err := repair.Unrestored(ctx.Node)
	for _, l := range lines {
		problem("endpoint %s: the next CNI STATUS after a bpffs loss restores it, ebpf-cni repair does it now", l)
	}
	if err != nil {
		problem("reading what the features keep for the endpoints: %v", err)
	}
}

// statusMaps reads how full the fillable maps are (those holding an entry)
// and says which are close to full, by what being full costs.
func statusMaps(ctx *Context, problem, note func(string, ...any)) []maps.Fill {
	fills, errs := maps.ReadFill(ctx.BPFRoot)
	for _, err := range errs {
		problem("reading a map's fill: %v", err)
	}
	out := []maps.Fill{}
	for _, f := range fills {
		if f.Entries == 0 {
			continue
		}
		out = append(out, f)
		pct := f.Percent()
		switch {
		case f.Kind() == maps.FillRefuses && pct >= 95:
			// No count in the text: a problem must read the same twice.
			problem("map %s is 95%% full or more (of %d entries; MAPS has the count): a full map refuses new entries, and what needs one fails (an ADD, a published port, a policy rule); remove what holds them (pods, mappings, policies; ebpf-cni gc for leftovers)",
				f.Name, f.Capacity)
		case f.Kind() == maps.FillRefuses && pct >= 80:
			note("map %s is %.0f%% full (%d of %d entries): at 100%% it refuses new entries", f.Name, pct, f.Entries, f.Capacity)
		case f.Kind() == maps.FillEvicts && pct >= 95:
			note("map %s is %.0f%% full (%d of %d entries): it evicts its least recently used flows; a flow idle long enough to be evicted starts over", f.Name, pct, f.Entries, f.Capacity)
		case f.Kind() == maps.FillCounts && pct >= 95:
			note("map %s is %.0f%% full (%d of %d entries): devices or rules beyond it are counted elsewhere (device_slots: in device_counters, a lookup more per packet) or not at all", f.Name, pct, f.Entries, f.Capacity)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Percent() > out[j].Percent() })
	return out
}

// programInfo fills in the kernel's name and load time of a program.
func programInfo(id ebpf.ProgramID, p *Program) {
	prog, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return
	}
	defer prog.Close()
	info, err := prog.Info()
	if err != nil {
		return
	}
	p.Name = info.Name
	var now unix.Timespec
	if loaded, ok := info.LoadTime(); ok && unix.ClockGettime(unix.CLOCK_BOOTTIME, &now) == nil {
		if age := time.Duration(now.Nano()) - loaded; age > 0 {
			p.LoadedSeconds = uint64(age / time.Second)
		}
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// statusFeatures is the order of status's feature table: what the kernel
// package probes, framed by what status checks itself (bpffs before, the
// conntrack kfuncs after).
// nodeDeviceType is what deviceType auto gives the node's new pods.
func nodeDeviceType(stateDir string, netkit bool) string {
	if k, ok := veth.RecordedAutoKind(stateDir); ok {
		return string(k)
	}
	if netkit {
		return string(veth.KindNetkit) + " (not decided yet: the first ADD decides)"
	}
	return string(veth.KindVeth) + " (not decided yet: the first ADD decides)"
}

func statusFeatures() []string {
	names := append([]string{"bpffs"}, kernel.Names...)
	return append(names, "conntrack")
}

func printStatus(ctx *Context, st *Status) error {
	w := ctx.Stdout
	fmt.Fprintf(w, "ebpf-cni %s (programs %s), kernel %s\nbpfRoot %s, stateDir %s\n\n", st.Version, st.ProgramTag, orDash(st.Kernel), st.BPFRoot, st.StateDir)
	ft := &view.Table{Header: []string{"FEATURE", "AVAILABLE", "DETAIL"}}
	for _, name := range statusFeatures() {
		if f, ok := st.Features[name]; ok {
			ft.Row(name, yesNo(f.Available), f.Detail)
		}
	}
	if err := ft.Write(w); err != nil {
		return err
	}
	if len(st.Programs) > 0 {
		fmt.Fprintln(w)
		pt := &view.Table{Header: []string{"PROGRAMS TAG", "VERSION", "THIS BINARY", "HOOK", "ID", "LOADED", "ENDPOINTS"}, Right: map[int]bool{4: true, 5: true, 6: true}}
		for _, ps := range st.Programs {
			for _, p := range ps.Programs {
				pt.Row(ps.Tag, ps.Version, yesNo(ps.Current), p.Hook, fmt.Sprint(p.ID), view.HumanAge(time.Duration(p.LoadedSeconds)*time.Second)+" ago", view.HumanCount(uint64(p.Endpoints)))
			}
		}
		if err := pt.Write(w); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "\ndevice type (deviceType auto): %s\n", st.DeviceType)
	fmt.Fprintf(w, "endpoints: %d", st.Endpoints)
	for _, d := range sortedKeys(st.Devices) {
		fmt.Fprintf(w, ", %s %d", d, st.Devices[d])
	}
	fmt.Fprintln(w)
	if len(st.AttachModes) > 0 {
		fmt.Fprintln(w)
		mt := &view.Table{Header: []string{"ATTACH MODE", "ENDPOINTS"}, Right: map[int]bool{1: true}}
		for _, m := range sortedKeys(st.AttachModes) {
			mt.Row(m, view.HumanCount(uint64(st.AttachModes[m])))
		}
		if err := mt.Write(w); err != nil {
			return err
		}
	}
	if len(st.Maps) > 0 {
		fmt.Fprintln(w)
		mt := &view.Table{Header: []string{"MAP", "ENTRIES", "CAPACITY", "FULL"}, Right: map[int]bool{1: true, 2: true, 3: true}}
		for _, f := range st.Maps {
			mt.Row(f.Name, view.HumanCount(uint64(f.Entries)), view.HumanCount(uint64(f.Capacity)), fmt.Sprintf("%.1f%%", f.Percent()))
		}
		if err := mt.Write(w); err != nil {
			return err
		}
	}
	if len(st.Problems) == 0 {
		fmt.Fprintln(w, "\nproblems: none")
	} else {
		fmt.Fprintf(w, "\nproblems (%d):\n", len(st.Problems))
		for _, p := range st.Problems {
			fmt.Fprintf(w, "  - %s\n", p)
		}
	}
	if len(st.Notes) > 0 {
		fmt.Fprintln(w, "notes:")
		for _, n := range st.Notes {
			fmt.Fprintf(w, "  - %s\n", n)
		}
	}
	return nil
}
