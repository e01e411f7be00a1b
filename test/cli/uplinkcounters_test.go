package cli_test

import (
	"fmt"
	"net"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/conflisttest"
	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
	"github.com/ebpf-cni/ebpf-cni/pkg/counters"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestUplinkCounters: the uplink programs count the uplink's packets in
// device_counters; while pods use the uplink that entry is no leftover
// (gc --dry-run does not list it), and it goes with the node's last
// endpoint (DEL) like the programs; one left behind (an older build's) is
// listed by gc --dry-run and removed by gc.
func TestUplinkCounters(t *testing.T) {
	e := newEnv(t)
	list := conflisttest.List(t, conflisttest.Options{Name: "clinet", BPFRoot: e.bpfRoot, StateDir: e.stateDir, Keys: map[string]any{"ipMasq": true}})
	p, err := e.cni.AddPod(list, "counted", nil)
	require.NoError(t, err)
	srv, err := nettest.ServeWho(e.node.World, "world", 0)
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	_, err = nettest.AskWhoUDP(p.NS, net.JoinHostPort(nettest.WorldIP4.String(), strconv.Itoa(srv.Port)))
	require.NoError(t, err)
	var up int
	require.NoError(t, e.node.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("uplink")
		if err == nil {
			up = l.Attrs().Index
		}
		return err
	}))
	keys, err := counters.DeviceCounterKeys(e.bpfRoot)
	require.NoError(t, err)
	require.Contains(t, keys, up, "the uplink's packets are counted")
	entry := fmt.Sprintf("%s[%d]", maps.CniMapDeviceCounters, up)

	var dry gcJSON
	e.json(&dry, cli.ExitOK, "gc", "--dry-run")
	require.NotContains(t, dry.Leftovers, entry, "the counters of an uplink in use are no leftover")

	require.NoError(t, e.cni.DelPod(list, p))
	keys, err = counters.DeviceCounterKeys(e.bpfRoot)
	require.NoError(t, err)
	require.Empty(t, keys, "device_counters after the last pod")

	// An entry left by an older build: gc lists it, then removes it.
	m, err := maps.OpenPinned(e.bpfRoot, maps.CniMapDeviceCounters)
	require.NoError(t, err)
	defer m[maps.CniMapDeviceCounters].Close()
	possible, err := ebpf.PossibleCPU()
	require.NoError(t, err)
	per := make([]maps.CniDevCounters, possible)
	per[0].ByReason[0].ByDir[0].Packets = 1
	require.NoError(t, m[maps.CniMapDeviceCounters].Put(uint32(up), per))
	e.json(&dry, cli.ExitOK, "gc", "--dry-run")
	require.Contains(t, dry.Leftovers, entry)
	var done gcJSON
	e.json(&done, cli.ExitOK, "gc")
	require.Contains(t, done.Leftovers, entry)
	keys, err = counters.DeviceCounterKeys(e.bpfRoot)
	require.NoError(t, err)
	require.Empty(t, keys)
}
