package counters

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// cReasons are the values of enum pkt_reason as the compiled C has them
// (the BTF of bpf/maps.c's object), by name, REASON_MAX left out.
func cReasons(t *testing.T) map[string]maps.CniPktReason {
	spec, err := maps.LoadCni()
	require.NoError(t, err)
	var enum *btf.Enum
	require.NoError(t, spec.Types.TypeByName("pkt_reason", &enum))
	out := map[string]maps.CniPktReason{}
	for _, v := range enum.Values {
		if v.Name != "REASON_MAX" {
			out[v.Name] = maps.CniPktReason(v.Value)
		}
	}
	return out
}

// TestEveryCReasonNamed: every reason the C enum has is named for people
// and for JSON, once; the CLI shows only what these tables name.
func TestEveryCReasonNamed(t *testing.T) {
	c := cReasons(t)
	require.NotEmpty(t, c)
	require.Len(t, ReasonKeys, len(c), "names for %d reasons, the C enum has %d (make generate)", len(ReasonKeys), len(c))
	seen := map[string]bool{}
	for name, r := range c {
		key, ok := ReasonKeys[r]
		require.True(t, ok, "%s (%d) has no key (make generate)", name, r)
		require.Equal(t, strings.ToLower(strings.TrimPrefix(name, "REASON_")), key)
		require.NotEmpty(t, ReasonNames[r], "%s has no name", name)
		require.False(t, seen[key], "key %s used twice", key)
		seen[key] = true
		require.Less(t, int(r), len(maps.CniDevCounters{}.ByReason), "%s beyond REASON_MAX", name)
	}
}

// dropCall is a reason a program returns as a drop (lib/verdict.h).
var dropCall = regexp.MustCompile(`\bDROP\(\s*(REASON_[A-Z0-9_]+)\s*\)`)

// TestCDropsCounted: every reason a program drops with is counted as a
// drop (the "dropped" totals, drop_ keys), and nothing else is.
func TestCDropsCounted(t *testing.T) {
	c := cReasons(t)
	for name, r := range c {
		drop := strings.HasPrefix(name, "REASON_DROP_")
		require.Equal(t, drop, IsDrop(r), "%s: counted as a drop", name)
		require.Equal(t, drop, strings.HasPrefix(ReasonKeys[r], "drop_"), "%s: key %s", name, ReasonKeys[r])
	}
	files, err := filepath.Glob("../../bpf/*.c")
	require.NoError(t, err)
	lib, err := filepath.Glob("../../bpf/lib/*.h")
	require.NoError(t, err)
	files = append(files, lib...)
	require.NotEmpty(t, files)
	used := 0
	for _, f := range files {
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range dropCall.FindAllStringSubmatch(string(src), -1) {
			r, ok := c[m[1]]
			require.True(t, ok, "%s: DROP(%s) of no enum pkt_reason value", f, m[1])
			require.True(t, IsDrop(r), "%s: DROP(%s) is not counted as a drop (name it REASON_DROP_*)", f, m[1])
			used++
		}
	}
	require.NotZero(t, used, "no DROP() found in bpf/")
}
