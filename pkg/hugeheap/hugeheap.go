// Package hugeheap prepares the process of a CNI call: the collector off,
// the heap on a transparent huge page, and the main goroutine's stack
// grown once; a blank import is all it takes. A process started without
// CNI_COMMAND (the operator CLI, a test binary) is left as it is.
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
package hugeheap

import (
	"bytes"
	"runtime/debug"
	"unsafe"

	"golang.org/x/sys/unix"
)

// hugeBytes is a PMD-sized huge page on x86-64 and arm64 (4 KiB pages).
const hugeBytes = 2 << 20

// largeBytes is the smallest run of pages the runtime takes first fit
// from the whole heap rather than from a P's cache (16 pages of 8 KiB).
const largeBytes = 128 << 10

// maxHoles bounds the pages moveHeap takes one by one (the cache and the
// holes the runtime left: a few dozen).
const maxHoles = 512

// modeFile says whether transparent huge pages are on: "always [madvise]
// never", the brackets around the mode in force.
const modeFile = "/sys/kernel/mm/transparent_hugepage/enabled"

var (
	// pads and holes hold what init allocated to move the heap on (never
	// touched).
	pads  [][]byte
	holes []*[8192]byte
	// region is the 2 MiB the call's heap continues in, marked
	// MADV_HUGEPAGE; zero when init left the heap where it was.
	region uintptr
	// call reports that init took the process for a CNI call.
	call bool
)

func init() {
	if _, ok := unix.Getenv("CNI_COMMAND"); !ok {
		return
	}
	call = true
	// Off before the pads: they count as live heap, and the collector
	// would otherwise start a cycle over them.
	debug.SetGCPercent(-1)
	if madviseMode() {
		region = moveHeap()
	}
	growStack(7)
}

// madviseMode reports whether huge pages come only where a process asks.
func madviseMode() bool {
	fd, err := unix.Open(modeFile, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var buf [64]byte
	n, err := unix.Read(fd, buf[:])
	if err != nil || n <= 0 {
		return false
	}
	return bytes.Contains(buf[:n], []byte("[madvise]"))
}

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
	pads = append(pads, p)
	end := uintptr(unsafe.Pointer(unsafe.SliceData(p))) + largeBytes
	boundary := (end + hugeBytes - 1) &^ (hugeBytes - 1)
	if gap := boundary - end; gap >= largeBytes {
		pads = append(pads, make([]byte, gap))
	}
	for range maxHoles {
		h := new([8192]byte)
		holes = append(holes, h)
		at := uintptr(unsafe.Pointer(h))
		if at < boundary {
			continue
		}
		if at >= boundary+hugeBytes || touched(boundary) {
			return 0
		}
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, boundary, hugeBytes, unix.MADV_HUGEPAGE); e != 0 {
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
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, addr, hugeBytes, uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
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
