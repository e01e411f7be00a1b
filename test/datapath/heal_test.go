package datapath_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// healNode is a node with live pods whose state the tests then break: pod
// a publishes hostPort 8080 (TCP), pod b reaches the world masqueraded.
type healNode struct {
	*env
	list *libcni.NetworkConfigList
	a, b *nettest.Pod
	srv  *worldServer // in the world
	app  *worldServer // in pod a, port 80
	lost bool         // the pods' published ports are lost (see TestStateLoss)
}

func newHealNode(t *testing.T, cg, mode string) *healNode {
	e := newEnv(t)
	h := &healNode{env: e, list: e.hostPortList("", mode, cg, map[string]any{"ipMasq": true})}
	h.a = e.addPodWith(h.list, "heal-a", mapping(8080, 80, "tcp"))
	h.b = e.addPodWith(h.list, "heal-b")
	h.srv = newWorldServer(t, e.node.World)
	h.app = newServer(t, h.a.NS, 80)
	return h
}

// works asserts, with packets, that the live pods still have everything
// they had: pod to pod, masquerade, hostPort from the world, and
// anti-spoofing, over IPv4 and IPv6.
func (h *healNode) works(t *testing.T, when string) { h.worksBut(t, when, false) }

// worksBut is works, without the hostPort when lost (a record rebuilt with
// neither its file nor the maps).
func (h *healNode) worksBut(t *testing.T, when string, lost bool) {
	t.Helper()
	mustConnect(t, []*nettest.Pod{h.a, h.b})
	node := map[netip.Addr]bool{addr(nettest.NodeIP4): true, addr(nettest.NodeIP6): true}
	for _, dst := range []net.IP{nettest.WorldIP4, nettest.WorldIP6} {
		c, err := dialFrom(h.b.NS, 0, dst, h.srv.port)
		require.NoError(t, err, "%s: masquerade: TCP from pod b to %s", when, dst)
		c.Close()
		require.True(t, node[h.srv.last("tcp").Addr()], "%s: the world saw %s, not the node", when, h.srv.last("tcp"))
	}
	for _, ip := range []net.IP{nettest.NodeIP4, nettest.NodeIP6} {
		if lost {
			break
		}
		c, err := dialFrom(h.node.World, 0, ip, 8080)
		if err != nil {
			ports, _ := h.cliRun("ports")
			eps, _ := h.cliRun("endpoints")
			t.Logf("ports:\n%s\nendpoints:\n%s", ports, eps)
		}
		require.NoError(t, err, "%s: hostPort: TCP from the world to %s", when, hp(ip, 8080))
		c.Close()
	}
	// A packet from an address that is not the pod's reaches nobody.
	before := h.counters()
	out, err := nettest.Run(h.b.NS, "sh", "-c", "ip addr add 10.244.77.77/32 dev eth0; ping -n -c 2 -i 0.01 -W 1 -I 10.244.77.77 "+h.a.IP(4).String()+"; r=$?; ip addr del 10.244.77.77/32 dev eth0; exit $r")
	require.Error(t, err, "%s: spoofed ping got through: %s", when, out)
	src := int(maps.CniPktReasonREASON_DROP_SPOOF_SRC)
	require.GreaterOrEqual(t, h.counters()[src]-before[src], uint64(2), "%s: spoofed packets not dropped by the datapath", when)
	before = h.counters()
	out, err = nettest.Run(h.b.NS, "sh", "-c", "ip -6 addr add fd00:244:77::77/128 dev eth0 nodad; ping -6 -n -c 2 -i 0.01 -W 1 -I fd00:244:77::77 "+h.a.IP(6).String()+"; r=$?; ip -6 addr del fd00:244:77::77/128 dev eth0; exit $r")
	require.Error(t, err, "%s: spoofed IPv6 ping got through: %s", when, out)
	require.GreaterOrEqual(t, h.counters()[src]-before[src], uint64(2), "%s: spoofed IPv6 packets not dropped by the datapath", when)
}

// cliRun runs the operator CLI in the node: its stdout and exit status.
func (e *env) cliRun(args ...string) (string, int) {
	e.t.Helper()
	var out bytes.Buffer
	code := 0
	require.NoError(e.t, e.node.NS.Do(func(ns.NetNS) error {
		cmd := exec.Command(filepath.Join(e.paths[0], "ebpf-cni"), append(args, "--bpf-root", e.bpfRoot, "--state-dir", e.stateDir)...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code, err = ee.ExitCode(), nil
		}
		return err
	}))
	return out.String(), code
}

// statusProblems is `ebpf-cni status -o json`'s problems.
func (e *env) statusProblems() []string {
	e.t.Helper()
	out, _ := e.cliRun("status", "-o", "json")
	var st struct {
		Problems []string `json:"problems"`
	}
	require.NoError(e.t, json.Unmarshal([]byte(out), &st), out)
	return st.Problems
}

// wipeState empties the stateDir, as a wiped or remounted /run does.
func (e *env) wipeState() {
	e.t.Helper()
	ents, err := os.ReadDir(e.stateDir)
	require.NoError(e.t, err)
	for _, d := range ents {
		require.NoError(e.t, os.RemoveAll(filepath.Join(e.stateDir, d.Name())))
	}
}

// remountBPFFS unmounts the node's bpffs and mounts a new, empty one in
// its place: every pin is lost.
func (e *env) remountBPFFS() {
	e.t.Helper()
	mnt := filepath.Dir(e.bpfRoot)
	require.NoError(e.t, unix.Unmount(mnt, unix.MNT_DETACH))
	require.NoError(e.t, unix.Mount("bpf", mnt, "bpf", 0, ""))
	_, err := os.Stat(e.bpfRoot)
	require.ErrorIs(e.t, err, os.ErrNotExist, "the new bpffs is empty")
}

// TestStateLoss: a node whose state directory is wiped, whose bpffs is
// remounted, or both, under live pods (pod to pod, masquerade, a hostPort,
// anti-spoofing), then meets each of the calls that used to break them or
// that must repair them: a CNI GC listing the live pods, an ADD and DEL of
// another pod, a STATUS, a CHECK, the operator's status and repair. After
// each, the pods work (with packets), and after one STATUS the node is
// mended: status reports no problem, CHECK passes, and DEL of everything
// leaves nothing behind.
func TestStateLoss(t *testing.T) {
	cg := testutil.Cgroup(t)
	damages := map[string]func(*env){
		"stateDir": (*env).wipeState,
		"bpffs":    (*env).remountBPFFS,
		"both":     func(e *env) { e.wipeState(); e.remountBPFFS() },
	}
	calls := map[string]func(t *testing.T, h *healNode){
		"gc": func(t *testing.T, h *healNode) {
			valid := []types.GCAttachment{{ContainerID: h.a.RT.ContainerID, IfName: h.a.RT.IfName}, {ContainerID: h.b.RT.ContainerID, IfName: h.b.RT.IfName}}
			require.NoError(t, h.cni.GC(h.list, valid))
		},
		"add-del": func(t *testing.T, h *healNode) {
			c, err := h.cni.AddPod(h.list, "heal-c", nil)
			require.NoError(t, err, "ADD of another pod")
			require.NoError(t, h.cni.DelPod(h.list, c), "DEL of another pod")
		},
		"status": func(t *testing.T, h *healNode) {
			if err := h.cni.Status(h.list); err != nil && (!h.lost || cniCode(t, err) != 51) {
				require.NoError(t, err)
			}
		},
		"check": func(t *testing.T, h *healNode) {
			_ = h.cni.Check(h.list, h.a.RT) // may fail: the damage is reported, not repaired, by CHECK
		},
		"cli-status": func(t *testing.T, h *healNode) {
			require.NotEmpty(t, h.statusProblems(), "ebpf-cni status sees no damage")
		},
		"repair": func(t *testing.T, h *healNode) {
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, "10-test.conflist"), h.list.Bytes, 0o600))
			out, code := h.cliRun("repair", "--cni-conf-dir", dir)
			require.Contains(t, []int{0, cli.ExitProblems}, code, out)
		},
	}
	for _, mode := range testutil.AttachModes {
		for dname, damage := range damages {
			for cname, call := range calls {
				t.Run(mode+"/"+dname+"/"+cname, func(t *testing.T) {
					testutil.RequireMode(t, mode)
					h := newHealNode(t, cg, mode)
					h.works(t, "before")
					// With tcx every program's link was pinned: a bpffs
					// remount leaves no program to keep the maps alive, and
					// with the stateDir gone too nothing tells a pod's
					// published ports. STATUS says so (51) until the pods
					// are recreated or the operator accepts the loss.
					lost := mode == "tcx" && dname == "both"
					h.lost = lost
					damage(h.env)
					call(t, h)
					if cname != "check" && cname != "cli-status" {
						h.worksBut(t, "after "+cname, lost)
					}
					// The kernel releases the dead links' programs a moment
					// after the unmount: a call quick enough pins their maps
					// again, and then nothing is lost.
					if err := h.cni.Status(h.list); lost && err != nil {
						require.Equal(t, uint(51), cniCode(t, err), "STATUS with pods that lost their ports: %v", err)
						for _, p := range []*nettest.Pod{h.a, h.b} {
							require.Contains(t, err.Error(), p.Result.Interfaces[0].Name, "STATUS names the pods")
						}
						require.NotEmpty(t, h.statusProblems())
						h.worksBut(t, "after STATUS", true)
						// Pod a is recreated by its owner; pod b's loss is accepted.
						require.NoError(t, h.cni.DelPod(h.list, h.a))
						h.a = h.addPodWith(h.list, "heal-a", mapping(8080, 80, "tcp"))
						h.app = newServer(t, h.a.NS, 80)
						out, code := h.cliRun("repair", "--accept-loss")
						require.Equal(t, 0, code, out)
					}
					// Within one STATUS the node is mended.
					require.NoError(t, h.cni.Status(h.list), "STATUS")
					require.Empty(t, h.statusProblems(), "problems left after STATUS")
					h.works(t, "after STATUS")
					require.NoError(t, h.cni.Check(h.list, h.a.RT), "CHECK of pod a after STATUS")
					require.NoError(t, h.cni.Check(h.list, h.b.RT), "CHECK of pod b after STATUS")
					require.NoError(t, h.cni.DelPod(h.list, h.a))
					require.NoError(t, h.cni.DelPod(h.list, h.b))
					h.requireClean()
					require.Empty(t, h.published(), "published ports left")
					require.Zero(t, h.uplinkProgramIDs(), "programs left on the uplink")
					require.Empty(t, h.ipamOwners(), "addresses left in ebpf-ipam")
				})
			}
		}
	}
}
