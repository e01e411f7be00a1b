package datapath_test

import (
	"net"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/containernetworking/plugins/pkg/ns"
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

// TestToWorldRouteChange: from_container reuses the FIB's answer for a
// destination only within the jiffy it was found in (lib/fib.h): a route
// that changes, or an egress MTU that shrinks, is seen by the next packet
// after the change, as the stack would see it, both families.
func TestToWorldRouteChange(t *testing.T) {
	e := newEnv(t)
	list := e.confList(netOpts{})
	p := e.addPod(list, "route-change")
	run := func(n ns.NetNS, args ...string) {
		t.Helper()
		o, err := nettest.Run(n, args[0], args[1:]...)
		require.NoError(t, err, "%v: %s", args, o)
	}
	// A destination beyond the world's end of the uplink, and the pod's
	// subnet routed back through the node.
	run(e.node.World, "ip", "addr", "add", "198.51.100.1/32", "dev", "lo")
	run(e.node.World, "ip", "-6", "addr", "add", "2001:db8:1::1/128", "dev", "lo")
	run(e.node.World, "ip", "route", "add", "10.244.1.0/24", "via", nettest.NodeIP4.String())
	run(e.node.World, "ip", "-6", "route", "add", "fd00:244:1::/64", "via", nettest.NodeIP6.String())
	run(e.node.NS, "ip", "route", "add", "198.51.100.0/24", "via", nettest.WorldIP4.String())
	run(e.node.NS, "ip", "-6", "route", "add", "2001:db8:1::/64", "via", nettest.WorldIP6.String())

	for _, c := range []struct{ ip, prefix, via, v string }{
		{"198.51.100.1", "198.51.100.0/24", nettest.WorldIP4.String(), "-4"},
		{"2001:db8:1::1", "2001:db8:1::/64", nettest.WorldIP6.String(), "-6"},
	} {
		// On one CPU: the answers are kept per CPU, and the pod's packets
		// meet from_container on the CPU that sent them.
		ping := func(args ...string) (string, error) {
			return nettest.Run(p.NS, "taskset", append([]string{"-c", "0", "ping", c.v, "-n", "-c", "3", "-i", "0.01", "-W", "1"}, append(args, c.ip)...)...)
		}
		before, err := counters.ReadCounters(e.bpfRoot)
		require.NoError(t, err)
		o, err := ping()
		require.NoError(t, err, o)
		after, err := counters.ReadCounters(e.bpfRoot)
		require.NoError(t, err)
		fib := maps.CniPktReasonREASON_FIB_REDIRECT
		require.GreaterOrEqual(t, after[fib].Packets-before[fib].Packets, uint64(3), "%s: not through the FIB's answer", c.ip)
		requireFIBCached(t, e.bpfRoot, net.ParseIP(c.ip))

		run(e.node.NS, "ip", c.v, "route", "replace", "unreachable", c.prefix)
		o, err = ping()
		require.Error(t, err, "%s: still forwarded after its route became unreachable: %s", c.ip, o)
		run(e.node.NS, "ip", c.v, "route", "replace", c.prefix, "via", c.via)
		o, err = ping()
		require.NoError(t, err, "%s: not forwarded again with its route back: %s", c.ip, o)

		// A packet the uplink's new MTU does not take (DF): the stack
		// answers with the MTU, instead of a redirect by the old answer.
		o, err = ping("-M", "do", "-s", "1400")
		require.NoError(t, err, o)
		run(e.node.NS, "ip", "link", "set", "uplink", "mtu", "1280")
		o, err = ping("-M", "do", "-s", "1400")
		require.Error(t, err, "%s: a 1400-byte packet went out of a 1280-byte uplink: %s", c.ip, o)
		require.Regexp(t, `(?i)frag needed|too big|mtu`, o)
		run(e.node.NS, "ip", "link", "set", "uplink", "mtu", "1500")
	}
}

// fibSlot and fibCache are struct fib_cache_slot and struct fib_cache of
// bpf/lib/fib.h (a map of each program object, not pinned, not in
// types.h).
type fibSlot struct {
	Tick           uint64
	Iif, Oif, Flow uint32
	MTU            uint16
	Family, Proto  uint8
	Src, Dst       [16]byte
	SrcMAC, DstMAC [6]byte
	Pad            uint32
}

type fibCache struct{ Slot [4]fibSlot }

// requireFIBCached: some CPU's from_container (or from_netkit) keeps the FIB's answer for
// dst, with the uplink's MTU (a kernel that does not give the MTU back
// would leave the cache unused).
func requireFIBCached(t *testing.T, bpfRoot string, dst net.IP) {
	t.Helper()
	want := [16]byte{}
	if v4 := dst.To4(); v4 != nil {
		copy(want[:], v4)
	} else {
		copy(want[:], dst)
	}
	// from_netkit for a netkit pod (deviceType auto on a kernel with
	// netkit): the same code, its own object.
	var pins []string
	for _, name := range []string{"from_container", "from_netkit"} {
		m, err := filepath.Glob(filepath.Join(bpfRoot, "programs", "*", name))
		require.NoError(t, err)
		pins = append(pins, m...)
	}
	require.NotEmpty(t, pins)
	for _, pin := range pins {
		prog, err := ebpf.LoadPinnedProgram(pin, nil)
		require.NoError(t, err)
		info, err := prog.Info()
		prog.Close()
		require.NoError(t, err)
		ids, _ := info.MapIDs()
		for _, id := range ids {
			m, err := ebpf.NewMapFromID(id)
			require.NoError(t, err)
			mi, err := m.Info()
			if err != nil || mi.Name != "fib_cache" {
				m.Close()
				continue
			}
			var cpus []fibCache
			err = m.Lookup(uint32(0), &cpus)
			m.Close()
			require.NoError(t, err)
			for _, c := range cpus {
				for _, s := range c.Slot {
					if s.Tick != 0 && s.Dst == want && s.MTU == 1500 {
						return
					}
				}
			}
		}
	}
	t.Fatalf("no from_container or from_netkit keeps the FIB's answer for %s with the uplink's MTU (%v)", dst, pins)
}
