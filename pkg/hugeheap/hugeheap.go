// Package hugeheap prepares the process of a CNI call: the collector off,
// the heap on a transparent huge page, the main goroutine's stack grown
// once, the threads' timer slack widened (slack.go), one P unless the
// caller set GOMAXPROCS (oneProc); a blank import is all it takes. A
// process started without CNI_COMMAND (the operator CLI, the agent, a test
// binary) is left as it is.
//
// A CNI call is a fresh process that allocates about a MiB and exits in
// milliseconds: collecting garbage would only cost time (loading the
// programs turns the collector on for its duration: programs.Load).
//
// Every first touch of a 4 KiB heap page is a page fault, a few hundred per
// call, and in a virtual machine a fault costs microseconds to tens of them.
// The runtime maps its heap in 4 MiB chunks and has touched the first one
// in places before any package initialises. init moves the heap on to a
// huge-page boundary: it allocates, without touching them, the pages up to
// the next 2 MiB boundary (in a fresh chunk when the current one ends
// there) and the free pages left below it, marks the 2 MiB from the
// boundary MADV_HUGEPAGE, and the call's allocations fault in one huge page
// there. The pages it skipped cost address space only.
// Collapsing the touched pages in place (MADV_COLLAPSE), what this package
// did first, costs more: the kernel drains every CPU's LRU caches first and
// waits for a worker on each CPU, milliseconds when another process keeps
// a CPU busy (docs/performance.md).
//
// With transparent huge pages "always" the kernel backs the heap with huge
// pages by itself, and with "never" (or on a kernel without them) nothing
// would; in both cases the heap is left where it is.
//
// The goroutine that runs the package inits and then main starts with an
// 8 KiB stack and doubles it, copying, each time a call chain outgrows it
// (netlink, JSON, cilium/ebpf go deep): 5-6% of a call's CPU in a perf
// profile, mostly faults on the fresh copies. init grows it once to
// 128 KiB, from the huge page; with the collector off nothing shrinks it
// again.
//
// All of this is worth most before the other packages initialise: about
// fifty of them allocate in their init (tables, maps, regexps), 55 of a
// call's 4 KiB heap faults when they ran first. Go initialises packages in
// the order of their import paths, each once its imports are initialised. So
// this package is a module of its own whose path, 0hugeheap, sorts before
// every other (digits come before letters), and it imports nothing but
// runtime (always initialised first) and unsafe: it takes the functions of
// runtime/debug and syscall it needs by name (go:linkname; each is one the
// runtime or syscall marks as reachable that way), because an import of
// either would wait for it and for every package sorting before it. Its init
// runs right after the runtime's (GODEBUG=inittrace=1 shows the order;
// test/layers checks it in both plugins).
package hugeheap

import (
	"runtime"
	"unsafe"
)

// What init needs of runtime/debug and of syscall, by name rather than by
// import (see the package comment).

//go:linkname setGCPercent runtime/debug.setGCPercent
func setGCPercent(percent int32) int32

//go:linkname runtimeEnvs syscall.runtime_envs
func runtimeEnvs() []string

//go:linkname rawSyscall6 syscall.RawSyscall6
func rawSyscall6(trap, a1, a2, a3, a4, a5, a6 uintptr) (r1, r2, errno uintptr)

// hugeBytes is a PMD-sized huge page on x86-64 and arm64 (4 KiB pages).
const hugeBytes = 2 << 20

// largeBytes is the smallest run of pages the runtime takes first fit
// from the whole heap rather than from a P's cache (16 pages of 8 KiB).
const largeBytes = 128 << 10

// maxHoles bounds the pages moveHeap takes one by one (the cache and the
// holes the runtime left: a few dozen).
const maxHoles = 512

// maxMoves bounds moveHeap's attempts. One fails when another thread of
// the runtime (a new M's stack, a background goroutine's first
// allocation) took a page at the boundary before the flag went on: at a
// call's start, where init runs, in 10 of 60 ADD and DEL processes on the
// bench machine, and 8 of 15 DELs in another run. The next 2 MiB is free.
const maxMoves = 4

// atFDCWD is AT_FDCWD (-100): a path relative to the working directory.
const atFDCWD = ^uintptr(99)

// modeFile says whether transparent huge pages are on: "always [madvise]
// never", the brackets around the mode in force; NUL-terminated for the
// system call.
const modeFile = "/sys/kernel/mm/transparent_hugepage/enabled\x00"

var (
	// pads and holes hold what init allocated to move the heap on (never
	// touched); arrays, not slices grown by append, whose growing copies
	// would fault in pages below the boundary.
	pads   [2 * maxMoves][]byte
	npads  int
	holes  [maxHoles]*[8192]byte
	nholes int
	// region is the 2 MiB the call's heap continues in, marked
	// MADV_HUGEPAGE; zero when init left the heap where it was.
	region uintptr
	// call reports that init took the process for a CNI call.
	call bool
	// slackThreads is how many threads init gave slackNs (slack.go).
	slackThreads int
	// procs is GOMAXPROCS before init put the call on one P; zero when it
	// left it alone (Procs).
	procs int
)

func init() {
	env := runtimeEnvs()
	if !inCall(env) {
		return
	}
	call = true
	// One P first: GOMAXPROCS stops the world, and the thread that stops
	// it sleeps 100 µs at a time until the other P stops. With the wide
	// slack each of those sleeps could last 5 ms: 11 of 100 calls spent
	// 5 ms here when the order was the other way round (slack.go).
	if oneProc(env) {
		procs = runtime.GOMAXPROCS(1)
	}
	if sysGetdents64 != 0 {
		defaultSlack = ownSlack()
		slackThreads = widenSlack()
	}
	// Off before the pads: they count as live heap, and the collector
	// would otherwise start a cycle over them.
	setGCPercent(-1)
	// Nor does a call's heap profile go anywhere: sampling an allocation
	// walks its stack and maps the profile's bucket table (1.4 MiB), and
	// the pads alone are several samples at the default rate.
	runtime.MemProfileRate = 0
	if sysMadvise != 0 && madviseMode() {
		region = move()
	}
	growStack(7)
}

// inCall reports whether env (KEY=value entries) sets CNI_COMMAND, as a
// runtime does for every call.
func inCall(env []string) bool {
	const key = "CNI_COMMAND="
	for _, kv := range env {
		if len(kv) >= len(key) && kv[:len(key)] == key {
			return true
		}
	}
	return false
}

// oneProc reports whether the call runs on one P: unless the caller set
// GOMAXPROCS (empty is unset, as for the runtime). A call runs one
// goroutine at a time (a netns switch hands over to a goroutine and waits
// for it); another P only adds threads that spin looking for work at every
// wakeup. On one P an ADD+DEL pair took 9%
// less CPU, and with eight calls in parallel on 2 vCPUs an ADD 8% less
// time (docs/performance.md).
func oneProc(env []string) bool {
	for _, kv := range env {
		if len(kv) > len("GOMAXPROCS=") && kv[:len("GOMAXPROCS=")] == "GOMAXPROCS=" {
			return false
		}
	}
	return true
}

// Procs is the runtime's GOMAXPROCS that init replaced with one, or zero
// when it left GOMAXPROCS alone (not a call, or the caller set it): the
// part of a call that uses several CPUs (programs.Load: the collector's
// workers) runs with that many and goes back to one.
func Procs() int { return procs }

// madviseMode reports whether huge pages come only where a process asks.
func madviseMode() bool {
	path := unsafe.StringData(modeFile)
	fd, _, e := rawSyscall6(sysOpenat, atFDCWD, uintptr(unsafe.Pointer(path)), oRDONLY|oCLOEXEC, 0, 0, 0)
	if e != 0 {
		return false
	}
	var buf [64]byte
	n, _, e := rawSyscall6(sysRead, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0, 0, 0)
	rawSyscall6(sysClose, fd, 0, 0, 0, 0, 0)
	if e != 0 || n == 0 || n > uintptr(len(buf)) {
		return false
	}
	return contains(string(buf[:n]), "[madvise]")
}

// contains is strings.Contains, which this package may not import.
func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// move tries moveHeap up to maxMoves times; it returns the region or zero.
func move() uintptr {
	for range maxMoves {
		if r := moveHeap(); r != 0 || nholes == maxHoles {
			return r
		}
	}
	return 0
}

// beforeCheck, when a test sets it, sees the page moveHeap found at the
// boundary before the check that nothing touched the region.
var beforeCheck func(*[8192]byte)

// moveHeap moves the heap on to the next 2 MiB boundary above its end and
// marks the 2 MiB from there MADV_HUGEPAGE; it returns the boundary, or
// zero when it could not.
//
// The runtime hands out runs of 16 pages (8 KiB each) and more first fit,
// from the lowest free address, and smaller ones from a cache of up to 64
// pages per P, itself taken from the lowest free pages. So a large pad finds
// the heap's end, a second one reaches up to the boundary, and one-page
// objects then take what is left below it (the cache, holes) until one
// comes from the boundary's pages. The heap is mapped there by then: the
// flag goes on after (mapping memory over the runtime's reservation drops
// it).
func moveHeap() uintptr {
	p := make([]byte, largeBytes)
	pads[npads] = p
	npads++
	end := uintptr(unsafe.Pointer(unsafe.SliceData(p))) + largeBytes
	boundary := (end + hugeBytes - 1) &^ (hugeBytes - 1)
	if gap := boundary - end; gap >= largeBytes {
		pads[npads] = make([]byte, gap)
		npads++
	}
	for nholes < maxHoles {
		h := new([8192]byte)
		holes[nholes] = h
		nholes++
		at := uintptr(unsafe.Pointer(h))
		if at < boundary {
			continue
		}
		if beforeCheck != nil {
			beforeCheck(h)
		}
		if at >= boundary+hugeBytes || touched(boundary) {
			return 0
		}
		if _, _, e := rawSyscall6(sysMadvise, boundary, hugeBytes, madvHugepage, 0, 0, 0); e != 0 {
			return 0
		}
		return boundary
	}
	return 0
}

// touched reports whether a page of the 2 MiB at addr is resident: then it
// is not what moveHeap was after (the large pad found a hole, not the
// heap's end) and a huge page would not come at the first touch.
func touched(addr uintptr) bool {
	var vec [hugeBytes / 4096]byte
	if _, _, e := rawSyscall6(sysMincore, addr, hugeBytes, uintptr(unsafe.Pointer(&vec[0])), 0, 0, 0); e != 0 {
		return true
	}
	for _, v := range vec {
		if v&1 != 0 {
			return true
		}
	}
	return false
}

// growStack's frame does not fit in less than 128 KiB of stack: calling it
// makes the runtime grow the stack to that size in one copy. Not inlined
// (the frame would merge into init's), and the array is used so it is
// not optimised away.
//
//go:noinline
func growStack(i int) byte {
	var buf [120 << 10]byte
	buf[i] = byte(i)
	return buf[(i*7)%len(buf)]
}
