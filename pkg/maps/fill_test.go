package maps

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFillable: the maps a node can fill are the pinned hash, LRU and LPM
// maps and device_slots, with their max_entries; what a full one costs
// follows its kind.
func TestFillable(t *testing.T) {
	f := Fillable()
	require.Equal(t, uint32(131072), f[CniMapNat])
	require.Equal(t, uint32(CniDevSlotConstDEV_SLOTS), f[CniMapDeviceSlots])
	require.Contains(t, f, CniMapEndpoints)
	require.Contains(t, f, CniMapPolicyRules, "an LPM trie")
	require.NotContains(t, f, CniMapNodeCounters, "an array has a fixed size")
	require.NotContains(t, f, CniMapSlotCounters)
	require.NotContains(t, f, "go_enums", "not pinned")

	for name, want := range map[string]FillKind{
		CniMapEndpoints: FillRefuses, CniMapHostports: FillRefuses, CniMapPolicyRules: FillRefuses,
		CniMapNat: FillEvicts, CniMapFlows: FillEvicts, CniMapSockRevnat: FillEvicts, CniMapPolicyFlows: FillEvicts,
		CniMapDeviceSlots: FillCounts, CniMapDeviceCounters: FillCounts, CniMapPolicyDrops: FillCounts,
	} {
		require.Equal(t, want, Fill{Name: name}.Kind(), name)
	}
	require.InDelta(t, 50.0, Fill{Entries: 128, Capacity: 256}.Percent(), 1e-9)
	require.Zero(t, Fill{Entries: 1}.Percent())
}
