package datapath_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/attach"
	"github.com/ebpf-cni/ebpf-cni/pkg/bandwidth"
	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
	"github.com/ebpf-cni/ebpf-cni/pkg/counters"
	"github.com/ebpf-cni/ebpf-cni/pkg/feature"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// killPods destroys the pods' network namespaces without a DEL and waits
// for the kernel to remove their veths (the kernel's own deferred work:
// slow in an emulated guest, hence the long wait).
func (e *env) killPods(pods ...*nettest.Pod) {
	e.t.Helper()
	for _, p := range pods {
		nettest.CloseNetNS(p.NS)
	}
	require.Eventually(e.t, func() bool {
		for _, l := range e.hostLinks() {
			for _, p := range pods {
				if l.Attrs().Name == veth.HostName(p.RT.ContainerID, p.RT.IfName) {
					return false
				}
			}
		}
		return true
	}, time.Minute, 20*time.Millisecond, "the kernel removed the dead pods' veths")
}

// talkToWorld opens (and closes) a TCP connection from the pod to the
// world: a masqueraded flow in the NAT table.
func talkToWorld(t *testing.T, p *nettest.Pod, srv *worldServer) {
	t.Helper()
	for _, dst := range []net.IP{nettest.WorldIP4, nettest.WorldIP6} {
		c, err := dialFrom(p.NS, 0, dst, srv.port)
		require.NoError(t, err, "TCP from %s to %s", p.RT.ContainerID, dst)
		c.Close()
	}
}

// TestLossNoPodLeft: pods of the node go without a DEL and the stateDir
// is lost with them, so no record and no veth is left to tell their map
// entries and addresses from live ones: with no pod left, or with one (its
// record lost too). The next CNI STATUS, or the operator's repair or gc,
// in the node's network namespace, reclaims every entry and address of the
// dead pods and keeps the live pod's, and status is clean afterwards.
func TestLossNoPodLeft(t *testing.T) {
	cg := testutil.Cgroup(t)
	for _, mode := range testutil.AttachModes {
		for _, left := range []int{0, 1} {
			for _, by := range []string{"STATUS", "repair", "gc"} {
				t.Run(fmt.Sprintf("%s/%d-left/%s", mode, left, by), func(t *testing.T) {
					testutil.RequireMode(t, mode)
					lossNoPodLeft(t, cg, mode, by, left == 1)
				})
			}
		}
	}
}

func lossNoPodLeft(t *testing.T, cg, mode, by string, keep bool) {
	e := newEnv(t)
	list := e.hostPortList("", mode, cg, map[string]any{"ipMasq": true})
	srv := newWorldServer(t, e.node.World)
	var live *nettest.Pod
	if keep {
		live = e.addPodWith(list, "live")
	}
	a, err := e.cni.AddPod(list, "gone-a", portMappingsCaps([]map[string]any{mapping(8080, 80, "tcp")}))
	require.NoError(t, err)
	b, err := e.cni.AddPod(list, "gone-b", nil)
	require.NoError(t, err)
	talkToWorld(t, b, srv)
	e.wipeState()
	e.killPods(a, b)
	out, code := e.cliRun("status")
	require.Equal(t, cli.ExitProblems, code, "status sees the dead pods' entries: %s", out)

	switch by {
	case "STATUS":
		require.NoError(t, e.cni.Status(list))
	case "repair":
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, "10-test.conflist"), list.Bytes, 0o600))
		out, code := e.cliRun("repair", "--cni-conf-dir", dir)
		require.Equal(t, 0, code, out)
	case "gc":
		out, code := e.cliRun("gc")
		require.Equal(t, 0, code, out)
	}
	wantAddrs, wantDevs := 0, 0
	if keep {
		wantAddrs, wantDevs = 2, 1
	}
	a4, d4 := e.endpointEntries()
	require.Equal(t, wantAddrs, a4, "%s: endpoint address entries: the live pod's only", by)
	require.Equal(t, wantDevs, d4, "%s: endpoint device entries: the live pod's only", by)
	held := e.ipamHeld()
	for ip, cid := range held {
		require.Equal(t, "live", cid, "%s: %s of a dead pod left in ebpf-ipam", by, ip)
	}
	require.Len(t, held, wantAddrs, "%s: the live pod's addresses stay held", by)
	require.Empty(t, e.published(), "%s: published ports left", by)
	for _, f := range e.flows() {
		require.True(t, keep && (f.Pod.Equal(live.IP(4)) || f.Pod.Equal(live.IP(6))), "%s: NAT flow of a dead pod left: %+v", by, f)
	}
	if keep {
		talkToWorld(t, live, srv)
		require.NoError(t, e.cni.Status(list), "STATUS mends the live pod's lost record")
	} else {
		require.Zero(t, e.uplinkProgramIDs(), "%s: programs left on the uplink", by)
	}
	out, code = e.cliRun("status")
	require.Equal(t, cli.ExitOK, code, "%s: status after: %s", by, out)
	if !keep {
		e.requireClean()
	}

	// The node takes new pods.
	c := e.addPodWith(list, "after")
	pods := []*nettest.Pod{c, e.addPod(list, "after-2")}
	if keep {
		pods = append(pods, live)
	}
	mustConnect(t, pods)
}

// TestLossRebootKeepsUplink: every pod is gone without a DEL, then the
// stateDir and the bpffs are lost while the node's uplink stays (what a
// node whose uplink outlives a runtime crash and a bpffs remount sees).
// The uplink's old filters keep the old maps alive; the first ADD after
// the loss succeeds, no flow, endpoint entry or device counter of the
// dead pods comes back, and the new pod masquerades and publishes.
func TestLossRebootKeepsUplink(t *testing.T) {
	cg := testutil.Cgroup(t)
	for _, mode := range testutil.AttachModes {
		t.Run(mode, func(t *testing.T) {
			testutil.RequireMode(t, mode)
			e := newEnv(t)
			list := e.hostPortList("", mode, cg, map[string]any{"ipMasq": true})
			srv := newWorldServer(t, e.node.World)
			var old []*nettest.Pod
			for i := range 2 {
				p, err := e.cni.AddPod(list, fmt.Sprintf("before-%d", i), portMappingsCaps([]map[string]any{mapping(8080+i, 80, "tcp")}))
				require.NoError(t, err)
				talkToWorld(t, p, srv)
				old = append(old, p)
			}
			require.NotZero(t, e.uplinkProgramIDs())
			e.killPods(old...)
			e.wipeState()
			e.remountBPFFS()

			p, err := e.cni.AddPod(list, "after", portMappingsCaps([]map[string]any{mapping(9090, 80, "tcp")}))
			require.NoError(t, err, "the first ADD after the loss")
			t.Cleanup(func() { _ = e.cni.DelPod(list, p) })
			require.NotZero(t, e.uplinkProgramIDs(), "the uplink's programs")
			require.Zero(t, e.natEntries(), "NAT flows of the pods gone before the loss came back")
			a4, d4 := e.endpointEntries()
			require.Equal(t, 2, a4, "endpoint entries: only the new pod's two addresses")
			require.Equal(t, 1, d4, "endpoint_devs: only the new pod's")
			require.Len(t, e.podEntries(), 0)
			keys, err := counters.DeviceCounterKeys(e.bpfRoot)
			require.NoError(t, err)
			live := map[int]bool{e.hostIndex(p): true, e.uplinkIndex(): true}
			for _, k := range keys {
				require.True(t, live[k], "device counters of ifindex %d, no live device", k)
			}
			require.Len(t, e.published(), 2, "published ports: only the new pod's, both families")
			require.Empty(t, e.statusProblems())

			app := newServer(t, p.NS, 80)
			_ = app
			talkToWorld(t, p, srv)
			c, err := dialFrom(e.node.World, 0, nettest.NodeIP4, 9090)
			require.NoError(t, err, "hostPort of the new pod")
			c.Close()
			require.NoError(t, e.cni.DelPod(list, p))
			e.requireClean()
			require.Zero(t, e.uplinkProgramIDs(), "programs left on the uplink")
		})
	}
}

// TestLossPacing: a pod with an egress limit keeps being paced at its
// source after a bpffs loss (with or without the stateDir): status calls
// an unpaced limited pod a problem (repair mends it), and after a bpffs
// loss and one STATUS its CHECK passes and a new TCP socket of the pod
// gets the pacing rate again.
func TestLossPacing(t *testing.T) {
	for _, dname := range []string{"bpffs", "both"} {
		t.Run(dname, func(t *testing.T) {
			e := newEnv(t)
			e.routeWorldToPods()
			list := e.bwList("", nil)
			const eg = 20_000_000
			caps := map[string]any{"bandwidth": map[string]any{"egressRate": eg, "egressBurst": 1_000_000}}
			p := e.addPodCaps(list, "pace-loss", caps)
			ci, _ := connInfo(t, p.NS, e.node.World, nettest.WorldIP4, 16100, false)
			require.InEpsilon(t, paced(eg, uint64(ci.Snd_mss), true), ci.Max_pacing_rate, 0.01, "paced before")

			// What a bpffs loss takes from it, taken by hand: status says
			// the pod is not paced, and repair restores it.
			idx := e.hostIndex(p)
			nsm := e.netnsMap()
			for cookie, i := range e.netnsEntries() {
				if i == idx {
					require.NoError(t, nsm.Delete(cookie))
				}
			}
			nsm.Close()
			require.NoError(t, attach.DetachPinned(filepath.Join(e.bpfRoot, feature.CgroupPins), bandwidth.PacingHooks))
			probs := strings.Join(e.statusProblems(), "\n")
			require.Contains(t, probs, "its netns is not in local_netns: its TCP is not paced", "status sees the unpaced pod")
			require.Contains(t, probs, "the pacing hook is not attached", "status sees the hook gone")
			out, code := e.cliRun("repair")
			require.Equal(t, 0, code, out)
			require.Contains(t, out, "restored")
			require.True(t, e.pacing(), "pacing hook attached by repair")
			require.Empty(t, e.statusProblems())

			if dname == "both" {
				e.wipeState()
			}
			e.remountBPFFS()
			require.NoError(t, e.cni.Status(list), "STATUS")
			require.True(t, e.pacing(), "pacing hook attached again")
			require.NoError(t, e.cni.Check(list, p.RT), "CHECK after STATUS")
			ci, _ = connInfo(t, p.NS, e.node.World, nettest.WorldIP4, 16101, false)
			require.InEpsilon(t, paced(eg, uint64(ci.Snd_mss), true), ci.Max_pacing_rate, 0.01, "paced after STATUS")
			require.Empty(t, e.statusProblems())
			require.NoError(t, e.cni.DelPod(list, p))
			e.requireClean()
			require.False(t, e.pacing(), "pacing hook left")
		})
	}
}

// uplinkIndex is the node's uplink's ifindex.
func (e *env) uplinkIndex() int {
	e.t.Helper()
	idx := 0
	require.NoError(e.t, e.node.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("uplink")
		if err == nil {
			idx = l.Attrs().Index
		}
		return err
	}))
	return idx
}
