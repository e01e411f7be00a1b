package attach

import (
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/cgroup"
)

// ResolveCgroup is the cgroup v2 directory cgroup hooks attach to: path, or
// the hierarchy's root when path is empty.
func ResolveCgroup(path string) (string, error) {
	if path == "" {
		root, err := cgroup.V2Root()
		if err != nil {
			return "", err
		}
		path = root
	}
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("%q is not an absolute path", path)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		return "", fmt.Errorf("%s is not a cgroup v2 directory", path)
	}
	return path, nil
}
