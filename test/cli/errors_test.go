package cli_test

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
)

var commandNames = []string{"counters", "endpoints", "gc", "ipam", "status", "version"}

// TestUsage: help says what each command shows and exits 0; bad usage
// exits 2; with CNI_COMMAND set the binary is still the CNI plugin.
func TestUsage(t *testing.T) {
	bin := filepath.Join(testutil.PluginDir(t), "ebpf-cni")
	for _, args := range [][]string{nil, {"--help"}, {"-h"}, {"help"}} {
		r := runIn(t, nil, bin, args...)
		require.Equal(t, cli.ExitOK, r.code, "%v: %s", args, r)
		for _, c := range commandNames {
			require.Regexp(t, `(?m)^  `+c+`\s+\S`, r.stdout, "%v lists %s", args, c)
		}
		require.Contains(t, r.stdout, "--bpf-root")
		// The intro says which commands change the node's state: every
		// one that does (an operator reads it to know what is safe to run).
		intro, _, _ := strings.Cut(r.stdout, "Usage:")
		for _, w := range []string{"gc", "repair", "tunnels --add", "--del"} {
			require.Regexp(t, `(^|\s)`+regexp.QuoteMeta(w)+`\b`, intro, "%v: the intro names %s among the commands that change state", args, w)
		}
		require.NotContains(t, intro, "Only gc", args)
	}
	for _, c := range commandNames {
		for _, args := range [][]string{{c, "--help"}, {"help", c}} {
			r := runIn(t, nil, bin, args...)
			require.Equal(t, cli.ExitOK, r.code, "%v: %s", args, r)
			require.Contains(t, r.stdout, "Usage: ebpf-cni "+c)
			require.Contains(t, r.stdout, "JSON:", "%s --help documents its JSON", c)
			require.Contains(t, r.stdout, "--bpf-root DIR")
		}
	}
	for _, args := range [][]string{{"bogus"}, {"endpoints", "--bogus"}, {"endpoints", "-o", "yaml"}, {"endpoints", "extra"}, {"help", "bogus"}} {
		r := runIn(t, nil, bin, args...)
		require.Equal(t, cli.ExitUsage, r.code, "%v: %s", args, r)
		require.NotEmpty(t, r.stderr)
		require.Empty(t, r.stdout)
	}

	var v map[string]string
	r := runIn(t, nil, bin, "version", "-o", "json")
	require.Equal(t, cli.ExitOK, r.code, "%s", r)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	require.NotEmpty(t, v["programTag"])

	out := testutil.Run(t, bin, testutil.Call{Command: "VERSION", Stdin: []byte(`{"cniVersion":"1.1.0"}`)}).Must(t)
	require.Contains(t, string(out.Stdout), "supportedVersions", "with CNI_COMMAND it is the plugin")
}

// TestBadBPFRoot: a bpfRoot that is not on bpffs, or holds no state, makes
// every command fail with what to do; status lists it as a problem.
func TestBadBPFRoot(t *testing.T) {
	bin := filepath.Join(testutil.PluginDir(t), "ebpf-cni")
	notBPF := t.TempDir()
	empty := filepath.Join(testutil.BPFFS(t), "nothing-here")
	for _, c := range []string{"endpoints", "counters", "ipam", "gc"} {
		r := runIn(t, nil, bin, c, "--bpf-root", notBPF, "--state-dir", t.TempDir())
		require.Equal(t, cli.ExitError, r.code, "%s: %s", c, r)
		require.Contains(t, r.stderr, "bpffs not mounted at "+notBPF+": mount -t bpf bpf "+notBPF, c)
		require.Empty(t, r.stdout)

		r = runIn(t, nil, bin, c, "--bpf-root", empty, "--state-dir", t.TempDir())
		require.Equal(t, cli.ExitError, r.code, "%s: %s", c, r)
		require.Contains(t, r.stderr, "no ebpf-cni state at "+empty, c)
	}
	r := runIn(t, nil, bin, "status", "--bpf-root", notBPF, "-o", "json")
	require.Equal(t, cli.ExitProblems, r.code, "%s", r)
	var st cli.Status
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	require.False(t, st.Features["bpffs"].Available)
	require.Len(t, st.Problems, 1)
	require.True(t, strings.Contains(st.Problems[0], "mount -t bpf bpf "+notBPF), st.Problems[0])

	// Read-only commands created nothing.
	entries, err := filepath.Glob(filepath.Join(filepath.Dir(empty), "*"))
	require.NoError(t, err)
	require.Empty(t, entries)
}
