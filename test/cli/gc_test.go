package cli_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ebpf-cni/ebpf-cni/internal/nettest"
	"github.com/ebpf-cni/ebpf-cni/internal/testutil"
	"github.com/ebpf-cni/ebpf-cni/pkg/cli"
	"github.com/ebpf-cni/ebpf-cni/pkg/counters"
	"github.com/ebpf-cni/ebpf-cni/pkg/node"
)

type gcJSON struct {
	DryRun    bool             `json:"dryRun"`
	Endpoints []*cli.Collected `json:"endpoints"`
	Leftovers []string         `json:"leftovers"`
	Skipped   []string         `json:"skipped"`
}

// TestGC: run in the wrong netns, gc collects nothing; a pod whose netns is
// deleted without DEL is listed by --dry-run, which removes nothing, then
// removed by gc (record, map entries, pins, counters, its ebpf-ipam
// addresses) while the other pods keep their state and their traffic.
func TestGC(t *testing.T) {
	for _, mode := range testutil.AttachModes {
		t.Run(mode, func(t *testing.T) {
			testutil.RequireMode(t, mode)
			e := newEnv(t)
			list := e.confList(mode)
			var pods []*nettest.Pod
			for i := range 3 {
				pods = append(pods, e.addPod(list, fmt.Sprintf("pod-%d", i)))
			}
			dead := pods[2]
			deadVeth := dead.Result.Interfaces[0].Name
			deadIPs := []string{dead.IP(4).String(), dead.IP(6).String()}

			// From a netns without the host veths every pod looks gone;
			// gc must see they are not.
			other, err := nettest.NewNetNS()
			require.NoError(t, err)
			t.Cleanup(func() { nettest.CloseNetNS(other) })
			r := runIn(t, other, e.bin, "gc", "--bpf-root", e.bpfRoot, "--state-dir", e.stateDir, "-o", "json")
			require.Equal(t, cli.ExitOK, r.code, "%s", r)
			var wrong gcJSON
			require.NoError(t, jsonUnmarshal(r.stdout, &wrong))
			require.Empty(t, wrong.Endpoints, "gc in the wrong netns collected live pods")
			require.Len(t, wrong.Skipped, 3)
			// tcx: the pinned link still has its device; tc: the pod's end
			// of the veth is alive in its netns.
			why := map[string]string{"tcx": "its tcx link", "tc": "is alive in"}[mode]
			for _, s := range wrong.Skipped {
				require.Contains(t, s, why)
			}
			require.Len(t, e.endpoints(), 3)

			// The pod's netns goes away without a DEL.
			e.killPod(dead)

			var dry gcJSON
			e.json(&dry, cli.ExitOK, "gc", "--dry-run")
			require.True(t, dry.DryRun)
			require.Len(t, dry.Endpoints, 1)
			require.Equal(t, "pod-2", dry.Endpoints[0].ContainerID)
			require.Equal(t, deadVeth, dry.Endpoints[0].HostVeth)
			require.Contains(t, dry.Endpoints[0].Reason, "gone")
			require.Len(t, e.endpoints(), 3, "dry run removed an endpoint")
			requireHeld(t, e, deadIPs, true)
			_, err = os.Stat(filepath.Join(e.stateDir, "endpoints", deadVeth+".json"))
			require.NoError(t, err, "dry run removed the record")

			var done gcJSON
			e.json(&done, cli.ExitOK, "gc")
			require.False(t, done.DryRun)
			require.Len(t, done.Endpoints, 1)
			require.ElementsMatch(t, deadIPs, done.Endpoints[0].IPAMReleased)
			require.Empty(t, done.Endpoints[0].Error)

			eps := e.endpoints()
			require.Len(t, eps, 2)
			for _, ep := range eps {
				require.NotEqual(t, "pod-2", ep.ContainerID)
				require.Empty(t, ep.Problems)
			}
			requireHeld(t, e, deadIPs, false)
			requireHeld(t, e, []string{pods[0].IP(4).String(), pods[1].IP(6).String()}, true)
			_, err = os.Stat(filepath.Join(e.stateDir, "endpoints", deadVeth+".json"))
			require.ErrorIs(t, err, os.ErrNotExist)
			_, err = os.Stat(node.LinkDir(e.bpfRoot, deadVeth))
			require.ErrorIs(t, err, os.ErrNotExist)
			keys, err := counters.DeviceCounterKeys(e.bpfRoot)
			require.NoError(t, err)
			require.NotContains(t, keys, hostIfIndex(t, dry))
			out, err := nettest.Ping(pods[0].NS, pods[1].IP(4), 2)
			require.NoError(t, err, out)

			// Nothing left to do, and status is clean.
			r = e.cli("gc")
			require.Equal(t, cli.ExitOK, r.code, "%s", r)
			require.True(t, strings.HasPrefix(r.stdout, "no endpoint to collect"), r.stdout)
			r = e.cli("status")
			require.Equal(t, cli.ExitOK, r.code, "%s", r)
		})
	}
}

func hostIfIndex(t *testing.T, g gcJSON) int {
	t.Helper()
	require.Len(t, g.Endpoints, 1)
	return g.Endpoints[0].HostIfIndex
}

// requireHeld checks that ebpf-ipam holds (or not) every address of ips.
func requireHeld(t *testing.T, e *env, ips []string, held bool) {
	t.Helper()
	var nets []cli.NetworkAllocations
	e.json(&nets, cli.ExitOK, "ipam")
	have := map[string]bool{}
	for _, n := range nets {
		for _, a := range n.Allocations {
			have[a.Address] = true
		}
	}
	for _, ip := range ips {
		require.Equal(t, held, have[ip], "address %s held", ip)
	}
}
