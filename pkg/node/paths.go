package node

import (
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// What lives where: the node's state locations are its own, and callers
// above pkg/node ask the handle for a path, never build one from a root.

// BPFRoot is the root of the node's pins (bpffs), for the building blocks
// below the handle that take it (programs, maps, counters, ebpf-ipam).
func (n *Node) BPFRoot() string { return n.bpfRoot }

// StateDir is the node's state directory, for the building blocks below
// the handle that take it (ebpf-ipam, the cgroup view, the call record).
func (n *Node) StateDir() string { return n.stateDir }

// PinPath is a path under the node's bpffs root: where a feature pins
// what is its own (links of its devices, cgroup links).
func (n *Node) PinPath(elem ...string) string {
	return filepath.Join(append([]string{n.bpfRoot}, elem...)...)
}

// LinkDir is where the tcx links of the endpoint whose host veth is
// hostIfName are pinned.
func (n *Node) LinkDir(hostIfName string) string { return LinkDir(n.bpfRoot, hostIfName) }

// RecordNames lists the host veths that have an endpoint record (names
// only: one directory listing).
func (n *Node) RecordNames() ([]string, error) { return RecordNames(n.stateDir) }

// SetMark marks the record of hostIfName.
func (n *Node) SetMark(m Mark, hostIfName string) error { return SetMark(n.stateDir, m, hostIfName) }

// Unmark takes mark m off the record of hostIfName.
func (n *Node) Unmark(m Mark, hostIfName string) error { return Unmark(n.stateDir, m, hostIfName) }

// Marked lists the host veths whose records carry mark m.
func (n *Node) Marked(m Mark) []string { return Marked(n.stateDir, m) }

// Repaired records that a call repaired the node now (HealStamp).
func (n *Node) Repaired() error {
	return os.WriteFile(filepath.Join(n.stateDir, HealStamp), nil, 0o600)
}

// SinceRepaired is how long ago a call last repaired the node; an error
// when none did since the stateDir was made.
func (n *Node) SinceRepaired() (time.Duration, error) {
	fi, err := os.Stat(filepath.Join(n.stateDir, HealStamp))
	if err != nil {
		return 0, err
	}
	return time.Since(fi.ModTime()), nil
}

// ReadMap opens the pinned map name read-only for a reader that must not
// change the node (the operator CLI's views), checked as every map the
// handle opens; maps.ErrNotPinned when it is not pinned. The caller closes
// it: it is not the call's (Map).
func (n *Node) ReadMap(name string) (*ebpf.Map, error) {
	return maps.OpenPinnedReadOnly(n.bpfRoot, name)
}

// Reopen is another handle on the same node, without the node lock and
// with nothing opened yet: a long-lived process (the node agent) keeps one
// handle and reopens it for each piece of work, so that a bpffs remounted
// meanwhile is seen (a handle keeps the maps it opened).
func (n *Node) Reopen() *Node {
	return &Node{bpfRoot: n.bpfRoot, stateDir: n.stateDir, objects: n.objects, tag: n.tag, maps: map[string]*ebpf.Map{}}
}

// HasMap reports whether the map name is pinned, opening nothing.
func (n *Node) HasMap(name string) bool {
	_, err := os.Stat(filepath.Join(maps.Dir(n.bpfRoot), name))
	return err == nil
}

// StatePath is a path under the node's state directory: where a
// component keeps a file of its own (the agent's record of the tunnel
// endpoints it wrote).
func (n *Node) StatePath(elem ...string) string {
	return filepath.Join(append([]string{n.stateDir}, elem...)...)
}
