package attach

import (
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/pkg/cgroup"
)

// ResolveCgroup is the cgroup v2 directory cgroup hooks attach to: path,
// or the hierarchy's root when path is empty, found wherever this mount
// namespace has it, or else mounted privately at stateDir/cgroup2 (see
// cgroup.EnsureV2Root). An error about path names what the process sees,
// so the caller can name the key; without path it is no configuration's
// fault.
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
