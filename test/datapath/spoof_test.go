package datapath_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestAntiSpoofing: with real packets, a pod that sends from an address or
// a MAC that is not its own reaches nobody, and the drops are counted by
// reason; its own traffic is unaffected.
func TestAntiSpoofing(t *testing.T) {
	e := newEnv(t)
	list := e.confList(netOpts{})
	a := e.addPod(list, "spoofer")
	b := e.addPod(list, "victim")
	mustConnect(t, []*nettest.Pod{a, b})

	src := int(maps.CniPktReasonREASON_DROP_SPOOF_SRC)
	mac := int(maps.CniPktReasonREASON_DROP_SPOOF_MAC)

	// Another pod's would-be address, added inside the pod by its owner.
	_, err := nettest.Run(a.NS, "ip", "addr", "add", "10.244.1.250/32", "dev", "eth0")
	require.NoError(t, err)
	before := e.counters()
	out, err := nettest.Run(a.NS, "ping", "-n", "-c", "3", "-i", "0.01", "-W", "1", "-I", "10.244.1.250", b.IP(4).String())
	require.Error(t, err, "spoofed ping got through: %s", out)
	require.GreaterOrEqual(t, e.counters()[src]-before[src], uint64(3))

	_, err = nettest.Run(a.NS, "ip", "-6", "addr", "add", "fd00:244:1::fade/128", "dev", "eth0", "nodad")
	require.NoError(t, err)
	before = e.counters()
	out, err = nettest.Run(a.NS, "ping", "-n", "-c", "3", "-i", "0.01", "-W", "1", "-I", "fd00:244:1::fade", b.IP(6).String())
	require.Error(t, err, "spoofed ping got through: %s", out)
	require.GreaterOrEqual(t, e.counters()[src]-before[src], uint64(3))

	// Its own address still works.
	o, err := nettest.Ping(a.NS, b.IP(4), 2)
	require.NoError(t, err, o)

	// A forged MAC: nothing passes, not even ARP. A netkit pod (L3 mode)
	// has no MAC to forge: the kernel refuses to give it one.
	out, err = nettest.Run(a.NS, "ip", "link", "set", "eth0", "address", "0e:66:66:66:66:66")
	if testutil.PodDevice() == "netkit" {
		require.Error(t, err, "a netkit pod took a MAC: %s", out)
		return
	}
	require.NoError(t, err)
	before = e.counters()
	out, err = nettest.Run(a.NS, "ping", "-n", "-c", "3", "-i", "0.01", "-W", "1", b.IP(4).String())
	require.Error(t, err, "ping with a forged MAC got through: %s", out)
	require.GreaterOrEqual(t, e.counters()[mac]-before[mac], uint64(1))
}
