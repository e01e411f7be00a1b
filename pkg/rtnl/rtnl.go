// Package rtnl runs a plugin call's netlink requests over one socket per
// network namespace instead of one per request.
//
// vishvananda/netlink's package functions open, bind, register with the
// poller and close a socket for every request: ten system calls around
// the one that matters, 62-68 µs against 24-28 µs on a kept socket (a VM
// with 2 vCPUs), and an ADD makes about 27 requests, a DEL 11. Between
// Begin and its end function, H returns a handle whose socket lives in the
// network namespace the calling thread is in (the node's, or a pod's
// inside ns.Do), made on first use and closed at the end. Outside such a
// span (the agent, tests calling packages directly) H is the zero handle,
// which behaves exactly like the package functions: nothing outlives a
// request, so no socket keeps a deleted namespace alive. The handle is
// netlinksafe's, whose dumps retry when the kernel interrupts them; only
// AddrList, which it lacks, is here. filtered.go has the questions a
// call asks about the node (its default routes, a device's addresses),
// answered by dumps the kernel narrows, on a socket of the same span.
//
// A kept socket holds a reference on its namespace, so a namespace cannot
// be freed, and its inode number reused, while its handle is cached: the
// inode keys the cache safely for the length of the span.
package rtnl

import (
	"errors"
	"strconv"
	"strings"
	"sync"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

var (
	mu      sync.Mutex
	active  int // nesting depth of Begin
	handles = map[uint64]*netlinksafe.Handle{}
	queries = map[uint64]*query{} // filtered.go's sockets, kept like handles
	// defaults are the default routes of a namespace, dumped once per span
	// (filtered.go).
	defaults = map[uint64][]Route{}
	zero     = &netlinksafe.Handle{Handle: &netlink.Handle{}} // a socket per request, as netlink's package functions
)

// Begin keeps one netlink socket per namespace until the function it
// returns is called (deferred by the caller, also on error paths).
// Spans nest; the outermost end closes the sockets.
func Begin() (end func()) {
	mu.Lock()
	active++
	mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			defer mu.Unlock()
			active--
			if active > 0 {
				return
			}
			for k, h := range handles {
				h.Close()
				delete(handles, k)
			}
			for k, q := range queries {
				q.close()
				delete(queries, k)
			}
			clear(defaults)
		})
	}
}

// H is the handle for the calling thread's network namespace: kept for
// the span of Begin, the zero handle (a socket per request) outside one
// or when the namespace cannot be told. Call it for each request (or
// each run of requests in one namespace): a handle is bound to the
// namespace it was made in, whatever namespace the thread moves to. It
// is netlinksafe's: its dumps retry when the kernel interrupts them.
func H() *netlinksafe.Handle {
	mu.Lock()
	defer mu.Unlock()
	if active == 0 {
		return zero
	}
	ino, ok := threadNetNS()
	if !ok {
		return zero
	}
	if h, ok := handles[ino]; ok {
		return h
	}
	h, err := netlinksafe.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return zero
	}
	handles[ino] = &h
	return &h
}

// threadNetNS is the inode number of the calling thread's network
// namespace, from the link's text ("net:[4026531840]"): reading a magic
// link costs half of following it (stat), 3 against 6-9 µs on a 2-vCPU
// VM, and a call asks before each of its 25-30 requests.
func threadNetNS() (uint64, bool) {
	var buf [48]byte
	n, err := unix.Readlink("/proc/thread-self/ns/net", buf[:])
	if err != nil {
		return 0, false
	}
	s := string(buf[:n])
	if !strings.HasPrefix(s, "net:[") || !strings.HasSuffix(s, "]") {
		return 0, false
	}
	ino, err := strconv.ParseUint(s[len("net:["):len(s)-1], 10, 64)
	return ino, err == nil
}

// maxAttempts bounds the retries of a dump the kernel reports as
// interrupted (NLM_F_DUMP_INTR: the table changed while it was read).
const maxAttempts = 5

// dump retries f while the kernel says the dump was interrupted, then
// keeps the last (possibly inconsistent) answer, as netlinksafe does.
func dump[T any](f func() (T, error)) (T, error) {
	var v T
	var err error
	for range maxAttempts {
		v, err = f()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return v, err
		}
	}
	return v, nil
}

// AddrList lists addresses (of link, or all with nil) of family:
// netlinksafe's Handle has no AddrList of its own.
func AddrList(link netlink.Link, family int) ([]netlink.Addr, error) {
	return dump(func() ([]netlink.Addr, error) { return H().Handle.AddrList(link, family) })
}

// Sockets is the number of sockets the current span keeps (for tests and
// the timing report).
func Sockets() int {
	mu.Lock()
	defer mu.Unlock()
	return len(handles) + len(queries)
}
