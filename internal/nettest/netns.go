package nettest

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NetNSDir is where named network namespaces are mounted (iproute2's).
const NetNSDir = "/var/run/netns"

// NetNSPrefix starts the name of every namespace this process makes: the
// pid tells the namespaces of one test binary from another's (other test
// runs on the machine make theirs at the same time), and the leftover check
// at the end of a run counts only its own.
func NetNSPrefix() string { return fmt.Sprintf("ebpfcni-%d-", os.Getpid()) }

var (
	nsDirOnce sync.Once
	nsDirErr  error
)

// prepareNetNSDir makes NetNSDir a shared mount point once per process, as
// `ip netns add` does, so a namespace mounted there is seen in mount
// namespaces made later (a runtime's, `ip netns exec`).
func prepareNetNSDir() error {
	nsDirOnce.Do(func() {
		if nsDirErr = os.MkdirAll(NetNSDir, 0o755); nsDirErr != nil {
			return
		}
		err := unix.Mount("", NetNSDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if errors.Is(err, unix.EINVAL) { // not a mount point yet: bind it onto itself
			if err = unix.Mount(NetNSDir, NetNSDir, "none", unix.MS_BIND|unix.MS_REC, ""); err == nil {
				err = unix.Mount("", NetNSDir, "none", unix.MS_SHARED|unix.MS_REC, "")
			}
		}
		if err != nil {
			nsDirErr = fmt.Errorf("making %s a shared mount point: %w", NetNSDir, err)
		}
	})
	return nsDirErr
}

// NewNetNS makes a named network namespace (NetNSDir/NetNSPrefix...) with
// loopback up. CloseNetNS removes it.
func NewNetNS() (ns.NetNS, error) {
	if err := prepareNetNSDir(); err != nil {
		return nil, err
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	path := filepath.Join(NetNSDir, fmt.Sprintf("%s%x", NetNSPrefix(), b))
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return nil, fmt.Errorf("creating netns mount point: %w", err)
	}
	f.Close()

	// The namespace is made by a thread of its own, bound to the name, and
	// the thread is never given back to the scheduler (no UnlockOSThread):
	// it exits with the goroutine, and no other goroutine runs in the new
	// namespace.
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("binding %s to %s: %w", self, path, err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("creating netns: %w", err)
	}
	n, err := ns.GetNS(path)
	if err != nil {
		removeNetNS(path)
		return nil, err
	}
	err = n.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	if err != nil {
		CloseNetNS(n)
		return nil, fmt.Errorf("setting lo up: %w", err)
	}
	return n, nil
}

// CloseNetNS removes a namespace made by NewNetNS: its name goes at once,
// the namespace when nothing uses it any more.
func CloseNetNS(n ns.NetNS) {
	if n == nil {
		return
	}
	path := n.Path()
	_ = n.Close()
	if strings.HasPrefix(path, NetNSDir+"/") {
		removeNetNS(path)
	}
}

// removeNetNS unmounts and removes a namespace's name. The unmount is a
// detach: a plain one fails with EBUSY while any process holds the file
// open, and one does for an instant whenever another goroutine of this
// process forks (the child has a copy of the file table until its exec
// closes the O_CLOEXEC files). With goroutines starting plugins, ping and
// ip all the time, 12 of 300 plain unmounts failed so, and the name stayed
// in /var/run/netns: the empty namespaces test runs left behind.
func removeNetNS(path string) {
	_ = unix.Unmount(path, unix.MNT_DETACH)
	_ = os.Remove(path)
}
