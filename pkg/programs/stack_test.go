package programs_test

import (
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/features"
)

// maxBPFStack is the kernel's MAX_BPF_STACK: what a program's frames may
// take together, along its deepest chain of BPF-to-BPF calls.
const maxBPFStack = 512

// frameDepths reads, per function of a program (its subprograms included:
// a global function like policy_from_pod is one), the deepest stack slot
// it touches, and whom it calls. A slot is touched by a load or store
// through the frame pointer (r10), or through a register copied from it
// and moved by a constant (a key on the stack handed to a helper): what
// the verifier counts as the function's stack_depth.
func frameDepths(insns asm.Instructions) (depth map[string]int, calls map[string][]string, entry string) {
	depth, calls = map[string]int{}, map[string][]string{}
	fp := map[asm.Register]int16{} // registers pointing into the frame: their offset from r10
	fn := ""
	note := func(off int16) {
		if off < 0 && int(-off) > depth[fn] {
			depth[fn] = int(-off)
		}
	}
	for _, ins := range insns {
		if sym := ins.Symbol(); sym != "" {
			fn, fp = sym, map[asm.Register]int16{}
			if entry == "" {
				entry = sym
			}
			depth[fn] += 0
		}
		op := ins.OpCode
		switch {
		case ins.IsFunctionCall():
			calls[fn] = append(calls[fn], ins.Reference())
			fp = map[asm.Register]int16{}
		case op.Class() == asm.LdXClass && op.Mode() == asm.MemMode:
			if o, ok := fp[ins.Src]; ok || ins.Src == asm.R10 {
				note(o + ins.Offset)
			}
			delete(fp, ins.Dst)
		case (op.Class() == asm.StXClass || op.Class() == asm.StClass) && op.Mode() == asm.MemMode:
			if o, ok := fp[ins.Dst]; ok || ins.Dst == asm.R10 {
				note(o + ins.Offset)
			}
		case op.Class() == asm.ALU64Class && op.ALUOp() == asm.Mov && op.Source() == asm.RegSource:
			if o, ok := fp[ins.Src]; ok || ins.Src == asm.R10 {
				fp[ins.Dst] = o
			} else {
				delete(fp, ins.Dst)
			}
		case op.Class() == asm.ALU64Class && op.ALUOp() == asm.Add && op.Source() == asm.ImmSource:
			if o, ok := fp[ins.Dst]; ok {
				fp[ins.Dst] = o + int16(ins.Constant)
				note(fp[ins.Dst])
			}
		case op.Class().IsALU() || op.Class().IsLoad():
			delete(fp, ins.Dst)
		}
	}
	return depth, calls, entry
}

// combinedStack is what the verifier of kernel 6.1 adds up for the
// deepest chain of calls from entry: each frame rounded up to 32 bytes
// (check_max_stack_depth). Newer kernels round less; 6.1 is the oldest
// the plugin supports (docs/kernels.md).
func combinedStack(depth map[string]int, calls map[string][]string, fn string, seen map[string]bool) int {
	if seen[fn] {
		return 0 // recursion: the verifier refuses it anyway
	}
	seen[fn] = true
	defer delete(seen, fn)
	d := max(depth[fn], 1)
	d = (d + 31) / 32 * 32
	deepest := 0
	for _, c := range calls[fn] {
		deepest = max(deepest, combinedStack(depth, calls, c, seen))
	}
	return d + deepest
}

// TestProgramsStackFits6_1: every program of every object the plugin
// loads (features.Objects: the embedded ones, so that it runs in the
// kernel guests too) keeps its frames, along its deepest chain of calls,
// within 512 bytes as kernel 6.1 counts them. CI runs on a newer kernel,
// which counts less (from_container once took 544 bytes there, with a
// second inlined bpf_fib_lookup, and loaded everywhere but 6.1).
// EBPF_CNI_STACK_OBJECTS (a list of .o files) checks others instead.
func TestProgramsStackFits6_1(t *testing.T) {
	type object struct {
		name string
		load func() (*ebpf.CollectionSpec, error)
	}
	var objs []object
	for _, o := range features.Objects() {
		objs = append(objs, object{o.Name, o.Load})
	}
	if files := os.Getenv("EBPF_CNI_STACK_OBJECTS"); files != "" {
		objs = nil
		for _, f := range filepath.SplitList(files) {
			objs = append(objs, object{f, func() (*ebpf.CollectionSpec, error) { return ebpf.LoadCollectionSpec(f) }})
		}
	}
	checked := 0
	for _, obj := range objs {
		spec, err := obj.load()
		require.NoError(t, err, obj.name)
		names := make([]string, 0, len(spec.Programs))
		for name := range spec.Programs {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			depth, calls, entry := frameDepths(spec.Programs[name].Instructions)
			total := combinedStack(depth, calls, entry, map[string]bool{})
			t.Logf("%s %s: %d bytes (frames %v)", obj.name, name, total, depth)
			require.LessOrEqual(t, total, maxBPFStack, "%s: program %s takes %d bytes of stack along its calls on 6.1 (frames %v, calls %v)", obj.name, name, total, depth, calls)
			checked++
		}
	}
	require.GreaterOrEqual(t, checked, len(objs), "every object has a program")
}

// TestFrameDepths: the reading of a frame on instructions made up for it.
func TestFrameDepths(t *testing.T) {
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R2, asm.R10).WithSymbol("main"),
		asm.Add.Imm(asm.R2, -200), // a key on the stack
		asm.StoreMem(asm.R10, -8, asm.R1, asm.DWord),
		asm.Call.Label("sub"),
		asm.Return(),
		asm.LoadMem(asm.R0, asm.R10, -40, asm.DWord).WithSymbol("sub"),
		asm.Return(),
	}
	depth, calls, entry := frameDepths(insns)
	require.Equal(t, "main", entry)
	require.Equal(t, map[string]int{"main": 200, "sub": 40}, depth)
	require.Equal(t, map[string][]string{"main": {"sub"}}, calls)
	require.Equal(t, 224+64, combinedStack(depth, calls, entry, map[string]bool{}))
}
