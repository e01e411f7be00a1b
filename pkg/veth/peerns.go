package veth

import (
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NetNSDirs are where runtimes bind-mount the network namespaces they make
// (ip netns, containerd, CRI-O, podman): a path there outlives its process.
var NetNSDirs = []string{"/run/netns", "/var/run/netns"}

// PeerNetNS finds the network namespace of the host veth l's peer (the
// pod's) without a path recorded for it: among the namespaces bound under
// NetNSDirs, then those of the node's processes (a pod's keeps its own),
// the one the kernel gives l's peer netns ID (IFLA_LINK_NETNSID) in this
// namespace. It returns a path under NetNSDirs when there is one (stable:
// a record may keep it), else /proc/<pid>/ns/net (valid while that process
// lives), and "" when none is found. A repair after a lost stateDir asks;
// no call on a node in order does.
func PeerNetNS(l netlink.Link) string {
	want := l.Attrs().NetNsID
	if want < 0 {
		return ""
	}
	var paths []string
	for _, dir := range NetNSDirs {
		if ents, err := os.ReadDir(dir); err == nil {
			for _, e := range ents {
				paths = append(paths, filepath.Join(dir, e.Name()))
			}
		}
	}
	if procs, err := filepath.Glob("/proc/[0-9]*/ns/net"); err == nil {
		paths = append(paths, procs...)
	}
	seen := map[uint64]bool{}
	for _, p := range paths {
		if nsid(p, seen) == want {
			return p
		}
	}
	return ""
}

// nsid is the netns ID this namespace gives the namespace at path, -1 if
// none, or one seen already (by inode).
func nsid(path string, seen map[uint64]bool) int {
	f, err := os.Open(path)
	if err != nil {
		return -1
	}
	defer f.Close()
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil || seen[st.Ino] {
		return -1
	}
	seen[st.Ino] = true
	var fs unix.Statfs_t
	if unix.Fstatfs(int(f.Fd()), &fs) != nil || fs.Type != unix.NSFS_MAGIC {
		return -1
	}
	id, err := netlink.GetNetNsIdByFd(int(f.Fd()))
	if err != nil {
		return -1
	}
	return id
}
