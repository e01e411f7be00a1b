package datapath_test

import (
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

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
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
			oldTags, err := datapath.InstalledTags(e.bpfRoot)
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

			newTags, err := datapath.InstalledTags(e.bpfRoot)
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
				p, err := ebpf.LoadPinnedProgram(filepath.Join(datapath.ProgramsDir(e.bpfRoot), newTags[0], "from_container"), nil)
				require.NoError(t, err)
				info, err := p.Info()
				require.NoError(t, err)
				pid, _ := info.ID()
				require.Equal(t, pid, id)
				p.Close()
			}
			_, err = os.Stat(filepath.Join(datapath.ProgramsDir(e.bpfRoot), oldTags[0]))
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
