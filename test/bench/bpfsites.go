package main

// Where in the programs a profile's samples fall: `perf annotate` cannot
// disassemble JITed BPF without libopcode (Debian's perf has none), and
// bpftool cannot dump JITed code without libbfd. The kernel keeps, for
// every loaded program, the JITed address of each BTF line record
// (jited_line_info) and the translated instructions with their map IDs:
// enough to name the source line and the map of each sample's innermost
// program frame. Run it while the programs profiled are still loaded
// (-hold), on `perf script -F ip,sym,symoff` of a `perf record -a -g`.

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// bpfLine is one BTF line record of a loaded program: where its JITed code
// starts, the source line, and the map its translated instructions load
// (a lookup's or an update's; "" when none).
type bpfLine struct {
	addr uint64
	prog string
	src  string // file:line
	text string
	mp   string
}

// bpfResolver finds the line record of a JITed address.
type bpfResolver struct {
	lines []bpfLine // sorted by addr
	funcs []addrRange
}

type addrRange struct{ start, end uint64 }

// newBPFResolver reads every program loaded now. Programs without line
// information (loaded without BTF) are left out.
func newBPFResolver() (*bpfResolver, error) {
	r := &bpfResolver{}
	mapNames := map[uint32]string{}
	for id := ebpf.ProgramID(0); ; {
		next, err := ebpf.ProgramGetNextID(id)
		if err != nil {
			break
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // gone meanwhile
		}
		info, err := p.Info()
		p.Close()
		if err != nil {
			return nil, fmt.Errorf("program %d: %w", id, err)
		}
		r.add(info, mapNames)
	}
	if len(r.lines) == 0 {
		return nil, fmt.Errorf("no loaded program has JITed line information (not root, or bpf_jit_enable off?)")
	}
	sort.Slice(r.lines, func(i, j int) bool { return r.lines[i].addr < r.lines[j].addr })
	sort.Slice(r.funcs, func(i, j int) bool { return r.funcs[i].start < r.funcs[j].start })
	return r, nil
}

func (r *bpfResolver) add(info *ebpf.ProgramInfo, mapNames map[uint32]string) {
	lis, err := info.LineInfos()
	jited, ok := info.JitedLineInfos()
	if err != nil || !ok || len(jited) != len(lis) {
		return
	}
	ksyms, _ := info.JitedKsymAddrs()
	lens, _ := info.JitedFuncLens()
	for i := range ksyms {
		if i < len(lens) {
			r.funcs = append(r.funcs, addrRange{uint64(ksyms[i]), uint64(ksyms[i]) + uint64(lens[i])})
		}
	}
	insns, err := info.Instructions()
	if err != nil {
		return
	}
	// The raw offset of each instruction, for the records' ranges.
	offs := make([]asm.RawInstructionOffset, len(insns))
	var off asm.RawInstructionOffset
	for i, ins := range insns {
		offs[i] = off
		off += asm.RawInstructionOffset(ins.Size() / asm.InstructionSize)
	}
	// Records by offset: each covers the instructions up to the next one.
	order := make([]int, len(lis))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return lis[order[a]].Offset < lis[order[b]].Offset })
	for k, i := range order {
		end := off
		if k+1 < len(order) {
			end = lis[order[k+1]].Offset
		}
		l := lis[i].Line
		line := bpfLine{addr: jited[i], prog: info.Name,
			src:  fmt.Sprintf("%s:%d", trimSrc(l.FileName()), l.LineNumber()),
			text: strings.Join(strings.Fields(l.Line()), " ")}
		start := sort.Search(len(offs), func(j int) bool { return offs[j] >= lis[i].Offset })
		for j := start; j < len(insns) && offs[j] < end; j++ {
			if insns[j].IsLoadFromMap() {
				line.mp = mapName(uint32(insns[j].Constant), mapNames)
			}
		}
		r.lines = append(r.lines, line)
	}
}

// trimSrc shortens a source path to what follows its last "bpf/".
func trimSrc(f string) string {
	if i := strings.LastIndex(f, "bpf/"); i >= 0 {
		return f[i:]
	}
	return f
}

func mapName(id uint32, cache map[uint32]string) string {
	if n, ok := cache[id]; ok {
		return n
	}
	n := fmt.Sprintf("map %d", id)
	if m, err := ebpf.NewMapFromID(ebpf.MapID(id)); err == nil {
		if mi, err := m.Info(); err == nil && mi.Name != "" {
			n = mi.Name
		}
		m.Close()
	}
	cache[id] = n
	return n
}

// resolve returns the line record of JITed address a, or nil when a is in
// no program with line information.
func (r *bpfResolver) resolve(a uint64) *bpfLine {
	f := sort.Search(len(r.funcs), func(i int) bool { return r.funcs[i].start > a }) - 1
	if f < 0 || a >= r.funcs[f].end {
		return nil
	}
	i := sort.Search(len(r.lines), func(i int) bool { return r.lines[i].addr > a }) - 1
	if i < 0 || r.lines[i].addr < r.funcs[f].start {
		return nil
	}
	return &r.lines[i]
}

// siteCount is the samples of one source line.
type siteCount struct {
	line    bpfLine
	samples int
}

// siteReport is what bpfSites found: samples per line of the innermost
// program frame, and the samples that had no program frame (or one without
// line information).
type siteReport struct {
	sites            []siteCount // most samples first
	matched, outside int
}

// bpfSites reads `perf script -F ip,sym,symoff` output (one block of
// frames per sample, innermost first, blocks separated by blank lines)
// and counts the samples whose innermost frame is leaf ("" for every
// sample) by the line of their innermost program frame.
func bpfSites(in io.Reader, r *bpfResolver, leaf string) (siteReport, error) {
	var rep siteReport
	counts := map[string]*siteCount{}
	var frames []string
	flush := func() {
		defer func() { frames = frames[:0] }()
		if len(frames) == 0 {
			return
		}
		if leaf != "" && frameSym(frames[0]) != leaf {
			return
		}
		rep.matched++
		for i, f := range frames {
			if !strings.HasPrefix(frameSym(f), "bpf_prog_") {
				continue
			}
			a, ok := frameAddr(f)
			if !ok {
				break
			}
			if i > 0 {
				a-- // a return address: the call is before it
			}
			l := r.resolve(a)
			if l == nil {
				break
			}
			key := l.prog + " " + l.src
			c := counts[key]
			if c == nil {
				c = &siteCount{line: *l}
				counts[key] = c
			}
			c.samples++
			return
		}
		rep.outside++
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		s := strings.TrimSpace(sc.Text())
		if s == "" {
			flush()
			continue
		}
		frames = append(frames, s)
	}
	flush()
	if err := sc.Err(); err != nil {
		return rep, err
	}
	for _, c := range counts {
		rep.sites = append(rep.sites, *c)
	}
	sort.Slice(rep.sites, func(i, j int) bool {
		if rep.sites[i].samples != rep.sites[j].samples {
			return rep.sites[i].samples > rep.sites[j].samples
		}
		return rep.sites[i].line.addr < rep.sites[j].line.addr
	})
	return rep, nil
}

// frameAddr and frameSym split a frame line "ffffffffc002614f
// bpf_prog_1c77fd38106b0978_to_netdev+0x466b".
func frameAddr(f string) (uint64, bool) {
	a, err := strconv.ParseUint(strings.Fields(f)[0], 16, 64)
	return a, err == nil
}

func frameSym(f string) string {
	fs := strings.Fields(f)
	if len(fs) < 2 {
		return ""
	}
	s := fs[1]
	if i := strings.Index(s, "+0x"); i >= 0 {
		s = s[:i]
	}
	return s
}

// writeSites prints the report, at most top lines.
func writeSites(w io.Writer, rep siteReport, top int) {
	inBPF := rep.matched - rep.outside
	fmt.Fprintf(w, "%d samples matched, %d in a program frame with line information, %d outside\n\n", rep.matched, inBPF, rep.outside)
	fmt.Fprintf(w, "%8s %6s  %-14s %-28s %-16s %s\n", "samples", "%", "program", "source", "map", "line")
	for i, s := range rep.sites {
		if i == top {
			break
		}
		mp := s.line.mp
		if mp == "" {
			mp = "-"
		}
		fmt.Fprintf(w, "%8d %5.1f%%  %-14s %-28s %-16s %s\n", s.samples, 100*float64(s.samples)/float64(inBPF),
			s.line.prog, s.line.src, mp, s.line.text)
	}
}

// runBPFSites is -bpf-sites: FILE ("-": stdin) attributed to the loaded
// programs' lines.
func runBPFSites(file, leaf string, top int) error {
	in := io.Reader(os.Stdin)
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	r, err := newBPFResolver()
	if err != nil {
		return err
	}
	rep, err := bpfSites(in, r, leaf)
	if err != nil {
		return err
	}
	writeSites(os.Stdout, rep, top)
	return nil
}
