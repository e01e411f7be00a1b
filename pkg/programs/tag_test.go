package programs_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/buildinfo"
	"github.com/ebpf-cni/ebpf-cni/pkg/features"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
)

// TestReleaseVersionLoads: a release build's version has dots (v0.1.0),
// which bpffs refuses in a name: its programs load and open all the same,
// under a tag without a dot.
func TestReleaseVersionLoads(t *testing.T) {
	defer func(v string) { buildinfo.Version = v }(buildinfo.Version)
	buildinfo.Version = "v0.1.0-58-g733ccab"
	tag := programs.Tag(features.Objects())
	require.False(t, strings.Contains(tag, "."), "tag %q has a dot", tag)
	bpfRoot, _, p := testPrograms(t)
	require.Equal(t, tag, p.Tag)
	tags, err := programs.Installed(bpfRoot)
	require.NoError(t, err)
	require.Equal(t, []string{tag}, tags)
	_, err = programs.Open(bpfRoot, tag, features.Objects())
	require.NoError(t, err)
}
