package node

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
)

// AttachmentSet records what a feature attached outside the endpoints'
// host veths: to one device of the node (an uplink, an overlay device) or
// to the node's cgroup. Upgrades re-point every recorded attachment
// without knowing which feature made it.
type AttachmentSet struct {
	// Owner groups the sets of one feature ("uplinks"); Name is the set
	// within it (the device's name, "hostport").
	Owner   string `json:"-"`
	Name    string `json:"name"`
	IfIndex int    `json:"ifindex,omitempty"` // the device; 0 for cgroup hooks
	// Cgroup is the cgroup v2 directory of cgroup hooks: a repair attaches
	// them there again when their pinned links were lost with the bpffs.
	Cgroup      string              `json:"cgroup,omitempty"`
	Attachments []attach.Attachment `json:"attachments"`
}

func setsDir(stateDir string) string { return filepath.Join(stateDir, "attachments") }

func setPath(stateDir, owner, name string) string {
	return filepath.Join(setsDir(stateDir), owner, name+".json")
}

// SaveAttachments stores s atomically.
func SaveAttachments(stateDir string, s *AttachmentSet) error {
	if s.Owner == "" || s.Name == "" || strings.ContainsAny(s.Owner+s.Name, "/\\") {
		return fmt.Errorf("attachment set %q/%q: owner and name must be plain names", s.Owner, s.Name)
	}
	return writeJSON(setPath(stateDir, s.Owner, s.Name), s)
}

// RemoveAttachments deletes a set's record; a missing one is fine.
func RemoveAttachments(stateDir, owner, name string) error {
	err := os.Remove(setPath(stateDir, owner, name))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing attachment record %s/%s: %w", owner, name, err)
	}
	return nil
}

// AttachmentSets lists the sets of owner, or of every owner when owner is
// "".
func AttachmentSets(stateDir, owner string) ([]*AttachmentSet, error) {
	owners := []string{owner}
	if owner == "" {
		ents, err := os.ReadDir(setsDir(stateDir))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("listing %s: %w", setsDir(stateDir), err)
		}
		owners = owners[:0]
		for _, e := range ents {
			if e.IsDir() {
				owners = append(owners, e.Name())
			}
		}
	}
	var out []*AttachmentSet
	for _, o := range owners {
		sets, err := readDir[AttachmentSet](filepath.Join(setsDir(stateDir), o))
		if err != nil {
			return nil, err
		}
		for _, s := range sets {
			s.Owner = o
		}
		out = append(out, sets...)
	}
	return out, nil
}

// legacySetDirs are where builds before the node package kept attachment
// records, by the owner their sets have now: stateDir/uplinks held the
// uplinks' (datapath.UplinkRecord, the same format). Open moves them, so
// the first call of a new build on a node that an older one set up finds
// them: its upgrade re-points them, its release detaches them.
var legacySetDirs = map[string]string{"uplinks": "uplinks"}

// migrate moves legacy attachment records into the sets' layout. Calls may
// race to do it: a rename is atomic, and a file gone meanwhile was moved.
func migrate(stateDir string) error {
	for dir, owner := range legacySetDirs {
		old := filepath.Join(stateDir, dir)
		ents, err := os.ReadDir(old)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("listing %s: %w", old, err)
		}
		dst := filepath.Join(setsDir(stateDir), owner)
		if err := os.MkdirAll(dst, 0o700); err != nil {
			return fmt.Errorf("creating %s: %w", dst, err)
		}
		for _, e := range ents {
			if !strings.HasSuffix(e.Name(), ".json") {
				continue
			}
			if err := os.Rename(filepath.Join(old, e.Name()), filepath.Join(dst, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("moving attachment record %s: %w", e.Name(), err)
			}
		}
		if err := os.Remove(old); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, os.ErrExist) && !errors.Is(err, unix.ENOTEMPTY) {
			return fmt.Errorf("removing %s: %w", old, err)
		}
	}
	return nil
}
