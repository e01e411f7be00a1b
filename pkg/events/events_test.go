package events

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestOptionsConfig: the rate limit becomes the bucket's cost per event
// and its tolerance, so that a CPU sends Burst events at once, then one
// per 1/Rate s; defaults apply to zeros.
func TestOptionsConfig(t *testing.T) {
	c := Options{Rate: 1000, Burst: 100, Flows: true, FlowSample: 10}.config(42, 7)
	require.Equal(t, maps.CniEventConfig{Lease: 7, NsPerEvent: 1_000_000, Burst: 99_000_000, Flags: uint32(maps.CniEventConfigFlagsEVENT_CF_FLOWS),
		FlowSample: 10, ReaderPid: 42}, c)
	// Burst events at one instant: the k-th is admitted while (k-1) costs
	// fit the tolerance (bpf/lib/events.h event_admit).
	admitted := 0
	for tat, now := uint64(0), uint64(1); ; admitted++ {
		tat = max(tat, now)
		if tat-now > c.Burst {
			break
		}
		tat += c.NsPerEvent
		if admitted > 1000 {
			t.Fatal("no limit")
		}
	}
	require.Equal(t, 100, admitted)

	d := Options{}.config(1, 1)
	require.Equal(t, uint64(1_000_000), d.NsPerEvent, "DefaultRate")
	require.Equal(t, 99*d.NsPerEvent, d.Burst, "burst rate/10")
	require.Zero(t, d.Flags)
	require.Equal(t, uint64(0), Options{Rate: 5}.config(1, 1).Burst, "at least one event at once")
}
