package deploy_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
)

// TestPluginsStayLean: the plugins are exec'd for every pod; the agent's
// Kubernetes client (client-go, k8s.io/api: tens of MB, seconds of init)
// must never reach them.
func TestPluginsStayLean(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "./cmd/ebpf-cni", "./cmd/ebpf-ipam")
	cmd.Dir = testutil.ModuleRoot()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "github.com/ebpf-cni/ebpf-cni/pkg/conflist", "the CLI's conflist command uses the same writer")
	for _, dep := range strings.Fields(string(out)) {
		// (sigs.k8s.io/knftables comes with the reference plugins' helpers.)
		if strings.HasPrefix(dep, "k8s.io/") || strings.HasPrefix(dep, "sigs.k8s.io/network-policy-api") || strings.Contains(dep, "/pkg/agent") {
			t.Errorf("a plugin binary depends on %s", dep)
		}
	}
}
