package datapath_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/errcode"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
)

// runtimeWithoutCgroupMount puts a wrapper named ebpf-cni first in the
// CNI path: it runs the real plugin the way a runtime in a mount namespace
// without a cgroup2 mount does (a containerized runtime; `ip netns exec`
// remounts /sys the same way): new mount and cgroup namespaces, every
// cgroup2 mount gone. The cgroup namespace's root is the test's cgroup,
// where the test process (and so the wrapper) is: the hooks of a plugin
// that takes the hierarchy's root land there, never on the machine's.
func (e *env) runtimeWithoutCgroupMount() {
	e.t.Helper()
	dir := e.t.TempDir()
	script := fmt.Sprintf(`#!/bin/sh
exec unshare --mount --cgroup --propagation private -- sh -c '
umount -a -t cgroup2 2>/dev/null
if grep -q " - cgroup2 " /proc/self/mountinfo; then echo "a cgroup2 mount is left" >&2; exit 99; fi
exec %s'
`, filepath.Join(testutil.PluginDir(e.t), "ebpf-cni"))
	require.NoError(e.t, os.WriteFile(filepath.Join(dir, "ebpf-cni"), []byte(script), 0o755))
	e.paths = append([]string{dir}, e.paths...)
	e.cni = nettest.NewCNI(e.node, e.paths, e.cacheDir)
}

// TestHostPortWithoutCgroupMount: an ADD with port mappings and no
// cgroupPath, from a mount namespace with no cgroup2 mount, succeeds (it
// failed with "invalid cgroupPath: no cgroup2 filesystem is mounted",
// although no cgroupPath was set): the plugin mounts a private cgroup2 at
// stateDir/cgroup2, the socket hooks land on the root of its cgroup
// namespace, and the hostPort works from the node. The private mount is in
// the plugin's own mount namespace and goes with it. Every spec version.
func TestHostPortWithoutCgroupMount(t *testing.T) {
	cg := testutil.Cgroup(t)
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(cg, &st))
	for _, v := range testutil.SpecVersions {
		t.Run(v, func(t *testing.T) {
			e := newEnv(t)
			e.runtimeWithoutCgroupMount()
			list := e.confList(netOpts{version: v, extra: map[string]any{"capabilities": map[string]any{"portMappings": true, "bandwidth": true}}})
			a := e.addPodWith(list, "nocg-a", mapping(8080, 80, "tcp"))
			// A limited pod: the pacing hook takes the same way.
			b := e.addPodCaps(list, "nocg-b", map[string]any{"bandwidth": map[string]any{"egressRate": 10_000_000, "egressBurst": 1_000_000}})
			require.True(t, e.pacing(), "pacing hook attached")
			srv, err := nettest.ListenPort(a.NS, a.IP(4), 80)
			require.NoError(t, err)
			defer srv.Close()

			// The hooks are on the test's cgroup: the same hierarchy, seen
			// through the private mount from the plugin's cgroup namespace.
			for _, hook := range []string{"hostport_connect4", "bw_pacing"} {
				l, err := link.LoadPinnedLink(filepath.Join(filepath.Join(e.bpfRoot, feature.CgroupPins), hook), nil)
				require.NoError(t, err)
				info, err := l.Info()
				l.Close()
				require.NoError(t, err)
				require.Equal(t, st.Ino, info.Cgroup().CgroupId, "%s attached to the test's cgroup", hook)
			}

			for _, ip := range []net.IP{nettest.NodeIP4, net.ParseIP("127.0.0.1")} {
				_, err := nodeDial(e.node.NS, hp(ip, 8080))
				require.NoError(t, err, "TCP from the node to %s", hp(ip, 8080))
			}
			c, err := dialFrom(e.node.World, 0, nettest.NodeIP4, 8080)
			require.NoError(t, err, "TCP from outside")
			c.Close()
			if testutil.AtLeast(v, "0.4.0") {
				require.NoError(t, e.cni.Check(list, a.RT))
			}

			// Nothing was mounted in the test's mount namespace.
			var fs unix.Statfs_t
			if err := unix.Statfs(filepath.Join(e.stateDir, "cgroup2"), &fs); err == nil {
				require.NotEqual(t, int64(unix.CGROUP2_SUPER_MAGIC), fs.Type, "the private mount leaked out")
			}
			require.NoError(t, e.cni.DelPod(list, a))
			require.NoError(t, e.cni.DelPod(list, b))
			e.requireClean()
			_, err = os.Stat(filepath.Join(e.bpfRoot, feature.CgroupPins))
			require.True(t, os.IsNotExist(err), "the socket hooks stay attached without pods")
		})
	}
}

// A cgroupPath the plugin cannot use is named; an error without one never
// mentions cgroupPath.
func TestCgroupErrorsNameTheKeySet(t *testing.T) {
	e := newEnv(t)
	e.runtimeWithoutCgroupMount()
	list := e.confList(netOpts{extra: map[string]any{"capabilities": map[string]any{"portMappings": true},
		"cgroupPath": "/sys/fs/cgroup"}})
	_, err := e.cni.AddPod(list, "nocg-bad", map[string]any{"portMappings": []any{mapping(8080, 80, "tcp")}})
	require.Equal(t, uint(types.ErrInvalidNetworkConfig), cniCode(t, err))
	require.Contains(t, err.Error(), "invalid cgroupPath: /sys/fs/cgroup is not a cgroup v2 directory in ebpf-cni's mount namespace (it sees no cgroup2 mount)")
	require.NotContains(t, err.Error(), "mount -t cgroup2")
	e.requireClean()

	// Without cgroupPath, and where the private mount cannot be made (its
	// directory is a file): not a configuration error, and no word of it.
	require.NoError(t, os.WriteFile(filepath.Join(e.stateDir, "cgroup2"), nil, 0o600))
	list = e.confList(netOpts{extra: map[string]any{"capabilities": map[string]any{"portMappings": true}}})
	_, err = e.cni.AddPod(list, "nocg-bad", map[string]any{"portMappings": []any{mapping(8080, 80, "tcp")}})
	require.Equal(t, errcode.HostPort, cniCode(t, err))
	require.NotContains(t, err.Error(), "cgroupPath")
	require.Contains(t, err.Error(), "no cgroup2 filesystem is mounted in this mount namespace")
	require.Contains(t, err.Error(), filepath.Join(e.stateDir, "cgroup2"))
	e.requireClean()
	require.Empty(t, e.ipamOwners())
}
