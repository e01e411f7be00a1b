package datapath_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
	"github.com/ebpf-cni/ebpf-cni/pkg/veth"
)

// pluginCall runs the ebpf-cni binary for one verb in the node, as a
// runtime execs it; killAfter > 0 sends it SIGKILL after that long. It
// returns how long it ran and whether it was killed.
func (e *env) pluginCall(t *testing.T, stdin []byte, verb, containerID, netns string, killAfter time.Duration) (time.Duration, bool) {
	t.Helper()
	var took time.Duration
	killed := false
	require.NoError(t, e.node.NS.Do(func(ns.NetNS) error {
		cmd := exec.Command(filepath.Join(e.paths[0], "ebpf-cni"))
		cmd.Env = []string{"CNI_COMMAND=" + verb, "CNI_CONTAINERID=" + containerID, "CNI_NETNS=" + netns, "CNI_IFNAME=eth0",
			"CNI_PATH=" + strings.Join(e.paths, ":"), "PATH=" + os.Getenv("PATH")}
		var out bytes.Buffer
		cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(stdin), &out, &out
		start := time.Now()
		if err := cmd.Start(); err != nil {
			return err
		}
		if killAfter > 0 {
			timer := time.AfterFunc(killAfter, func() { _ = cmd.Process.Signal(syscall.SIGKILL) })
			defer timer.Stop()
		}
		err := cmd.Wait()
		took = time.Since(start)
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			killed = true
			return nil
		}
		if killAfter == 0 && err != nil {
			return fmt.Errorf("%s %s: %v: %s", verb, containerID, err, out.String())
		}
		return nil
	}))
	return took, killed
}

// pluginStdin is what a runtime gives the first plugin of list.
func pluginStdin(t *testing.T, list *libcni.NetworkConfigList) []byte {
	t.Helper()
	var conf map[string]any
	require.NoError(t, json.Unmarshal(list.Plugins[0].Bytes, &conf))
	conf["name"], conf["cniVersion"] = list.Name, list.CNIVersion
	b, err := json.Marshal(conf)
	require.NoError(t, err)
	return b
}

// leftOf lists what is left on the node of one container: its veth,
// record, ebpf-ipam addresses and endpoint entries.
func (e *env) leftOf(containerID string) []string {
	e.t.Helper()
	var out []string
	name := veth.HostName(containerID, "eth0")
	for _, l := range e.hostLinks() {
		if l.Attrs().Name == name {
			out = append(out, "veth "+name)
		}
	}
	if _, err := node.ReadRecord(e.stateDir, name); err == nil {
		out = append(out, "record "+name)
	}
	for ip, cid := range e.ipamHeld() {
		if cid == containerID {
			out = append(out, "address "+ip)
		}
	}
	return out
}

// TestKillSweep: ADD and DEL killed with SIGKILL at 200 points spread over
// the whole call (100 each, from the exec to the end): afterwards every
// attachment is either complete or removed by one DEL, and without that
// DEL the CNI GC (the container not among the valid ones) or, when its pod
// is gone, the next STATUS leave nothing of it.
func TestKillSweep(t *testing.T) {
	e := newEnv(t)
	list := e.hostPortList("", "", testutil.Cgroup(t), map[string]any{"ipMasq": true})
	keep := e.addPod(list, "keep")
	stdin := pluginStdin(t, list)

	// How long a call takes here, to spread the kill points over it.
	var adds, dels []time.Duration
	for i := range 5 {
		pod := testutil.NetNS(t)
		id := fmt.Sprintf("measure-%d", i)
		d, _ := e.pluginCall(t, stdin, "ADD", id, pod.Path(), 0)
		adds = append(adds, d)
		d, _ = e.pluginCall(t, stdin, "DEL", id, pod.Path(), 0)
		dels = append(dels, d)
	}
	median := func(d []time.Duration) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)/2]
	}
	// The span follows the machine: the median of the verb's last 9
	// calls that ran to their end (a loaded CI machine may run the sweep
	// faster or slower than the measurement).
	done := map[string][]time.Duration{"ADD": adds, "DEL": dels}
	spanOf := func(verb string) time.Duration {
		d := done[verb]
		return median(append([]time.Duration(nil), d[max(0, len(d)-9):]...))
	}
	const points = 100
	killedAt := map[string]int{}
	for _, verb := range []string{"ADD", "DEL"} {
		for i := range points {
			span := spanOf(verb)
			id := fmt.Sprintf("kill-%s-%d", strings.ToLower(verb), i)
			pod := testutil.NetNS(t)
			if verb == "DEL" {
				e.pluginCall(t, stdin, "ADD", id, pod.Path(), 0)
			}
			// From the first instructions of the process to past its end.
			at := time.Duration(int64(span) * int64(i+1) * 12 / 10 / points)
			if d, killed := e.pluginCall(t, stdin, verb, id, pod.Path(), at); killed {
				killedAt[verb]++
			} else {
				done[verb] = append(done[verb], d)
			}
			switch i % 3 {
			case 0: // the runtime retries DEL once
				e.pluginCall(t, stdin, "DEL", id, pod.Path(), 0)
			case 1: // the runtime lost it; its GC lists the live ones
				require.NoError(t, e.cni.GC(list, []types.GCAttachment{{ContainerID: "keep", IfName: "eth0"}}))
			case 2: // the pod went away; the next STATUS reclaims
				nettest.CloseNetNS(pod)
				// The kernel removes the pod's veth with its netns, a moment later.
				require.NoError(t, e.node.NS.Do(func(ns.NetNS) error {
					for start := time.Now(); veth.Exists(veth.HostName(id, "eth0")) && time.Since(start) < 5*time.Second; {
						time.Sleep(10 * time.Millisecond)
					}
					return nil
				}))
				require.NoError(t, e.cni.Status(list))
			}
			require.Empty(t, e.leftOf(id), "%s killed after %s (point %d), then %s", verb, at, i, []string{"DEL", "GC", "STATUS"}[i%3])
		}
	}
	t.Logf("ADD %s, DEL %s (measured), %s, %s (last spans); killed: %v of %d each", median(adds), median(dels),
		spanOf("ADD"), spanOf("DEL"), killedAt, points)
	require.Greater(t, killedAt["ADD"], points/2, "most kills land inside the ADD")
	require.Greater(t, killedAt["DEL"], points/2, "most kills land inside the DEL")
	e.requireConsistent("after the sweep")
	require.NoError(t, e.cni.Check(list, keep.RT))
	require.NoError(t, e.cni.DelPod(list, keep))
	e.requireClean()
	require.Empty(t, e.ipamHeld(), "addresses left")
	require.Empty(t, e.published(), "published ports left")
	require.Zero(t, e.uplinkProgramIDs(), "programs left on the uplink")
}
