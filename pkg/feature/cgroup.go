package feature

import (
	"errors"
	"path/filepath"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/config"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
)

// Cgroup hooks: what the features with hooks on the node's cgroup share.
// Their links are pinned in one directory, one file per hook, and recorded
// as the attachment set (cgroupOwner, set).

const cgroupOwner = "cgroup"

// CgroupPins is the directory under bpfRoot where the cgroup hooks' links
// are pinned, one file per hook.
const CgroupPins = "cgroup"

// CgroupDir is where the node's cgroup hooks' links are pinned.
func CgroupDir(n *node.Node) string { return n.PinPath(CgroupPins) }

// CgroupAttached reports whether every hook of hooks runs this build's
// program from its pinned link.
func CgroupAttached(n *node.Node, progs *programs.Set, hooks []attach.Hook) bool {
	ids := progs.IDsOf(hooks)
	for _, h := range hooks {
		id, err := attach.PinnedProgram(filepath.Join(CgroupDir(n), h.Name))
		if err != nil || ids[id] != h.Name {
			return false
		}
	}
	return true
}

// AttachCgroup attaches hooks to the cgroup unless they run there already,
// all or nothing: what an earlier attach of them left goes first. The
// caller holds the feature's lock.
func AttachCgroup(n *node.Node, set, cgroup string, hooks []attach.Hook) error {
	progs, err := n.Programs()
	if err != nil {
		return err
	}
	if CgroupAttached(n, progs, hooks) {
		return nil
	}
	if err := DetachCgroup(n, set, hooks); err != nil {
		return err
	}
	s := &node.AttachmentSet{Owner: cgroupOwner, Name: set, Cgroup: cgroup}
	for _, h := range hooks {
		prog, err := progs.Prog(h.Name)
		if err != nil {
			return errors.Join(err, DetachCgroup(n, set, hooks))
		}
		a, err := attach.AttachCgroup(cgroup, h, prog, CgroupDir(n))
		if err != nil {
			return errors.Join(err, DetachCgroup(n, set, hooks))
		}
		s.Attachments = append(s.Attachments, a)
	}
	return n.SaveAttachments(s)
}

// DetachCgroup takes hooks off the cgroup, recorded or not (a build before
// attachment sets left them unrecorded); idempotent.
func DetachCgroup(n *node.Node, set string, hooks []attach.Hook) error {
	if err := attach.DetachPinned(CgroupDir(n), hooks); err != nil {
		return err
	}
	return n.RemoveAttachments(cgroupOwner, set)
}

// CgroupKeys are the node-level setting of the cgroup hooks (hostPort's
// socket hooks, the pacing hook): the cgroup v2 directory whose sockets
// they see, default the root of the unified hierarchy (found wherever this
// mount namespace has it, or mounted privately under stateDir).
type CgroupKeys struct {
	SocketCgroupPath string `json:"socketCgroupPath,omitempty"`
	// CgroupPath is socketCgroupPath's deprecated name: the CNI
	// conventions give cgroupPath to the pod's own cgroup (a capability,
	// in runtimeConfig). It still works when socketCgroupPath is not set.
	CgroupPath string `json:"cgroupPath,omitempty"`
	StateDir   string `json:"stateDir,omitempty"`
}

// Resolve is the cgroup directory the hooks attach to. An error about a
// configured directory is a *config.Error naming the key that was set;
// without one, the error is no configuration's fault.
func (k CgroupKeys) Resolve() (string, error) {
	key, path := "socketCgroupPath", k.SocketCgroupPath
	if path == "" && k.CgroupPath != "" {
		key, path = "cgroupPath", k.CgroupPath
	}
	cg, err := attach.ResolveCgroup(path, config.StateDirOr(k.StateDir))
	if err != nil && path != "" {
		return "", config.Invalid(key, "%s", err.Error())
	}
	return cg, err
}
