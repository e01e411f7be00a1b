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

// TestUplinkCounters: the uplink programs count the uplink's packets per
// device; while pods use the uplink those counters are no leftover (gc
// --dry-run does not list them), and they go with the node's last
// endpoint (DEL) like the programs; a device_counters entry left behind
// (an older build's) or a slot left to the uplink is listed by gc
// --dry-run and removed by gc.
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

	// A slot left to it (a DEL killed before it freed the slot): gc lists
	// it too, then frees it zeroed.
	d, closeDevs, err := counters.PinnedDevices(e.bpfRoot, false)
	require.NoError(t, err)
	defer closeDevs()
	slot := uint32(up) & uint32(maps.CniDevSlotConstDEV_SLOTS-1)
	require.NoError(t, d.Slots.Put(slot, per))
	require.NoError(t, d.Owners.Put(slot, uint32(up)))
	e.json(&dry, cli.ExitOK, "gc", "--dry-run")
	require.Contains(t, dry.Leftovers, entry)
	done = gcJSON{}
	e.json(&done, cli.ExitOK, "gc")
	require.Contains(t, done.Leftovers, entry)
	keys, err = counters.DeviceCounterKeys(e.bpfRoot)
	require.NoError(t, err)
	require.Empty(t, keys)
	var owner uint32
	require.NoError(t, d.Owners.Lookup(slot, &owner))
	require.Zero(t, owner, "the slot is free")
	var vals []maps.CniDevCounters
	require.NoError(t, d.Slots.Lookup(slot, &vals))
	require.Zero(t, vals[0].ByReason[0].ByDir[0].Packets, "the freed slot is zeroed")
}
