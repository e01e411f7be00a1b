package cli_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
	"github.com/ebpf-cni/ebpf-cni/pkg/counters"
)

// TestCounters: pod-to-pod traffic grows the sender's redirect count, a
// spoofed packet its drop_spoof_src count (and nobody else's), both per
// endpoint and in the node total; DEL removes the endpoint's counters.
func TestCounters(t *testing.T) {
	e := newEnv(t)
	list := e.confList(testutil.BestMode())
	a := e.addPod(list, "sender")
	b := e.addPod(list, "receiver")

	before := e.counters()
	out, err := nettest.Ping(a.NS, b.IP(4), 5)
	require.NoError(t, err, out)
	after := e.counters()
	redirects := func(c countersJSON, id string) uint64 { return c.of(id).Reasons["redirect"].Packets }
	require.GreaterOrEqual(t, redirects(after, "sender")-redirects(before, "sender"), uint64(5), "sender's echo requests")
	require.GreaterOrEqual(t, redirects(after, "receiver")-redirects(before, "receiver"), uint64(5), "receiver's echo replies")
	require.GreaterOrEqual(t, after.Total.Reasons["redirect"].Packets-before.Total.Reasons["redirect"].Packets, uint64(10))
	require.Greater(t, after.of("sender").Reasons["redirect"].Bytes, before.of("sender").Reasons["redirect"].Bytes)
	// Both leave their pod (from_container: egress); none arrives through
	// to_container, redirect_peer skips it.
	egress := func(c countersJSON, id, reason string) uint64 { return c.of(id).Directions["egress"][reason].Packets }
	require.GreaterOrEqual(t, egress(after, "sender", "redirect")-egress(before, "sender", "redirect"), uint64(5))
	require.Equal(t, before.of("sender").Directions["ingress"]["redirect"], after.of("sender").Directions["ingress"]["redirect"])

	// The pod adds an address that is not its own and sends from it.
	_, err = nettest.Run(a.NS, "ip", "addr", "add", "10.244.1.250/32", "dev", "eth0")
	require.NoError(t, err)
	before = e.counters()
	out, err = nettest.Run(a.NS, "ping", "-n", "-c", "3", "-i", "0.01", "-W", "1", "-I", "10.244.1.250", b.IP(4).String())
	require.Error(t, err, "spoofed ping got through: %s", out)
	after = e.counters()
	spoofed := func(c countersJSON, id string) uint64 { return c.of(id).Reasons["drop_spoof_src"].Packets }
	require.GreaterOrEqual(t, spoofed(after, "sender")-spoofed(before, "sender"), uint64(3))
	require.GreaterOrEqual(t, after.of("sender").Dropped.Packets-before.of("sender").Dropped.Packets, uint64(3))
	require.Equal(t, spoofed(before, "receiver"), spoofed(after, "receiver"), "the receiver spoofed nothing")
	require.GreaterOrEqual(t, after.Total.Reasons["drop_spoof_src"].Packets-before.Total.Reasons["drop_spoof_src"].Packets, uint64(3))
	require.GreaterOrEqual(t, after.Total.Directions["egress"]["drop_spoof_src"].Packets-before.Total.Directions["egress"]["drop_spoof_src"].Packets, uint64(3))

	// The table names the drop by reason on the sender's rows.
	r := e.cli("counters")
	require.Equal(t, cli.ExitOK, r.code, "%s", r)
	lines := strings.Split(r.stdout, "\n")
	start := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "sender/eth0") })
	require.GreaterOrEqual(t, start, 0, r.stdout)
	end := start + 1
	for end < len(lines) && strings.HasPrefix(lines[end], " ") {
		end++
	}
	require.Contains(t, strings.Join(lines[start:end], "\n"), "drop_spoof_src", r.stdout)

	// DEL removes the sender's per-device counters.
	ifindex := after.of("sender").HostIfIndex
	require.NotZero(t, ifindex)
	require.NoError(t, e.cni.DelPod(list, a))
	keys, err := counters.DeviceCounterKeys(e.bpfRoot)
	require.NoError(t, err)
	require.NotContains(t, keys, ifindex, "DEL left the endpoint's counters")
	for _, ep := range e.counters().Endpoints {
		require.NotEqual(t, "sender", ep.ContainerID)
	}
}
