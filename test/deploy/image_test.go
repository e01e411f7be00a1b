package deploy_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/agent"
)

func podman(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("podman", args...).CombinedOutput()
	require.NoError(t, err, "podman %s: %s", strings.Join(args, " "), out)
	return strings.TrimSpace(string(out))
}

// TestMakeImage: make image, with no network at all (its own network
// namespace), builds an image of exactly the four static binaries (the agent, the
// two plugins, the reference loopback plugin) tagged
// with the build version; the binaries in it are the ones built, the agent
// reports that version, and the paths the DaemonSet uses are there.
func TestMakeImage(t *testing.T) {
	testutil.RequireRoot(t)
	image, bin := makeImage(t)
	version := strings.TrimPrefix(image, "localhost/ebpf-cni:")

	var inspect []struct {
		Config struct {
			Entrypoint []string
			Cmd        []string
			Labels     map[string]string
		}
	}
	require.NoError(t, json.Unmarshal([]byte(podman(t, "image", "inspect", image)), &inspect))
	require.Len(t, inspect, 1)
	require.Equal(t, []string{"/ebpf-cni-agent"}, inspect[0].Config.Entrypoint)
	require.Equal(t, []string{"run"}, inspect[0].Config.Cmd)
	require.Equal(t, version, inspect[0].Config.Labels["org.opencontainers.image.version"])

	root := podman(t, "image", "mount", image)
	t.Cleanup(func() { _ = exec.Command("podman", "image", "unmount", image).Run() })
	files := tree(t, root)
	src := strings.TrimPrefix(agent.DefaultSrcDir, "/")
	require.ElementsMatch(t, []string{"ebpf-cni-agent", "opt/", "opt/ebpf-cni/", src + "/", src + "/ebpf-cni", src + "/ebpf-ipam", src + "/loopback"}, files)
	for _, b := range []string{"ebpf-cni-agent", src + "/ebpf-cni", src + "/ebpf-ipam", src + "/loopback"} {
		want, err := os.ReadFile(filepath.Join(bin, filepath.Base(b)))
		require.NoError(t, err)
		got, err := os.ReadFile(filepath.Join(root, b))
		require.NoError(t, err)
		require.Equal(t, want, got, b)
	}
	v, err := exec.Command(filepath.Join(root, "ebpf-cni-agent"), "version").CombinedOutput()
	require.NoError(t, err)
	require.Equal(t, "ebpf-cni-agent "+version+"\n", string(v))
}
