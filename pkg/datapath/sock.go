package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/cgroup"
)

// SockHooks are the socket-address hooks of the node's cgroup: hostPort
// from the node's own sockets. They are Hooks for loading and pinning; their
// Cgroup says where they attach.
var SockHooks = []Hook{
	{Name: "hostport_connect4", Cgroup: ebpf.AttachCGroupInet4Connect},
	{Name: "hostport_connect6", Cgroup: ebpf.AttachCGroupInet6Connect},
	{Name: "hostport_sendmsg4", Cgroup: ebpf.AttachCGroupUDP4Sendmsg},
	{Name: "hostport_sendmsg6", Cgroup: ebpf.AttachCGroupUDP6Sendmsg},
	{Name: "hostport_recvmsg4", Cgroup: ebpf.AttachCGroupUDP4Recvmsg},
	{Name: "hostport_recvmsg6", Cgroup: ebpf.AttachCGroupUDP6Recvmsg},
	{Name: "hostport_peername4", Cgroup: ebpf.AttachCgroupInet4GetPeername},
	{Name: "hostport_peername6", Cgroup: ebpf.AttachCgroupInet6GetPeername},
}

// PacingHooks are the sock_ops hook of the node's cgroup: TCP senders of
// the node and its pods paced to the bandwidth limits (bpf/sock_pacing.c).
// They attach apart from SockHooks, with the first limited pod.
var PacingHooks = []Hook{{Name: "bw_pacing", Cgroup: ebpf.AttachCGroupSockOps}}

// cgroupHooks is every hook of the node's cgroup.
func cgroupHooks() []Hook { return append(append([]Hook{}, SockHooks...), PacingHooks...) }

// SockDir holds the pinned cgroup links of the socket hooks.
func SockDir(bpfRoot string) string { return filepath.Join(bpfRoot, "cgroup") }

// CgroupV2 is the mount point of the unified (v2) cgroup hierarchy.
func CgroupV2() (string, error) { return cgroup.V2Root() }

// ResolveCgroup is the cgroup v2 directory the cgroup hooks attach to:
// path, or the hierarchy's root when path is empty, found wherever this
// mount namespace has it, or else mounted privately at stateDir/cgroup2
// (see cgroup.EnsureV2Root). An error about path names what the process
// sees, so the caller can name the key; without path it is no
// configuration's fault.
func ResolveCgroup(path, stateDir string) (string, error) {
	if path == "" {
		return cgroup.EnsureV2Root(filepath.Join(stateDir, "cgroup2"))
	}
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("%q is not an absolute path", path)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		seen := "it sees no cgroup2 mount"
		if ms, err := cgroup.Mounts(); err == nil && len(ms) > 0 {
			var pts []string
			for _, m := range ms {
				pts = append(pts, m.Point)
			}
			seen = "it sees cgroup2 at " + strings.Join(pts, ", ")
		}
		return "", fmt.Errorf("%s is not a cgroup v2 directory in ebpf-cni's mount namespace (%s)", path, seen)
	}
	return path, nil
}

// SockAttached reports whether every hook of hooks (SockHooks,
// PacingHooks) is attached (its pinned link exists and runs progs'
// program).
func SockAttached(bpfRoot string, progs *Programs, hooks []Hook) bool {
	ids := progs.IDs()
	for _, h := range hooks {
		l, err := link.LoadPinnedLink(filepath.Join(SockDir(bpfRoot), h.Name), nil)
		if err != nil {
			return false
		}
		info, err := l.Info()
		l.Close()
		if err != nil || ids[info.Program] != h.Name {
			return false
		}
	}
	return true
}

// AttachSock attaches hooks to the cgroup and pins their links; what an
// earlier attach of them left goes first. All or nothing.
func AttachSock(bpfRoot, cgroup string, progs *Programs, hooks []Hook) error {
	if err := DetachSock(bpfRoot, hooks); err != nil {
		return err
	}
	dir := SockDir(bpfRoot)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	for _, h := range hooks {
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroup, Attach: h.Cgroup, Program: progs.ByHook[h.Name]})
		if err == nil {
			err = l.Pin(filepath.Join(dir, h.Name))
			l.Close()
		}
		if err != nil {
			_ = DetachSock(bpfRoot, hooks)
			return fmt.Errorf("attaching %s to cgroup %s: %w", h.Name, cgroup, err)
		}
	}
	return nil
}

// DetachSock removes hooks from the cgroup; idempotent.
func DetachSock(bpfRoot string, hooks []Hook) error {
	dir := SockDir(bpfRoot)
	var errs []error
	for _, h := range hooks {
		p := filepath.Join(dir, h.Name)
		l, err := link.LoadPinnedLink(p, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("opening %s: %w", p, err))
			continue
		}
		// Detach now: an unpinned link lingers while a handle is open.
		if err := l.Detach(); err != nil && !errors.Is(err, unix.ENOLINK) {
			errs = append(errs, fmt.Errorf("detaching %s: %w", h.Name, err))
		}
		l.Close()
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		// The other set's pins may still be there.
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOTEMPTY) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// upgradeSock points the pinned cgroup hooks at p's programs.
func upgradeSock(bpfRoot string, p *Programs) error {
	for _, h := range cgroupHooks() {
		l, err := link.LoadPinnedLink(filepath.Join(SockDir(bpfRoot), h.Name), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("opening the link of %s: %w", h.Name, err)
		}
		err = l.Update(p.ByHook[h.Name])
		l.Close()
		if err != nil {
			return fmt.Errorf("upgrading %s: %w", h.Name, err)
		}
	}
	return nil
}

// soNetnsCookie is SO_NETNS_COOKIE (linux/socket.h; not in x/sys yet).
const soNetnsCookie = 71

// NetnsCookie is the cookie of the calling thread's network namespace, as
// bpf_get_netns_cookie sees it.
func NetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	v, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, soNetnsCookie)
	if err != nil {
		return 0, fmt.Errorf("reading the netns cookie: %w", err)
	}
	return v, nil
}
