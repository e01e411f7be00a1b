// Package hugeheap backs the heap of a short-lived plugin process with
// transparent huge pages, and its main goroutine's stack with that heap;
// a blank import is all it takes.
//
// A CNI call is a fresh process that allocates a few MiB and exits, and
// every first touch of a 4 KiB heap page is a page fault: a few hundred per
// call. In a virtual machine a fault costs tens of microseconds (21 µs on
// the 2-vCPU bench machine, where an ADD took about 630 faults, 190 of them
// in the heap after this package's init). The Go runtime maps its heap in
// 4 MiB chunks; init marks the first one MADV_HUGEPAGE and collapses the
// pages the runtime touched before it into huge pages (MADV_COLLAPSE,
// Linux 6.1), so the call allocates the rest of its heap without faulting.
// With transparent huge pages "never", or on an older kernel, the calls fail
// and nothing changes; errors are ignored on purpose.
//
// The goroutine that runs the package inits and then main starts with an
// 8 KiB stack and doubles it, copying, each time a call chain outgrows it
// (netlink, JSON, cilium/ebpf go deep): 5-6% of a call's CPU in a perf
// profile, mostly faults on the fresh copies. init grows it once to
// 128 KiB, from the huge-page chunk; with the collector off (the plugins'
// main) nothing shrinks it again.
package hugeheap

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// chunkBytes is the runtime's heap mapping unit (pallocChunkBytes): the
// first chunk is mapped whole at start, aligned to its size.
const chunkBytes = 4 << 20

// hugeBytes is a PMD-sized huge page on x86-64 and arm64 (4 KiB pages).
const hugeBytes = 2 << 20

// probe is heap-allocated (a package variable holds it), so its address is
// in the heap's current chunk.
var probe *[64]byte

// Applied reports whether init marked the heap (for tests).
var Applied bool

func init() {
	markHuge()
	growStack(7)
}

// markHuge marks the heap's first chunk and collapses what is in it.
func markHuge() {
	probe = new([64]byte)
	chunk := uintptr(unsafe.Pointer(probe)) &^ (chunkBytes - 1)
	if _, _, e := unix.Syscall(unix.SYS_MADVISE, chunk, chunkBytes, unix.MADV_HUGEPAGE); e != 0 {
		return
	}
	Applied = true
	// Collapse per huge page: a half the runtime has not touched yet has
	// nothing to collapse (and gets a huge page at its first fault).
	for off := uintptr(0); off < chunkBytes; off += hugeBytes {
		_, _, _ = unix.Syscall(unix.SYS_MADVISE, chunk+off, hugeBytes, unix.MADV_COLLAPSE)
	}
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
