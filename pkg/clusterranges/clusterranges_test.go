package clusterranges

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Of gives the ranges a configuration names, and nothing when it names
// none or a bad one (the cluster feature's Parse fails the call then).
func TestOf(t *testing.T) {
	got := Of([]byte(`{"type":"ebpf-cni","clusterCIDRs":["10.244.0.0/16","fd00:244::/48"]}`))
	require.Len(t, got, 2)
	require.Equal(t, "10.244.0.0/16", got[0].String())
	require.Equal(t, "fd00:244::/48", got[1].String())
	require.Nil(t, Of([]byte(`{"type":"ebpf-cni"}`)))
	require.Nil(t, Of([]byte(`{"clusterCIDRs":["10.244.0.0/16","0.0.0.0/0"]}`)))
	require.Nil(t, Of([]byte(`{"clusterCIDRs":"10.244.0.0/16"}`)))
}
