package datapath_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/pkg/counters"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestToWorld: traffic to beyond the node's uplink leaves through
// bpf_fib_lookup + redirect, not the stack (the world routes the pod subnet
// back to the node here, as masquerade is another issue's).
func TestToWorld(t *testing.T) {
	e := newEnv(t)
	list := e.confList(netOpts{})
	p := e.addPod(list, "to-world")
	_, err := nettest.Run(e.node.World, "ip", "route", "add", "10.244.1.0/24", "via", nettest.NodeIP4.String())
	require.NoError(t, err)
	_, err = nettest.Run(e.node.World, "ip", "-6", "route", "add", "fd00:244:1::/64", "via", nettest.NodeIP6.String())
	require.NoError(t, err)

	before, err := counters.ReadCounters(e.bpfRoot)
	require.NoError(t, err)
	for _, ip := range []string{nettest.WorldIP4.String(), nettest.WorldIP6.String()} {
		o, err := nettest.Run(p.NS, "ping", "-n", "-c", "3", "-i", "0.01", "-W", "2", ip)
		require.NoError(t, err, o)
	}
	require.NoError(t, nettest.TCP(p.NS, e.node.World, nettest.WorldIP4))
	after, err := counters.ReadCounters(e.bpfRoot)
	require.NoError(t, err)
	fib := maps.CniPktReasonREASON_FIB_REDIRECT
	require.GreaterOrEqual(t, after[fib].Packets-before[fib].Packets, uint64(6), "pod-to-world packets did not take the fib path")
}
