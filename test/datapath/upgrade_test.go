package datapath_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
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
	"github.com/ebpf-cni/ebpf-cni/pkg/portmap"
	"github.com/ebpf-cni/ebpf-cni/pkg/programs"
	"github.com/ebpf-cni/ebpf-cni/pkg/uplink"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

var lossRE = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)

// TestUpgrade: the first ADD of a newer binary loads its programs once,
// swaps them into the existing endpoints atomically and unpins the old ones;
// a ping stream and an open TCP connection between old pods go on across
// the swap without loss.
func TestUpgrade(t *testing.T) {
	for _, mode := range testutil.AttachModes {
		t.Run(mode, func(t *testing.T) {
			testutil.RequireMode(t, mode)
			e := newEnv(t)
			list := e.confList(netOpts{attachMode: mode})
			a := e.addPod(list, "old-a")
			b := e.addPod(list, "old-b")
			oldTags, err := programs.Installed(e.bpfRoot)
			require.NoError(t, err)
			require.Len(t, oldTags, 1)
			oldIDs := e.attachedProgramIDs()
			require.Len(t, oldIDs, 1)

			// Traffic across the swap: a ping stream and a live connection.
			l, err := nettest.Listen(b.NS, b.IP(4))
			require.NoError(t, err)
			defer l.Close()
			conn, err := nettest.Dial(a.NS, l.Addr().String())
			require.NoError(t, err)
			defer conn.Close()
			require.NoError(t, nettest.Echo(conn, "before\n"))
			newer := nettest.NewCNI(e.node, []string{testutil.VersionDir(t, "upgrade-test"), testutil.RefPluginDir(t)}, e.cacheDir)

			// A ping stream that runs until interrupted, so the swap surely
			// happens inside it.
			var ping *exec.Cmd
			var out strings.Builder
			require.NoError(t, a.NS.Do(func(ns.NetNS) error {
				ping = exec.Command("ping", "-n", "-q", "-i", "0.01", b.IP(4).String())
				ping.Stdout = &out
				return ping.Start()
			}))
			t.Cleanup(func() { _ = ping.Process.Kill(); _ = ping.Wait() }) // a failure before the Wait below leaves no process
			time.Sleep(300 * time.Millisecond)

			c, err := newer.AddPod(list, "new-c", nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = newer.DelPod(list, c) })

			time.Sleep(300 * time.Millisecond)
			require.NoError(t, ping.Process.Signal(os.Interrupt))
			_ = ping.Wait()
			m := lossRE.FindStringSubmatch(out.String())
			require.NotNil(t, m, out.String())
			sent, got := atoi(t, m[1]), atoi(t, m[2])
			require.Greater(t, sent, 20, out.String())
			// The interrupt may catch one request in flight.
			require.LessOrEqual(t, sent-got, 1, "packets lost across the upgrade: %s", out.String())
			require.NoError(t, nettest.Echo(conn, "after\n"), "the open connection broke")

			newTags, err := programs.Installed(e.bpfRoot)
			require.NoError(t, err)
			require.Len(t, newTags, 1)
			require.NotEqual(t, oldTags[0], newTags[0])
			require.True(t, strings.HasPrefix(newTags[0], "upgrade-test-"))
			newIDs := e.attachedProgramIDs()
			require.Len(t, newIDs, 1, "every endpoint runs the new program")
			for id, n := range newIDs {
				require.Equal(t, 3, n)
				_, old := oldIDs[id]
				require.False(t, old, "old program %d still attached", id)
				p, err := ebpf.LoadPinnedProgram(filepath.Join(programs.Dir(e.bpfRoot), newTags[0], endpoint.HooksFor(testutil.PodDevice())[0].Name), nil)
				require.NoError(t, err)
				info, err := p.Info()
				require.NoError(t, err)
				pid, _ := info.ID()
				require.Equal(t, pid, id)
				p.Close()
			}
			_, err = os.Stat(filepath.Join(programs.Dir(e.bpfRoot), oldTags[0]))
			require.ErrorIs(t, err, os.ErrNotExist, "old programs still pinned")

			mustConnect(t, []*nettest.Pod{a, b, c})
			// The newer binary checks the old pods fine.
			require.NoError(t, newer.Check(list, a.RT))
		})
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}

// TestUpgradeFromOlderLayout: a node whose state an older build kept in
// its own layout (the published ports at the top of the endpoint record,
// the uplinks' records under stateDir/uplinks, the cgroup links pinned
// without a record) is upgraded by the first ADD of a newer build like any
// other: every attachment runs the new programs (host veths, uplinks, the
// cgroup hooks), the old ones are unpinned, and CHECK and DEL still find
// the old pod's published ports; the last DEL takes everything off.
func TestUpgradeFromOlderLayout(t *testing.T) {
	cg := testutil.Cgroup(t)
	for _, mode := range []string{"tcx", "tc"} {
		t.Run(mode, func(t *testing.T) {
			testutil.RequireMode(t, mode)
			e := newEnv(t)
			list := e.hostPortList("1.1.0", mode, cg, map[string]any{"ipMasq": true, "egressRate": 50_000_000, "egressBurst": 5_000_000})
			a := e.addPodWith(list, "old-a", mapping(8080, 80, "tcp"))
			oldTags, err := programs.Installed(e.bpfRoot)
			require.NoError(t, err)
			require.Len(t, oldTags, 1)
			e.olderLayout(a)

			newer := nettest.NewCNI(e.node, []string{testutil.VersionDir(t, "layout-test"), testutil.RefPluginDir(t)}, e.cacheDir)
			c, err := newer.AddPod(list, "new-c", nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = newer.DelPod(list, c) })

			tags, err := programs.Installed(e.bpfRoot)
			require.NoError(t, err)
			require.Len(t, tags, 1)
			require.True(t, strings.HasPrefix(tags[0], "layout-test-"))
			want := func(hook string) ebpf.ProgramID {
				p, err := ebpf.LoadPinnedProgram(filepath.Join(programs.Dir(e.bpfRoot), tags[0], hook), nil)
				require.NoError(t, err, hook)
				defer p.Close()
				info, err := p.Info()
				require.NoError(t, err)
				id, _ := info.ID()
				return id
			}
			require.NoError(t, e.node.NS.Do(func(ns.NetNS) error {
				up, err := netlink.LinkByName("uplink")
				require.NoError(t, err)
				for _, h := range uplink.Hooks {
					ids, err := attach.AttachedIDs(up, h)
					require.NoError(t, err)
					require.Equal(t, []ebpf.ProgramID{want(h.Name)}, ids, "uplink %s runs the new program", h.Name)
				}
				host, err := netlink.LinkByName(veth.HostName(a.RT.ContainerID, a.RT.IfName))
				require.NoError(t, err)
				for _, h := range endpoint.HooksFor(testutil.PodDevice()) {
					ids, err := attach.AttachedIDs(host, h)
					require.NoError(t, err)
					require.Equal(t, []ebpf.ProgramID{want(h.Name)}, ids, "the old pod's %s runs the new program", h.Name)
				}
				return nil
			}))
			for _, h := range append(append([]attach.Hook{}, portmap.SockHooks...), bandwidth.PacingHooks...) {
				id, err := attach.PinnedProgram(filepath.Join(filepath.Join(e.bpfRoot, feature.CgroupPins), h.Name))
				require.NoError(t, err, h.Name)
				require.Equal(t, want(h.Name), id, "cgroup hook %s runs the new program", h.Name)
			}

			require.NoError(t, newer.Check(list, a.RT), "the old pod's record is read")
			require.Len(t, e.published(), 2, "8080 for both families")
			require.NoError(t, newer.DelPod(list, a))
			require.Empty(t, e.published(), "DEL found the ports in the old record")
			require.NoError(t, newer.DelPod(list, c))
			require.Zero(t, e.uplinkProgramIDs(), "the last DEL takes the programs off the uplink")
			_, err = os.Stat(filepath.Join(e.bpfRoot, feature.CgroupPins))
			require.ErrorIs(t, err, os.ErrNotExist, "and the cgroup hooks")
			e.requireClean()
		})
	}
}

// olderLayout rewrites the node's state as builds before the node package
// kept it: the endpoint record of p with its ports at the top level and no
// feature state, the uplinks' records in stateDir/uplinks, no record of the
// cgroup links.
func (e *env) olderLayout(p *nettest.Pod) {
	e.t.Helper()
	path := filepath.Join(e.stateDir, "endpoints", veth.HostName(p.RT.ContainerID, p.RT.IfName)+".json")
	b, err := os.ReadFile(path)
	require.NoError(e.t, err)
	var rec map[string]json.RawMessage
	require.NoError(e.t, json.Unmarshal(b, &rec))
	var fs map[string]json.RawMessage
	require.NoError(e.t, json.Unmarshal(rec["features"], &fs))
	require.Contains(e.t, fs, "hostPort")
	rec["hostPorts"] = fs["hostPort"]
	delete(rec, "features")
	b, err = json.Marshal(rec)
	require.NoError(e.t, err)
	require.NoError(e.t, os.WriteFile(path, b, 0o600))

	sets := filepath.Join(e.stateDir, "attachments")
	require.NoError(e.t, os.Rename(filepath.Join(sets, "uplinks"), filepath.Join(e.stateDir, "uplinks")))
	require.NoError(e.t, os.RemoveAll(sets))
}
