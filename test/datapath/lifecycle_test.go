package datapath_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
	"github.com/ebpf-cni/ebpf-cni/pkg/kernel"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

func cniCode(t *testing.T, err error) uint {
	t.Helper()
	require.Error(t, err)
	var te *types.Error
	require.ErrorAs(t, err, &te, "not a CNI error: %v", err)
	return te.Code
}

// TestCheckFails: CHECK passes after ADD and names what is wrong once a pod
// route is removed, once the program is detached.
func TestCheckFails(t *testing.T) {
	for _, mode := range testutil.AttachModes {
		t.Run(mode, func(t *testing.T) {
			testutil.RequireMode(t, mode)
			e := newEnv(t)
			list := e.confList(netOpts{attachMode: mode})
			p := e.addPod(list, "check-routes")
			q := e.addPod(list, "check-prog")
			require.NoError(t, e.cni.Check(list, p.RT))
			require.NoError(t, e.cni.Check(list, q.RT))

			// Remove the pod's default IPv4 route.
			_, err := nettest.Run(p.NS, "ip", "-4", "route", "del", "default")
			require.NoError(t, err)
			err = e.cni.Check(list, p.RT)
			require.Equal(t, errcode.CheckFailed, cniCode(t, err))
			require.Contains(t, err.Error(), "route 0.0.0.0/0 via")

			// Detach the program of the other pod.
			host := veth.HostName("check-prog", "eth0")
			rec, err := node.ReadRecord(e.stateDir, host)
			require.NoError(t, err)
			require.NoError(t, e.node.NS.Do(func(ns.NetNS) error {
				return attach.Detach(rec.Attachments[0], rec.HostIfIndex, endpoint.HooksFor(testutil.PodDevice())[0])
			}))
			err = e.cni.Check(list, q.RT)
			require.Equal(t, errcode.CheckFailed, cniCode(t, err))
			require.Contains(t, err.Error(), "not attached to "+host)

			require.NoError(t, e.cni.DelPod(list, p))
			require.NoError(t, e.cni.DelPod(list, q))
			e.requireClean()
		})
	}
}

// TestRollback: every failure inside ADD leaves no veth, route, entry, pin,
// record or allocation.
func TestRollback(t *testing.T) {
	e := newEnv(t)
	list := e.confList(netOpts{})

	allocs := func() int {
		// ebpf-ipam keeps one owner file per attachment.
		n := 0
		_ = filepath.Walk(filepath.Join(e.stateDir, "ipam"), func(p string, info os.FileInfo, err error) error {
			if err == nil && !info.IsDir() && strings.Contains(p, "owners") {
				n++
			}
			return nil
		})
		return n
	}

	t.Run("interface exists", func(t *testing.T) {
		n, err := nettest.NewNetNS()
		require.NoError(t, err)
		t.Cleanup(func() { nettest.CloseNetNS(n) })
		_, err = nettest.Run(n, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "other")
		require.NoError(t, err)
		rt := &libcni.RuntimeConf{ContainerID: "exists", NetNS: n.Path(), IfName: "eth0"}
		_, err = e.cni.Add(list, rt)
		require.Equal(t, errcode.InterfaceExists, cniCode(t, err))
		require.Contains(t, err.Error(), "eth0")
		e.requireClean()
		require.Zero(t, allocs())
	})

	t.Run("netns gone", func(t *testing.T) {
		n, err := nettest.NewNetNS()
		require.NoError(t, err)
		path := n.Path()
		nettest.CloseNetNS(n)
		_, err = e.cni.Add(list, &libcni.RuntimeConf{ContainerID: "gone", NetNS: path, IfName: "eth0"})
		require.Equal(t, uint(types.ErrInvalidEnvironmentVariables), cniCode(t, err))
		require.Contains(t, err.Error(), "CNI_NETNS")
		e.requireClean()
		require.Zero(t, allocs())
	})

	t.Run("ipam error", func(t *testing.T) {
		full := e.confList(netOpts{ipam: map[string]any{"type": "ebpf-ipam", "ranges": []any{
			[]any{map[string]any{"subnet": "10.99.0.0/30"}}}}})
		p, err := e.cni.AddPod(full, "fill", nil) // takes the only address
		require.NoError(t, err)
		t.Cleanup(func() { _ = e.cni.DelPod(full, p) })
		_, err = e.cni.AddPod(full, "nospace", nil)
		require.Error(t, err)
		require.Len(t, e.hostLinks(), 1)
		require.NoError(t, e.cni.DelPod(full, p))
		e.requireClean()
		require.Zero(t, allocs())
	})

	t.Run("address conflict after IPAM", func(t *testing.T) {
		// A live endpoint holds 10.244.1.2 in the maps behind IPAM's back (as
		// another network on the same node would): the second ADD fails
		// after IPAM and the veth were made, and must undo both.
		other := e.confList(netOpts{version: "1.0.0", ipam: map[string]any{"type": "host-local", "dataDir": t.TempDir(),
			"ranges": []any{[]any{map[string]any{"subnet": "10.244.1.0/24"}}}}})
		p, err := e.cni.AddPod(other, "holder", nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = e.cni.DelPod(other, p) })
		_, err = e.cni.AddPod(list, "clash", nil)
		require.Equal(t, errcode.AddressConflict, cniCode(t, err))
		require.Len(t, e.hostLinks(), 1)
		require.Equal(t, 1, e.records())
		require.Zero(t, allocs(), "the ebpf-ipam allocation of the failed ADD was not released")
		require.NoError(t, e.cni.DelPod(other, p))
		e.requireClean()
	})
}

type badCase struct {
	name  string
	extra map[string]any
	caps  map[string]any
	code  uint
	key   string
}

// TestBadConfig: bad input gives a CNI error naming the key, and leaves
// nothing behind.
func TestBadConfig(t *testing.T) {
	e := newEnv(t)
	cases := []badCase{
		{"attachMode", map[string]any{"attachMode": "xdp"}, nil, types.ErrInvalidNetworkConfig, "attachMode"},
		{"mtu", map[string]any{"mtu": 20}, nil, types.ErrInvalidNetworkConfig, "mtu"},
		{"bpfRoot", map[string]any{"bpfRoot": "relative/path"}, nil, types.ErrInvalidNetworkConfig, "bpfRoot"},
		{"stateDir", map[string]any{"stateDir": "x"}, nil, types.ErrInvalidNetworkConfig, "stateDir"},
		{"mac", nil, map[string]any{"mac": "not-a-mac"}, types.ErrInvalidNetworkConfig, "runtimeConfig.mac"},
		{"multicast mac", nil, map[string]any{"mac": "01:00:5e:00:00:01"}, types.ErrInvalidNetworkConfig, "runtimeConfig.mac"},
		{"ipam missing", map[string]any{"ipam": nil}, nil, types.ErrInvalidNetworkConfig, "ipam"},
		{"not bpffs", map[string]any{"bpfRoot": t.TempDir()}, nil, errcode.BPFFS, "bpfRoot"},
		{"deviceType", map[string]any{"deviceType": "tap"}, nil, types.ErrInvalidNetworkConfig, "deviceType"},
	}
	if f := kernel.HaveNetkit(); !f.Available {
		// This kernel cannot make netkit: asking for it is refused,
		// naming the key and the kernel.
		cases = append(cases, badCase{"deviceType netkit", map[string]any{"deviceType": "netkit"}, nil, types.ErrInvalidNetworkConfig, "invalid deviceType: netkit: kernel " + kernel.Release() + " cannot make a netkit pair"})
	} else {
		cases = append(cases, badCase{"deviceType netkit with a mac", map[string]any{"deviceType": "netkit"}, map[string]any{"mac": "0e:00:00:00:12:34"}, types.ErrInvalidNetworkConfig, "deviceType"})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			list := e.confList(netOpts{extra: tc.extra})
			_, err := e.cni.AddPod(list, "bad", tc.caps)
			require.Equal(t, tc.code, cniCode(t, err), "%v", err)
			require.Contains(t, err.Error(), tc.key)
			e.requireClean()
		})
	}
}

// TestMACAndMTU: the mac capability and mtu reach the pod's interface.
func TestMACAndMTU(t *testing.T) {
	e := newEnv(t)
	list := e.confList(netOpts{extra: map[string]any{"mtu": 1400}})
	p, err := e.cni.AddPod(list, "macpod", map[string]any{"mac": "0e:00:00:00:12:34"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.cni.DelPod(list, p) })
	require.Equal(t, "0e:00:00:00:12:34", p.Result.Interfaces[1].Mac)
	require.NoError(t, p.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		require.Equal(t, "0e:00:00:00:12:34", l.Attrs().HardwareAddr.String())
		require.Equal(t, 1400, l.Attrs().MTU)
		return nil
	}))
	q := e.addPod(list, "peer")
	mustConnect(t, []*nettest.Pod{p, q})
	require.NoError(t, e.cni.Check(list, p.RT))

	// Without mtu, the uplink's MTU (set to 1450 here) is the default.
	_, err = nettest.Run(e.node.NS, "ip", "link", "set", "uplink", "mtu", "1450")
	require.NoError(t, err)
	r := e.addPod(e.confList(netOpts{}), "defmtu")
	require.NoError(t, r.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err == nil {
			require.Equal(t, 1450, l.Attrs().MTU)
		}
		return err
	}))
}

// TestGC: GC removes endpoints not in cni.dev/valid-attachments, and
// orphans no record accounts for, and forwards to IPAM.
func TestGC(t *testing.T) {
	e := newEnv(t)
	list := e.confList(netOpts{})
	keep := e.addPod(list, "keep")
	drop := e.addPod(list, "drop")

	// An orphan: a veth made by ebpf-cni whose record was lost.
	orphan := e.addPod(list, "orphan")
	require.NoError(t, node.RemoveRecord(e.stateDir, veth.HostName("orphan", "eth0")))

	// libcni with an empty cache issues no DEL of its own: what goes is
	// the plugin's GC.
	gc := nettest.NewCNI(e.node, e.paths, t.TempDir())
	require.NoError(t, gc.GC(list, []types.GCAttachment{{ContainerID: "keep", IfName: "eth0"}}))

	links := e.hostLinks()
	require.Len(t, links, 1)
	require.Equal(t, veth.HostName("keep", "eth0"), links[0].Attrs().Name)
	require.Equal(t, 1, e.records())
	a, d := e.endpointEntries()
	require.Equal(t, 2, a)
	require.Equal(t, 1, d)
	if n := testutil.PinnedHooks(endpoint.HooksFor(testutil.PodDevice()), testutil.DefaultMode()); n > 0 { // a tc filter is not pinned: CHECK below finds it
		require.Len(t, e.pinnedLinks(), n, "one pinned link per linked hook of the pod that stays")
	} else {
		require.Empty(t, e.pinnedLinks(), "the default attachMode, tc: no pinned links")
	}
	require.NoError(t, e.cni.Check(list, keep.RT))
	mustConnect(t, []*nettest.Pod{keep})

	// IPAM forgot "drop": its address is free again.
	var owners []string
	_ = filepath.Walk(filepath.Join(e.stateDir, "ipam"), func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() && strings.Contains(p, "owners") {
			owners = append(owners, p)
		}
		return nil
	})
	require.Len(t, owners, 1, "IPAM GC was not forwarded: %v", owners)
	_ = drop
	_ = orphan
	b, _ := json.Marshal(owners)
	_ = b
	_ = testutil.SpecVersions
}

// TestAttachModeTCXMissing: on a kernel without tcx (before 6.6), an ADD
// that asks for attachMode tcx fails with code 123, naming the key, and
// leaves nothing behind, and STATUS answers 50; attachMode auto works there (it falls back to tc:
// every other test).
func TestAttachModeTCXMissing(t *testing.T) {
	if f := kernel.HaveTCX(); f.Available {
		t.Skipf("the kernel has tcx (%s): make test-kernel runs this on Debian 12's 6.1", f.Detail)
	}
	e := newEnv(t)
	list := e.confList(netOpts{attachMode: "tcx"})
	_, err := e.cni.AddPod(list, "tcx-missing", nil)
	require.Equal(t, errcode.KernelFeature, cniCode(t, err))
	require.ErrorContains(t, err, "attachMode tcx: this kernel has no tcx links")
	e.requireClean()
	// STATUS says the same, as "plugin not available".
	err = e.cni.Status(list)
	require.Equal(t, uint(types.ErrPluginNotAvailable), cniCode(t, err))
	require.ErrorContains(t, err, "attachMode tcx")
}
