package datapath_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/bandwidth"
	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/portmap"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
	"github.com/ebpf-cni/ebpf-cni/pkg/uplink"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// previousRelease is the commit of the release before this tree
// (CHANGELOG.md: v0.1.0), named by commit: a clone without tags has it.
const previousRelease = "edc7ee1"

// TestRollbackToPreviousRelease: a node this build set up (pods with a
// hostPort, masquerade and a bandwidth limit: records with feature state,
// cgroup hooks, uplink programs) is rolled back in place by the first call
// of the previous release's binaries, as a DaemonSet rollback would: its
// programs are swapped into every running pod and hook, this build's
// unpinned, an open connection survives; the map only this build has
// (node_info) stays pinned, untouched; the previous release reads this
// build's records (CHECK, the published ports) and DELs a pod this build
// added. The next call of this build upgrades the node again, and this
// build DELs the pod the previous release added: the node ends clean.
func TestRollbackToPreviousRelease(t *testing.T) {
	cg := testutil.Cgroup(t)
	e := newEnv(t)
	list := e.hostPortList("1.1.0", "", cg, map[string]any{"ipMasq": true, "egressRate": 50_000_000, "egressBurst": 5_000_000})
	a := e.addPodWith(list, "new-a", mapping(8080, 80, "tcp"))
	b := e.addPod(list, "new-b")
	x := e.addPod(list, "new-x")
	tags, err := programs.Installed(e.bpfRoot)
	require.NoError(t, err)
	require.Len(t, tags, 1)
	thisTag := tags[0]
	nodeInfo := filepath.Join(maps.Dir(e.bpfRoot), maps.CniMapNodeInfo)
	infoBefore := pinnedMapInfo(t, nodeInfo)

	l, err := nettest.Listen(b.NS, b.IP(4))
	require.NoError(t, err)
	defer l.Close()
	conn, err := nettest.Dial(a.NS, l.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(time.Minute)))
	require.NoError(t, nettest.Echo(conn, "before\n"))

	older := nettest.NewCNI(e.node, []string{testutil.CommitDir(t, previousRelease), testutil.RefPluginDir(t)}, e.cacheDir)
	c, err := older.AddPod(list, "old-c", nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.cni.DelPod(list, c) })
	e.requireRunning("commit-" + previousRelease + "-")
	require.NoError(t, nettest.Echo(conn, "after the rollback\n"), "the open connection broke")
	require.Equal(t, infoBefore, pinnedMapInfo(t, nodeInfo), "node_info, which the previous release does not know, stays as it was")
	mustConnect(t, []*nettest.Pod{a, b, c, x})
	if testutil.PodDevice() == "netkit" {
		// The previous release knows no netkit pods: its CHECK says so
		// (docs/datapath.md, "netkit pods"); the pod works on.
		err := older.Check(list, a.RT)
		require.ErrorContains(t, err, "is a netkit, not a veth")
	} else {
		require.NoError(t, older.Check(list, a.RT), "the previous release reads this build's record")
	}
	require.Len(t, e.published(), 2, "8080 for both families")
	require.NoError(t, older.DelPod(list, x), "the previous release DELs a pod this build added")

	d := e.addPod(list, "new-d")
	e.requireRunning(thisTag)
	require.NoError(t, nettest.Echo(conn, "after the upgrade\n"), "the open connection broke")
	mustConnect(t, []*nettest.Pod{a, b, c, d})
	require.NoError(t, e.cni.Check(list, c.RT), "this build reads the previous release's record")
	require.NoError(t, e.cni.DelPod(list, c))
	require.NoError(t, e.cni.DelPod(list, a))
	require.NoError(t, e.cni.DelPod(list, b))
	require.Empty(t, e.published())
	require.NoError(t, e.cni.DelPod(list, d))
	e.requireClean()
}

// requireRunning asserts that one program set is pinned, its tag starting
// with tag, and that every host veth, the uplink and the cgroup hooks run
// its programs.
func (e *env) requireRunning(tag string) {
	e.t.Helper()
	tags, err := programs.Installed(e.bpfRoot)
	require.NoError(e.t, err)
	require.Len(e.t, tags, 1, "one program set pinned")
	require.True(e.t, strings.HasPrefix(tags[0], tag), "%s is not of %s", tags[0], tag)
	want := func(hook string) ebpf.ProgramID {
		p, err := ebpf.LoadPinnedProgram(filepath.Join(programs.Dir(e.bpfRoot), tags[0], hook), nil)
		require.NoError(e.t, err, hook)
		defer p.Close()
		info, err := p.Info()
		require.NoError(e.t, err)
		id, _ := info.ID()
		return id
	}
	require.NoError(e.t, e.node.NS.Do(func(ns.NetNS) error {
		links, err := veth.HostLinks()
		require.NoError(e.t, err)
		for _, l := range links {
			h := endpoint.HooksOf(l)[0]
			got, err := attach.AttachedIDs(l, h)
			require.NoError(e.t, err)
			if _, err := os.Stat(filepath.Join(programs.Dir(e.bpfRoot), tags[0], h.Name)); err != nil {
				// A build without netkit pods (a downgrade): a netkit pod
				// keeps the programs its links run until it is deleted
				// (docs/kernels.md, "netkit pods").
				require.Len(e.t, got, 1, "%s runs its program still", l.Attrs().Name)
				continue
			}
			require.Equal(e.t, []ebpf.ProgramID{want(h.Name)}, got, "%s runs %s", l.Attrs().Name, h.Name)
		}
		return nil
	}))
	require.NoError(e.t, e.node.NS.Do(func(ns.NetNS) error {
		up, err := netlink.LinkByName("uplink")
		require.NoError(e.t, err)
		for _, h := range uplink.Hooks {
			ids, err := attach.AttachedIDs(up, h)
			require.NoError(e.t, err)
			require.Equal(e.t, []ebpf.ProgramID{want(h.Name)}, ids, "uplink %s", h.Name)
		}
		return nil
	}))
	for _, h := range append(append([]attach.Hook{}, portmap.SockHooks...), bandwidth.PacingHooks...) {
		id, err := attach.PinnedProgram(filepath.Join(e.bpfRoot, feature.CgroupPins, h.Name))
		require.NoError(e.t, err, h.Name)
		require.Equal(e.t, want(h.Name), id, "cgroup hook %s", h.Name)
	}
}

// pinnedMapInfo is the pinned map at path: its kernel ID and contents
// (an array).
func pinnedMapInfo(t *testing.T, path string) string {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(path, nil)
	require.NoError(t, err, "%s pinned", path)
	defer m.Close()
	info, err := m.Info()
	require.NoError(t, err)
	id, _ := info.ID()
	out := fmt.Sprintf("map %d:", id)
	var k uint32
	var v []byte
	it := m.Iterate()
	for it.Next(&k, &v) {
		out += fmt.Sprintf(" %d=%x", k, v)
	}
	require.NoError(t, it.Err())
	return out
}
