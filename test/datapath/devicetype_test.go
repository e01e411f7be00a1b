package datapath_test

import (
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/kernel"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// TestDeviceTypeAuto: deviceType auto gives this kernel's pods their
// device type, netkit where it has netkit, veth elsewhere, and the node
// keeps its decision; the host end runs the programs of its kind.
func TestDeviceTypeAuto(t *testing.T) {
	for _, v := range testutil.SpecVersions {
		t.Run(v, func(t *testing.T) {
			e := newEnv(t)
			list := e.confList(netOpts{version: v, extra: map[string]any{"deviceType": "auto"}})
			p := e.addPod(list, "auto")
			want := veth.KindVeth
			if kernel.HaveNetkit().Available {
				want = veth.KindNetkit
			}
			k, ok := veth.RecordedAutoKind(e.stateDir)
			require.True(t, ok, "the first ADD records the node's decision")
			require.Equal(t, want, k)
			requireDevice(t, e, p, want)
			if testutil.AtLeast(v, "0.4.0") {
				require.NoError(t, e.cni.Check(list, p.RT))
			}
			require.NoError(t, e.cni.DelPod(list, p))
			e.requireClean()
		})
	}
}

// TestDeviceTypeMixed: a node with veth pods (made before an upgrade, or
// asked for) and netkit pods: pod to pod both ways, both families, TCP;
// the world through the node; CHECK of each; DEL leaves nothing.
func TestDeviceTypeMixed(t *testing.T) {
	testutil.RequireNetkit(t)
	for _, v := range testutil.SpecVersions {
		t.Run(v, func(t *testing.T) {
			e := newEnv(t)
			vethList := e.confList(netOpts{version: v, extra: map[string]any{"deviceType": "veth"}})
			nkList := e.confList(netOpts{version: v, extra: map[string]any{"deviceType": "netkit"}})
			v1, v2 := e.addPod(vethList, "veth-1"), e.addPod(vethList, "veth-2")
			n1, n2 := e.addPod(nkList, "netkit-1"), e.addPod(nkList, "netkit-2")
			requireDevice(t, e, v1, veth.KindVeth)
			requireDevice(t, e, n1, veth.KindNetkit)
			for _, i := range n1.Result.Interfaces {
				require.Empty(t, i.Mac, "a netkit pod (L3 mode) has no MAC in its result")
			}
			mustConnect(t, []*nettest.Pod{v1, n1, v2, n2})

			_, err := nettest.Run(e.node.World, "ip", "route", "add", "10.244.1.0/24", "via", nettest.NodeIP4.String())
			require.NoError(t, err)
			_, err = nettest.Run(e.node.World, "ip", "-6", "route", "add", "fd00:244:1::/64", "via", nettest.NodeIP6.String())
			require.NoError(t, err)
			for _, p := range []*nettest.Pod{n1, v1} {
				for _, ip := range []string{nettest.WorldIP4.String(), nettest.WorldIP6.String()} {
					o, err := nettest.Run(p.NS, "ping", "-n", "-c", "2", "-i", "0.01", "-W", "2", ip)
					require.NoError(t, err, o)
				}
				require.NoError(t, nettest.TCP(p.NS, e.node.World, nettest.WorldIP4))
				require.NoError(t, nettest.TCP(p.NS, e.node.World, nettest.WorldIP6))
			}
			for _, c := range []struct {
				list *libcni.NetworkConfigList
				p    *nettest.Pod
			}{{vethList, v1}, {vethList, v2}, {nkList, n1}, {nkList, n2}} {
				if testutil.AtLeast(v, "0.4.0") {
					require.NoError(t, e.cni.Check(c.list, c.p.RT), c.p.RT.ContainerID)
				}
			}
			require.NoError(t, e.cni.DelPod(vethList, v1))
			require.NoError(t, e.cni.DelPod(nkList, n1))
			mustConnect(t, []*nettest.Pod{v2, n2})
			require.NoError(t, e.cni.DelPod(vethList, v2))
			require.NoError(t, e.cni.DelPod(nkList, n2))
			e.requireClean()
		})
	}
}

// requireDevice asserts the pod's host end is of kind k and runs the
// programs of its kind, attached as that kind attaches them.
func requireDevice(t *testing.T, e *env, p *nettest.Pod, k veth.Kind) {
	t.Helper()
	require.NoError(t, e.node.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(veth.HostName(p.RT.ContainerID, p.RT.IfName))
		require.NoError(t, err)
		require.Equal(t, k, veth.KindOf(l))
		hooks := endpoint.HooksOf(l)
		if k == veth.KindNetkit {
			require.Equal(t, endpoint.NetkitHooks, hooks)
		} else {
			require.Equal(t, endpoint.Hooks, hooks)
		}
		for _, h := range hooks {
			ids, err := attach.AttachedIDs(l, h)
			require.NoError(t, err)
			require.Len(t, ids, 1, "%s runs one program at %s", l.Attrs().Name, h.Name)
		}
		return nil
	}))
	require.NoError(t, p.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(p.RT.IfName)
		require.NoError(t, err)
		require.Equal(t, string(k), l.Type(), "the pod's end")
		return nil
	}))
}
