package plugin

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

type needing struct{ n feature.Needs }

func (p needing) Needs() feature.Needs                                 { return p.n }
func (needing) Add(*node.Node, *feature.Endpoint, *feature.Undo) error { return nil }
func (needing) Check(*node.Node, *feature.Endpoint) []string           { return nil }

// The core gets every feature's flags and the largest MTU overhead.
func TestGather(t *testing.T) {
	got := gather([]feature.Pod{
		needing{feature.Needs{Flags: maps.CniEndpointFlagsEP_F_HOSTPORT}},
		needing{feature.Needs{Flags: maps.CniEndpointFlagsEP_F_BW_EGRESS, Overhead: 50}},
		needing{feature.Needs{Overhead: 20}},
	})
	require.Equal(t, maps.CniEndpointFlagsEP_F_HOSTPORT|maps.CniEndpointFlagsEP_F_BW_EGRESS, got.Flags)
	require.Equal(t, 50, got.Overhead)
	require.Equal(t, feature.Needs{}, gather(nil))
}
