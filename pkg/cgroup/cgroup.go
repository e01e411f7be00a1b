// Package cgroup finds the unified (v2) cgroup hierarchy, wherever this
// process's mount namespace has it, and mounts a private view of it where
// the namespace has none.
package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrNoV2Mount means this process's mount namespace has no cgroup2 mount
// of its cgroup namespace's root.
var ErrNoV2Mount = errors.New("no cgroup2 filesystem is mounted in this mount namespace")

// Mount is one cgroup2 mount of /proc/self/mountinfo.
type Mount struct {
	Point string // where it is mounted
	Root  string // the cgroup it shows at Point, relative to this process's cgroup namespace
}

// Mounts lists every cgroup2 mount this process sees: /sys/fs/cgroup on a
// unified host, /sys/fs/cgroup/unified on a hybrid one (v1 controllers at
// /sys/fs/cgroup/*), anywhere else someone mounted one, or none at all (a
// runtime in a mount namespace of its own, `ip netns exec`, which mounts a
// fresh /sys).
func Mounts() ([]Mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseMountinfo(f)
}

func parseMountinfo(r io.Reader) ([]Mount, error) {
	var out []Mount
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source super
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, pf := strings.Fields(pre), strings.Fields(post)
		if len(fields) >= 5 && len(pf) >= 1 && pf[0] == "cgroup2" {
			out = append(out, Mount{Point: unescape(fields[4]), Root: unescape(fields[3])})
		}
	}
	return out, sc.Err()
}

// unescape undoes mountinfo's octal escapes (\040 for a space...).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// V2Root is a mount point of the unified (v2) cgroup hierarchy's root (of
// this process's cgroup namespace): the cgroup every process of the node is
// under. A mount of a cgroup below the root (a bind mount of a
// subdirectory, or one made from another cgroup namespace) is not it.
func V2Root() (string, error) {
	ms, err := Mounts()
	if err != nil {
		return "", err
	}
	for _, m := range ms {
		if m.Root == "/" {
			return m.Point, nil
		}
	}
	return "", ErrNoV2Mount
}

// EnsureV2Root is V2Root, and where this mount namespace has no cgroup2
// mount of the root, a private cgroup2 mount at dir made for the purpose
// (as Cilium mounts /run/cilium/cgroupv2). The cgroup v2 hierarchy is one
// per kernel: a new mount shows the same cgroups as any other, from the
// root of this process's cgroup namespace. The mount is left in place:
// the next call finds it as any other, and with this process's mount
// namespace private (a runtime's own, `ip netns exec`) it goes with it.
func EnsureV2Root(dir string) (string, error) {
	root, err := V2Root()
	if !errors.Is(err, ErrNoV2Mount) {
		return root, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("%w, and creating %s for one failed: %w", ErrNoV2Mount, dir, err)
	}
	if err := unix.Mount("cgroup2", dir, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		if errors.Is(err, unix.EBUSY) {
			// Another call mounted it since V2Root looked.
			if root, err := V2Root(); err == nil {
				return root, nil
			}
		}
		_ = os.Remove(dir)
		return "", fmt.Errorf("%w, and mounting one at %s failed: %w", ErrNoV2Mount, dir, err)
	}
	return dir, nil
}

// Join moves this process (every thread) into the cgroup v2 directory
// dir. leave moves it back to where it was; it does not remove dir.
func Join(dir string) (leave func() error, err error) {
	root, err := V2Root()
	if err != nil {
		return nil, err
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	home := root
	for _, l := range strings.Split(string(self), "\n") {
		if rest, ok := strings.CutPrefix(l, "0::"); ok {
			home = filepath.Join(root, rest)
		}
	}
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), pid, 0o644); err != nil {
		return nil, fmt.Errorf("joining %s: %w", dir, err)
	}
	return func() error {
		if err := os.WriteFile(filepath.Join(home, "cgroup.procs"), pid, 0o644); err != nil {
			return fmt.Errorf("leaving %s: %w", dir, err)
		}
		return nil
	}, nil
}
