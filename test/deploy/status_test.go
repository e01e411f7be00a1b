package deploy_test

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// TestStatusWithoutPodRange: a node whose configuration names no pod range
// (a Kubernetes Node without spec.podCIDRs) fails STATUS with code 50 and
// says what to do; with a range, the same STATUS succeeds. Both for the
// shorthand and for ranges, through the real binary as a runtime calls it.
func TestStatusWithoutPodRange(t *testing.T) {
	dir := testutil.PluginDir(t)
	bpfRoot, stateDir := testutil.BPFFS(t), t.TempDir()
	conf := func(ipam map[string]any) []byte {
		b, err := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "net", "type": "ebpf-cni",
			"bpfRoot": bpfRoot, "stateDir": stateDir, "ipam": ipam})
		require.NoError(t, err)
		return b
	}
	for name, ipam := range map[string]map[string]any{
		"no ranges key":   {"type": "ebpf-ipam"},
		"empty ranges":    {"type": "ebpf-ipam", "ranges": []any{}},
		"host-local bare": {"type": "host-local"},
	} {
		t.Run(name, func(t *testing.T) {
			out := testutil.Run(t, filepath.Join(dir, "ebpf-cni"), testutil.Call{Command: "STATUS", Path: dir, Stdin: conf(ipam)})
			e := out.Error(t)
			require.Equal(t, uint(types.ErrPluginNotAvailable), e.Code, "%+v", e)
			require.Equal(t, "no pod range configured for this node", e.Msg)
			require.Contains(t, e.Details, "spec.podCIDRs")
			require.Contains(t, e.Details, "ipam.ranges")
		})
	}
	ok := conf(map[string]any{"type": "ebpf-ipam", "ranges": []any{[]any{map[string]any{"subnet": "10.244.1.0/24"}}}})
	testutil.Run(t, filepath.Join(dir, "ebpf-cni"), testutil.Call{Command: "STATUS", Path: dir, Stdin: ok}).Must(t)
}
