package counters

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestReasonKeysNameEveryReason: the CLI and JSON name reasons by ReasonKeys;
// a reason added to ReasonNames without a key would vanish from them.
func TestReasonKeysNameEveryReason(t *testing.T) {
	require.Equal(t, len(ReasonNames), len(ReasonKeys))
	seen := map[string]bool{}
	for r := range ReasonNames {
		k, ok := ReasonKeys[r]
		require.True(t, ok, "reason %d has no key", r)
		require.False(t, seen[k], "key %s used twice", k)
		seen[k] = true
		require.Less(t, int(r), len(maps.CniDevCounters{}.ByReason), "reason %d beyond REASON_MAX", r)
	}
}
