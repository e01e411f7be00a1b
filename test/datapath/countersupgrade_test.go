package datapath_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/counters"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
)

// beforeDirections is the last commit whose programs counted by reason
// only, in pkt_counters and endpoint_counters.
const beforeDirections = "74f57fa"

// TestUpgradeCountersGainDirection: a node whose programs of an older
// build count into pkt_counters and endpoint_counters (by reason only) is
// upgraded in place by the first ADD of this build: its programs create
// node_counters and device_counters, the old pods' traffic is counted
// there by direction, the old maps are unpinned, and the last DEL leaves
// the node clean.
func TestUpgradeCountersGainDirection(t *testing.T) {
	e := newEnv(t)
	list := e.confList(netOpts{})
	older := nettest.NewCNI(e.node, []string{testutil.CommitDir(t, beforeDirections), testutil.RefPluginDir(t)}, e.cacheDir)
	a, err := older.AddPod(list, "old-a", nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.cni.DelPod(list, a) })
	b, err := older.AddPod(list, "old-b", nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.cni.DelPod(list, b) })
	out, err := nettest.Ping(a.NS, b.IP(4), 2)
	require.NoError(t, err, out)
	pinned := func(name string) bool {
		_, err := os.Stat(filepath.Join(maps.Dir(e.bpfRoot), name))
		return err == nil
	}
	// The older build's counters (maps.Retired has later retirements too,
	// policy_names, which this build predates).
	for _, name := range []string{"pkt_counters", "endpoint_counters"} {
		require.True(t, pinned(name), "the older build pins %s", name)
	}
	require.False(t, pinned(maps.CniMapNodeCounters))

	c := e.addPod(list, "new-c")
	tags, err := programs.Installed(e.bpfRoot)
	require.NoError(t, err)
	require.Len(t, tags, 1, "upgraded: one program set")
	for _, name := range maps.Retired {
		require.False(t, pinned(name), "%s left pinned after the upgrade", name)
	}

	nd := e.handle()
	defer nd.Close()
	dev, err := counters.OpenDevices(nd.PinnedMap)
	require.NoError(t, err)
	before, err := dev.Sum()
	require.NoError(t, err)
	out, err = nettest.Ping(a.NS, b.IP(4), 5)
	require.NoError(t, err, out)
	out, err = nettest.Ping(c.NS, a.IP(4), 1)
	require.NoError(t, err, out)
	after, err := dev.Sum()
	require.NoError(t, err)
	ia := uint32(e.hostIndex(a))
	redirect := maps.CniPktReasonREASON_REDIRECT
	require.GreaterOrEqual(t, after[ia][redirect][counters.Egress].Packets-before[ia][redirect][counters.Egress].Packets, uint64(5),
		"the old pod's requests, counted by its new program under egress")
	total, err := counters.ReadCounters(e.bpfRoot)
	require.NoError(t, err)
	require.GreaterOrEqual(t, total[redirect].Packets, uint64(12))

	require.NoError(t, e.cni.DelPod(list, a))
	require.NoError(t, e.cni.DelPod(list, b))
	require.NoError(t, e.cni.DelPod(list, c))
	e.requireClean()
}
