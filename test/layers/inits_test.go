package layers_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// TestHugeheapInitsFirst: in both plugins' processes, 0hugeheap's init
// (pkg/hugeheap: the collector off, the heap moved on to a huge page) runs
// before any other package's init allocates, which is what its import path
// is for: every allocation before it faults in 4 KiB pages. The runtime
// lists each package's init with GODEBUG=inittrace=1.
func TestHugeheapInitsFirst(t *testing.T) {
	dir := testutil.PluginDir(t)
	for _, plugin := range []string{"ebpf-cni", "ebpf-ipam"} {
		cmd := exec.Command(filepath.Join(dir, plugin))
		cmd.Env = []string{"CNI_COMMAND=VERSION", "GODEBUG=inittrace=1"}
		cmd.Stdin = strings.NewReader("{}")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s VERSION: %s", plugin, out)
		var before []string
		found := false
		for _, line := range strings.Split(string(out), "\n") {
			// init <package> @0.5 ms, 0.1 ms clock, 312 bytes, 7 allocs
			f := strings.Fields(line)
			if len(f) < 10 || f[0] != "init" {
				continue
			}
			if f[1] == "0hugeheap" {
				found = true
				break
			}
			if f[7] != "0" {
				before = append(before, f[1]+" ("+f[7]+" bytes)")
			}
		}
		require.True(t, found, "%s: no init of 0hugeheap in the trace:\n%s", plugin, out)
		require.Empty(t, before, "%s: packages that allocated in init before 0hugeheap's", plugin)
	}
}
