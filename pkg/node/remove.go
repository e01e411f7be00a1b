package node

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The node's state locations go for good when ebpf-cni leaves the node
// (ebpf-cni-agent uninstall), after everything that ran from them is gone
// (repair.Uninstall): a pin is then all that holds a map, a program or a
// link, and removing it frees that in the kernel.

// RemovePins removes every pin under bpfRoot (maps, programs, links, of
// every build), and bpfRoot itself unless it is a mount point (the
// DaemonSet mounts it: the directory stays, empty). A bpfRoot that is not
// on a bpffs holds no pin of the plugin's, which refuses to pin there: it
// is left as it is. It returns how many pins it removed.
func (n *Node) RemovePins() (int, error) {
	n.closeOpened()
	if _, err := os.Stat(n.bpfRoot); errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err := n.CheckBPFFS(); err != nil {
		return 0, nil
	}
	return emptyDir(n.bpfRoot)
}

// RemoveStateDir removes everything under stateDir (records, locks, the
// node lock this handle may hold included: a lock on a removed file
// still excludes the calls that opened it), and stateDir itself unless it
// is a mount point. It returns how many files it removed.
func (n *Node) RemoveStateDir() (int, error) {
	if _, err := os.Stat(n.stateDir); errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	return emptyDir(n.stateDir)
}

// closeOpened closes the maps and programs the handle opened: their pins
// are about to go.
func (n *Node) closeOpened() {
	for _, m := range n.maps {
		m.Close()
	}
	n.maps = map[string]*ebpf.Map{}
	n.progs.Close()
	n.progs = nil
}

// emptyDir removes what dir holds and then dir, unless it is a mount
// point; it returns how many files (not directories) went.
func emptyDir(dir string) (int, error) {
	files := 0
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files++
		}
		return nil
	})
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("listing %s: %w", dir, err)
	}
	var errs []error
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", filepath.Join(dir, e.Name()), err))
		}
	}
	// A mount point stays: EBUSY, or EROFS where it lies on a container's
	// read-only root.
	if err := os.Remove(dir); err != nil && !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.EROFS) && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("removing %s: %w", dir, err))
	}
	return files, errors.Join(errs...)
}
