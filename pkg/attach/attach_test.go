package attach_test

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
)

// TestMain fails the run when its tests left a namespace, mount, cgroup or
// process behind.
func TestMain(m *testing.M) { testutil.Main(m) }

// passProgram is a tc program that lets every packet pass.
func passProgram(t *testing.T) *ebpf.Program {
	t.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

func programID(t *testing.T, p *ebpf.Program) ebpf.ProgramID {
	t.Helper()
	info, err := p.Info()
	require.NoError(t, err)
	id, ok := info.ID()
	require.True(t, ok)
	return id
}

// TestAttachTCOverOwnFilter: a device that outlived the records of its
// tc attachment (a wiped stateDir, a remounted bpffs) still carries our
// filter at our priority and handle: attaching again replaces it in place
// instead of failing with EEXIST. A filter another tool put there is never
// replaced: the attach fails and the filter stays.
func TestAttachTCOverOwnFilter(t *testing.T) {
	testutil.RequireRoot(t)
	pod := testutil.NetNS(t)
	hook := attach.Ingress("from_netdev", attach.Device)
	old, cur := passProgram(t), passProgram(t)
	require.NoError(t, pod.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		require.NoError(t, err)
		_, err = attach.Attach(attach.ModeTC, lo, hook, old, t.TempDir())
		require.NoError(t, err)
		// The records are lost; the next attach meets the old filter.
		a, err := attach.Attach(attach.ModeTC, lo, hook, cur, t.TempDir())
		require.NoError(t, err, "attaching over our own filter")
		ids, err := attach.AttachedIDs(lo, hook)
		require.NoError(t, err)
		require.Equal(t, []ebpf.ProgramID{programID(t, cur)}, ids, "the new program replaced the old one in place")

		// Another tool's filter at the same priority and handle.
		require.NoError(t, attach.Detach(a, lo.Attrs().Index, hook))
		foreign := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: lo.Attrs().Index, Parent: hook.TCParent, Handle: 1, Priority: 1, Protocol: unix.ETH_P_ALL},
			Fd: old.FD(), Name: "someone_else", DirectAction: true}
		require.NoError(t, netlink.FilterAdd(foreign))
		_, err = attach.Attach(attach.ModeTC, lo, hook, cur, t.TempDir())
		require.ErrorIs(t, err, unix.EEXIST, "another tool's filter is not replaced")
		ids, err = attach.AttachedIDs(lo, hook)
		require.NoError(t, err)
		require.Equal(t, []ebpf.ProgramID{programID(t, old)}, ids, "the other tool's filter stays")
		return nil
	}))
}

// TestEndpointHooksOf: a veth's hooks are the Endpoint hooks; on a netkit
// device a NetkitEndpoint hook replaces the one it runs instead of, in its
// place; other targets are never an endpoint's.
func TestEndpointHooksOf(t *testing.T) {
	from := attach.Ingress("from_container", attach.Endpoint)
	to := attach.Egress("to_container", attach.Endpoint)
	nk := attach.NetkitHook("from_netkit", ebpf.AttachNetkitPeer, "from_container")
	up := attach.Ingress("from_netdev", attach.Device)
	hooks := []attach.Hook{from, up, to, nk}
	require.Equal(t, []attach.Hook{from, to}, attach.EndpointHooksOf(hooks, &netlink.Veth{}))
	require.Equal(t, []attach.Hook{nk, to}, attach.EndpointHooksOf(hooks, &netlink.Netkit{}))
	require.True(t, attach.IsNetkit(&netlink.Netkit{}))
	require.False(t, attach.IsNetkit(&netlink.Veth{}))
	require.False(t, attach.IsNetkit(nil))
}
