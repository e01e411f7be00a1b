package cli_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/conflisttest"
	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
)

// TestGCRangeRoutes: an unreachable route of a pod range no pod is in
// (left by a crash) is a leftover: `gc --dry-run` lists it and keeps it,
// `gc` removes it and lists it; the ranges of live pods keep theirs.
func TestGCRangeRoutes(t *testing.T) {
	e := newEnv(t)
	e.addPod(e.confList(""), "alive")
	routes := func() string {
		out, err := nettest.Run(e.node.NS, "ip", "-4", "route", "show", "proto", "237")
		require.NoError(t, err)
		out6, err := nettest.Run(e.node.NS, "ip", "-6", "route", "show", "proto", "237")
		require.NoError(t, err)
		return out + out6
	}
	require.Contains(t, routes(), "unreachable "+conflisttest.DefaultSubnets[0])
	_, err := nettest.Run(e.node.NS, "ip", "route", "add", "unreachable", "10.99.0.0/24", "proto", "237")
	require.NoError(t, err)
	want := "unreachable route 10.99.0.0/24 (no pod of the node in it)"

	var dry gcJSON
	e.json(&dry, cli.ExitOK, "gc", "--dry-run")
	require.Equal(t, []string{want}, dry.Leftovers)
	require.Contains(t, routes(), "10.99.0.0/24", "the dry run removed the route")
	var done gcJSON
	e.json(&done, cli.ExitOK, "gc")
	require.Equal(t, []string{want}, done.Leftovers)
	require.NotContains(t, routes(), "10.99.0.0/24")
	require.Contains(t, routes(), "unreachable "+conflisttest.DefaultSubnets[0], "the live pod's range keeps its route")
	require.Equal(t, 2, strings.Count(routes(), "unreachable"), "one route per family of the live pod")
}
